"""Defects a review found in an interrupted session's work (per-step seeding, the error exit, numbers too large for
a float, distributed errors); each test fails without its fix."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from cli_helpers import one_line_error
from test_checkpoint_third_audit import _resume, finished  # noqa: F401 - a fixture

from attnlab.errors import CheckpointError

HUGE = 10**400  # a JSON integer beyond float's range: math.isfinite raises OverflowError on it


def test_seed_step_seeds_the_cpu_generator_as_manual_seed_would_without_calling_it(monkeypatch):
    from attnlab.training.trainer import seed_step

    # torch.manual_seed queues CUDA's seeding on every call where CUDA is not started, recording the caller's
    # stack: ~0.3-0.8 ms a training step on a CPU.
    monkeypatch.setattr(torch, "manual_seed", lambda seed: pytest.fail("seed_step called torch.manual_seed"))
    seed_step(3, 1, 7)
    drawn = torch.rand(4)
    words = np.random.SeedSequence([3, 1, 7]).generate_state(2, dtype=np.uint32)
    expected = torch.rand(4, generator=torch.Generator().manual_seed(int(words[0]) << 31 | int(words[1]) >> 1))
    assert torch.equal(drawn, expected)


def test_a_refused_command_line_does_not_import_torch():
    # Leaving a torchrun process group at exit needs the distributed module only where a command imported it.
    code = ("import sys\nfrom attnlab.cli import main\ntry:\n    main(['--bogus'])\nexcept SystemExit as e:\n"
            "    print(e.code, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False"], out.stdout + out.stderr


@pytest.mark.parametrize("entry, value", [("best_eval_loss", HUGE),
                                          ("best", {"metric": "loss", "value": HUGE, "step": 2})],
                         ids=["best_eval_loss", "best"])
def test_a_best_value_beyond_floats_range_is_refused_in_one_line(finished, entry, value):  # noqa: F811
    file = finished / "checkpoint" / "trainer_state.json"
    state = json.loads(file.read_text(encoding="utf-8"))
    state[entry] = value
    file.write_text(json.dumps(state), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"trainer_state.json is malformed \(best: "):  # was an OverflowError
        _resume(finished).fit()


@pytest.mark.parametrize("key", ["loss_sum", "seconds", "grad_norm"])
def test_a_log_window_number_beyond_floats_range_is_refused_in_one_line(finished, key):  # noqa: F811
    file = finished / "checkpoint" / "trainer_state.json"
    state = json.loads(file.read_text(encoding="utf-8"))
    state["log_window"] = {"global": True, "loss_sum": 1.0, "targets": 4, "tokens": 8, "seconds": 0.1, "steps": 1,
                           "grad_norm": 0.5, key: HUGE}
    file.write_text(json.dumps(state), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"trainer_state.json is malformed \(log_window: "):  # OverflowError
        _resume(finished).fit()


def test_the_loss_plot_skips_a_loss_beyond_floats_range(tmp_path):
    from attnlab.training.logging import plot_losses

    records = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": HUGE}, {"step": 3, "loss": True}]
    assert plot_losses(records, tmp_path / "loss.png") == tmp_path / "loss.png"


def test_a_float_option_beyond_floats_range_is_one_line(capsys, tmp_path):
    line = one_line_error(capsys, "train", "--set", "model.position=rotary",
                          "--set", f"model.position_options={{base={HUGE}}}",
                          "--set", f"train.out_dir={json.dumps(str(tmp_path / 'run'))}")
    assert line.startswith("attnlab: error: position 'rotary' option 'base' must be a finite number, got 1000")


def test_an_hf_config_number_beyond_floats_range_is_refused():
    from attnlab.convert.hf_folder import config_float

    with pytest.raises(CheckpointError, match=r"config.json: layer_norm_eps is 1000.*; it must be a number"):
        config_float({"layer_norm_eps": HUGE}, "layer_norm_eps", "config.json", 1e-5)


def test_a_distributed_error_keeps_its_own_first_line(monkeypatch, capsys):
    import torch.distributed as dist

    from attnlab import cli

    def fail(**kwargs):  # this process's own NCCL failure looks like a peer's from here: say what it was
        raise dist.DistBackendError("NCCL error in: init.cpp:12, invalid usage\nmore detail")

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(cli, "app", fail)
    line = one_line_error(capsys, "train")
    assert line == ("attnlab: error: another process of this distributed run stopped (its own message says why), "
                    "or this one could not reach it; this one stops too (here: NCCL error in: init.cpp:12, "
                    "invalid usage)")
