"""A Ctrl-C after the last step, while the run writes its last checkpoint and its loss plot: it cut them (the
plot was gone, the final save lost the steps since the last checkpoint) and the finished run was reported only as
"attnlab: interrupted". Now the writes finish and the one line says the run finished."""

from __future__ import annotations

import json
import signal

import pytest
from cli_helpers import run_cli
from cli_helpers import toml_str as _q

from attnlab.training.trainer import Trainer

TINY = ["--set", "model.preset=gpt-char-tiny", "--set", "train.steps=6", "--set", "train.save_every=4",
        "--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu",
        "--set", "data.val_fraction=0", "--set", "train.warmup_steps=1"]


@pytest.mark.parametrize("during", ["save", "_plot"])
def test_ctrl_c_while_a_finished_run_writes_its_last_files(capsys, tmp_path, monkeypatch, during):
    original = getattr(Trainer, during)
    calls = []

    def pressed(self, *args, **kwargs):
        calls.append(self.step)
        if self.step == 6:  # the final save (step 6, after the one at step 4) or the final plot
            signal.raise_signal(signal.SIGINT)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, during, pressed)
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", *TINY, "--set", f"train.out_dir={_q(out)}")
    assert code == 130, err
    lines = [line for line in err.splitlines() if line.startswith("attnlab:") and "warning" not in line]
    assert lines == [f"attnlab: training finished at step 6 (the last), interrupted before its summary; checkpoint "
                     f"saved in {out / 'checkpoint'}"], err
    assert json.loads((out / "checkpoint" / "trainer_state.json").read_text())["step"] == 6
    assert (out / "loss.png").is_file()


def test_a_log_window_of_one_process_share_is_said_to_be_dropped_on_resume(capsys, tmp_path, monkeypatch):
    # A distributed run stopped by Ctrl-C saves without gathering: its window's loss is rank 0's share alone, which
    # the resume drops; the record closing that window then covered fewer steps than it claimed, without a word.
    out = tmp_path / "run"
    args = ["train", "--set", "model.preset=gpt-char-tiny", "--set", "train.log_every=3", "--set", "train.steps=8",
            *TINY[6:], "--set", f"train.out_dir={_q(out)}"]
    step = Trainer._train_step

    def pressed(self, *a, **k):
        if self.step == 5:
            signal.raise_signal(signal.SIGINT)
        return step(self, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(Trainer, "_train_step", pressed)
        assert run_cli(capsys, *args)[0] == 130
    path = out / "checkpoint" / "trainer_state.json"
    state = json.loads(path.read_text())
    assert state["step"] == 5 and state["log_window"]["steps"] == 2 and state["log_window"].get("global")
    del state["log_window"]["global"]
    state["world_size"] = 2  # as a two-process run interrupted between two records saves it
    path.write_text(json.dumps(state))
    with pytest.warns(UserWarning, match="the next training record covers only the steps after 5: the loss of steps "
                                         "4 to 5 was interrupted with each process holding its own share"):
        assert run_cli(capsys, *args, "--resume")[0] == 0


def test_the_summary_says_a_run_stopped_early_and_which_step_best_holds(capsys, tmp_path, monkeypatch):
    # The summary's stopped_early and best were dropped from the line: a run that stopped early read as a whole one,
    # and best_eval_loss as the loss of best/.
    from attnlab.training import trainer as trainer_module

    losses = iter([2.0, 1.0, 3.0, 4.0, 5.0, 6.0])

    def evaluate(self, *args, **kwargs):  # evaluations that get worse after the second
        return {"loss": next(losses)}

    monkeypatch.setattr(trainer_module.Trainer, "evaluate", evaluate)
    out = tmp_path / "run"
    code, printed, err = run_cli(capsys, "train", "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=20",
                                 "--set", "train.eval_every=2", "--set", "train.early_stopping_patience=2",
                                 *TINY[6:12], "--set", "data.val_fraction=0.1",
                                 "--set", f"train.out_dir={_q(out)}")
    assert code == 0, err
    assert "stopped early at step 8 of 20: no better evaluation in train.early_stopping_patience = 2" in printed
    assert "best/: step 4, loss 1\n" in printed
