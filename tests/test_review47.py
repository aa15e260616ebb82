"""Findings of stop 47's audits, each pinned by the behaviour a user sees."""

from __future__ import annotations

import warnings

import pytest
import torch
from cli_helpers import run_cli_warned
from torch import nn
from training_helpers import ToySource, tiny_model

from attnlab.errors import ConfigError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.training import Trainer, TrainerConfig, load_checkpoint_into, load_model
from attnlab.training.checkpoint import ModelMismatch


def _config(**changes) -> TrainerConfig:
    settings = dict(steps=4, batch_size=8, lr=1e-2, precision="fp32", device="cpu", progress=False)
    settings.update(changes)
    return TrainerConfig(**settings)


def test_patience_running_out_at_the_last_step_is_not_a_stop_before_it(tmp_path):
    scores = iter([1.0, 2.0])  # the second (last) evaluation is worse: patience 1 runs out at step 4 of 4
    cfg = _config(eval_every=2, early_stopping_patience=1, best_metric="score", best_mode="min")
    summary = Trainer(tiny_model(), cfg, ToySource(), out_dir=tmp_path,
                      metrics_fn=lambda m: {"score": next(scores)}).fit()
    assert summary["steps"] == 4 and summary["stopped_early"] is False
    # More steps on resume: the run stays stopped, as one given 8 steps from the start would have stopped at 4.
    resumed = Trainer(tiny_model(), cfg.replace(steps=8), ToySource(), out_dir=tmp_path, resume=True,
                      metrics_fn=lambda m: {"score": 0.0}).fit()
    assert resumed["start_step"] == resumed["steps"] == 4 and resumed["stopped_early"] is True


class _WithExtra(GPT):
    def __init__(self, config):
        super().__init__(config)
        self.extra = nn.Linear(4, 4)


class _OtherForward(GPT):
    def forward(self, *args, **kwargs):
        return super().forward(*args, **kwargs)


_GPT = GPTConfig(vocab_size=32, block_size=16, n_layers=1, n_heads=2, d_model=16)


def test_a_model_its_config_does_not_rebuild_is_warned_of_at_the_start_and_loads_back_into_its_class(tmp_path):
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match=r"the model is a _WithExtra: its weights are not those of the GPT its "
                                         r"config builds \(weight 'extra\.weight'\), so load_model.* will refuse its "
                                         r"checkpoints; load them into a model of its class with "
                                         r"attnlab\.training\.load_checkpoint_into"):
        trainer = Trainer(_WithExtra(_GPT), _config(steps=1), ToySource(), out_dir=tmp_path / "a")
    trainer.fit()
    with pytest.raises(ModelMismatch):
        load_model(tmp_path / "a")
    back = _WithExtra(_GPT)
    load_checkpoint_into(tmp_path / "a", back)
    assert torch.equal(back.extra.weight, trainer.model.extra.weight)

    with pytest.warns(UserWarning, match="rebuild its checkpoints as a GPT, without what _OtherForward changes"):
        Trainer(_OtherForward(_GPT), _config(steps=1), ToySource(), out_dir=tmp_path / "b")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="the model is a")
        Trainer(GPT(_GPT), _config(steps=1), ToySource(), out_dir=tmp_path / "c")
        Trainer(torch.compile(GPT(_GPT)), _config(steps=1), ToySource(), out_dir=tmp_path / "d")


def test_a_knowledge_run_replaces_only_files_named_as_a_run_names_them(tmp_path):
    from attnlab.experiments.knowledge import _earlier_outputs

    for phase in ("pretrain-dot", "finetune-dot", "finetune-none"):
        (tmp_path / phase / "checkpoint").mkdir(parents=True)
    (tmp_path / "finetune-none" / "metrics.jsonl").write_text("{}\n", encoding="utf-8")
    (tmp_path / "finetune-none" / "loss.png.123.tmp.png").write_text("x", encoding="utf-8")
    (tmp_path / "finetune-none" / ".best.old").mkdir()
    for name, entry in (("finetune-ideas", "best.md"), ("pretrain-none", "checkpoint"), ("finetune-scratch", "best"),
                        ("finetune-dot + rotary", "checkpoint"), ("pretrain-dot+rotary", "loss.png.txt")):
        (tmp_path / name).mkdir()
        (tmp_path / name / entry).mkdir()
    predictions = tmp_path / "predictions"
    predictions.mkdir()
    for name in ("dot.tsv", "none.predict.tsv", "scratch.tsv", " dot.tsv", "dot + rotary.tsv"):
        (predictions / name).write_text("x", encoding="utf-8")
    found = {path.relative_to(tmp_path).as_posix() for path in _earlier_outputs(tmp_path, [])}
    assert found == {"pretrain-dot", "finetune-dot", "finetune-none", "predictions/dot.tsv",
                     "predictions/none.predict.tsv"}


