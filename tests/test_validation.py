"""Settings and input files that are refused up front with one line naming the problem and the fix (exit
code 2, no traceback) instead of failing later in torch, numpy or the optimizer, or being silently
ignored."""

from __future__ import annotations

import codecs
import math
import re
from pathlib import Path

import pytest
import torch
from cli_helpers import one_line_error, run_cli

from attnlab.errors import ConfigError, DataError
from attnlab.models.registry import FAMILIES, _load_families

TINY = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu"]


@pytest.mark.parametrize("setting", ["lr", "eps", "grad_clip", "weight_decay"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_train_settings_are_refused(capsys, tmp_path, monkeypatch, setting, value):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, "train", "--set", "train.steps=3", "--set", f"train.{setting}={value}")
    assert f"train.{setting} must be a finite" in line
    assert list(tmp_path.iterdir()) == []


def test_non_finite_setting_in_a_config_file_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.toml").write_text("[train]\nlr = nan\n", encoding="utf-8")
    assert "train.lr must be a finite positive number, got nan" in one_line_error(capsys, "train", "run.toml")


@pytest.mark.parametrize("setting", ["pretrain_epochs=inf", "pretrain_epochs=nan", "decay_epochs=inf",
                                     "pretrain_lr=nan", "weight_decay=inf"])
def test_non_finite_knowledge_settings_are_refused(capsys, tmp_path, monkeypatch, setting):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, "run", "knowledge", "--set", setting)
    assert f"{setting.split('=')[0]} must be a finite" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("family", ["gpt", "encoder", "bert", "seq2seq"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
def test_layer_norm_eps_must_be_finite_and_non_negative(family, value):
    _load_families()
    with pytest.raises(ConfigError, match="model.layer_norm_eps must be"):
        FAMILIES.get(family).config_cls.from_dict({"layer_norm_eps": value}, where="model")


@pytest.mark.parametrize("family, setting", [("gpt", "init_std"), ("bert", "initializer_range")])
@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
def test_init_std_must_be_finite_and_non_negative(family, setting, value):
    _load_families()
    with pytest.raises(ConfigError, match=f"model.{setting} must be"):
        FAMILIES.get(family).config_cls.from_dict({setting: value}, where="model")


@pytest.mark.parametrize("value", ["nan", "-1"])
def test_init_std_on_the_command_line(capsys, tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    assert "model.init_std must be" in one_line_error(capsys, "train", "--set", f"model.init_std={value}")


@pytest.mark.parametrize("seed", [2**63, 99999999999999999999])
def test_seed_must_fit_in_64_bits(capsys, tmp_path, monkeypatch, seed):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, "train", "--set", "train.steps=3", "--set", f"train.seed={seed}")
    assert line == (f"attnlab: error: train.seed: {seed} does not fit in 64 bits; give an integer from -2**63 to "
                    "2**63 - 1")


@pytest.mark.parametrize("error", [
    MemoryError(),  # numpy's _ArrayMemoryError is one
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried "
                 "to allocate 4398046511104 bytes. Error code 12 (Cannot allocate memory)"),
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB."),
])
def test_out_of_memory_is_one_line(capsys, tmp_path, monkeypatch, error):
    import attnlab.training.recipe as recipe

    def train_run(run, *, resume=False):
        raise error

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(recipe, "train_run", train_run)
    line = one_line_error(capsys, "train", "--set", "train.batch_size=100000000")
    assert line.startswith("attnlab: error: out of memory; use a smaller model") and "train.batch_size" in line


def test_other_runtime_errors_are_not_taken_for_out_of_memory(capsys, tmp_path, monkeypatch):
    import attnlab.training.recipe as recipe

    def train_run(run, *, resume=False):
        raise RuntimeError("a bug")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(recipe, "train_run", train_run)
    with pytest.raises(RuntimeError, match="a bug"):
        one_line_error(capsys, "train")


@pytest.mark.parametrize("text", ["model = 5\n", "train = [1, 2]\n", "data = \"lm\"\n"])
def test_config_section_must_be_a_table(capsys, tmp_path, monkeypatch, text):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.toml").write_text(text, encoding="utf-8")
    section = text.split(" ")[0]
    for extra in ([], ["--set", f"{section}.x=1"]):
        line = one_line_error(capsys, "train", "bad.toml", *extra)
        assert f"bad.toml: {section} = " in line and f"write a [{section}] header" in line


@pytest.mark.parametrize("setting, kind", [("model.family=[1]", "a model family"), ("model.preset=[1]", "a preset"),
                                           ("model.family=3", "a model family")])
def test_names_must_be_strings(capsys, tmp_path, monkeypatch, setting, kind):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, "train", "--set", setting)
    assert f"{kind} is given by its name (a string), not {setting.split('=')[1]}; choose one of: " in line


