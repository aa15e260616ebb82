"""Interrupts from the sixth training-engine audit: a Ctrl-C (or SIGTERM) before a run's first step no longer
replaces the trained run in its folder with an untrained one, and a Ctrl-C while a run that stopped early writes its
checkpoint says it stopped early (it told the user to --resume a run that has nothing left to train)."""

from __future__ import annotations

import json
import signal

import pytest
from cli_helpers import run_cli
from cli_helpers import toml_str as _q
from test_trainer import config
from training_helpers import ToySource, tiny_model

from attnlab.errors import Terminated
from attnlab.training import Trainer, TrainingInterrupted
from attnlab.training.checkpoint import read_trainer_state


@pytest.mark.parametrize("stop", [KeyboardInterrupt, Terminated])
def test_stopping_a_replacing_run_before_its_first_step_keeps_the_trained_run(tmp_path, stop):
    run = tmp_path / "run"
    Trainer(tiny_model(), config(steps=3), ToySource(), out_dir=run).fit()
    before = (run / "checkpoint" / "model.safetensors").read_bytes()
    records = (run / "metrics.jsonl").read_text()

    class Stopped(ToySource):
        def batch(self, step):
            raise stop  # inside the first step: nothing of the new run is trained

    with pytest.raises(TrainingInterrupted) as info:
        Trainer(tiny_model(seed=1), config(steps=6), Stopped(seed=1), out_dir=run).fit()
    assert "training interrupted at step 0 of 6, before this run's first save: nothing of it was saved, and the " \
           "run it was replacing in" in str(info.value)
    assert (run / "checkpoint" / "model.safetensors").read_bytes() == before
    assert read_trainer_state(run)["step"] == 3
    # its records are back in place (the new run's log had replaced them), and so is its loss curve
    assert (run / "metrics.jsonl").read_text() == records and not (run / ".metrics.jsonl.replaced").exists()
    assert (run / "loss.png").is_file()
    # --resume continues the kept run, with its records
    with pytest.warns(UserWarning, match="train.steps 3 → 4 moves the end of the cosine decay"):
        summary = Trainer(tiny_model(seed=1), config(steps=4), ToySource(), out_dir=run).fit(resume=True)
    assert summary["start_step"] == 3 and summary["steps"] == 4
    assert (run / "metrics.jsonl").read_text().startswith(records)


def test_a_replacing_run_stopped_after_a_step_saves_itself(tmp_path):
    # After a step the new run has weights of its own: Ctrl-C saves them (as before), replacing the old run.
    run = tmp_path / "run"
    Trainer(tiny_model(), config(steps=3), ToySource(), out_dir=run).fit()

    class Stopped(ToySource):
        def batch(self, step):
            if step == 1:
                raise KeyboardInterrupt
            return super().batch(step)

    with pytest.raises(TrainingInterrupted, match="training interrupted at step 1 of 6; checkpoint saved in"):
        Trainer(tiny_model(seed=1), config(steps=6), Stopped(seed=1), out_dir=run).fit()
    assert read_trainer_state(run)["step"] == 1 and not (run / ".metrics.jsonl.replaced").exists()


TINY = ["--set", "model.preset=gpt-char-tiny", "--set", "train.steps=12", "--set", "train.eval_every=1",
        "--set", "train.early_stopping_patience=2", "--set", "train.progress=false", "--set", "train.precision=fp32",
        "--set", "train.device=cpu", "--set", "train.warmup_steps=1"]


@pytest.mark.parametrize("during", ["save", "_plot"])
def test_ctrl_c_while_a_run_that_stopped_early_writes_its_files(capsys, tmp_path, monkeypatch, during):
    from attnlab.training import trainer as trainer_module

    losses = iter([2.0, 1.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    monkeypatch.setattr(trainer_module.Trainer, "evaluate", lambda self, *a, **k: {"loss": next(losses)})
    original = getattr(Trainer, during)

    def pressed(self, *args, **kwargs):
        if self.step == 4:  # the save of the early stop (evaluations 3 and 4 were no better), or the plot after it
            signal.raise_signal(signal.SIGINT)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, during, pressed)
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", *TINY, "--set", f"train.out_dir={_q(out)}")
    assert code == 130, err
    lines = [line for line in err.splitlines() if line.startswith("attnlab:") and "warning" not in line]
    assert lines == ["attnlab: training stopped early at step 4 of 12 (no better evaluation in "
                     "train.early_stopping_patience evaluations), interrupted before its summary; checkpoint saved "
                     f"in {out / 'checkpoint'}"], err
    assert json.loads((out / "checkpoint" / "trainer_state.json").read_text())["step"] == 4


def test_ctrl_c_while_a_resumed_run_saves_its_redone_last_evaluation(capsys, tmp_path, monkeypatch):
    # A run stopped inside its last step's evaluation redoes it when resumed; a Ctrl-C in the save after that told
    # the user to --resume a run with nothing left to train (the redone evaluation was still counted as pending).
    out = tmp_path / "run"
    args = ["train", "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=3", "--set", "train.eval_every=1",
            "--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu",
            "--set", "train.warmup_steps=1", "--set", f"train.out_dir={_q(out)}"]
    evaluate, save = Trainer.evaluate, Trainer.save

    def stopped_in_last_eval(self, *a, **k):
        if self.step == 3:
            raise KeyboardInterrupt
        return evaluate(self, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(Trainer, "evaluate", stopped_in_last_eval)
        assert run_cli(capsys, *args)[0] == 130
    assert json.loads((out / "checkpoint" / "trainer_state.json").read_text()).get("eval_pending")

    def pressed(self, *a, **k):
        signal.raise_signal(signal.SIGINT)
        return save(self, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(Trainer, "save", pressed)
        code, _, err = run_cli(capsys, *args, "--resume")
    assert code == 130, err
    lines = [line for line in err.splitlines() if line.startswith("attnlab:") and "warning" not in line]
    assert lines == [f"attnlab: training finished at step 3 (the last), interrupted before its summary; checkpoint "
                     f"saved in {out / 'checkpoint'}"], err
