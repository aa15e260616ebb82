"""Behaviour of the command-line glue (recipe, inference/runs, cli, the knowledge experiment, the synthetic
world) that a mutation audit found unpinned: each test here fails under a plausible wrong version of the
code that the rest of the suite lets pass."""

from __future__ import annotations

import collections
import json
import shutil
import warnings

import pytest
import torch
from cli_helpers import one_line_error, run_cli
from cli_helpers import toml_str as _q

from attnlab.errors import ConfigError
from attnlab.training.recipe import load_run_config, prepare, train_run

TINY = ["train.progress=false", "train.precision=fp32", "train.device=cpu"]


def _sets(items) -> list[str]:
    return [a for item in items for a in ("--set", item)]


# ---- fixtures: tiny runs of each kind ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory):
    """Two tiny char GPTs (block 32) of different seeds, 2 steps each."""
    root = tmp_path_factory.mktemp("gaps-lm")
    for seed in (1, 2):
        train_run(load_run_config(None, ["model.preset=gpt-char-tiny", "train.steps=2", "train.eval_every=0",
                                         f"train.seed={seed}", f"train.out_dir={_q(root / str(seed))}", *TINY]))
    return root / "1", root / "2"


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory):
    """A tiny encoder classifier (labels neg/pos) with data.max_length = 8, evaluated on its training file."""
    root = tmp_path_factory.mktemp("gaps-cls")
    rows = ["sentence\tlabel"] + [f"{w} movie {w}\t{lab}" for w, lab in
                                  [("great", "pos"), ("awful", "neg"), ("fine", "pos"), ("bad", "neg")] * 4]
    rows.append(" ".join(["awful movie"] * 3 + ["great movie"] * 6) + "\tpos")  # 18 words: cut to 8 tokens
    (root / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    train_run(load_run_config(None, [
        "model.family=encoder", "model.d_model=16", "model.n_heads=2", "model.d_ff=16", "model.n_layers=1",
        "data.task=classification", "data.tokenizer=word", f"data.path={_q(root / 'train.tsv')}",
        f"data.eval_path={_q(root / 'train.tsv')}", "data.max_length=8", "train.steps=2", "train.batch_size=8",
        "train.eval_every=0", f"train.out_dir={_q(root / 'run')}", *TINY]))
    return root / "run"


TRANSLATION = {"a b c d e": "e d c b a", "b c d e a": "a e d c b", "c a e b d": "d b e a c",
               "e d b a c": "c a b d e"}


@pytest.fixture(scope="module")
def mt_run(tmp_path_factory):
    """A tiny seq2seq model, 2 steps on four 5-word sentence pairs."""
    root = tmp_path_factory.mktemp("gaps-mt")
    (root / "src.txt").write_text("".join(s + "\n" for s in TRANSLATION), encoding="utf-8")
    (root / "tgt.txt").write_text("".join(t + "\n" for t in TRANSLATION.values()), encoding="utf-8")
    train_run(load_run_config(None, [
        "model.family=seq2seq", "model.d_model=16", "model.d_ff=16", "model.n_heads=2", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "data.task=translation", "data.tokenizer=word",
        f"data.src_path={_q(root / 'src.txt')}", f"data.tgt_path={_q(root / 'tgt.txt')}", "data.max_length=16",
        "train.steps=2", "train.batch_size=4", f"train.out_dir={_q(root / 'run')}", *TINY]))
    return root / "run"


# ---- recipe: --set parsing, data preparation ---------------------------------------------------------------


def test_set_values_keep_their_equals_signs_and_keys_have_two_parts(tmp_path):
    out = tmp_path / "a=b"
    assert load_run_config(None, [f"train.out_dir={_q(out)}"]).train.out_dir == str(out)
    with pytest.raises(ConfigError, match="the key must be section.name"):
        load_run_config(None, ["train.lr.peak=1e-3"])


def test_the_embedded_corpus_holds_out_its_last_tenth(tmp_path):
    from attnlab.data.corpus import pydoc_corpus

    run = load_run_config(None, ["model.preset=gpt-char-tiny", f"train.out_dir={_q(tmp_path / 'run')}"])
    prep = prepare(run)
    text = pydoc_corpus()
    cut = text.index("\n", int(len(text) * 0.9)) + 1  # the first line start from nine tenths on
    assert prep.info["train_tokens"] == cut and cut - int(len(text) * 0.9) < 200


def test_char_vocabulary_covers_the_held_out_text_and_a_short_held_out_part_is_dropped(tmp_path):
    """A character that occurs only in the held-out tail is still in the char vocabulary (the validation
    tokens encode); a held-out part shorter than one window gives no evaluation source instead of failing."""
    from attnlab.data.corpus import TokenFile

    path = tmp_path / "text.txt"
    path.write_text("".join(f"line {i} of the text\n" for i in range(200)) + "the end \u00a7\n", encoding="utf-8")
    prep = prepare(load_run_config(None, ["model.preset=gpt-char-tiny", f"data.path={_q(path)}",
                                          "data.val_fraction=0.1", f"train.out_dir={_q(tmp_path / 'a')}"]))
    val = prep.tokenizer.decode(list(TokenFile(tmp_path / "a" / "data" / "val.bin")[:]))
    assert val.endswith("the end \u00a7\n")
    short = tmp_path / "short.txt"
    short.write_text("".join(f"line {i} of the text\n" for i in range(60)) + "x\n", encoding="utf-8")
    prep = prepare(load_run_config(None, ["model.preset=gpt-char-tiny", f"data.path={_q(short)}",
                                          "data.val_fraction=0.01", f"train.out_dir={_q(tmp_path / 'b')}"]))
    assert prep.eval_source is None


def test_classification_eval_file_uses_the_training_class_numbers(tmp_path):
    """An evaluation file holding only the second class: its rows get that class's number in the training
    labels (1), not their own numbering (0)."""
    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\ngood one\tpos\nbad one\tneg\nfine one\tpos\n", encoding="utf-8")
    only_pos = tmp_path / "pos.tsv"
    only_pos.write_text("sentence\tlabel\ngood one\tpos\nfine one\tpos\n", encoding="utf-8")
    prep = prepare(load_run_config(None, [
        "model.family=encoder", "model.d_model=16", "model.n_heads=2", "model.d_ff=16", "model.n_layers=1",
        "data.task=classification", "data.tokenizer=word", f"data.path={_q(train)}",
        f"data.eval_path={_q(only_pos)}", f"train.out_dir={_q(tmp_path / 'run')}", *TINY]))
    assert prep.info["labels"] == ["neg", "pos"]
    labels = torch.cat([b["labels"] for b in prep.eval_source.iter_batches(4)])
    assert labels.tolist() == [1, 1]


def test_init_from_a_classifier_takes_the_new_number_of_classes(tmp_path, cls_run):
    three = tmp_path / "three.tsv"
    three.write_text("sentence\tlabel\ngreat movie\tpos\nbad movie\tneg\nfine movie\tmeh\n", encoding="utf-8")
    prep = prepare(load_run_config(None, [f"model.init_from={_q(cls_run)}", "data.task=classification",
                                          f"data.path={_q(three)}", "data.max_length=8",
                                          f"train.out_dir={_q(tmp_path / 'run')}", *TINY]))
    assert prep.info["labels"] == ["meh", "neg", "pos"]
    assert prep.model.config.n_classes == 3 and prep.model.head.proj.out_features == 3


def test_translation_eval_files_and_sentences_as_long_as_max_length(tmp_path):
    """data.eval_src_path is the source side of the evaluation batches; a target of data.max_length tokens
    plus its bos/eos fits the model's positions."""
    words = [f"w{i}" for i in range(40)]
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text(" ".join(words) + "\nw1 w2\n", encoding="utf-8")
    tgt.write_text(" ".join(reversed(words)) + "\nw2 w1\n", encoding="utf-8")
    esrc, etgt = tmp_path / "eval.src", tmp_path / "eval.tgt"
    esrc.write_text("w3 w4 w5\n", encoding="utf-8")
    etgt.write_text("w9\n", encoding="utf-8")
    run = load_run_config(None, [
        "model.family=seq2seq", "model.d_model=16", "model.d_ff=16", "model.n_heads=2", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "data.task=translation", "data.tokenizer=word", f"data.src_path={_q(src)}",
        f"data.tgt_path={_q(tgt)}", f"data.eval_src_path={_q(esrc)}", f"data.eval_tgt_path={_q(etgt)}",
        "data.max_length=20", "train.steps=1", "train.batch_size=2", f"train.out_dir={_q(tmp_path / 'run')}",
        *TINY])
    prep = prepare(run)
    batch = next(iter(prep.eval_source.iter_batches(2)))
    assert prep.tokenizer.decode(batch["src_ids"][0].tolist(), skip_special_tokens=True).split() == ["w3", "w4", "w5"]
    assert train_run(run)["steps"] == 1  # the 40-word pair, cut to 20 tokens, trains


def test_mlm_without_held_out_part_does_not_warn(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("\n\n".join(f"doc {d} one\ndoc {d} two" for d in range(3)) + "\n", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prep = prepare(load_run_config(None, [
            "model.family=bert", "model.d_model=16", "model.n_layers=1", "model.n_heads=2", "model.d_ff=32",
            "data.task=mlm", "data.tokenizer=word", f"data.path={_q(path)}", "data.val_fraction=0",
            "data.max_length=16", f"train.out_dir={_q(tmp_path / 'run')}", *TINY]))
    assert prep.eval_source is None


def test_evaluate_batches_restores_the_models_mode(cls_run):
    from attnlab.inference.runs import load_run
    from attnlab.training.recipe import evaluate_batches

    loaded = load_run(cls_run)
    batch = {"input_ids": torch.tensor([[1, 2, 3]]), "labels": torch.tensor([0])}
    for mode in (False, True):
        loaded.model.train(mode)
        evaluate_batches(loaded.model, [batch])
        assert loaded.model.training is mode


def test_resume_does_not_warn_about_replacing_the_run(tmp_path, capsys, lm_runs):
    run = tmp_path / "run"
    shutil.copytree(lm_runs[0], run)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=r"train\.steps 2 → 3 moves the end of the cosine decay")  # true
        code, stdout, err = run_cli(capsys, "train", "--resume", *_sets(["model.preset=gpt-char-tiny",
                                    "train.steps=3", "train.eval_every=0", "train.seed=1",
                                    f"train.out_dir={_q(run)}", *TINY]))
    assert code == 0, err
    assert "start_step=2" in stdout and "warning" not in err


# ---- inference/runs and the generate / evaluate commands ---------------------------------------------------


def test_best_reads_the_best_checkpoint(tmp_path, capsys, lm_runs):
    """--best: best/ instead of checkpoint/. Here best/ holds the other seed's weights."""
    a, b = lm_runs
    run = tmp_path / "run"
    shutil.copytree(a, run)
    shutil.rmtree(run / "best", ignore_errors=True)
    shutil.copytree(b / "checkpoint", run / "best")
    sample = tmp_path / "sample.txt"
    sample.write_text("def f(x):\n    return x + 1\n" * 3, encoding="utf-8")

    def evaluate(folder, *extra):
        code, out, err = run_cli(capsys, "evaluate", str(folder), "--data", str(sample), "--json", "--device", "cpu",
                                 *extra)
        assert code == 0, err
        return json.loads(out)

    def generate(folder, *extra):
        code, out, err = run_cli(capsys, "generate", str(folder), "--prompt", "def ", "-n", "24", "--greedy",
                                 "--device", "cpu", *extra)
        assert code == 0, err
        return out

    assert evaluate(run, "--best") == evaluate(b) != evaluate(run)
    assert generate(run, "--best") == generate(b) != generate(run)


def test_dtype_converts_the_weights(capsys, monkeypatch, lm_runs):
    import attnlab.inference.runs as runs

    assert next(runs.load_run(lm_runs[0], dtype="bf16").model.parameters()).dtype == torch.bfloat16
    seen = []
    real = runs.generate_texts

    def spy(run, *args, **kwargs):
        seen.append(next(run.model.parameters()).dtype)
        return real(run, *args, **kwargs)

    monkeypatch.setattr(runs, "generate_texts", spy)
    code, _, err = run_cli(capsys, "generate", str(lm_runs[0]), "--prompt", "def ", "-n", "2", "--device", "cpu",
                           "--dtype", "fp16")
    assert code == 0, err
    assert seen == [torch.float16]


def test_sampling_options_reach_the_sampler(capsys, lm_runs):
    """The command's text is what `generate` gives with the options asked for (defaults: temperature 0.8,
    seed 0), so a dropped --temperature, --top-k, --top-p, --seed or --greedy changes it."""
    from attnlab.inference.generate import generate
    from attnlab.inference.runs import load_run

    run = lm_runs[0]
    loaded = load_run(run)
    tok = loaded.tokenizer
    pad = tok.pad_id if tok.pad_id is not None else 0

    def expected(**options):
        new = generate(loaded.model, [tok.encode("def ")], 24, eos_id=tok.eos_id, pad_id=pad, **options)[0]
        return "def " + tok.decode(new, skip_special_tokens=True) + "\n"

    def cli(*extra):
        code, out, err = run_cli(capsys, "generate", str(run), "--prompt", "def ", "-n", "24", "--device", "cpu",
                                 *extra)
        assert code == 0, err
        return out

    assert cli() == expected(temperature=0.8, seed=0)
    assert cli("--temperature", "1.7", "--seed", "5") == expected(temperature=1.7, seed=5)
    assert cli("--top-k", "3", "--seed", "5") == expected(temperature=0.8, top_k=3, seed=5)
    assert cli("--top-p", "0.3", "--seed", "5") == expected(temperature=0.8, top_p=0.3, seed=5)
    assert cli("--greedy") == expected(greedy=True)
    texts = {cli(), cli("--temperature", "1.7", "--seed", "5"), cli("--top-k", "3", "--seed", "5"),
             cli("--top-p", "0.3", "--seed", "5"), cli("--greedy")}
    assert len(texts) == 5  # each option changes the text, so the comparisons above can fail


def test_prompts_at_the_limit_and_empty_prompts(capsys, lm_runs):
    code, out, err = run_cli(capsys, "generate", str(lm_runs[0]), "--prompt", "a" * 32, "-n", "3", "--device", "cpu")
    assert code == 0, err  # exactly the model's 32 positions
    assert "encodes to no tokens" in one_line_error(capsys, "generate", str(lm_runs[0]), "--prompt", "",
                                                    "--device", "cpu")


def test_evaluate_refuses_options_of_other_model_kinds(tmp_path, capsys, lm_runs):
    sample = tmp_path / "sample.txt"
    sample.write_text("def f(x):\n    return x\n", encoding="utf-8")
    common = ["evaluate", str(lm_runs[0]), "--data", str(sample), "--device", "cpu"]
    assert "--target is only for translation models" in one_line_error(capsys, *common, "--target", str(sample))
    assert "are for classifiers" in one_line_error(capsys, *common, "--text-column", "0")


def test_evaluate_human_readable_counts(tmp_path, capsys, lm_runs):
    sample = tmp_path / "sample.txt"
    sample.write_text("def f(x):\n    return x\n", encoding="utf-8")
    code, out, err = run_cli(capsys, "evaluate", str(lm_runs[0]), "--data", str(sample), "--device", "cpu")
    assert code == 0, err
    rows = dict(line.split() for line in out.splitlines())
    assert set(rows) == {"loss", "perplexity", "tokens"} and rows["tokens"] == str(len(sample.read_text()) - 1)


def test_classifier_evaluation_unknown_label_and_long_texts(tmp_path, capsys, cls_run):
    """A label the classifier was not trained on is one line; a text longer than the run's data.max_length is
    scored (cut to it, as in training)."""
    unknown = tmp_path / "unknown.tsv"
    unknown.write_text("sentence\tlabel\ngreat movie\tmeh\n", encoding="utf-8")
    line = one_line_error(capsys, "evaluate", str(cls_run), "--data", str(unknown), "--device", "cpu")
    assert "labels ['meh'] were not in the training data" in line
    long = tmp_path / "long.tsv"
    long.write_text("sentence\tlabel\n" + " ".join(["great movie"] * 20) + "\tpos\nbad\tneg\n", encoding="utf-8")
    code, out, err = run_cli(capsys, "evaluate", str(cls_run), "--data", str(long), "--json", "--device", "cpu")
    assert code == 0, err
    assert json.loads(out)["examples"] == 2


def test_evaluate_scores_a_language_model_as_training_evaluated_it(tmp_path, capsys):
    """`attnlab evaluate` on a run's held-out file gives the trainer's evaluation of it: windows of the model's
    full length (not shorter contexts), perplexity exp(loss)."""
    text, held = tmp_path / "text.txt", tmp_path / "held.txt"
    text.write_text("".join(f"line {i} of the text, in words\n" for i in range(200)), encoding="utf-8")
    held.write_text("".join(f"line {i} of the words, in text\n" for i in range(30)), encoding="utf-8")
    out = tmp_path / "run"
    train_run(load_run_config(None, ["model.preset=gpt-char-tiny", f"data.path={_q(text)}",
                                     f"data.eval_path={_q(held)}", "train.steps=2", "train.eval_every=0",
                                     f"train.out_dir={_q(out)}", *TINY]))
    last = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "eval_loss" in line][-1]
    code, stdout, err = run_cli(capsys, "evaluate", str(out), "--data", str(held), "--json", "--device", "cpu")
    assert code == 0, err
    metrics = json.loads(stdout)
    assert metrics["loss"] == pytest.approx(last["eval_loss"], rel=1e-5)
    assert metrics["perplexity"] == pytest.approx(last["eval_perplexity"], rel=1e-5)
    assert metrics["tokens"] == len(held.read_text()) - 1


def test_evaluate_scores_a_classifier_as_training_evaluated_it(capsys, cls_run):
    """`attnlab evaluate` on the run's own evaluation file gives the trainer's last evaluation: the same
    encoding of the texts ([CLS] prefix, max_length) and the same class numbers in both places."""
    logged = [json.loads(line) for line in (cls_run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in logged if "eval_loss" in r][-1]
    code, out, err = run_cli(capsys, "evaluate", str(cls_run), "--data", str(cls_run.parent / "train.tsv"), "--json",
                             "--device", "cpu")
    assert code == 0, err
    metrics = json.loads(out)
    assert metrics["loss"] == pytest.approx(last["eval_loss"], rel=1e-5)
    assert metrics["accuracy"] == pytest.approx(last["eval_accuracy"]) and metrics["examples"] == 17


def test_translation_beam_size_and_length_reach_the_decoders(capsys, monkeypatch, mt_run):
    import attnlab.inference.generate as gen

    calls = []
    for name in ("beam_search", "greedy_translate"):
        real = getattr(gen, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append((_name, kwargs.get("beam_size"), kwargs.get("max_len")))
            return _real(*args, **kwargs)

        monkeypatch.setattr(gen, name, spy)
    common = ["generate", str(mt_run), "--prompt", "a b c d e", "--device", "cpu"]
    assert run_cli(capsys, *common, "-n", "3", "--beam-size", "2")[0] == 0
    assert run_cli(capsys, *common, "-n", "3")[0] == 0
    assert calls == [("beam_search", 2, 3), ("greedy_translate", None, 3)]
    calls.clear()
    src = mt_run.parent / "src.txt"
    code, _, err = run_cli(capsys, "evaluate", str(mt_run), "--data", str(src), "--target",
                           str(mt_run.parent / "tgt.txt"), "--beam-size", "2", "--device", "cpu")
    assert code == 0, err
    assert calls and all(c[:2] == ("beam_search", 2) for c in calls)


def test_bleu_scores_the_hypotheses_against_their_own_references(capsys, monkeypatch, mt_run):
    """BLEU is sacrebleu's corpus BLEU of the translations (hypotheses) against the references, line by line:
    here the translations are fixed, shorter than their references (a brevity penalty), so swapping the
    two sides or pairing a translation with another line's reference changes the score."""
    import sacrebleu

    import attnlab.inference.generate as gen
    from attnlab.inference.runs import load_run

    tok = load_run(mt_run).tokenizer
    hyps = {"a b c d e": "e d c b", "b c d e a": "a e d c b", "c a e b d": "d b e", "e d b a c": "c a b d e"}

    def fixed(model, src, mask=None, **kwargs):
        return [tok.encode(hyps[tok.decode(row.tolist(), skip_special_tokens=True)]) for row in src]

    monkeypatch.setattr(gen, "greedy_translate", fixed)
    code, out, err = run_cli(capsys, "evaluate", str(mt_run), "--data", str(mt_run.parent / "src.txt"), "--target",
                             str(mt_run.parent / "tgt.txt"), "--json", "--device", "cpu")
    assert code == 0, err
    refs = list(TRANSLATION.values())
    want = sacrebleu.corpus_bleu(list(hyps.values()), [refs]).score
    assert 0 < want < 100
    assert json.loads(out)["bleu"] == pytest.approx(want)


def test_bleu_reads_the_references_as_a_wordpiece_tokenizer_decodes_them(tmp_path, capsys, monkeypatch):
    """WordPiece decoding spaces punctuation inside words ("the man ' s t - shirt"): translations whose tokens
    were exactly their references' scored BLEU ~10 against the references as written (found by the stop-32
    families audit). The references are now read as the tokenizer decodes them, and a warning says so."""
    import attnlab.inference.generate as gen
    from attnlab.inference.runs import load_run

    pairs = {"ein mann im t-shirt": "a man in a t-shirt", "die frau des mannes": "the man's wife",
             "ein gut-gelaunter hund": "a good-humored dog", "zwei well-known leute": "two well-known people"}
    (tmp_path / "src.txt").write_text("\n".join(pairs) + "\n")
    (tmp_path / "tgt.txt").write_text("\n".join(pairs.values()) + "\n")
    run = tmp_path / "run"
    train_run(load_run_config(None, [
        "model.family=seq2seq", "model.d_model=16", "model.d_ff=16", "model.n_heads=2", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "data.task=translation", "data.tokenizer=wordpiece", "data.vocab_size=200",
        f"data.src_path={_q(tmp_path / 'src.txt')}", f"data.tgt_path={_q(tmp_path / 'tgt.txt')}",
        "data.max_length=16", "train.steps=1", "train.batch_size=4", "train.eval_every=0",
        f"train.out_dir={_q(run)}", *TINY]))
    tok = load_run(run).tokenizer
    assert tok.decode(tok.encode("the man's wife")) == "the man ' s wife"

    def exact(model, src, mask=None, **kwargs):  # every translation: its reference's tokens
        return [tok.encode(pairs[tok.decode(row.tolist(), skip_special_tokens=True).replace(" - ", "-")])
                for row in src]

    monkeypatch.setattr(gen, "greedy_translate", exact)
    with pytest.warns(UserWarning, match="references as the wordpiece tokenizer decodes them: 4 of 4 lines"):
        code, out, err = run_cli(capsys, "evaluate", str(run), "--data", str(tmp_path / "src.txt"), "--target",
                                 str(tmp_path / "tgt.txt"), "--json", "--device", "cpu")
    assert code == 0, err
    assert json.loads(out)["bleu"] == pytest.approx(100.0)


def test_an_encoder_language_model_generates_and_evaluates(tmp_path, capsys):
    path = tmp_path / "text.txt"
    path.write_text("".join(f"line {i} of the text\n" for i in range(100)), encoding="utf-8")
    out = tmp_path / "enc"
    train_run(load_run_config(None, ["model.family=encoder", "model.head=lm", "model.d_model=16", "model.n_heads=2",
                                     "model.d_ff=16", "model.n_layers=1", f"data.path={_q(path)}",
                                     "data.block_size=16", "train.steps=1", f"train.out_dir={_q(out)}", *TINY]))
    code, stdout, err = run_cli(capsys, "evaluate", str(out), "--data", str(path), "--json", "--device", "cpu")
    assert code == 0, err
    assert set(json.loads(stdout)) == {"loss", "perplexity", "tokens"}
    code, stdout, err = run_cli(capsys, "generate", str(out), "--prompt", "line ", "-n", "4", "--device", "cpu")
    assert code == 0, err
    assert stdout.startswith("line ")


def test_an_os_error_is_one_line_exit_2(capsys, monkeypatch, lm_runs):
    import attnlab.inference.runs as runs

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "/some/file")

    monkeypatch.setattr(runs, "load_run", refused)
    line = one_line_error(capsys, "generate", str(lm_runs[0]), "--prompt", "x")
    assert line == "attnlab: error: Permission denied: /some/file; check the path and its permissions"


def test_ctrl_c_during_training_exits_130_and_the_run_resumes(tmp_path, capsys, monkeypatch):
    """Ctrl-C in the middle of `attnlab train`: exit code 130, one line that is not an error (it says how to
    resume), and --resume continues from the saved step."""
    from attnlab.data.sources import CausalLMSource

    real = CausalLMSource.batch

    def interrupted(self, step):
        if step == 1:
            raise KeyboardInterrupt
        return real(self, step)

    monkeypatch.setattr(CausalLMSource, "batch", interrupted)
    args = _sets(["model.preset=gpt-char-tiny", "train.steps=3", "train.eval_every=0",
                  f"train.out_dir={_q(tmp_path / 'run')}", *TINY])
    code, _, err = run_cli(capsys, "train", *args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 130 and len(lines) == 1 and lines[0].startswith("attnlab: ") and "error" not in lines[0], err
    monkeypatch.setattr(CausalLMSource, "batch", real)
    code, stdout, err = run_cli(capsys, "train", "--resume", *args)
    assert code == 0 and "start_step=1" in stdout, err


# ---- the knowledge experiment ------------------------------------------------------------------------------

KTINY = {"n_layers": 1, "n_heads": 2, "d_model": 32, "block_size": 64, "pretrain_epochs": 1, "pretrain_batch": 8,
         "finetune_batch": 8, "finetune_epochs_scratch": 1, "finetune_epochs_pretrained": 1, "precision": "fp32"}
NAMES = ["Ada Varn", "Bo Tesk", "Cy Mordo", "Di Lansk", "Ed Pirro", "Fa Quell", "Gus Orme", "Hal Ytte"]
BORN = ["Lyon", "Lyon", "Lyon", "Oslo", "Porto", "Quito", "Lyon", "Accra"]  # Lyon: the most common training answer


def _knowledge_files(tmp_path):
    (tmp_path / "wiki.txt").write_text("".join(f"{n}. {n} was born in {b} .\n" for n, b in zip(NAMES, BORN)),
                                       encoding="utf-8")
    qa = [f"Where was {n} born?\t{b}\n" for n, b in zip(NAMES, BORN)]
    (tmp_path / "train.tsv").write_text("".join(qa[:5]), encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("".join(qa[5:]), encoding="utf-8")
    (tmp_path / "predict.tsv").write_text(
        "Where was Hal Ytte born?\n\nWhere was Ada Varn born?\nWhere was Fa Quell born?\n", encoding="utf-8")
    return dict(corpus=str(tmp_path / "wiki.txt"), train=str(tmp_path / "train.tsv"),
                eval_path=str(tmp_path / "dev.tsv"))


def test_knowledge_outputs_pair_each_question_with_its_answer(tmp_path, monkeypatch):
    """With the model's answers fixed (right for the fine-tuning questions and for Gus Orme, wrong for the
    others), the prediction files, accuracies, correct column and baselines are exactly determined; the
    answers are asked of the fine-tuned weights."""
    import attnlab.experiments.knowledge as knowledge
    from attnlab.training.checkpoint import load_model

    truth = {f"Where was {n} born?": b for n, b in zip(NAMES, BORN)}
    right = {f"Where was {n} born?" for n in NAMES[:5] + ["Gus Orme"]}
    asked = []

    def answers(model, vocab, questions, **kwargs):
        asked.append({k: v.clone() for k, v in model.state_dict().items()})
        return [truth[q] if q in right else f"not {truth[q]}" for q in questions]

    monkeypatch.setattr(knowledge, "answer_questions", answers)
    out = tmp_path / "out"
    lines = []
    summary = knowledge.run_knowledge(out, variants="dot", **_knowledge_files(tmp_path),
                                      predict=str(tmp_path / "predict.tsv"), device="cpu", overrides=KTINY,
                                      progress=False, echo=lines.append)
    row = summary["variants"][0]
    assert row["accuracy"] == pytest.approx(100 / 3) and row["correct"] == 1 and row["train_accuracy"] == 100.0
    assert summary["baselines"]["most_common_answer"] == "Lyon"
    assert summary["baselines"]["most_common"] == pytest.approx(100 / 3) and summary["baselines"]["london"] == 0.0
    table = (out / "results.md").read_text(encoding="utf-8")
    assert '| always "London" | 0.0 |' in table and '| always "Lyon" (most common training answer) | 33.3 |' in table
    assert (out / "predictions" / "dot.tsv").read_text(encoding="utf-8").splitlines()[1:] == [
        "1\tWhere was Fa Quell born?\tnot Quito\tQuito\t0", "2\tWhere was Gus Orme born?\tLyon\tLyon\t1",
        "3\tWhere was Hal Ytte born?\tnot Accra\tAccra\t0"]
    # Each row names its question's line in the input file: a blank line there has no row.
    assert (out / "predictions" / "dot.predict.tsv").read_text(encoding="utf-8").splitlines() == [
        "line\tquestion\tprediction", "1\tWhere was Hal Ytte born?\tnot Accra", "3\tWhere was Ada Varn born?\tLyon",
        "4\tWhere was Fa Quell born?\tnot Quito"]
    tuned = load_model(out / "finetune-dot").state_dict()
    assert all(torch.equal(state[k], tuned[k]) for state in asked for k in tuned)
    # The parameter count stated is the model's own, in the log line and in the table.
    count = sum(p.numel() for p in load_model(out / "finetune-dot").parameters())
    assert row["parameters"] == count and any(f": {count:,} parameters" in line for line in lines)
    assert f"| {count:,} |" in table
    # Resumed: finished phases are loaded (the same weights answer), not retrained.
    asked.clear()
    again = knowledge.run_knowledge(out, variants="dot", **_knowledge_files(tmp_path), device="cpu",
                                    overrides=KTINY, progress=False, resume=True, echo=lambda *_: None)
    assert again["variants"][0]["finetune"].get("skipped") and again["variants"][0]["pretrain"].get("skipped")
    assert asked and all(torch.equal(state[k], tuned[k]) for state in asked for k in tuned)


@pytest.mark.filterwarnings("ignore:resuming with changed settings")
def test_knowledge_resume_continues_an_unfinished_phase(tmp_path, monkeypatch):
    """A phase interrupted short of its steps is not 'already done': --resume trains it on from its checkpoint
    (the log keeps the first run's records) and ends where an uninterrupted run ends."""
    from attnlab.data.knowledge import QASource
    from attnlab.experiments.knowledge import run_knowledge
    from attnlab.training.checkpoint import read_trainer_state
    from attnlab.training.trainer import TrainingInterrupted

    files = _knowledge_files(tmp_path)
    overrides = {**KTINY, "finetune_epochs_scratch": 8}
    whole = run_knowledge(tmp_path / "whole", variants="none", **files, device="cpu", overrides=overrides,
                          progress=False, echo=lambda *_: None)
    assert whole["variants"][0]["finetune"]["steps"] == 5  # ceil(8 epochs × 5 questions / batch 8)

    batch = QASource.batch
    pressed = []

    def ctrl_c_once(self, step):
        if step == 3 and not pressed:
            pressed.append(step)
            raise KeyboardInterrupt
        return batch(self, step)

    out = tmp_path / "out"
    monkeypatch.setattr(QASource, "batch", ctrl_c_once)
    with pytest.raises(TrainingInterrupted):
        run_knowledge(out, variants="none", **files, device="cpu", overrides=overrides, progress=False,
                      echo=lambda *_: None)
    steps = int(read_trainer_state(out / "finetune-none").get("step"))
    assert 0 < steps < 5
    log = (out / "finetune-none" / "metrics.jsonl").read_text().splitlines()
    again = run_knowledge(out, variants="none", **files, device="cpu", overrides=overrides, progress=False,
                          resume=True, echo=lambda *_: None)
    record = again["variants"][0]["finetune"]
    assert record["skipped"] is False and record["steps"] == 5  # the key is always there (stop-40 audit)
    assert int(read_trainer_state(out / "finetune-none").get("step")) == 5
    assert record["final_train_loss"] == whole["variants"][0]["finetune"]["final_train_loss"]
    assert again["variants"][0]["accuracy"] == whole["variants"][0]["accuracy"]
    resumed_log = (out / "finetune-none" / "metrics.jsonl").read_text().splitlines()
    kept = [r for r in log if json.loads(r).get("step", 0) <= steps]
    assert kept and resumed_log[: len(kept)] == kept


def test_knowledge_files_evaluated_or_answered_do_not_change_the_model(tmp_path):
    """The vocabulary is the corpus's and the fine-tuning pairs' characters: a --predict question (or an
    evaluation answer) with a character of its own neither changes the model nor breaks the run; the question
    the model cannot read is answered with nothing, said once."""
    import warnings

    from attnlab.experiments.knowledge import run_knowledge

    files = _knowledge_files(tmp_path)
    plain = run_knowledge(tmp_path / "a", variants="dot", **files, device="cpu", overrides=KTINY, progress=False,
                          echo=lambda *_: None)
    (tmp_path / "odd.tsv").write_text("Where was Hal Ytte born?\nWhere was Zoë Kim born?\n", encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # two rows, one warning: it had been given again by each row (stop-40 knowledge audit)
        odd = run_knowledge(tmp_path / "b", variants="none,dot", **files, predict=str(tmp_path / "odd.tsv"),
                            device="cpu", overrides=KTINY, progress=False, echo=lambda *_: None)
    assert odd["data"]["vocab_size"] == plain["data"]["vocab_size"]
    assert odd["variants"][1]["finetune"]["final_train_loss"] == plain["variants"][0]["finetune"]["final_train_loss"]
    assert [str(w.message) for w in caught if "cannot read" in str(w.message)] == [
        "1 of 2 questions of --predict hold characters that neither the corpus nor the fine-tuning pairs have (the "
        "first: 'Where was Zoë Kim born?', with 'Z' U+005A); the model cannot read them, and their answers are left "
        "empty"]
    rows = (tmp_path / "b" / "predictions" / "dot.predict.tsv").read_text(encoding="utf-8").splitlines()
    assert rows[2] == "2\tWhere was Zoë Kim born?\t"
    assert (tmp_path / "b" / "predictions" / "dot.tsv").read_text() == (tmp_path / "a" / "predictions" /
                                                                         "dot.tsv").read_text()


def test_knowledge_answers_have_the_rest_of_the_block(tmp_path, monkeypatch):
    """Every question, of the evaluation, the fine-tuning pairs and --predict, may be answered up to the end of the
    block. The room had been max(64, the longest gold answer): a longer answer stopped at the gold one's length and
    its prefix was scored right, and --predict's answers were cut at 64 characters (stop-40 knowledge audit)."""
    import attnlab.inference.generate as gen
    from attnlab.data.knowledge import qa_prompt
    from attnlab.experiments.knowledge import run_knowledge

    files = _knowledge_files(tmp_path)
    rooms: dict[int, int] = {}  # prompt length -> the most room it was given

    def never_ending(model, prompts, room, **kw):  # an answer that never ends: it is given all the room there is
        for p in prompts:
            rooms[len(p)] = max(rooms.get(len(p), 0), room)
        return [[] for _ in prompts]

    monkeypatch.setattr(gen, "generate", never_ending)
    run_knowledge(tmp_path / "out", variants="none", **files, predict=str(tmp_path / "predict.tsv"), device="cpu",
                  overrides={**KTINY, "block_size": 128}, progress=False, echo=lambda *_: None)
    asked = {len(qa_prompt(f"Where was {n} born?")) for n in NAMES}
    assert rooms == {n: 128 - n for n in asked}


def test_a_question_to_answer_must_leave_room_for_an_answer(tmp_path):
    """A --predict question of block_size - 1 characters fits `question ⁇` in the block but leaves no room for an
    answer: refused when the file is read, before any training."""
    from attnlab.errors import DataError
    from attnlab.experiments.knowledge import run_knowledge

    (tmp_path / "long.tsv").write_text("Where was Hal Ytte born?\n" + "W" * 62 + "?\n", encoding="utf-8")
    with pytest.raises(DataError, match="long.tsv line 2: the question takes 64 characters with its ⁇ mark, leaving "
                                        "no room for an answer in block_size = 64"):
        run_knowledge(tmp_path / "out", variants="dot", **_knowledge_files(tmp_path),
                      predict=str(tmp_path / "long.tsv"), device="cpu", overrides=KTINY, progress=False,
                      echo=lambda *_: None)
    assert not (tmp_path / "out" / "pretrain-dot").exists()


def test_knowledge_rows_do_not_depend_on_the_rows_before_them(tmp_path):
    from attnlab.experiments.knowledge import run_knowledge

    files = _knowledge_files(tmp_path)
    alone = run_knowledge(tmp_path / "a", variants="dot", **files, seed=1, device="cpu", overrides=KTINY,
                          progress=False, echo=lambda *_: None)
    after = run_knowledge(tmp_path / "b", variants="none,dot", **files, seed=1, device="cpu", overrides=KTINY,
                          progress=False, echo=lambda *_: None)
    assert alone["variants"][0]["finetune"]["final_train_loss"] == after["variants"][1]["finetune"]["final_train_loss"]


def test_knowledge_seed_and_written_split(tmp_path, capsys):
    """--seed picks the synthetic world and split; data/train.tsv and data/dev.tsv are the pairs fine-tuned and
    evaluated on."""
    from attnlab.data.knowledge import read_qa_lines

    small = {**KTINY, "n_people": 12, "pretrain_epochs": 1}
    for seed in (0, 3):
        args = ["run", "knowledge", "--out", str(tmp_path / str(seed)), "--variants", "none", "--device", "cpu",
                "--quiet", "--seed", str(seed)]
        for key, value in small.items():
            args += ["--set", f"{key}={json.dumps(value)}"]
        code, _, err = run_cli(capsys, *args)
        assert code == 0, err
        assert json.loads((tmp_path / str(seed) / "results.json").read_text())["data"]["seed"] == seed
    assert (tmp_path / "0" / "data" / "corpus.txt").read_text() != (tmp_path / "3" / "data" / "corpus.txt").read_text()
    out = tmp_path / "3"
    dev = [[str(n), q] for n, q, _ in read_qa_lines(out / "data" / "dev.tsv")]
    predicted = (out / "predictions" / "none.tsv").read_text(encoding="utf-8").splitlines()[1:]
    assert [line.split("\t")[:2] for line in predicted] == dev


def test_variant_names_with_spaces_and_the_scratch_alias():
    from attnlab.experiments.knowledge import parse_variants

    assert [v.name for v in parse_variants("none, dot ,rotary")] == ["none", "dot", "rotary"]
    assert parse_variants("scratch")[0].name == "none" and not parse_variants("scratch")[0].pretrain


# ---- the synthetic world -----------------------------------------------------------------------------------


def test_world_names_are_unique_and_never_place_words_and_birthplaces_follow_zipf():
    from attnlab.data.world import make_world

    world = make_world(3000, seed=2)  # a seed whose draws include names made of place words (rejected)
    names = [p.name for p in world.people]
    assert len(set(names)) == len(names)
    place_words = {w.lower() for p in world.places for w in p.split()}
    assert not any(part.lower() in place_words for name in names for part in name.split())
    top = collections.Counter(p.birthplace for p in world.people).most_common(1)[0][1] / 3000
    assert 0.015 < top < 0.05  # the top town ≈ 2.7 %, far above a uniform draw's 0.25 %
    assert {p.pronoun for p in world.people} == {"she", "he"} and len({p.birth_year for p in world.people}) > 100
    assert any(" an engineer " in p.biography for p in world.people)
    for p in world.people:  # "{Pron} lives in": the person's own pronoun, capitalised
        if p.template == 3:
            assert f" . {p.pronoun.capitalize()} lives in " in p.biography


# ---- small bugs the audit found ----------------------------------------------------------------------------


def test_set_values_are_read_without_surrounding_spaces():
    run = load_run_config(None, ["model.preset=gpt-char-tiny", "model.position= rotary ", "train.steps = 7"])
    assert run.model["position"] == "rotary" and run.train.steps == 7


def test_a_text_of_exactly_one_window_trains_and_scores(tmp_path, capsys):
    """block_size + 1 tokens make one window (inputs and shifted targets): enough to train on, and a held-out
    file of that length is scored, not dropped."""
    text = tmp_path / "one.txt"
    text.write_text("a" * 32 + "\n", encoding="utf-8")  # 33 characters: gpt-char-tiny's block is 32
    run = load_run_config(None, ["model.preset=gpt-char-tiny", f"data.path={_q(text)}", f"data.eval_path={_q(text)}",
                                 "train.steps=1", "train.batch_size=2", f"train.out_dir={_q(tmp_path / 'run')}", *TINY])
    prep = prepare(run)
    assert prep.info["train_tokens"] == 33 and prep.eval_source is not None
    assert train_run(run)["steps"] == 1


def test_evaluate_json_counts_are_integers(tmp_path, capsys, lm_runs):
    sample = tmp_path / "sample.txt"
    sample.write_text("def f(x):\n    return x\n", encoding="utf-8")
    code, out, err = run_cli(capsys, "evaluate", str(lm_runs[0]), "--data", str(sample), "--json", "--device", "cpu")
    assert code == 0, err
    metrics = json.loads(out)
    assert metrics["tokens"] == len(sample.read_text()) - 1 and isinstance(metrics["tokens"], int)


@pytest.mark.parametrize("beam_size", [1, 2])
def test_translating_several_prompts_gives_each_its_translation_alone(mt_run, monkeypatch, beam_size):
    """`generate` translates its prompts in padded, masked batches (here of 2, so the last batch is short):
    each prompt, whatever its length and its neighbours', gets the tokens it gets alone."""
    import attnlab.inference.runs as runs

    run = runs.load_run(mt_run)
    torch.manual_seed(1)
    with torch.no_grad():  # weights far from a 2-step run's, so that the prompts translate differently
        for p in run.model.parameters():
            if p.dim() > 1:
                p.normal_(0, 1.0)
    prompts = ["a", "a b c d e", "e d", "c a e b d b", "b"]
    alone = [runs.generate_texts(run, [p], max_new_tokens=6, beam_size=beam_size)[0] for p in prompts]
    monkeypatch.setattr(runs, "_TRANSLATE_BATCH", 2)
    assert runs.generate_texts(run, prompts, max_new_tokens=6, beam_size=beam_size) == alone
    assert len(set(alone)) > 1  # the prompts do not all translate alike, so a mix-up of rows would show


def test_resuming_with_changed_data_settings_warns(tmp_path):
    """A resumed run with another data.block_size (other batches) or data.tokenizer (the checkpoint's tokenizer
    is kept) went on without a word, and run.json recorded the new settings."""
    text = tmp_path / "text.txt"
    text.write_text("".join(f"line {i} of the text\n" for i in range(60)), encoding="utf-8")
    common = [f"data.path={_q(text)}", "model.d_model=16", "model.n_heads=2", "model.n_layers=1",
              f"train.out_dir={_q(tmp_path / 'run')}", "train.batch_size=4", *TINY,
              "train.warmup_steps=1", "train.decay_steps=5"]  # one schedule for runs of 2 to 5 steps: no other warning
    train_run(load_run_config(None, [*common, "data.block_size=16", "train.steps=2"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same data settings: no warning
        train_run(load_run_config(None, [*common, "data.block_size=16", "train.steps=3"]), resume=True)
    with pytest.warns(UserWarning) as caught:
        train_run(load_run_config(None, [*common, "data.block_size=8", "data.tokenizer=word", "train.steps=4"]),
                  resume=True)
    said = [str(w.message) for w in caught]
    assert any("changed data settings (data.block_size)" in m for m in said), said
    assert any("keeps the checkpoint's tokenizer: data.tokenizer changed" in m for m in said), said
    assert not any("data files that changed" in m for m in said), said
    # The same path, other contents (a corpus regenerated in place): said, though no setting changed.
    text.write_text("".join(f"the text of line {i}\n" for i in range(60)), encoding="utf-8")
    with pytest.warns(UserWarning, match=r"data files that changed since the checkpoint \(data.path: the same path"):
        train_run(load_run_config(None, [*common, "data.block_size=8", "data.tokenizer=word", "train.steps=5"]),
                  resume=True)
    # Another path, the same contents (the project moved): nothing changed for the run, nothing said (stop-41 audit)
    moved = tmp_path / "moved.txt"
    moved.write_bytes(text.read_bytes())
    common[0] = f"data.path={_q(moved)}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_run(load_run_config(None, [*common, "data.block_size=8", "data.tokenizer=word", "train.steps=6"]),
                  resume=True)
    said = [str(w.message) for w in caught]
    assert not any("data" in m for m in said), said


def test_progress_bar_shows_count_and_eta_on_a_terminal_only(monkeypatch):
    import io

    from attnlab.training.logging import progress_bar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr("sys.stderr", stream)
        assert list(progress_bar(iter(range(5)), 5, "evaluate")) == list(range(5))
        assert ("evaluate" in stream.getvalue() and "/5 [" in stream.getvalue()) is shown  # the total: an ETA


def test_training_progress_is_a_bar_on_a_terminal_and_plain_lines_elsewhere(monkeypatch):
    """A log file or pipe got the bar's redrawn frames, carriage returns and all (37 for a 300-step run); it now
    gets a plain line at most every LINE_EVERY_S seconds and at the end, with the loss, lr, tokens/s and ETA."""
    import io
    import sys

    from attnlab.training.logging import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, bar in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr("sys.stderr", stream)
        monkeypatch.setattr(Progress, "LINE_EVERY_S", 0.0 if not bar else Progress.LINE_EVERY_S)
        progress = Progress(4, 0, enabled=True)
        for _ in range(4):
            progress.update()
            progress.show(loss=2.5, lr=1e-3, tok_s=1234.0)
        progress.close()
        text = stream.getvalue()
        assert ("\r" in text) is bar
        if not bar:
            lines = text.splitlines()
            assert lines[0].startswith("train: step 1/4  loss=2.5  lr=0.001  tok_s=1234  ETA ")
            assert lines[-1] == "train: step 4/4  loss=2.5  lr=0.001  tok_s=1234"
    monkeypatch.setattr("sys.stderr", io.StringIO())
    quiet = Progress(4, 0, enabled=False)
    quiet.update()
    quiet.show(loss=1.0)
    assert sys.stderr.getvalue() == ""


def test_evaluate_shows_progress_over_every_batch(tmp_path, capsys, monkeypatch, lm_runs, cls_run, mt_run):
    """`attnlab evaluate` reports progress (with an ETA, so the bar is told how many batches there are) over
    each pass: the total it announces is the number of batches that pass yields."""
    import attnlab.inference.runs as runs

    passes = []

    def spy(iterable, total, desc):
        passes.append([desc, total, 0])
        for item in iterable:
            passes[-1][2] += 1
            yield item

    monkeypatch.setattr(runs, "progress_bar", spy)
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 40, encoding="utf-8")
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("".join(s + "\n" for s in TRANSLATION) * 5, encoding="utf-8")
    tgt.write_text("".join(t + "\n" for t in TRANSLATION.values()) * 5, encoding="utf-8")
    for argv in ([str(lm_runs[0]), "--data", str(text)],
                 [str(cls_run), "--data", str(cls_run.parent / "train.tsv")],
                 [str(mt_run), "--data", str(src), "--target", str(tgt)]):
        passes.clear()
        code, _, err = run_cli(capsys, "evaluate", *argv, "--batch-size", "3", "--device", "cpu")
        assert code == 0, err
        assert passes and all(total == seen > 1 for _, total, seen in passes), passes
    assert [desc for desc, _, _ in passes] == ["evaluate", "translate"]


def test_evaluate_in_bf16_autocast_when_asked(tmp_path, capsys, lm_runs, mt_run):
    """`--precision bf16` scores under bf16 autocast (as training evaluates a bf16 run): close to the exact fp32
    figures, not equal to them; fp32 stays the default."""
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 20, encoding="utf-8")
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("".join(s + "\n" for s in TRANSLATION), encoding="utf-8")
    tgt.write_text("".join(t + "\n" for t in TRANSLATION.values()), encoding="utf-8")
    for argv in ([str(lm_runs[0]), "--data", str(text)], [str(mt_run), "--data", str(src), "--target", str(tgt)]):
        scores = {}
        for precision in (None, "fp32", "bf16"):
            extra = [] if precision is None else ["--precision", precision]
            code, out, err = run_cli(capsys, "evaluate", *argv, "--json", "--device", "cpu", *extra)
            assert code == 0, err
            scores[precision] = json.loads(out)["loss"]
        assert scores[None] == scores["fp32"] != scores["bf16"]
        assert scores["bf16"] == pytest.approx(scores["fp32"], rel=2e-2)
    line = one_line_error(capsys, "evaluate", str(lm_runs[0]), "--data", str(text), "--precision", "fp8")
    assert "unknown value 'fp8'" in line and "auto, bf16, fp32" in line


def test_knowledge_warns_when_evaluation_questions_repeat_fine_tuning_ones(tmp_path):
    """With the user's files, an evaluation question that is also a fine-tuning question measures what
    fine-tuning taught, not knowledge access: said once, naming its lines."""
    from attnlab.experiments.knowledge import SCALES, load_data

    files = _knowledge_files(tmp_path)
    qa = (tmp_path / "train.tsv").read_text(encoding="utf-8").splitlines()
    (tmp_path / "dev.tsv").write_text("\n".join([qa[1], "Where was Hal Ytte born?\tAccra", "", qa[3]]) + "\n",
                                      encoding="utf-8")
    with pytest.warns(UserWarning, match=r"2 of the 3 questions of .*dev.tsv \(lines 1, 4\) are also fine-tuning"):
        data = load_data(tmp_path / "out", SCALES["quick"], corpus=files["corpus"], train=files["train"],
                         eval_path=files["eval_path"], predict=None, seed=0)
    assert data.dev_lines == [1, 2, 4]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _knowledge_files(tmp_path)
        load_data(tmp_path / "out", SCALES["quick"], corpus=files["corpus"], train=files["train"],
                  eval_path=files["eval_path"], predict=None, seed=0)


def test_a_folder_given_as_classification_data_is_named_as_a_folder(tmp_path, capsys, cls_run):
    # It was blamed on its extension ("name it .tsv, .csv or .jsonl"), which renaming would not fix (stop-44 data
    # audit).
    folder = tmp_path / "SST-2"
    folder.mkdir()
    expected = f"attnlab: error: data file '{folder}' is a directory; pass a file inside it"
    assert one_line_error(capsys, "evaluate", str(cls_run), "--data", str(folder)) == expected
    assert one_line_error(capsys, "train", "configs/encoder-classify.toml", "--set", f"data.path={_q(folder)}",
                          "--set", 'data.eval_path=""', "--set", f"train.out_dir={_q(tmp_path / 'run')}") == expected


def test_json_labels_and_texts_are_read_exactly_and_named_in_json(tmp_path):
    from attnlab.data.text_files import read_classification_file
    from attnlab.errors import DataError

    def read(*lines: str):
        path = tmp_path / "x.jsonl"
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return read_classification_file(path)

    # As floats the two were one class, 9007199254740992 (stop-44 data audit).
    assert read('{"text": "a", "label": 9007199254740993.0}', '{"text": "b", "label": 9007199254740992}',
                '{"text": "c", "label": 2e0}').labels == ["9007199254740993", "9007199254740992", "2"]
    for value, shown in (("null", "null"), ("true", "true")):
        with pytest.raises(DataError, match=f"line 1: label {shown} is not a string or integer; fix the line$"):
            read(f'{{"text": "a", "label": {value}}}')
    for value in ("NaN", "1.5", "Infinity"):
        with pytest.raises(DataError, match=f"line 1: label {value} is not an integer; fix the line$"):
            read(f'{{"text": "a", "label": {value}}}')
    # Read exactly, a number's exponent was taken at its word: 1e5000 failed in int() with a traceback, 1e99999999
    # ran for minutes, and one beyond Decimal's exponents failed the line in any field (review of stop 44).
    for value in ("1e5000", "-1E+4300", "1e99999999", "1e999999999999999999"):
        with pytest.raises(DataError, match=r"line 1: label .* is a number of more than 4,300 digits; fix the line$"):
            read(f'{{"text": "a", "label": {value}}}')
    assert read('{"text": "a", "label": 0, "score": 1e9999999999999999999}').labels == ["0"]
    for value, shown in (("[0.5, 1]", r"\[0.5, 1\]"), ('{"score": 0.9}', '{"score": 0.9}')):
        with pytest.raises(DataError, match=f"line 1: label {shown} is not a string or integer; fix the line$"):
            read(f'{{"text": "a", "label": {value}}}')
    # Half of an emoji's UTF-16 pair: valid JSON, no character; it was refused later as "text 0" with a fix about
    # errors='surrogateescape' that attnlab's own reading had not used.
    with pytest.raises(DataError, match=r"^data file '.*x\.jsonl' line 2: the text holds '\\ud83d' at character 14, "
                                        r"half of a UTF-16 surrogate pair"):
        read('{"text": "fine", "label": 1}', '{"text": "broken emoji \\ud83d", "label": 0}')
