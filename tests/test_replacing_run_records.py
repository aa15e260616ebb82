"""A from-scratch run that replaces a trained run in its folder (DDP audit 6): the replaced run is kept whole or
replaced whole. A Ctrl-C or SIGTERM while this run's first save removed the old checkpoints was taken for one before
that save (the old checkpoint/ said kept beside this run's best/), or saved checkpoint/ and removed this run's best/
as the old run's; and a run kept at step 0 that had no run.json (trained in Python, or converted) was left with the
stopped run's, which `generate` and `evaluate` read for what its checkpoint lacks."""

from __future__ import annotations

import json
import os
import signal

import pytest
from test_trainer import config
from training_helpers import ToySource, tiny_model

from attnlab.errors import Terminated
from attnlab.training import Trainer, TrainingInterrupted
from attnlab.training import checkpoint as ckpt
from attnlab.training.checkpoint import read_trainer_state


def test_ctrl_c_while_the_first_save_removes_the_replaced_run_keeps_this_runs_best(tmp_path, monkeypatch):
    run = tmp_path / "run"
    Trainer(tiny_model(), config(steps=4, eval_every=2), ToySource(), eval_source=ToySource(), out_dir=run).fit()
    assert read_trainer_state(run / "best")["step"] == 4
    real = ckpt.remove_checkpoint

    def slow_remove(folder):  # Ctrl-C while the old checkpoint/ is being removed
        os.kill(os.getpid(), signal.SIGINT)
        return real(folder)

    monkeypatch.setattr(ckpt, "remove_checkpoint", slow_remove)
    # The first save of the new run is best/ at its step-2 evaluation; the old checkpoint/ is removed then.
    with pytest.raises(TrainingInterrupted, match="training interrupted at step 2 of 6; checkpoint saved in"):
        Trainer(tiny_model(seed=1), config(steps=6, eval_every=2), ToySource(seed=1), eval_source=ToySource(),
                out_dir=run).fit()
    assert read_trainer_state(run / "best")["step"] == 2  # this run's best/, not removed as the old run's
    assert read_trainer_state(run)["step"] == 2
    assert not (run / ".metrics.jsonl.replaced").exists()
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 2  # this run's records alone


@pytest.mark.parametrize("stop", [KeyboardInterrupt, Terminated])
def test_a_kept_run_without_a_run_json_is_not_left_with_the_stopped_runs(tmp_path, stop):
    run = tmp_path / "run"
    Trainer(tiny_model(), config(steps=3), ToySource(), out_dir=run).fit()  # Python: no run.json
    records = (run / "metrics.jsonl").read_text()

    class Stopped(ToySource):
        def batch(self, step):
            raise stop

    def describe():  # as `attnlab train` writes the settings of the run it starts
        (run / "run.json").write_text(json.dumps({"data": {"block_size": 4}}), encoding="utf-8")

    with pytest.raises(TrainingInterrupted, match="before this run's first save: nothing of it was saved"):
        Trainer(tiny_model(seed=1), config(steps=6), Stopped(seed=1), out_dir=run).fit(on_start=describe)
    assert not (run / "run.json").exists()
    assert (run / "metrics.jsonl").read_text() == records and read_trainer_state(run)["step"] == 3
