"""BERT pre-training from a config (`data.task = "mlm"`): documents split at blank lines, masked-LM and
next-sentence objectives learnt on a corpus where both are learnable, perplexity of the masked tokens
alone, the "no NSP" ablation, and the command line end to end (train, evaluate)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli

from attnlab.data.text_files import split_documents
from attnlab.errors import ConfigError
from attnlab.training.recipe import load_run_config, prepare, pretraining_accuracy
from attnlab.training.trainer import Trainer

TINY = ["train.progress=false", "train.precision=fp32", "train.device=cpu"]
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "bert-mlm.toml"


def test_split_documents():
    text = "a b.\r\nc d.\n\n\n  \ne f.\n   g h.  \n\n"
    assert split_documents(text) == [["a b.", "c d."], ["e f.", "g h."]]
    assert split_documents("\n\n") == []
    assert split_documents("one line") == [["one line"]]


def test_a_line_of_invisible_format_characters_is_blank():
    # A zero-width space survived str.strip() as a sentence, which WordPiece encodes to no tokens: a pair
    # "[CLS] A [SEP] [SEP]" with an empty B.
    text = "a b.\nc d.\n\u200b\ne f.\n\ufeff \u200d\ng h.\ni j.\u200b\n"
    assert split_documents(text) == [["a b.", "c d."], ["e f."], ["g h.", "i j.\u200b"]]


def corpus(n_docs: int = 12, n_sentences: int = 4) -> str:
    """Each document repeats its own topic word in every sentence, between words that depend on the
    sentence's place: a masked topic word is predictable from the rest of the pair, and B follows A
    exactly when both carry the same topic word (and B's place word is the next one)."""
    places = ["first", "second", "third", "fourth", "fifth"]
    docs = []
    for d in range(n_docs):
        topic = f"topic{d}"
        docs.append("\n".join(f"the {places[i]} line about {topic} is here" for i in range(n_sentences)))
    return "\n\n".join(docs) + "\n"


def _config(tmp_path, *extra: str):
    path = tmp_path / "docs.txt"
    path.write_text(corpus(), encoding="utf-8")
    eval_path = tmp_path / "eval.txt"
    eval_path.write_text(corpus(), encoding="utf-8")  # the same documents: the test is of learning at all
    return load_run_config(None, [
        "model.family=bert", "model.d_model=64", "model.n_layers=2", "model.n_heads=4", "model.d_ff=128",
        "model.dropout=0.0", "model.attention_dropout=0.0", "data.task=mlm", "data.tokenizer=word",
        f"data.path={json.dumps(str(path))}", f"data.eval_path={json.dumps(str(eval_path))}",
        "data.max_length=24", "train.steps=700", "train.batch_size=16", "train.lr=1e-3", "train.warmup_steps=10",
        f"train.out_dir={json.dumps(str(tmp_path / 'run'))}", *TINY, *extra])


def test_both_objectives_are_learnt_and_perplexity_is_of_the_masked_tokens(tmp_path):
    run = _config(tmp_path)
    prep = prepare(run)
    assert prep.info == {"documents": 12, "sentence_pairs": 36}
    before = pretraining_accuracy(prep.model, prep.eval_source)
    trainer = Trainer(prep.model, run.train, prep.train_source, eval_source=prep.eval_source,
                      tokenizer=prep.tokenizer, out_dir=run.train.out_dir, eval_counts=prep.eval_counts)
    trainer.fit()
    after = trainer.evaluate()
    assert after["mlm_accuracy"] > max(60.0, before["mlm_accuracy"] + 30)
    assert after["nsp_accuracy"] > 80.0  # 36 pairs, 64 % of one class: a constant guess stays below
    # The evaluation loss adds the NSP loss; perplexity is exp of the masked-LM loss alone.
    mlm_sum = n = 0.0
    with torch.no_grad():
        prep.model.eval()
        for batch in prep.eval_source.iter_batches():
            out = prep.model(**batch)
            mlm_sum += float(out.extra["mlm_loss"]) * int(out.n_targets)
            n += int(out.n_targets)
    assert after["perplexity"] == pytest.approx(math.exp(mlm_sum / n), rel=1e-5)
    assert after["loss"] > mlm_sum / n


def test_without_nsp_the_same_pairs_train_the_masked_lm_only(tmp_path):
    run = _config(tmp_path, "model.nsp=false", "train.steps=2")
    prep = prepare(run)
    assert prep.model.nsp is None
    batch = prep.train_source.batch(0)
    assert bool((batch["next_sentence_label"] == 0).all())  # B is always A's successor
    metrics = pretraining_accuracy(prep.model, prep.eval_source)
    assert set(metrics) == {"mlm_accuracy"}


def test_mlm_needs_bert_and_its_pretraining_heads(tmp_path):
    with pytest.raises(ConfigError, match="needs a model of family bert"):
        load_run_config(None, ["data.task=mlm"])
    # Without a config file, naming another family drops the default run's GPT preset.
    assert load_run_config(None, ["data.task=mlm", "model.family=bert"]).model == {"family": "bert"}
    with pytest.raises(ConfigError, match="model.heads = 'classification', but this data.task trains the "
                                          "'pretraining'"):
        prepare(_config(tmp_path, "model.heads=classification"))
    with pytest.raises(ConfigError, match="mask_prob"):
        _config(tmp_path, "data.mask_prob=0")


def test_command_line_train_and_evaluate(tmp_path, capsys):
    docs = tmp_path / "docs.txt"
    docs.write_text(corpus(), encoding="utf-8")
    out = tmp_path / "bert"
    sets = [f"data.path={json.dumps(str(docs))}", "data.tokenizer=word", "data.vocab_size=100",
            "data.max_length=24", "train.steps=4", "train.eval_every=2", "model.d_model=16", "model.d_ff=32",
            "model.n_layers=1", f"train.out_dir={json.dumps(str(out))}", "data.val_fraction=0.25", *TINY]
    code, stdout, err = run_cli(capsys, "train", str(CONFIG), *[a for s in sets for a in ("--set", s)])
    assert code == 0, err
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in logged if "eval_loss" in r]
    assert evals and {"eval_mlm_accuracy", "eval_nsp_accuracy", "eval_perplexity"} <= set(evals[-1])
    code, stdout, err = run_cli(capsys, "evaluate", str(out), "--data", str(docs), "--json", "--device", "cpu")
    assert code == 0, err
    metrics = json.loads(stdout)
    assert metrics["sentence_pairs"] == 36 and metrics["masked_tokens"] > 0
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["mlm_loss"]), rel=1e-6)
    assert metrics["loss"] > metrics["mlm_loss"] and 0 <= metrics["nsp_accuracy"] <= 100
    again = json.loads(run_cli(capsys, "evaluate", str(out), "--data", str(docs), "--json", "--device", "cpu")[1])
    assert again == metrics  # masking and pairing are seeded
    code, _, err = run_cli(capsys, "generate", str(out), "--prompt", "the", "--device", "cpu")
    assert code == 2 and "does not generate" in err
    single = tmp_path / "single.txt"  # one sentence a document: no pairs; the error names the file
    single.write_text("the cat sat\n\nthe dog ran\n", encoding="utf-8")
    code, _, err = run_cli(capsys, "evaluate", str(out), "--data", str(single), "--device", "cpu")
    assert code == 2 and err.startswith(f"attnlab: error: {single}: no document has two sentences"), err