def test_family_of_a_checkpoint_must_be_a_string(capsys, tmp_path):
    import json

    from attnlab.data.tokenizers import train_tokenizer
    from attnlab.models.gpt import GPTConfig
    from attnlab.models.registry import build_model
    from attnlab.training.checkpoint import save_checkpoint

    folder = tmp_path / "ckpt"
    tokenizer = train_tokenizer("char", ["abc"])
    config = GPTConfig(vocab_size=tokenizer.vocab_size, block_size=4, d_model=8, n_heads=2, n_layers=1)
    save_checkpoint(folder, build_model(config), tokenizer=tokenizer)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "family": ["gpt"]}))
    for argv in (["params", str(folder)], ["generate", str(folder), "-p", "a"]):
        assert "a model family is given by its name (a string), not ['gpt']" in one_line_error(capsys, *argv)


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n"])
def test_empty_config_file_is_refused(capsys, tmp_path, monkeypatch, text):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.toml").write_text(text, encoding="utf-8")
    line = one_line_error(capsys, "train", "empty.toml", *TINY, "--set", "train.steps=1")
    assert "config file 'empty.toml' is empty" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.toml"]


@pytest.mark.parametrize("setting", ["path", "eval_path"])
def test_whitespace_only_lm_file_is_refused(capsys, tmp_path, monkeypatch, setting):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ws.txt").write_text("  \n\n\t \n" * 50, encoding="utf-8")
    (tmp_path / "text.txt").write_text("some text to train on\n" * 50, encoding="utf-8")
    paths = {"path": "text.txt", setting: "ws.txt"}
    line = one_line_error(capsys, "train", *TINY, "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=2",
                          *[arg for key, value in paths.items() for arg in ("--set", f"data.{key}={value}")])
    assert line == "attnlab: error: data file 'ws.txt' has only whitespace; give a file with data in it"


@pytest.mark.parametrize("setting", ["data.block_size=0", "data.block_size=-5", "data.vocab_size=0",
                                     "data.vocab_size=-5"])
def test_data_sizes_must_be_positive(capsys, tmp_path, monkeypatch, setting):
    monkeypatch.chdir(tmp_path)
    name, value = setting.split("=")
    line = one_line_error(capsys, "train", *TINY, "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=1",
                          "--set", setting)
    assert line == f"attnlab: error: {name} must be positive, got {value}"


@pytest.mark.parametrize("given, missing", [("eval_src_path", "eval_tgt_path"), ("eval_tgt_path", "eval_src_path")])
def test_translation_evaluation_needs_both_sides(capsys, tmp_path, monkeypatch, given, missing):
    monkeypatch.chdir(tmp_path)
    for name in ("src.txt", "tgt.txt"):
        (tmp_path / name).write_text("a b c\nd e f\n" * 10, encoding="utf-8")
    line = one_line_error(capsys, "train", *TINY, "--set", "data.task=translation",
                          "--set", "model.preset=seq2seq-tiny", "--set", "data.src_path=src.txt",
                          "--set", "data.tgt_path=tgt.txt", "--set", f"data.{given}=src.txt", "--set", "train.steps=1")
    assert f"data.{given} is set without data.{missing};" in line and f"set data.{missing} or drop data.{given}" in line