@pytest.mark.parametrize("raw, value", [("True", True), ("FALSE", False), ("0b101", 5)])
def test_set_and_a_yaml_config_read_booleans_and_binary_numbers_alike(tmp_path, raw, value):
    from attnlab.training.recipe import load_run_config, parse_value

    setting = "train.compile" if isinstance(value, bool) else "train.steps"
    section, key = setting.split(".")
    config = tmp_path / "c.yaml"
    config.write_text(f"{section}:\n  {key}: {raw}\n", encoding="utf-8")
    assert parse_value(raw) == value and type(parse_value(raw)) is type(value)
    from_file, from_set = load_run_config(config), load_run_config(None, [f"{setting}={raw}"])
    assert getattr(from_file.train, key) == getattr(from_set.train, key) == value


def test_an_options_table_with_nothing_under_it_in_yaml_is_empty(tmp_path):
    from attnlab.training.recipe import load_run_config

    config = tmp_path / "c.yaml"
    config.write_text("model:\n  position: relative\n  position_options:\ndata:\n", encoding="utf-8")
    assert load_run_config(config).model["position_options"] == {}


def test_params_reads_a_config_json_as_utf8_whatever_the_locale(tmp_path):
    import json
    import os
    import subprocess
    import sys

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "id2label": {"0": "négatif"}},
                                                   ensure_ascii=False), encoding="utf-8")
    env = {**os.environ, "PYTHONCOERCECLOCALE": "0", "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": "utf-8"}
    out = subprocess.run([sys.executable, "-m", "attnlab", "params", str(folder)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 2 and "attnlab convert" in out.stderr and "codec" not in out.stderr, out.stderr


def test_a_resumed_fine_tune_keeps_recording_the_run_it_started_from(capsys, tmp_path):
    # The command's init_from (another run, one that does not exist) or a preset given instead had replaced it in
    # run.json, though a resume continues the run's own checkpoint and reads neither.
    import json

    from cli_helpers import run_cli
    from cli_helpers import toml_str as _q

    base = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu",
            "--set", "train.warmup_steps=0", "--set", "train.eval_every=0"]
    pre, other, run = tmp_path / "pre", tmp_path / "other", tmp_path / "run"
    for out in (pre, other):
        assert run_cli(capsys, "train", "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=1", *base,
                       "--set", f"train.out_dir={_q(out)}")[0] == 0
    assert run_cli(capsys, "train", "--set", f"model.init_from={_q(pre)}", "--set", "train.steps=1", *base,
                   "--set", f"train.out_dir={_q(run)}")[0] == 0
    recorded = {"init_from": str(pre)}
    assert json.loads((run / "run.json").read_text(encoding="utf-8"))["model"] == recorded
    for steps, model in enumerate([f"model.init_from={_q(other)}", f"model.init_from={_q(tmp_path / 'no' / 'such')}",
                                   "model.preset=gpt-char-tiny"], start=2):
        code, err, named = run_cli_warned(capsys, "train", "--set", model, "--set", f"train.steps={steps}", *base,
                                          "--set", f"train.out_dir={_q(run)}", "--resume",
                                          about="is not the run this one started from")
        assert code == 0, err
        assert len(named) == ("init_from" in model), named
        assert json.loads((run / "run.json").read_text(encoding="utf-8"))["model"] == recorded


def _prefixing_tokenizer():
    """A byte-level BPE that puts a space before a text's start, as a GPT-2 tokenizer saved with
    add_prefix_space=True does (and `attnlab convert` keeps)."""
    import tokenizers

    from attnlab.data.tokenizers import BPETokenizer

    texts = ["The quick brown fox jumps over the lazy dog.\nSecond line here, and a third.\n"] * 20
    byte_level = tokenizers.ByteLevelBPETokenizer(add_prefix_space=True)
    byte_level.train_from_iterator(texts, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>", "<pad>"])
    none = dict.fromkeys(("unk", "mask", "cls", "sep", "bos"))
    return BPETokenizer(byte_level._tokenizer, specials={**none, "pad": "<pad>", "eos": "<|endoftext|>"})


def test_a_token_file_of_a_tokenizer_that_prefixes_a_text_holds_the_ids_of_the_whole_text(tmp_path):
    # Encoded in pieces (about a line each, blocks of a megabyte), every piece had got the prefix: a space token
    # before each line end in a converted GPT-2's token files, so evaluate scored other tokens than HF does.
    import numpy as np

    from attnlab.data.corpus import build_token_file

    text = "".join(f"The quick brown fox {i}.\nSecond line here.\n" for i in range(30))
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8")
    tok = _prefixing_tokenizer()
    whole = tok.hf.encode(text, add_special_tokens=False).ids
    assert tok.decode(whole) == " " + text
    assert tok.encode(text) == tok.encode_array(text).tolist() == whole
    for block in (40, 1 << 20):  # blocks of a few lines each, and the text as one block
        for source in (path, text):
            ids = build_token_file(source, tok, tmp_path / f"{block}-{type(source).__name__}.bin", block_chars=block)
            assert np.asarray(ids).tolist() == whole, (block, source)


@pytest.mark.parametrize("command", [["train"], ["run", "knowledge"], ["generate"], ["evaluate"], ["params"],
                                     ["convert"]])
def test_help_at_sixty_columns_folds_long_words_instead_of_cutting_them(capsys, monkeypatch, command):
    # rich cut them with an ellipsis: "model.position=rotar…", the --variants default, knowledge settings' names.
    from cli_helpers import run_cli

    monkeypatch.setenv("COLUMNS", "60")
    code, out, _ = run_cli(capsys, *command, "--help")
    assert code == 0 and "Usage" in out and "…" not in out, out
    assert max(len(line) for line in out.splitlines()) <= 60


def test_alibi_where_a_model_cannot_tell_a_sequence_from_its_reverse_is_warned_of(capsys, tmp_path):
    from types import SimpleNamespace

    from cli_helpers import toml_str as _q

    from attnlab.models.registry import build_model, get_preset
    from attnlab.training.recipe import _warn_order_blind

    def said(family_preset: str, tokenizer=None, **changes) -> list[str]:
        config = get_preset(family_preset)[1].replace(**changes)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            _warn_order_blind(config, tokenizer)
        return [str(w.message) for w in seen]

    (message,) = said("seq2seq-tiny", position="alibi")
    assert "is symmetric in the encoder of a seq2seq model" in message and "use rotary, t5-bias" in message
    model = build_model(get_preset("seq2seq-tiny")[1].replace(position="alibi")).eval()
    src, tgt = torch.tensor([[5, 6, 7, 8]]), torch.tensor([[1, 9]])
    with torch.no_grad():  # what the warning says: the decoder reads a source and its reverse alike
        torch.testing.assert_close(model(src, tgt).logits, model(src.flip(1), tgt).logits, atol=1e-5, rtol=0)
    mean = dict(position="alibi", head="classification", pooling="mean", n_classes=2)
    assert len(said("encoder-tiny", SimpleNamespace(cls_id=None), **mean)) == 1
    # A cls token before every text anchors the positions: each token's distance to it tells its place.
    assert said("encoder-tiny", SimpleNamespace(cls_id=2), **mean) == []
    classifier = build_model(get_preset("encoder-tiny")[1].replace(**mean)).eval()
    def logits(*ids: int) -> torch.Tensor:
        with torch.no_grad():
            return classifier(torch.tensor([ids])).logits

    assert not torch.allclose(logits(2, 5, 6, 7, 8), logits(2, 8, 7, 6, 5), atol=1e-6)
    assert torch.allclose(logits(5, 6, 7, 8), logits(8, 7, 6, 5), atol=1e-5)
    assert len(said("encoder-tiny", position="alibi", head="lm", causal=False)) == 1
    assert said("encoder-tiny", SimpleNamespace(cls_id=None), **{**mean, "pooling": "first"}) == []
    assert said("encoder-tiny", position="alibi", head="lm") == []  # causal: the penalty has a direction
    assert said("gpt-char-tiny", position="alibi") == []
    assert said("seq2seq-tiny", position="alibi", attention="synthesizer-dense") == []  # scores by position
    assert said("seq2seq-tiny", position="rotary") == []

    # A run says it when it starts (not again on resume).
    src_file, tgt_file = tmp_path / "s.txt", tmp_path / "t.txt"
    src_file.write_text("der hund beisst\ndie katze schläft\n" * 20, encoding="utf-8")
    tgt_file.write_text("the dog bites\nthe cat sleeps\n" * 20, encoding="utf-8")
    argv = ["train", "--set", "model.preset=seq2seq-tiny", "--set", "model.position=alibi", "--set",
            "data.task=translation", "--set", f"data.src_path={_q(src_file)}", "--set", f"data.tgt_path={_q(tgt_file)}",
            "--set", "data.tokenizer=word", "--set", "train.eval_every=0", "--set", "train.progress=false", "--set",
            "train.device=cpu", "--set", "train.batch_size=4", "--set", f"train.out_dir={_q(tmp_path / 'run')}"]
    for steps, expected in ((1, 1), (2, 0)):
        code, err, said = run_cli_warned(capsys, *argv, "--set", f"train.steps={steps}",
                                         *(["--resume"] if steps > 1 else []),
                                         about="is symmetric in the encoder of a seq2seq model")
        assert code == 0, err
        assert len(said) == expected, said


def test_a_classifier_of_other_classes_named_by_init_from_or_resume_says_which_classes_differ(capsys, tmp_path):
    # The refusal of a resume listed the first 8 classes of each side, the same 8 where class '10' was missing; a
    # fine-tune from a classifier dropped its trained head without a word.
    from cli_helpers import one_line_error, run_cli
    from cli_helpers import toml_str as _q

    rows = "".join(f"text number {i} here\t{i % 11}\n" for i in range(66))
    full, short = tmp_path / "full.tsv", tmp_path / "short.tsv"
    full.write_text("text\tlabel\n" + rows, encoding="utf-8")
    short.write_text("text\tlabel\n" + "".join(r for r in rows.splitlines(True) if not r.endswith("\t10\n")),
                     encoding="utf-8")
    common = ["--set", "model.preset=encoder-tiny", "--set", "model.head=classification", "--set",
              "data.task=classification", "--set", "data.tokenizer=word", "--set", "train.eval_every=0", "--set",
              "train.progress=false", "--set", "train.device=cpu", "--set", "train.batch_size=4"]
    run = tmp_path / "run"
    assert run_cli(capsys, "train", *common, "--set", "train.steps=1", "--set", f"data.path={_q(full)}", "--set",
                   f"train.out_dir={_q(run)}")[0] == 0
    line = one_line_error(capsys, "train", *common, "--set", "train.steps=2", "--set", f"data.path={_q(short)}",
                          "--set", f"train.out_dir={_q(run)}", "--resume")
    assert "has other classes than the run was trained on ('10' missing)" in line, line
    fine_tune = [*common[4:], "--set", "train.steps=1", "--set", f"data.path={_q(short)}", "--set",
                 f"model.init_from={_q(run)}", "--set", f"train.out_dir={_q(tmp_path / 'ft')}"]
    with pytest.warns(UserWarning, match=r"is a classifier of other classes than the data's \('10' missing\): its "
                                         r"classification head is not kept and starts afresh"):
        code, _, err = run_cli(capsys, "train", *fine_tune)
    assert code == 0, err


@pytest.mark.parametrize("pre", ["metaspace", "none", "byte-level-without-pattern"])
def test_a_gpt2_folder_whose_tokenizer_reads_across_line_ends_is_refused(tmp_path, pre):
    # Its token files (cut before line ends to encode in parallel) held other ids than the text's.
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from attnlab.convert.to_run import hf_tokenizer
    from attnlab.training.checkpoint import CheckpointError

    hf = Tokenizer(models.BPE(unk_token="<unk>"))
    hf.pre_tokenizer = {"metaspace": pre_tokenizers.Metaspace(prepend_scheme="first"), "none": None,
                        "byte-level-without-pattern": pre_tokenizers.ByteLevel(use_regex=False)}[pre]
    hf.train_from_iterator(["The quick brown fox jumps.\nover the lazy dog\n"] * 20,
                           trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"]))
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "unk_token": "<unk>"}),
                                                    encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"tokenizer.json: its pre-tokenizer is .*, which does not end a token "
                                              r"at each line end as GPT-2's byte-level one does"):
        hf_tokenizer(tmp_path, "gpt2")


