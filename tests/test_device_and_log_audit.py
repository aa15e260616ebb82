"""Devices, precision and the run folder's log: what an audit of device selection and training logs found."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from cli_helpers import one_line_error, run_cli
from cli_helpers import toml_str as _q

TINY = ["--set", "train.progress=false", "--set", "train.device=cpu"]
LM = ["--set", "model.preset=gpt-char-tiny", "--set", "train.eval_every=0", "--set", "train.batch_size=4",
      "--set", "train.warmup_steps=0", *TINY]


def _digests(folder) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".attnlab.lock"}


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm") / "run"
    from cli_helpers import train_in_process

    train_in_process("--set", "train.steps=4", "--set", "train.precision=fp32", "--set", f"train.out_dir={_q(out)}",
                     *LM)
    return out


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_run_refused_for_its_device_writes_nothing(capsys, tmp_path, lm_run):
    # The device was checked by the trainer, after preparing had written the token files: a refused run replaced a
    # finished run's data/ (here with another split), and left a folder of token files where there was none.
    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    before = _digests(run)
    line = one_line_error(capsys, "train", "--set", "train.steps=4", "--set", f"train.out_dir={_q(run)}", *LM,
                          "--set", "train.device=cuda", "--set", "data.val_fraction=0.3")
    assert "cuda" in line.lower()
    assert _digests(run) == before
    fresh = tmp_path / "fresh"
    one_line_error(capsys, "train", "--set", "train.steps=4", "--set", f"train.out_dir={_q(fresh)}", *LM,
                   "--set", "train.device=cuda")
    assert not fresh.exists()


def test_a_run_diverging_before_its_first_record_leaves_no_other_runs_curve(capsys, tmp_path, lm_run):
    # The earlier run's loss.png stayed beside the new run.json and an empty metrics.jsonl, and the message called
    # the earlier run's checkpoint "the last checkpoint".
    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    assert (run / "loss.png").is_file()
    line = one_line_error(capsys, "train", "--set", "train.steps=20", "--set", "train.lr=1e6", "--set",
                          "train.grad_clip=0", "--set", "train.precision=fp32", "--set", f"train.out_dir={_q(run)}",
                          *LM)
    assert "the training loss became" in line and "(this run saved no checkpoint)" in line
    assert (run / "metrics.jsonl").read_text(encoding="utf-8") == "" and not (run / "loss.png").exists()


def test_a_resume_where_auto_precision_resolves_otherwise_is_named(capsys, tmp_path, monkeypatch):
    import attnlab.training.device as device

    out = tmp_path / "run"
    common = ["--set", f"train.out_dir={_q(out)}", "--set", "train.precision=auto", *LM]
    monkeypatch.setattr(device, "cpu_has_bf16", lambda: True)  # trained in bf16 ...
    code, _, err = run_cli(capsys, "train", "--set", "train.steps=2", *common)
    assert code == 0, err
    state = json.loads((out / "checkpoint" / "trainer_state.json").read_text(encoding="utf-8"))
    assert state["precision_used"] == "bf16"
    monkeypatch.setattr(device, "cpu_has_bf16", lambda: False)  # ... resumed on a CPU without bf16
    with pytest.warns(UserWarning, match=r"resuming with changed settings \(precision: train.precision = 'auto' "
                                         r"gives fp32 here, the run trained in bf16\)"):
        code, _, err = run_cli(capsys, "train", "--resume", "--set", "train.steps=3", *common)
    assert code == 0, err


@pytest.mark.parametrize("name", ["cpu:1", "mps:1", "cpu:0", "mps:0", "cuda:01", "cuda:N", "cuda:x", "cuda:-1"])
def test_only_a_gpu_is_taken_by_number(name):
    # cpu:1 ran on the CPU, mps:1 named a second Apple GPU, cuda:01 passed train.device's check and then failed
    # as no device name, and the literal cuda:N passed it too; cpu:0, taken by generate and refused by train.device
    # (after run knowledge had written its world), is refused by both.
    from attnlab.errors import ConfigError
    from attnlab.training.device import select_device
    from attnlab.training.trainer import TrainerConfig

    with pytest.raises(ConfigError, match=f"device: '{name}' is not a device name"):
        select_device(name)
    with pytest.raises(ConfigError, match="^device: "):
        TrainerConfig(device=name)