def test_evaluate_masks_the_eval_file_as_training_did_whatever_the_seed(tmp_path, capsys):
    """`evaluate` masked and paired with seed 0, training's evaluation with train.seed: a run of seed 5 scored its
    own data.eval_path with other masks than its log's (6.6431 against 6.6411 in the audit's run)."""
    docs, held_out = tmp_path / "docs.txt", tmp_path / "held_out.txt"
    docs.write_text(corpus(), encoding="utf-8")
    held_out.write_text(corpus(8, 3), encoding="utf-8")
    out = tmp_path / "bert"
    sets = [f"data.path={json.dumps(str(docs))}", f"data.eval_path={json.dumps(str(held_out))}",
            "data.tokenizer=word", "data.vocab_size=100", "data.max_length=24", "train.steps=2", "train.eval_every=2",
            "train.seed=5", "model.d_model=16", "model.d_ff=32", "model.n_layers=1",
            f"train.out_dir={json.dumps(str(out))}", *TINY]
    assert run_cli(capsys, "train", str(CONFIG), *[a for s in sets for a in ("--set", s)])[0] == 0
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "eval_loss" in line][-1]
    code, stdout, err = run_cli(capsys, "evaluate", str(out), "--data", str(held_out), "--json", "--device", "cpu")
    assert code == 0, err
    scored = json.loads(stdout)
    assert scored["loss"] == pytest.approx(logged["eval_loss"], rel=1e-6)
    assert scored["mlm_accuracy"] == logged["eval_mlm_accuracy"]
    assert scored["nsp_accuracy"] == logged["eval_nsp_accuracy"]


