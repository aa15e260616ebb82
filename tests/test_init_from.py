"""Pretrain, then fine-tune from the command line: `model.init_from` starts a run from another run's weights
and tokenizer. The body is copied exactly, a head of another kind starts fresh, the same head is kept
(continued training), and what cannot fit is refused with one line."""

from __future__ import annotations

import json

import pytest
import torch
from cli_helpers import one_line_error, run_cli
from cli_helpers import toml_str as _q

from attnlab.data.tokenizers import load_tokenizer
from attnlab.errors import CheckpointError, ConfigError
from attnlab.training.checkpoint import find_checkpoint, load_model
from attnlab.training.recipe import load_run_config, prepare, train_run

TINY = ["train.progress=false", "train.precision=fp32", "train.device=cpu", "train.steps=2", "train.batch_size=4"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("init_from")
    docs = "\n\n".join("\n".join(f"the {w} line of story {d} is {'good' if d % 2 else 'bad'}"
                                 for w in ("first", "second", "third")) for d in range(8)) + "\n"
    (root / "docs.txt").write_text(docs, encoding="utf-8")
    rows = ["text\tlabel"] + [f"story {d} is {'good' if d % 2 else 'bad'}\t{'pos' if d % 2 else 'neg'}"
                              for d in range(16)]
    (root / "cls.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


def _pretrain(files, name: str, *sets: str):
    """A 2-step run of a tiny model of family `name` on the documents, in files/name."""
    train_run(load_run_config(None, [
        f"model.family={name}", "model.d_model=16", "model.n_layers=1", "model.n_heads=2", "model.d_ff=32",
        "data.tokenizer=word", f"data.path={_q(files / 'docs.txt')}", f"train.out_dir={_q(files / name)}",
        *sets, *TINY]))
    return files / name


@pytest.fixture(scope="module")
def bert_run(files):
    return _pretrain(files, "bert", "data.task=mlm", "data.max_length=24", "data.val_fraction=0")


@pytest.fixture(scope="module")
def encoder_run(files):
    return _pretrain(files, "encoder", "model.head=lm", "data.block_size=8")


def _classify(files, init_from, *extra: str):
    return load_run_config(None, [
        f"model.init_from={_q(init_from)}", "data.task=classification", f"data.path={_q(files / 'cls.tsv')}",
        f"data.eval_path={_q(files / 'cls.tsv')}", "data.max_length=16",
        f"train.out_dir={_q(files / 'cls')}", *TINY, *extra])


@pytest.mark.parametrize("kind", ["bert", "encoder"])
def test_fine_tuning_copies_the_body_and_starts_a_new_head(files, bert_run, encoder_run, kind):
    source = bert_run if kind == "bert" else encoder_run
    pretrained = load_model(source)
    prep = prepare(_classify(files, source))
    model = prep.model
    head = ("classifier.",) if kind == "bert" else ("head.",)
    saved, ours = pretrained.state_dict(), model.state_dict()
    body = [k for k in ours if not k.startswith(head)]
    assert body and all(torch.equal(ours[k], saved[k]) for k in body)  # pooler included for BERT
    assert ours[f"{head[0]}{'weight' if kind == 'bert' else 'proj.weight'}"].shape[0] == 2  # two classes
    assert model.config.d_model == 16 and model.config.n_layers == 1  # the architecture of the checkpoint
    if kind == "encoder":  # trained under the causal mask of its LM head, it keeps that mask
        assert model.config.is_causal
    assert prep.tokenizer.vocab() == load_tokenizer(find_checkpoint(source)).vocab()  # the weights' vocabulary


def test_the_same_head_is_kept_for_continued_training(files, bert_run):
    prep = prepare(load_run_config(None, [
        f"model.init_from={_q(bert_run)}", "data.task=mlm", f"data.path={_q(files / 'docs.txt')}",
        "data.max_length=24", "data.val_fraction=0", f"train.out_dir={_q(files / 'again')}", *TINY]))
    saved = load_model(bert_run).state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in prep.model.state_dict().items())


def test_command_line_pretrain_then_fine_tune(files, bert_run, capsys):
    out = files / "cli-cls"
    args = ["train", "--set", f"model.init_from={_q(bert_run)}", "--set", "data.task=classification",
            "--set", f"data.path={_q(files / 'cls.tsv')}", "--set", f"data.eval_path={_q(files / 'cls.tsv')}",
            "--set", "data.max_length=16", "--set", f"train.out_dir={_q(out)}"]
    for item in TINY:
        args += ["--set", item]
    code, stdout, err = run_cli(capsys, *args)
    assert code == 0, err
    code, stdout, err = run_cli(capsys, "evaluate", str(out), "--data", str(files / "cls.tsv"), "--json",
                                "--device", "cpu")
    assert code == 0, err
    assert json.loads(stdout)["examples"] == 16


def test_what_cannot_fit_is_refused(files, bert_run, encoder_run):
    with pytest.raises(ConfigError, match="model.d_model = 32, but the model in model.init_from was trained with"):
        prepare(_classify(files, bert_run, "model.d_model=32"))  # another width
    with pytest.raises(ConfigError, match="model.max_len = 40, .*its 24 positions are weights"):  # a longer table
        prepare(_classify(files, bert_run, "model.max_len=40", "data.max_length=40"))
    with pytest.raises(ConfigError, match="init_from and model.preset"):
        _classify(files, bert_run, "model.preset=bert-tiny")
    with pytest.raises(ConfigError, match="holds a 'bert' model, not 'encoder'"):
        _classify(files, bert_run, "model.family=encoder")
    with pytest.raises(ConfigError, match="holds an 'encoder' model, not 'bert'"):  # the article fits the name
        _classify(files, encoder_run, "model.family=bert")
    with pytest.raises(ConfigError, match="needs a model of family bert, not 'encoder'"):
        load_run_config(None, [f"model.init_from={_q(encoder_run)}", "data.task=mlm"])
    with pytest.raises(ConfigError, match="data.max_length 40 is longer than the model's 24 positions; set "
                                          "data.max_length to at most 24"):
        prepare(_classify(files, bert_run, "data.max_length=40"))
    with pytest.raises(CheckpointError, match="does not exist"):
        _classify(files, files / "nowhere")


def test_set_init_from_on_a_config_file_takes_the_pretrained_architecture(files, bert_run):
    """`--set model.init_from=RUN` on a config written for training from scratch (here with a preset and a
    max_len of its own) replaces the file's [model] table: the architecture is the pretrained run's."""
    from pathlib import Path

    config = Path(__file__).resolve().parents[1] / "configs" / "encoder-classify.toml"
    run = load_run_config(config, [f"model.init_from={_q(bert_run)}", "model.dropout=0.0",
                                   f"data.path={_q(files / 'cls.tsv')}", "data.text_column=text",
                                   "data.label_column=label", "data.eval_path=''", "data.max_length=16",
                                   f"train.out_dir={_q(files / 'from-file')}", *TINY])
    assert run.model == {"init_from": str(bert_run), "dropout": 0.0}
    prep = prepare(run)
    assert prep.model.config.d_model == 16 and prep.model.config.heads == "classification"


def test_a_head_the_new_model_shares_is_kept(files, bert_run):
    """Continued pre-training without next-sentence prediction keeps the masked-LM head (and the pooler);
    only what the checkpoint lacks would be new."""
    from attnlab.training.recipe import init_from_pretrained

    run = load_run_config(None, [
        f"model.init_from={_q(bert_run)}", "model.nsp=false", "data.task=mlm", f"data.path={_q(files / 'docs.txt')}",
        "data.max_length=24", f"train.out_dir={_q(files / 'no-nsp')}", *TINY])
    model = prepare(run).model
    assert model.nsp is None
    saved = load_model(bert_run).state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    # the pooler by name: the loop above reads the new model's weights only, and a model without one passed it
    # (fourth BERT audit: left unset, it went with the NSP head, and a classifier made later started one afresh)
    pooler = [k for k in saved if k.startswith("pooler.")]
    assert pooler and set(pooler) <= set(model.state_dict()), sorted(model.state_dict())
    assert init_from_pretrained(model, bert_run)["new"] == []


def test_a_new_kind_of_head_starts_fresh_even_when_its_shapes_match(tmp_path):
    """An encoder LM with 12 tokens fine-tuned as a 12-class classifier: both heads are (12, D) projections,
    so only the change of head kind tells that the classifier must not inherit the LM head's weights."""
    from attnlab.models.encoder import EncoderConfig, EncoderModel
    from attnlab.training import save_checkpoint
    from attnlab.training.recipe import init_from_pretrained

    settings = dict(vocab_size=12, d_model=16, n_heads=2, d_ff=16, n_layers=1, dropout=0.0)
    torch.manual_seed(0)
    lm = EncoderModel(EncoderConfig(**settings, head="lm"))
    save_checkpoint(tmp_path / "lm", lm)
    classifier = EncoderModel(EncoderConfig(**settings, head="classification", n_classes=12, causal=True))
    fresh = {k: v.clone() for k, v in classifier.state_dict().items() if k.startswith("head.")}
    assert fresh["head.proj.weight"].shape == lm.state_dict()["head.proj.weight"].shape
    result = init_from_pretrained(classifier, tmp_path / "lm")
    assert sorted(result["new"]) == sorted(fresh)
    for key, value in fresh.items():
        assert torch.equal(classifier.state_dict()[key], value)  # untouched: the classifier's own init
    assert torch.equal(classifier.encoder.layers[0].ff.fc1.weight, lm.encoder.layers[0].ff.fc1.weight)


def test_a_classifier_head_is_kept_only_for_the_same_classes(files, bert_run):
    # A classifier fine-tuned again keeps its head for the same classes; for other classes of the same number
    # (output 0 meant "neg", now "bad") the head starts fresh instead of carrying the old meaning.
    first = files / "cls"
    train_run(_classify(files, bert_run))
    head = load_model(first).state_dict()["classifier.weight"]
    again = prepare(_classify(files, first, f"train.out_dir={_q(files / 'cls-again')}"))
    assert torch.equal(again.model.state_dict()["classifier.weight"], head)
    renamed = files / "renamed.tsv"
    renamed.write_text((files / "cls.tsv").read_text(encoding="utf-8").replace("\tneg", "\tbad")
                       .replace("\tpos", "\tgood"), encoding="utf-8")
    other = prepare(_classify(files, first, f"data.path={_q(renamed)}", f"data.eval_path={_q(renamed)}",
                              f"train.out_dir={_q(files / 'cls-renamed')}"))
    assert other.info["labels"] == ["bad", "good"]
    ours, saved = other.model.state_dict(), load_model(first).state_dict()
    assert not torch.equal(ours["classifier.weight"], head)
    assert all(torch.equal(v, saved[k]) for k, v in ours.items() if not k.startswith("classifier."))
    # The same from a copy of the checkpoint without trainer_state.json: the weights file names its classes.
    import shutil

    bare = files / "cls-bare"
    shutil.copytree(first / "checkpoint", bare)
    (bare / "trainer_state.json").unlink()
    from_bare = prepare(_classify(files, bare, f"data.path={_q(renamed)}", f"data.eval_path={_q(renamed)}",
                                  f"train.out_dir={_q(files / 'cls-from-bare')}"))
    assert not torch.equal(from_bare.model.state_dict()["classifier.weight"], head)


def test_a_trainer_state_without_class_names_defers_to_the_weights_file(files, bert_run):
    # A trainer_state.json that names no classes (written by hand, or by a tool that kept only the step) is no
    # proof of none: the weights file's names decide, so a head for neg/pos is not kept for bad/good.
    first = files / "cls-r10"
    train_run(_classify(files, bert_run, f"train.out_dir={_q(first)}"))
    head = load_model(first).state_dict()["classifier.weight"]
    copy = files / "cls-r10-copy"
    import shutil

    shutil.copytree(first / "checkpoint", copy)
    state_file = copy / "trainer_state.json"
    state = json.loads(state_file.read_text(encoding="utf-8"))
    assert state["extra_state"].pop("labels") == ["neg", "pos"]
    state_file.write_text(json.dumps(state), encoding="utf-8")
    renamed = files / "renamed-r10.tsv"
    renamed.write_text((files / "cls.tsv").read_text(encoding="utf-8").replace("\tneg", "\tbad")
                       .replace("\tpos", "\tgood"), encoding="utf-8")
    same = prepare(_classify(files, copy, f"train.out_dir={_q(files / 'cls-r10-same')}"))
    assert torch.equal(same.model.state_dict()["classifier.weight"], head)  # the same classes: the head is kept
    other = prepare(_classify(files, copy, f"data.path={_q(renamed)}", f"data.eval_path={_q(renamed)}",
                              f"train.out_dir={_q(files / 'cls-r10-other')}"))
    assert not torch.equal(other.model.state_dict()["classifier.weight"], head)


def test_resuming_a_fine_tuning_run_reads_its_own_checkpoint_not_the_pretrained_folder(tmp_path, capsys):
    """A resumed fine-tuning run takes its vocabulary, architecture and weights from its own checkpoint: the run
    in model.init_from may since have been retrained on other text (it trained on with that vocabulary) or moved
    away (the resume was refused)."""
    import shutil

    words = ("alpha bravo charlie delta echo foxtrot golf hotel".split(),
             "kilo lima mike oscar papa romeo sierra tango".split())
    for name, vocab in zip(("a.txt", "b.txt"), words):
        lines = (" ".join(vocab[(i * 5 + j) % 8] for j in range(6)) for i in range(40))
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    rows = ["text\tlabel"] + [f"{words[0][i % 8]} {words[0][(i + 3) % 8]}\t{'x' if i % 2 else 'y'}" for i in range(24)]
    (tmp_path / "cls.tsv").write_text("\n".join(rows) + "\n")
    pre = tmp_path / "pre"

    def pretrain(text):
        train_run(load_run_config(None, [
            "model.family=encoder", "model.head=lm", "model.d_model=16", "model.n_layers=1", "model.n_heads=2",
            "model.d_ff=32", "data.tokenizer=word", "data.block_size=8", f"data.path={_q(tmp_path / text)}",
            f"train.out_dir={_q(pre)}", *TINY]))

    def finetune(out, steps, *flags):
        args = ["train", *flags]
        for item in [f"model.init_from={_q(pre)}", "data.task=classification",
                     f"data.path={_q(tmp_path / 'cls.tsv')}", "data.max_length=8", "train.schedule=constant",
                     "train.warmup_steps=1", f"train.out_dir={_q(out)}", *TINY, f"train.steps={steps}"]:
            args += ["--set", item]
        code, _, err = run_cli(capsys, *args)
        assert code == 0, err
        return load_model(out), load_tokenizer(find_checkpoint(out)).vocab()

    pretrain("a.txt")
    whole, whole_vocab = finetune(tmp_path / "whole", 6)
    _, first_vocab = finetune(tmp_path / "ft", 3)
    pretrain("b.txt")  # the pretrained run redone on other words: the same vocabulary size, other tokens
    resumed, resumed_vocab = finetune(tmp_path / "ft", 6, "--resume")
    assert resumed_vocab == first_vocab == whole_vocab and "alpha" in resumed_vocab
    assert all(torch.equal(v, whole.state_dict()[k]) for k, v in resumed.state_dict().items())

    shutil.rmtree(tmp_path / "ft")
    pretrain("a.txt")
    finetune(tmp_path / "ft", 3)
    shutil.move(pre, tmp_path / "moved")
    resumed, _ = finetune(tmp_path / "ft", 6, "--resume")
    assert all(torch.equal(v, whole.state_dict()[k]) for k, v in resumed.state_dict().items())


def test_a_character_the_pretrained_vocabulary_lacks_names_the_file_and_init_from(tmp_path, capsys):
    (tmp_path / "lm.txt").write_text("the cat sat\nthe dog ran\n" * 40)
    (tmp_path / "cls.tsv").write_text("text\tlabel\nthe cat\tpos\nthe dog\tneg\nthe cat Z\tpos\nthe dog\tneg\n")
    (tmp_path / "eval.tsv").write_text("text\tlabel\nthe cat\tpos\nthe dog Q\tneg\n")
    train_run(load_run_config(None, [
        "model.family=encoder", "model.d_model=16", "model.n_heads=2", "model.n_layers=1", "model.d_ff=32",
        "model.max_len=16", f"data.path={_q(tmp_path / 'lm.txt')}", f"train.out_dir={_q(tmp_path / 'pre')}",
        *TINY]))  # a char vocabulary: no unk token
    args = ["train"]
    for item in [f"model.init_from={_q(tmp_path / 'pre')}", "data.task=classification", "data.max_length=16",
                 f"train.out_dir={_q(tmp_path / 'ft')}", *TINY]:
        args += ["--set", item]
    line = one_line_error(capsys, *args, "--set", f"data.path={_q(tmp_path / 'cls.tsv')}")
    assert line.endswith(f"{tmp_path / 'cls.tsv'}: line 4: 'Z' is not in the vocabulary of the run in "
                         "model.init_from, which has no unk token; remove it from the text or start from a run "
                         "trained on text that has it")
    (tmp_path / "cls.tsv").write_text("text\tlabel\nthe cat\tpos\nthe dog\tneg\n")
    line = one_line_error(capsys, *args, "--set", f"data.path={_q(tmp_path / 'cls.tsv')}",
                          "--set", f"data.eval_path={_q(tmp_path / 'eval.tsv')}")
    assert f"{tmp_path / 'eval.tsv'}: line 3: 'Q' is not in the vocabulary" in line


@pytest.mark.parametrize("value", ["42", "[1]"])
def test_an_init_from_that_is_not_text_is_one_line(capsys, value):
    # TOML reads a folder named 42 as a number: a TypeError traceback (found by the stop-32 bad-input audit).
    line = one_line_error(capsys, "train", "--set", f"model.init_from={value}")
    assert line.endswith(f"model.init_from: expected a string (a run folder), got {value}; write it in double "
                         "quotes (on the command line: --set model.init_from='\"...\"')")


def test_a_setting_that_leaves_out_pretrained_body_weights_is_refused(files):
    """model.final_norm = false beside init_from (a pre-norm model has a final norm) dropped the pretrained norm
    without a word: the body computed something else before the first step."""
    pre_norm = files / "pre-norm"
    train_run(load_run_config(None, [
        "model.family=encoder", "model.head=lm", "model.norm=pre", "model.d_model=16", "model.n_layers=1",
        "model.n_heads=2", "model.d_ff=32", "data.tokenizer=word", "data.block_size=8",
        f"data.path={_q(files / 'docs.txt')}", f"train.out_dir={_q(pre_norm)}", *TINY]))
    assert "encoder.norm.weight" in load_model(pre_norm).state_dict()
    # named as the setting it is since stop 45 (it was refused later, for the weights the model then lacks)
    with pytest.raises(ConfigError, match=r"model.final_norm = False, but the model in model.init_from was trained "
                                          r"with True, which its weights keep; drop model.final_norm"):
        prepare(_classify(files, pre_norm, "model.final_norm=false"))
    prepare(_classify(files, pre_norm))  # and without it, the body is taken whole


def test_resuming_continued_pretraining_needs_not_the_pretrained_run(files, tmp_path):
    """A BERT mlm run from model.init_from read the pretrained folder again on --resume (whether it predicts the
    next sentence): deleted since, the resume was refused; retrained as a GPT, it ended in a traceback."""
    import shutil

    source, run = tmp_path / "src", tmp_path / "ft"
    common = ["data.task=mlm", "data.tokenizer=word", f"data.path={_q(files / 'docs.txt')}", "data.max_length=24",
              "data.val_fraction=0", *TINY]
    train_run(load_run_config(None, ["model.family=bert", "model.d_model=16", "model.n_layers=1", "model.n_heads=2",
                                     "model.d_ff=32", f"train.out_dir={_q(source)}", *common]))
    sets = [f"model.init_from={_q(source)}", f"train.out_dir={_q(run)}", *common]
    train_run(load_run_config(None, sets))
    shutil.rmtree(source)
    resumed = load_run_config(None, [*sets, "train.steps=4"], resume=True)
    assert train_run(resumed, resume=True)["steps"] == 4


def test_a_run_named_dot_from_inside_it_and_an_empty_init_from(files, encoder_run, monkeypatch, capsys):
    """"." (a folder named by where it is) ended in a ValueError traceback (an empty name has no .old sibling), and
    an empty model.init_from was taken as the working folder."""
    monkeypatch.chdir(encoder_run)
    assert find_checkpoint(".").resolve() == find_checkpoint(encoder_run)
    prepare(_classify(files, "."))
    with pytest.raises(ConfigError, match="^model.init_from is empty; give the folder of the pretrained run"):
        prepare(_classify(files, ""))
    monkeypatch.chdir(files)  # a folder that holds runs: said so, as for any other name of it
    line = one_line_error(capsys, "evaluate", ".", "--data", str(files / "cls.tsv"), "--device", "cpu")
    assert line.startswith("attnlab: error: . holds no model itself but the runs ")