def test_parallel_files_of_different_lengths_are_named(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src.txt").write_text("a b c\n" * 12, encoding="utf-8")
    (tmp_path / "tgt.txt").write_text("d e f\n" * 5, encoding="utf-8")
    line = one_line_error(capsys, "train", *TINY, "--set", "data.task=translation",
                          "--set", "model.preset=seq2seq-tiny", "--set", "data.src_path=src.txt",
                          "--set", "data.tgt_path=tgt.txt", "--set", "train.steps=1")
    assert "'src.txt' has 12 lines and 'tgt.txt' has 5" in line


def test_char_vocab_size_below_the_characters_of_the_text(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.txt").write_text("abcdefgh\n" * 40, encoding="utf-8")  # 9 characters with the newline
    line = one_line_error(capsys, "train", *TINY, "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=1",
                          "--set", "data.path=text.txt", "--set", "data.vocab_size=5")
    assert line == "attnlab: error: data.vocab_size=5 keeps 5 of the text's 9 characters; raise it or leave it unset"


def test_resuming_on_a_text_with_a_new_character_names_file_and_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("hello world\nthis is text\n" * 30, encoding="utf-8")
    (tmp_path / "b.txt").write_text("hello world\nhello\nzebra\n" * 30, encoding="utf-8")
    argv = ["train", *TINY, "--set", "model.preset=gpt-char-tiny", "--set", "train.out_dir=run"]
    assert run_cli(capsys, *argv, "--set", "data.path=a.txt", "--set", "train.steps=2")[0] == 0
    line = one_line_error(capsys, *argv, "--set", "data.path=b.txt", "--set", "train.steps=4", "--resume")
    assert line.startswith("attnlab: error: b.txt: line 3: 'z' is not in the resumed run's vocabulary")
    assert "without --resume" in line


@pytest.mark.parametrize("data, advice", [
    ("hello world\n".encode("utf-16"), "iconv -f utf-16 -t utf-8"),
    ("hello world\n".encode("utf-16-be").join([codecs.BOM_UTF16_BE, b""]), "iconv -f utf-16 -t utf-8"),
    (b"\x7fELF\x02\x01\x01" + bytes(100) + bytes(range(256)) * 4, "looks like a binary file, not text"),
    ("h\u00e9llo\n".encode("latin1"), "iconv -f latin1 -t utf-8"),
], ids=["utf-16-le", "utf-16-be", "binary", "latin1"])
def test_undecodable_file_advice(capsys, tmp_path, monkeypatch, data, advice):
    from attnlab.data.text_files import iter_text_blocks, read_text

    (tmp_path / "data.txt").write_bytes(data)
    for read in (read_text, lambda path: list(iter_text_blocks(path))):
        with pytest.raises(DataError, match=re.escape(advice)):
            read(tmp_path / "data.txt")
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, "train", *TINY, "--set", "data.path=data.txt", "--set", "train.steps=1")
    assert advice in line and "data.txt" in line


def test_headerless_table_read_with_column_names_suggests_numbers(tmp_path):
    from attnlab.data.text_files import read_classification_file

    path = tmp_path / "dev.tsv"
    path.write_text("lovely nice movie\t1\nawful movie\t0\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"first row \['lovely nice movie', '1'\] does not look like a header.*"
                                        "--text-column 0 --label-column 1"):
        read_classification_file(path, "sentence", "label")
    assert read_classification_file(path, 0, 1).texts == ["lovely nice movie", "awful movie"]
    path.write_text("review\tstars\ngood\t1\n", encoding="utf-8")  # a header, without the column asked for
    with pytest.raises(DataError, match=r"no text column 'sentence' in the header \['review', 'stars'\]; set"):
        read_classification_file(path, "sentence", "stars")
    # A test split without labels (GLUE's test.tsv): said so, not only "pick one of index, sentence" (--label-column
    # index then read the row numbers as classes)
    path.write_text("index\tsentence\n0\tgood\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"no label column 'label' in the header \['index', 'sentence'\]; if the "
                                        "file has no labels .*give a labelled file"):
        read_classification_file(path, "sentence", "label")


@pytest.mark.parametrize("columns", [("label", None), ("label", "label"), ("1", "1"), (None, "sentence")])
def test_text_column_must_differ_from_label_column(capsys, tmp_path, monkeypatch, columns):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "good movie\t1\nbad movie\t0\n" * 10, encoding="utf-8")
    sets = [f"data.{name}_column={value}" for name, value in zip(("text", "label"), columns) if value is not None]
    line = one_line_error(capsys, "train", *TINY, "--set", "data.task=classification", "--set", "data.path=train.tsv",
                          "--set", "model.family=encoder", "--set", "train.steps=1",
                          *[arg for item in sets for arg in ("--set", item)])
    assert "the labels would be read as the text; set data.text_column" in line


