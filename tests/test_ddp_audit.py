"""Distributed settings found wrong by an audit: each was a traceback before its fix."""

from __future__ import annotations

import pytest
import torch
from training_helpers import ToySource, ddp_trainer_config, tiny_model

from attnlab.errors import ConfigError
from attnlab.training import Trainer
from attnlab.training.distributed import World


@pytest.mark.parametrize("batch, micro, message", [
    (1, None, r"batch_size \(1\) must be a multiple of the 2 processes"),  # was a ZeroDivisionError
    (7, None, r"batch_size \(7\) must be a multiple of the 2 processes"),  # named a micro_batch_size never set
    (6, 2, r"batch_size \(6\) must be divisible by micro_batch_size \(2\) × processes \(2\)"),
])
def test_a_global_batch_the_processes_cannot_share_is_one_line(monkeypatch, tmp_path, batch, micro, message):
    monkeypatch.setattr("attnlab.training.trainer.init_distributed",
                        lambda device: (World(rank=0, size=2), torch.device("cpu")))
    with pytest.raises(ConfigError, match=message):
        Trainer(tiny_model(), ddp_trainer_config(batch_size=batch, micro_batch_size=micro), ToySource(),
                out_dir=tmp_path)


def test_world_size_set_without_torchrun_is_one_line(monkeypatch):
    from attnlab.training.distributed import init_distributed

    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"WORLD_SIZE=2 but the process group cannot start .*MASTER_ADDR.*; "
                                          r"launch distributed runs with torchrun, or unset WORLD_SIZE"):
        init_distributed("cpu")


def test_the_knowledge_experiment_under_torchrun_is_refused_in_one_line(monkeypatch, capsys, tmp_path):
    from cli_helpers import one_line_error

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")  # every process wrote the same outputs and printed the same table
    line = one_line_error(capsys, "run", "knowledge", "-o", str(tmp_path / "k"))
    assert line == "attnlab: error: attnlab run knowledge runs in one process; run it without torchrun"
    assert not (tmp_path / "k").exists()
