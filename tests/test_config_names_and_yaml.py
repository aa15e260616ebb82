"""Config reading found by the stop-31 audit: names that YAML reads as numbers, booleans or null; YAML 1.1's
octal, base-60, yes/no and date readings; and an evaluation limit beyond islice's range."""

from __future__ import annotations

import pytest
from cli_helpers import one_line_error, run_cli, toml_str


@pytest.mark.parametrize("text, where", [
    ("model:\n  preset: gpt-char-tiny\ntrain:\n  1: 2\n", "train"),
    ("model:\n  preset: gpt-char-tiny\n  true: 3\n", "model"),
    ("model:\n  preset: gpt-char-tiny\ndata:\n  null: 3\n", "data"),
    ("model:\n  preset: gpt-char-tiny\n  attention_options: {1: 2}\n", "model.attention_options"),
    ("model:\n  preset: gpt-char-tiny\n  position_options: {0.5: 2}\n", "model.position_options"),
])
def test_a_yaml_name_that_is_not_text_gets_one_line(capsys, tmp_path, text, where):
    # Each was a traceback with exit code 1 (difflib on an int, or "keywords must be strings" in the model).
    config = tmp_path / "run.yaml"
    config.write_text(text, encoding="utf-8")
    line = one_line_error(capsys, "train", str(config))
    assert f"under {where} is not text" in line and "setting's name" in line


def test_yaml_numbers_booleans_and_dates_are_read_as_yaml_1_2_and_toml_read_them(tmp_path):
    from attnlab.training.recipe import load_run_config

    config = tmp_path / "run.yaml"
    config.write_text("model:\n  preset: gpt-char-tiny\ntrain:\n  seed: 010\n  steps: 1_000\n  eval_every: 0x10\n"
                      "  save_every: 0o10\n  progress: false\n  out_dir: 2024-01-05\n", encoding="utf-8")
    run = load_run_config(config)
    # YAML 1.1 (PyYAML's own reading) gave seed 8 (octal) and a datetime.date for the folder.
    assert (run.train.seed, run.train.steps, run.train.eval_every, run.train.save_every) == (10, 1000, 16, 8)
    assert run.train.out_dir == "2024-01-05" and run.train.progress is False


@pytest.mark.parametrize("value", ["1:30", "yes", "on"])
def test_yaml_1_1_base_60_and_yes_no_are_text_that_the_setting_refuses(capsys, tmp_path, value):
    # 1:30 was silently 90 steps of warmup; yes/on were true.
    config = tmp_path / "run.yaml"
    config.write_text(f"model:\n  preset: gpt-char-tiny\ntrain:\n  warmup_steps: {value}\n", encoding="utf-8")
    line = one_line_error(capsys, "train", str(config))
    assert "train.warmup_steps" in line and repr(value) in line


def test_an_evaluation_limit_beyond_islice_with_micro_batches_trains(capsys, tmp_path):
    # eval_batches × (batch_size / micro_batch_size) passed sys.maxsize: a ValueError at the first evaluation.
    code, _, err = run_cli(capsys, "train", "--set", "model.preset=\"gpt-char-tiny\"", "--set", "train.steps=2",
                           "--set", "train.batch_size=4", "--set", "train.micro_batch_size=2",
                           "--set", "train.eval_every=2", "--set", f"train.eval_batches={2**63 - 1}",
                           "--set", "train.progress=false", "--set", "train.device=\"cpu\"",
                           "--set", f"train.out_dir={toml_str(tmp_path / 'run')}")
    assert code == 0, err
    assert (tmp_path / "run" / "checkpoint").is_dir()


def test_a_yaml_config_holding_itself_through_an_alias_is_checked_once(capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("model:\n  preset: gpt-char-tiny\n  attention_options: &a {x: [*a]}\n", encoding="utf-8")
    assert "has no option 'x'" in one_line_error(capsys, "train", str(config))


@pytest.mark.parametrize("task, value", [("lm", ""), ("lm", " null"), ("mlm", " ~")])
def test_a_yaml_text_file_with_no_value_is_refused_as_empty(capsys, tmp_path, task, value):
    # `path:` left blank is None in YAML: the run trained on the embedded pydoc texts without a word (stop 43).
    preset = {"lm": "gpt-char-tiny", "mlm": "bert-tiny"}[task]
    config = tmp_path / "run.yaml"
    config.write_text(f"model:\n  preset: {preset}\ndata:\n  task: {task}\n  path:{value}\ntrain:\n  steps: 1\n"
                      f"  out_dir: {toml_str(tmp_path / 'run')}\n", encoding="utf-8")
    line = one_line_error(capsys, "train", str(config))
    assert "error: data.path is empty; give a file name, or leave it out for the embedded pydoc texts" in line


def test_a_yaml_evaluation_file_with_no_value_is_none(tmp_path):
    from attnlab.training.recipe import load_run_config

    config = tmp_path / "run.yaml"
    config.write_text("model:\n  preset: gpt-char-tiny\ndata:\n  eval_path:\n", encoding="utf-8")
    assert load_run_config(config).data.eval_path is None and load_run_config(config).data.path is None