def test_add_eos_on_one_text_is_refused_not_ignored(tmp_path):
    from attnlab.data.corpus import TextStream, build_token_file
    from attnlab.data.tokenizers import train_tokenizer

    tok = train_tokenizer("word", "one two three four\n")
    path = tmp_path / "t.txt"
    path.write_text("one two\nthree four\n", encoding="utf-8")
    for source in ("one two\nthree four\n", path, TextStream(["one two\n", "three four\n"])):
        with pytest.raises(ConfigError, match="add_eos puts an eos after each document of an iterable of documents"):
            build_token_file(source, tok, tmp_path / "a.bin", add_eos=True)
    ids = build_token_file(["one two", "three four"], tok, tmp_path / "b.bin", add_eos=True)
    assert [int(i) for i in ids].count(tok.eos_id) == 2


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_a_long_line_is_encoded_in_pieces_between_words_with_the_ids_of_the_whole(monkeypatch, kind):
    # A one-line corpus (text8) went to HF as 4 MB blocks, whose Encodings held ~0.9 GB for a moment.
    import attnlab.data.tokenizers as tokenizers

    text = " ".join(f"word{i % 37} and  other\tthings," for i in range(400)) + "\nsecond line here\n"
    tok = tokenizers.train_tokenizer(kind, text, 300)
    whole = tok.encode(text)
    monkeypatch.setattr(tokenizers, "LONGEST_PIECE", 50)
    pieces = tokenizers.text_pieces(text)
    assert "".join(pieces) == text and len(pieces) > 100 and max(map(len, pieces)) <= 50
    assert tok.encode_array(text).tolist() == whole
    assert tokenizers.text_pieces("x" * 120) == ["x" * 120]  # no space to cut at: left whole


