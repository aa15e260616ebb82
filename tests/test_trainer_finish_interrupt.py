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