def test_resumed_pre_training_ends_with_the_weights_of_an_uninterrupted_run(tmp_path):
    """Masking and pairing are functions of (seed, step), dropout's RNG is in the checkpoint: a run stopped
    after 3 steps and resumed to 6 ends bit for bit where 6 steps in one go end (the noam schedule does not
    depend on the total steps)."""
    from attnlab.training.checkpoint import load_model
    from attnlab.training.recipe import train_run

    docs = tmp_path / "docs.txt"
    docs.write_text(corpus(), encoding="utf-8")

    def run(out, steps):
        return load_run_config(None, [
            "model.family=bert", "model.d_model=16", "model.n_layers=1", "model.n_heads=2", "model.d_ff=32",
            "data.task=mlm", "data.tokenizer=word", f"data.path={json.dumps(str(docs))}", "data.max_length=24",
            "data.val_fraction=0", f"train.steps={steps}", "train.batch_size=4", "train.schedule=noam",
            "train.warmup_steps=2",
            f"train.out_dir={json.dumps(str(tmp_path / out))}", *TINY])

    train_run(run("straight", 6))
    train_run(run("resumed", 3))
    train_run(run("resumed", 6), resume=True)
    a, b = load_model(tmp_path / "straight").state_dict(), load_model(tmp_path / "resumed").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_held_out_documents_whole_documents_or_the_last_sentences():
    from attnlab.data.text_files import held_out_documents

    docs = [[f"d{i} s{j}" for j in range(3)] for i in range(20)]
    train, held = held_out_documents(docs, 0.1)
    assert train == docs[:18] and held == docs[18:]  # two whole documents
    one = [[f"s{j}" for j in range(40)]]  # one sentence per line, no blank lines
    train, held = held_out_documents(one, 0.1)
    assert train == [one[0][:36]] and held == [one[0][36:]]
    # The cut starts inside a document: its tail is held out with the documents after it.
    train, held = held_out_documents([["a", "b", "c"], ["d", "e", "f", "g"]], 0.5)
    assert train == [["a", "b", "c"], ["d"]] and held == [["e", "f", "g"]]
    # Next-sentence prediction needs two documents on each side: here the held-out part would have one.
    assert held_out_documents([["a", "b", "c"], ["d", "e", "f", "g"]], 0.5, min_documents=2)[1] == []
    assert held_out_documents(one, 0.01)[1] == []  # fewer than two sentences: no pair to evaluate
    assert held_out_documents(one, 0.0) == (one, [])


def test_one_long_document_holds_out_its_last_sentences(tmp_path):
    """A corpus without blank lines (one sentence per line, e.g. a data set's sentences) was one document, too
    few to hold out any: the run trained without evaluation and said nothing. Now its last sentences are held
    out; where even that cannot give sentence pairs on both sides (next-sentence prediction needs two held-out
    documents), the run warns."""
    path = tmp_path / "sentences.txt"
    path.write_text("".join(f"the line number {i} is here\n" for i in range(40)), encoding="utf-8")
    sets = ["model.family=bert", "model.d_model=16", "model.n_layers=1", "model.n_heads=2", "model.d_ff=32",
            "data.task=mlm", "data.tokenizer=word", f"data.path={json.dumps(str(path))}", "data.max_length=16",
            "train.steps=1", f"train.out_dir={json.dumps(str(tmp_path / 'run'))}", *TINY]
    prep = prepare(load_run_config(None, [*sets, "model.nsp=false"]))
    assert prep.info == {"documents": 1, "sentence_pairs": 35}  # 36 training sentences
    assert len(prep.eval_source.pairs) == 3  # the last 4 sentences
    three = tmp_path / "three.txt"
    three.write_text(corpus(n_docs=3), encoding="utf-8")
    with pytest.warns(UserWarning, match="nothing held out for evaluation: .*three.txt has 3 document"):
        prep = prepare(load_run_config(None, [*sets, f"data.path={json.dumps(str(three))}",
                                              "data.val_fraction=0.2"]))
    assert prep.eval_source is None


@pytest.mark.parametrize("nsp", [True, False])
def test_masked_lm_logits_at_the_labelled_positions_only_give_the_same_loss_and_gradients(nsp):
    """mlm_logits = "labelled" runs the masked-LM head at the labelled positions in training: the same loss,
    masked-LM loss and gradients as the head over every position; evaluation still scores every position."""
    from attnlab.models.bert import BertConfig, BertModel

    torch.manual_seed(0)
    ids = torch.randint(5, 50, (4, 12))
    labels = torch.where(torch.rand(4, 12) < 0.2, ids, -100)
    labels[0, 3] = 7
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels,
             "token_type_ids": (torch.arange(12) >= 6).long().expand(4, 12),
             "next_sentence_label": torch.tensor([0, 1, 1, 0])}
    config = dict(vocab_size=50, d_model=16, n_layers=2, n_heads=2, d_ff=24, max_len=16, dropout=0.0,
                  attention_dropout=0.0, nsp=nsp)
    dense = BertModel(BertConfig(**config)).train()
    sparse = BertModel(BertConfig(**config, mlm_logits="labelled")).train()
    sparse.load_state_dict(dense.state_dict())
    outs = [model(**batch) for model in (dense, sparse)]
    for out in outs:
        out.loss.backward()
    n = int((labels != -100).sum())
    assert outs[0].logits.shape == (4, 12, 50) and outs[1].logits.shape == (n, 50)
    assert int(outs[1].n_targets) == int(outs[0].n_targets) == n
    torch.testing.assert_close(outs[1].loss, outs[0].loss)
    torch.testing.assert_close(outs[1].extra["mlm_loss"], outs[0].extra["mlm_loss"])
    grads = dict(dense.named_parameters())
    for name, param in sparse.named_parameters():
        torch.testing.assert_close(param.grad, grads[name].grad, atol=1e-6, rtol=1e-5, msg=name)
    with torch.no_grad():
        assert sparse.eval()(**batch).logits.shape == (4, 12, 50)
    with pytest.raises(ConfigError, match="mlm_logits"):
        BertConfig(**config, mlm_logits="some")
