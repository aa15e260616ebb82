"""Settings the command line took and then failed on, or silently ignored (from an audit of the CLI and config
handling): each is now refused in one line before anything trains."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_helpers import one_line_error, run_cli
from cli_helpers import toml_str as _q

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--set", "train.progress=false", "--set", "train.device=cpu", "--set", "train.steps=1"]


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = ["sentence\tlabel"] + [f"{w} movie {w}\t{y}" for w, y in [("great", 1), ("awful", 0)] * 6]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "lm.txt").write_text("the cat sat on the mat\n" * 20, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("config, sets, needle", [
    # A head for another task: "Expected input batch_size (24) to match target batch_size (4)" at the first step.
    ("encoder-classify.toml", ["data.path=\"train.tsv\"", "data.eval_path=\"train.tsv\"", "model.head=\"lm\""],
     "model.head = 'lm', but this data.task trains the 'classification' head; drop model.head"),
    (None, ["model.family=\"encoder\"", "model.head=\"classification\"", "model.causal=true",
            "data.path=\"lm.txt\""], "model.head = 'classification', but this data.task trains the 'lm' head"),
    # Fewer embeddings than tokens: "IndexError: index out of range in self"; more: trained, then refused by
    # evaluate and generate.
    ("gpt-text.toml", ["data.path=\"lm.txt\"", "model.vocab_size=5"], "model.vocab_size = 5, but the tokenizer has"),
    ("gpt-text.toml", ["data.path=\"lm.txt\"", "model.vocab_size=100"], "model.vocab_size = 100, but the tokenizer"),
    ("encoder-classify.toml", ["data.path=\"train.tsv\"", "data.eval_path=\"train.tsv\"", "model.n_classes=5"],
     "model.n_classes = 5, but the training data has 2 labels"),
])
def test_what_the_data_decides_is_not_overridden(capsys, files, config, sets, needle):
    argv = ["train", *([str(ROOT / "configs" / config)] if config else [])]
    for item in sets:
        argv += ["--set", item]
    assert needle in one_line_error(capsys, *argv, *FAST)


@pytest.mark.parametrize("table, key", [("attention_options", "bias"), ("attention_options", "block_size"),
                                        ("position_options", "max_len"), ("position_options", "causal")])
def test_options_tables_do_not_take_what_the_model_gives(capsys, files, table, key):
    # "TypeError: build_variant() got multiple values for keyword argument 'bias'".
    line = one_line_error(capsys, "train", "--set", "model.preset=gpt-char-tiny", "--set",
                          f"model.{table}={{{key}=1}}", *FAST)
    assert f"model.{table} sets '{key}'" in line and f"drop it from model.{table}" in line


@pytest.mark.parametrize("sets, needle", [
    # Trained with no evaluation and no word: translation reads data.eval_src_path and data.eval_tgt_path.
    (["data.task=\"translation\"", "data.src_path=\"lm.txt\"", "data.tgt_path=\"lm.txt\"", "data.eval_path=\"x\""],
     "data.eval_path is not read by data.task = 'translation'"),
    (["data.block_size=8", "data.path=\"train.tsv\"", "data.task=\"classification\"", "model.family=\"encoder\""],
     "data.block_size is not read by data.task = 'classification'"),
    (["data.max_length=16"], "data.max_length is not read by data.task = 'lm'"),
    # data.path = "" trained on the embedded pydoc texts.
    (["data.path=\"\""], "data.path is empty; give a file name, or leave it out for the embedded pydoc texts"),
])
def test_data_settings_the_task_does_not_read_are_refused(capsys, files, sets, needle):
    argv = ["train"]
    for item in sets:
        argv += ["--set", item]
    assert needle in one_line_error(capsys, *argv, *FAST)


def test_the_shipped_configs_set_only_what_their_task_reads():
    from attnlab.training.recipe import load_run_config

    for config in sorted((ROOT / "configs").glob("*.toml")):
        load_run_config(config, [f"data.path={_q('x.txt')}"] if "translate" not in config.name else [])


@pytest.mark.parametrize("command", [["train"], ["generate"], ["evaluate"], ["params"], ["run", "knowledge"]])
def test_help_does_not_show_flags_as_taking_a_value(capsys, command):
    # `--resume <bool>` read as if it took a value: `attnlab train --resume true` then looked for a config 'true'.
    from cli_helpers import run_cli

    code, out, err = run_cli(capsys, *command, "--help")
    assert code == 0, err
    assert "--help" in out and "<bool>" not in out and "<list[str]>" not in out


def test_every_shipped_config_written_as_yaml_gives_the_same_run(tmp_path):
    # "Config files (TOML or YAML)": YAML was refused ("config files are TOML").
    import yaml

    from attnlab.training.recipe import load_run_config, tomllib  # tomllib, or tomli before Python 3.11

    for config in sorted((ROOT / "configs").glob("*.toml")):
        as_yaml = tmp_path / f"{config.stem}.yaml"
        as_yaml.write_text(yaml.safe_dump(tomllib.loads(config.read_text(encoding="utf-8"))), encoding="utf-8")
        sets = [f"data.path={_q('x.txt')}"] if "translate" not in config.name else []
        toml_run, yaml_run = load_run_config(config, sets), load_run_config(as_yaml, sets)
        assert yaml_run.to_dict() == toml_run.to_dict(), config.name


@pytest.mark.parametrize("item, needle", [
    ("train.lr=1" + "0" * 400, "train.lr: 100000000000... is too large for a number"),  # OverflowError
    ("model.block_size=99999999999999999999", "does not fit in 64 bits; give an integer from -2**63 to 2**63 - 1"),
    ("train.out_dir=2024-01-01", "write it in double quotes (on the command line: --set train.out_dir='\"...\"')"),
    ("train.out_dir=1.10", "expected a string, got 1.1; write it in double quotes"),
    # one entry of an options table is set as model.attention_options.NAME=VALUE (test_config_audit5.py); deeper keys
    # are refused
    ("model.attention_options.window.size=4", "an options table holds single values; set one entry with --set "
                                              "model.attention_options.NAME=VALUE"),
])
def test_odd_set_values_get_one_line_with_the_fix(capsys, files, item, needle):
    assert needle in one_line_error(capsys, "train", "--set", item, *FAST)


def test_the_pydoc_config_is_the_default_run_written_out():
    # Both write runs/gpt-pydoc: the config held out 0.05 of the text where the default run holds out 0.1, so one
    # replaced the other with different numbers.
    from attnlab.training.recipe import load_run_config

    assert load_run_config(ROOT / "configs" / "gpt-pydoc.toml").to_dict() == load_run_config(None).to_dict()


def test_a_blank_evaluation_file_drops_the_configs_own():
    from attnlab.training.recipe import load_run_config

    run = load_run_config(ROOT / "configs" / "encoder-classify.toml", ['data.eval_path=""'])
    assert run.data.eval_path is None and run.data.path == "train.tsv"


def test_yaml_reads_numbers_as_toml_does_and_empty_sections(tmp_path):
    # PyYAML's YAML 1.1 read 3e-4 as a string ("train.lr: expected a number, got '3e-4'"), and a section with
    # nothing under it as None ("data = None is not a table of settings").
    from attnlab.training.recipe import load_run_config

    config = tmp_path / "run.yaml"
    config.write_text("model:\n  preset: gpt-char-tiny\n  position: sinusoidal\n  position_options: {base: 5e5}\n"
                      "data:\n  # nothing to change\ntrain:\n  lr: 3e-4\n  steps: 10\n  betas: [0.9, 0.95]\n"
                      "  out_dir: ._\n", encoding="utf-8")
    run = load_run_config(config)
    assert run.train.lr == 3e-4 and run.train.steps == 10 and isinstance(run.train.steps, int)
    assert run.model["position_options"] == {"base": 5e5} and run.data.task == "lm"
    assert run.train.out_dir == "._"  # a dot and an underscore: a name, not a number (it failed as float('.'))


def test_an_mlm_run_may_state_its_vocabulary_size():
    # Whether BERT predicts the next sentence is read before the tokenizer exists, from a config built with a
    # placeholder vocabulary of 1: a stated model.vocab_size, even the right one, was refused against it.
    from attnlab.training.recipe import _predicts_next_sentence, load_run_config

    run = load_run_config(ROOT / "configs" / "bert-mlm.toml", ["model.vocab_size=4000"])
    assert _predicts_next_sentence(run)


@pytest.mark.parametrize("family", ["gpt", "bert", "encoder", "transformer"])
@pytest.mark.parametrize("table, key", [("attention_options", "n_heads"), ("position_options", "max_len")])
def test_every_family_refuses_options_the_model_gives(family, table, key):
    # Only the GPT path was tested (its preset); BERT, the encoder and the Transformer check their tables too.
    import importlib

    from attnlab.errors import ConfigError

    module = importlib.import_module(f"attnlab.models.{family}")
    config_cls = {"gpt": "GPTConfig", "bert": "BertConfig", "encoder": "EncoderConfig",
                  "transformer": "TransformerConfig"}[family]
    with pytest.raises(ConfigError, match=f"model.{table} sets '{key}'.*drop it from model.{table}"):
        getattr(module, config_cls)(**{table: {key: 1}})


def test_an_empty_yaml_config_is_called_empty(capsys, tmp_path):
    # As an empty TOML file is: "is empty (no settings)", not "a YAML config is a mapping of sections".
    config = tmp_path / "run.yaml"
    config.write_text("# settings to come\n", encoding="utf-8")
    assert "is empty (no settings)" in one_line_error(capsys, "train", str(config))


@pytest.mark.parametrize("value", ["0x_", "0b_"])
def test_a_yaml_value_that_looks_like_a_number_prefix_is_text(tmp_path, value):
    # PyYAML's YAML 1.1 resolver took 0x_ for an integer, then int('', 16) failed: a ValueError traceback. As in
    # YAML 1.2, it is text.
    from attnlab.training.recipe import load_run_config

    config = tmp_path / "run.yaml"
    config.write_text(f"model:\n  preset: gpt-char-tiny\ntrain:\n  out_dir: {value}\n", encoding="utf-8")
    assert load_run_config(config).train.out_dir == value


def test_a_yml_config_is_read_as_yaml(tmp_path):
    from attnlab.training.recipe import load_run_config

    config = tmp_path / "run.yml"
    config.write_text("model:\n  preset: gpt-char-tiny\ntrain:\n  lr: 3e-4\n  steps: 10\n", encoding="utf-8")
    run = load_run_config(config)
    assert run.model["preset"] == "gpt-char-tiny" and run.train.lr == 3e-4 and run.train.steps == 10


def test_an_output_encoding_without_the_characters_gets_escapes_not_a_traceback():
    """PYTHONIOENCODING=ascii (or an old console): `params` died on its × column, `params --json` on a formula's
    ·, and `run knowledge` on its table's — after every phase had trained (UnicodeEncodeError, exit code 1)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    for args in (["params", "gpt-char-tiny"], ["params", "gpt-char-tiny", "--json"]):
        done = subprocess.run([sys.executable, "-m", "attnlab", *args], capture_output=True, text=True, env=env,
                              encoding="ascii", errors="strict", timeout=120)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
    assert json.loads(done.stdout)["total"] > 0  # --json: escaped as JSON, so still JSON