def test_a_text_stream_of_bytes_is_refused_in_one_line(tmp_path):
    from attnlab.data.corpus import TextStream, build_token_file
    from attnlab.data.tokenizers import train_tokenizer

    with pytest.raises(ConfigError, match="a TextStream holds strings, got a piece of type bytes"):
        build_token_file(TextStream([b"one two\n"]), train_tokenizer("char", "one two\n"), tmp_path / "a.bin")


def test_a_resumed_fine_tunes_init_from_is_compared_as_folders(tmp_path, monkeypatch):
    # Compared as paths from this folder, the run's own start named from another folder was warned of, and a
    # home folder that cannot be found or a NUL byte in the name failed with a traceback.
    from attnlab.training.recipe import _other_folder

    (tmp_path / "w" / "pre").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path)
    assert not _other_folder("w/pre", "pre")  # run.json's "pre", given where the run started (w/): not found here
    assert not _other_folder(str(tmp_path / "w" / "pre"), "w/pre") and not _other_folder("w/pre/", "w/pre")
    assert _other_folder("other", "w/pre") and _other_folder("no/such/run", "w/pre")
    for odd in ("~nosuchuser12345/pre", "w/pre\0"):
        assert _other_folder(odd, "w/pre")  # not a folder there: said, not a traceback


