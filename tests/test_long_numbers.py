"""A number of more than 4,300 digits in a file or setting. JSON, TOML and YAML read it as valid, and then Python
refuses to turn the digits into an int (a ValueError that is not their decode error): each was a traceback."""

from __future__ import annotations

import json
import shutil

import pytest
from cli_helpers import one_line_error, toml_str

from attnlab.errors import DataError

HUGE = "9" * 5000
SAYS = "a number of more than 4,300 digits"


def _train(out, *more: str) -> list[str]:
    return ["train", "--set", "model.preset=gpt-char-tiny", "--set", "model.block_size=16", "--set",
            "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu", "--set",
            "train.eval_every=0", "--set", "train.warmup_steps=0", "--set", f"train.out_dir={toml_str(out)}", *more]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from attnlab.cli import main

    out = tmp_path_factory.mktemp("long") / "run"
    main(_train(out, "--set", "train.steps=1"))
    return out


def test_in_a_set_override(capsys, tmp_path):
    line = one_line_error(capsys, *_train(tmp_path / "run", "--set", f"train.steps={HUGE}"))
    assert SAYS in line and "give a smaller number" in line and len(line) < 200


def test_in_an_experiment_setting(capsys):
    line = one_line_error(capsys, "run", "knowledge", "--set", f"pretrain_epochs={HUGE}")
    assert SAYS in line and len(line) < 200


@pytest.mark.parametrize("suffix, text", [(".toml", f"[train]\nsteps = {HUGE}\n"),
                                          (".yaml", f"train:\n  steps: {HUGE}\n")], ids=["toml", "yaml"])
def test_in_a_config_file(capsys, tmp_path, suffix, text):
    config = tmp_path / f"c{suffix}"
    config.write_text(text, encoding="utf-8")
    line = one_line_error(capsys, "train", str(config))
    assert line.startswith(f"attnlab: error: {config}: invalid ") and SAYS in line


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_in_a_checkpoint_file(capsys, tmp_path, tiny_run, name):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    file = run / "checkpoint" / name
    data = json.loads(file.read_text(encoding="utf-8"))
    file.write_text(json.dumps(data)[:-1] + f', "extra": {HUGE}}}', encoding="utf-8")
    line = one_line_error(capsys, "generate", str(run), "-p", "a", "-n", "2", "--device", "cpu")
    assert name in line and SAYS in line


def test_in_the_trainer_state_when_resuming(capsys, tmp_path, tiny_run):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (run / "checkpoint" / "trainer_state.json").write_text(f'{{"step": {HUGE}}}', encoding="utf-8")
    line = one_line_error(capsys, *_train(run, "--set", "train.steps=2", "--resume"))
    assert "trainer_state.json" in line and SAYS in line


def test_in_the_params_command(capsys, tmp_path):
    (tmp_path / "config.json").write_text(f'{{"family": "gpt", "vocab_size": {HUGE}}}', encoding="utf-8")
    line = one_line_error(capsys, "params", str(tmp_path))
    assert "not a readable JSON config" in line and SAYS in line


def test_a_metrics_line_is_skipped(tmp_path):
    from attnlab.training.logging import MetricsLog

    path = tmp_path / "metrics.jsonl"
    path.write_text(f'{{"step": 1, "loss": 2.0}}\n{{"step": {HUGE}}}\n{{"step": 2, "loss": 1.5}}\n', encoding="utf-8")
    assert [r["step"] for r in MetricsLog(path).read()] == [1, 2]


def test_in_a_jsonl_data_file_names_the_line(tmp_path):
    from attnlab.data.text_files import read_classification_file

    data = tmp_path / "d.jsonl"
    data.write_text(f'{{"text": "fine", "label": "a"}}\n{{"text": "long", "label": {HUGE}}}\n', encoding="utf-8")
    with pytest.raises(DataError, match=f"line 2: {SAYS}; fix the line"):
        read_classification_file(data, text_column="text", label_column="label")