@pytest.mark.parametrize("name, text, columns", [
    ("dev.tsv", "sentence\tlabel\ngood\t1\n", ("label", "label")),
    ("dev.tsv", "sentence\tlabel\ngood\t1\n", (None, "sentence")),
    ("dev.tsv", "good\t1\n", (1, 1)),
    ("dev.jsonl", '{"sentence": "good", "label": 1}\n', ("label", "label")),
    ("dev.jsonl", '{"sentence": "good", "label": 1}\n', (None, "sentence")),
])
def test_reading_a_file_with_the_same_text_and_label_column(tmp_path, name, text, columns):
    from attnlab.data.text_files import read_classification_file

    (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match="the text and the label column are the same"):
        read_classification_file(tmp_path / name, *columns)


def test_attnlab_alone_shows_the_help_without_an_empty_error(capsys):
    code, out, err = run_cli(capsys)
    assert code == 2 and "Usage" in out + err and "train" in out + err
    assert "error" not in out + err


def test_run_without_an_experiment_is_a_usage_error(capsys):
    line = one_line_error(capsys, "run")
    assert "missing the experiment: attnlab run EXPERIMENT, with EXPERIMENT one of: knowledge" in line
    code, out, _ = run_cli(capsys, "run", "--list")
    assert code == 0 and out.startswith("knowledge ")


def test_init_from_a_run_of_the_wrong_family_says_so(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_cli(capsys, "train", *TINY, "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=1",
                   "--set", "train.out_dir=gpt")[0] == 0
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "good movie\t1\nbad movie\t0\n" * 5, encoding="utf-8")
    line = one_line_error(capsys, "train", *TINY, "--set", "model.init_from=gpt", "--set", "data.task=classification",
                          "--set", "data.path=train.tsv")
    assert line.endswith("not 'gpt'; model.init_from names a gpt run: give it the run folder of a model of family "
                         "encoder or bert")


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_143(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "text.txt").write_text("a small text to train on, again and again\n" * 200, encoding="utf-8")
    paths = [str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH")]  # this checkout's attnlab
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", "train", *TINY, "--set", "model.preset=gpt-char-tiny",
         "--set", "data.path=text.txt", "--set", "train.steps=100000", "--set", "train.eval_every=0",
         "--set", "train.log_every=1", "--set", "train.out_dir=run"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and metrics.read_text().strip()):  # training has taken its first step
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("attnlab: terminated (SIGTERM): training interrupted at step "), err
    assert "checkpoint saved in run/checkpoint" in lines[0]
    assert (tmp_path / "run" / "checkpoint" / "model.safetensors").is_file()


@pytest.mark.parametrize("task, extra, needle", [
    ("mlm", [], "data.max_length = 4 is too short for data.task = 'mlm' ([CLS] A [SEP] B [SEP] needs 5)"),
    ("translation", ["data.src_path=a", "data.tgt_path=b"], "data.max_length = 1 is too short for data.task = "
                                                             "'translation' (bos or eos and one token needs 2)"),
])
def test_max_length_too_short_for_the_task_names_the_setting(task, extra, needle):
    # They were refused deep in the data sources, as 'sentence pair max_length' / 'max_tgt_length'.
    from attnlab.training.recipe import load_run_config

    length = 4 if task == "mlm" else 1
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_run_config(None, [f"data.task={task}", f"data.max_length={length}", *extra])