def test_a_fine_tune_past_the_pretrained_windows_of_learned_positions_is_warned_of(capsys, tmp_path):
    # Its positions past the pretrained run's windows were never trained, without a word (generate says so).
    from cli_helpers import run_cli
    from cli_helpers import toml_str as _q

    text, table = tmp_path / "lm.txt", tmp_path / "t.tsv"
    text.write_text("alpha beta gamma delta epsilon\n" * 40, encoding="utf-8")
    table.write_text("text\tlabel\n" + "alpha beta\t1\ngamma delta epsilon\t0\n" * 10, encoding="utf-8")
    common = ["--set", "train.eval_every=0", "--set", "train.progress=false", "--set", "train.device=cpu",
              "--set", "train.steps=1", "--set", "train.batch_size=4"]
    lm = tmp_path / "lm"
    assert run_cli(capsys, "train", "--set", "model.preset=encoder-tiny", "--set", "model.max_len=64", "--set",
                   "model.position=learned", "--set", "data.tokenizer=char", "--set", f"data.path={_q(text)}",
                   "--set", "data.block_size=8", *common, "--set", f"train.out_dir={_q(lm)}")[0] == 0
    for length, expected in ((40, 1), (8, 0)):
        code, err, said = run_cli_warned(capsys, "train", "--set", f"model.init_from={_q(lm)}", "--set",
                                         "data.task=classification", "--set", f"data.path={_q(table)}", "--set",
                                         f"data.max_length={length}", *common, "--set",
                                         f"train.out_dir={_q(tmp_path / f'ft{length}')}", about="were never trained")
        assert code == 0, err
        assert len(said) == expected, said
        assert not said or said[0].startswith("data.max_length 40 is longer than the windows of 8 tokens")