def test_a_reader_that_stops_early_gets_the_pipe_writers_exit_code(tmp_path, capsys):
    """`attnlab generate ... | head`: typer answered the broken pipe with exit code 1 (a bug's), which fails
    `set -o pipefail` scripts for a reader's choice; a pipe's writer exits 141 (SIGPIPE), quietly."""
    import os
    import subprocess
    import sys

    run = tmp_path / "run"
    assert run_cli(capsys, "train", "--set", "model.preset=\"gpt-char-tiny\"", "--set", "train.steps=1",
                   "--set", "train.progress=false", "--set", f"train.out_dir={_q(run)}")[0] == 0
    prompts = [arg for _ in range(3000) for arg in ("-p", "a" * 30)]  # ~100 KB of output: more than a pipe holds
    child = subprocess.Popen([sys.executable, "-m", "attnlab", "generate", str(run), "-n", "1", "--device", "cpu",
                              *prompts], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    child.stdout.read(5)
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait(timeout=300) == 141, err
    assert "Traceback" not in err


def test_a_broken_pipe_under_richs_help_screen_is_a_readers_exit_too(monkeypatch):
    """`attnlab --help | head`: rich answers the broken pipe itself (its Console.on_broken_pipe exits 1, outside
    click's quiet stdout wrapper), which the mapping to 141 missed."""
    import io
    import os
    import sys

    from rich.console import Console

    from attnlab.cli import _reader_went_away

    class Stdout(io.StringIO):
        def fileno(self) -> int:
            return 1

    monkeypatch.setattr(sys, "stdout", Stdout())
    monkeypatch.setattr(os, "dup2", lambda fd, fd2: None)  # rich points stdout at /dev/null before it exits
    with pytest.raises(SystemExit) as exited:
        Console(file=io.StringIO()).on_broken_pipe()
    assert exited.value.code == 1 and _reader_went_away(exited.value)
    with pytest.raises(SystemExit) as exited:
        sys.exit(1)
    assert not _reader_went_away(exited.value)  # any other exit 1 is left alone


@pytest.mark.parametrize("name, text, says", [
    ("run.toml", 'steps = 2\n[model]\npreset = "gpt-char-tiny"\n', "the setting 'steps' is outside any section; "
                                                                    "write it under the [train] header"),
    ("run.yaml", "train:\n  steps: 3\nblock_size: 4\n", "the setting 'block_size' is outside any section; write it "
                                                         "under the 'data:' line, indented"),
    ("run.toml", "d_model = 2\n", "the setting 'd_model' is outside any section; write it under the [...] header of "
                                  "its section (model, data, train)")])
def test_a_setting_above_every_section_is_named_as_a_setting(tmp_path, name, text, says):
    # It was called an unknown section ("unknown config section [steps]"; stop-39 CLI audit).
    from attnlab.training.recipe import load_run_config

    config = tmp_path / name
    config.write_text(text, encoding="utf-8")
    from attnlab.errors import ConfigError

    with pytest.raises(ConfigError, match=f"{re.escape(says)}$"):
        load_run_config(config)