def test_tokenizer_vocabulary_too_small_names_the_specials_and_the_setting():
    from attnlab.data.tokenizers import WordPieceTokenizer

    with pytest.raises(ConfigError, match=r"must exceed the \d+ special tokens, got 5; raise vocab_size "
                                          r"\(data.vocab_size in a run config\)"):
        WordPieceTokenizer.train(["some text here"], vocab_size=5)


def test_bpe_vocabulary_too_small_names_the_setting():
    from attnlab.data.tokenizers import BPETokenizer

    with pytest.raises(ConfigError, match=r"bpe vocab_size \(data.vocab_size in a run config\) must be at least "
                                          r"\d+ \(256 byte symbols \+ \d+ specials\), got 100; raise it"):
        BPETokenizer.train(["some text here"], vocab_size=100)


def test_wordpiece_vocabulary_below_the_alphabet_is_reported():
    # It was raised to what the text needs without a word (data.vocab_size=10 gave 43 tokens).
    from attnlab.data.tokenizers import WordPieceTokenizer

    with pytest.warns(UserWarning, match=r"wordpiece vocab_size 10 is below the \d+ tokens the text's 8 characters"):
        tok = WordPieceTokenizer.train(["abcd efgh"], vocab_size=10)
    assert tok.vocab_size > 10


def test_mlm_text_without_sentence_pairs_is_refused_first(capsys, tmp_path, monkeypatch):
    # A one-sentence file warned "nothing held out for evaluation" before its real error.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one.txt").write_text("alpha beta.\n\ngamma delta.\n", encoding="utf-8")
    line = one_line_error(capsys, "train", str(Path(__file__).resolve().parents[1] / "configs" / "bert-mlm.toml"),
                          "--set", "data.path=one.txt", "--set", "train.device=cpu")
    assert "one.txt: no document has two sentences" in line and "one sentence per line" in line


def test_bucketing_is_a_setting_of_padded_tasks(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, "train", *TINY, "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=1",
                          "--set", "data.bucket_by_length=true")
    assert line == ("attnlab: error: data.bucket_by_length applies to data.task = 'translation', "
                    "'classification' or 'mlm' (this run's task is 'lm'); drop the setting")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("setting, bucketed", [(None, True), ("true", True), ("false", False)])
def test_translation_batches_by_length_unless_told_not_to(tmp_path, setting, bucketed):
    """Vaswani et al. batch sentence pairs by approximate length: so does a translation run by default, in
    training and in evaluation, and `data.bucket_by_length=false` gives uniformly random batches (evaluation in
    file order)."""
    from attnlab.data.sources import evaluation_batches
    from attnlab.training.recipe import load_run_config, prepare

    # Sources of 1 to 24 words in shuffled order: random batches of 8 mix short and long ones.
    rng = torch.Generator().manual_seed(0)
    lengths = (torch.randperm(96, generator=rng) % 24 + 1).tolist()
    lines = [" ".join(f"w{(i + j) % 7}" for j in range(n)) for i, n in enumerate(lengths)]
    for name in ("src.txt", "tgt.txt"):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    overrides = ["model.preset=seq2seq-tiny", "data.task=translation", "data.tokenizer=word", "train.batch_size=8",
                 f"data.src_path={tmp_path / 'src.txt'}", f"data.tgt_path={tmp_path / 'tgt.txt'}",
                 f"data.eval_src_path={tmp_path / 'src.txt'}", f"data.eval_tgt_path={tmp_path / 'tgt.txt'}"]
    if setting is not None:
        overrides.append(f"data.bucket_by_length={setting}")
    prep = prepare(load_run_config(None, overrides))
    source = prep.train_source
    real = [source.batch(step)["src_mask"].float().mean().item() for step in range(source.steps_per_epoch)]
    share = sum(real) / len(real)  # the share of real tokens in the batches of an epoch
    assert (share > 0.9) if bucketed else (share < 0.75)
    masks = [batch["src_mask"] for batch in evaluation_batches(prep.eval_source, 8)]
    share = sum(m.sum().item() for m in masks) / sum(m.numel() for m in masks)
    assert (share > 0.9) if bucketed else (share < 0.75)


