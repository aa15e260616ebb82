"""Under torchrun a diverged loss is every process's alike (the loss is summed over them, and each holds the same
weights): rank 0 alone says it, as for a refused setting. Every process printed it, rank 1's first, and rank 1 exiting
at once had torchrun stop rank 0 while it drew the loss curve (DDP audit 6)."""

from __future__ import annotations

import pytest
from cli_helpers import run_cli


def _train_fails_with(monkeypatch, error):
    from attnlab.training import recipe

    def failing(run, resume=False):
        raise error

    monkeypatch.setattr(recipe, "train_run", failing)


@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_diverged_loss_is_said_by_rank_0_alone_and_the_others_wait(capsys, monkeypatch, rank):
    import attnlab.cli as cli
    from attnlab.training.trainer import TrainingDiverged

    waits = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(cli.time, "sleep", lambda s: waits.append(s))
    _train_fails_with(monkeypatch, TrainingDiverged("the training loss became nan at step 4; lower train.lr"))
    code, _, err = run_cli(capsys, "train")
    assert code == 2
    if rank == "0":
        assert err == "attnlab: error: the training loss became nan at step 4; lower train.lr\n" and waits == []
    else:
        assert err == "" and waits == [cli.QUIET_RANK_WAIT_S]  # quiet, waiting for rank 0's line


def test_one_process_errors_are_still_said_by_each_rank_with_its_number(capsys, monkeypatch):
    from attnlab.errors import CheckpointError, DataError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    for error in (DataError("data file 'x.txt' is empty"), CheckpointError("checkpoint folder runs/x is corrupt")):
        _train_fails_with(monkeypatch, error)
        code, _, err = run_cli(capsys, "train")
        assert code == 2 and err.startswith("attnlab (rank 1): error: "), err