@pytest.mark.parametrize("setting, bucketed", [(None, True), ("false", False)])
def test_classification_batches_by_length_unless_told_not_to(tmp_path, setting, bucketed):
    from attnlab.data.sources import evaluation_batches
    from attnlab.training.recipe import load_run_config, prepare

    rng = torch.Generator().manual_seed(0)
    lengths = (torch.randperm(96, generator=rng) % 24 + 1).tolist()
    texts = [" ".join(f"w{(i + j) % 7}" for j in range(n)) for i, n in enumerate(lengths)]
    rows = ["text\tlabel"] + [f"{text}\t{i % 2}" for i, text in enumerate(texts)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    overrides = ["model.preset=encoder-tiny", "data.task=classification", "data.tokenizer=word", "train.batch_size=8",
                 f"data.path={tmp_path / 'train.tsv'}", f"data.eval_path={tmp_path / 'train.tsv'}",
                 "data.text_column=text", "data.label_column=label"]
    if setting is not None:
        overrides.append(f"data.bucket_by_length={setting}")
    prep = prepare(load_run_config(None, overrides))
    source = prep.train_source
    real = [source.batch(step)["attention_mask"].float().mean().item() for step in range(source.steps_per_epoch)]
    share = sum(real) / len(real)
    assert (share > 0.9) if bucketed else (share < 0.75)
    masks = [batch["attention_mask"] for batch in evaluation_batches(prep.eval_source, 8)]
    share = sum(m.sum().item() for m in masks) / sum(m.numel() for m in masks)
    assert (share > 0.9) if bucketed else (share < 0.75)


@pytest.mark.parametrize("setting, bucketed", [(None, False), ("true", True), ("false", False)])
def test_bert_pretraining_batches_by_length_when_told_to(tmp_path, setting, bucketed):
    """BERT's sentence pairs padded to the longest of a random batch are about half padding; with
    data.bucket_by_length the pairs of 50 steps are sorted by length into those steps' batches, and evaluation
    sorts them too. Off by default (a higher loss after equal steps on configs/bert-mlm.toml)."""
    from attnlab.data.sources import evaluation_batches
    from attnlab.training.recipe import load_run_config, prepare

    rng = torch.Generator().manual_seed(0)
    lengths = (torch.randperm(240, generator=rng) % 24 + 1).tolist()
    sentences = [" ".join(f"w{(i + j) % 7}" for j in range(n)) for i, n in enumerate(lengths)]
    documents = ["\n".join(sentences[d:d + 6]) for d in range(0, len(sentences), 6)]
    (tmp_path / "docs.txt").write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    overrides = ["model.preset=bert-tiny", "data.task=mlm", "data.tokenizer=word", "train.batch_size=8",
                 f"data.path={tmp_path / 'docs.txt'}", "data.max_length=64", "data.val_fraction=0.25"]
    if setting is not None:
        overrides.append(f"data.bucket_by_length={setting}")
    prep = prepare(load_run_config(None, overrides))
    for batches in ([prep.train_source.batch(step) for step in range(100)], evaluation_batches(prep.eval_source, 8)):
        masks = [batch["attention_mask"] for batch in batches]
        share = sum(m.sum().item() for m in masks) / sum(m.numel() for m in masks)
        assert (share > 0.9) if bucketed else (share < 0.75)


def test_one_segment_embedding_for_two_segment_pairs_is_refused(capsys, tmp_path, monkeypatch):
    # The sentence pairs give B segment 1: a table of one segment embedding failed with "IndexError: index out of
    # range in self" at the first step. 0 (no segment embeddings, the ablation) stays allowed.
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, "train", str(Path(__file__).resolve().parents[1] / "configs" / "bert-mlm.toml"),
                          "--set", "model.type_vocab_size=1", "--set", "data.vocab_size=300",
                          "--set", "train.device=cpu")
    assert "model.type_vocab_size = 1" in line and "set it to 2, or to 0" in line
