"""What a third pass over the README found in the trainer's messages: a diverged run was told to "enable
grad_clip or use precision = fp32" when it already did both, and a resume that trains nothing warned that the
schedule moves."""

from __future__ import annotations

import pytest
from test_training_audit import _config, _nan_loss_at_step
from training_helpers import ToySource

from attnlab.training import Trainer, TrainingDiverged


@pytest.mark.parametrize("settings, advice", [
    (dict(grad_clip=1.0, precision="fp32"), "; lower lr or raise warmup_steps ("),
    (dict(grad_clip=0.0, precision="fp32"), "; lower lr, raise warmup_steps or enable grad_clip ("),
    # (bf16 runs everywhere, emulated where the CPU lacks its instructions: the case is not skipped there)
    pytest.param(dict(grad_clip=1.0, precision="bf16"), '; lower lr, raise warmup_steps or use precision = "fp32" (',
                 marks=pytest.mark.filterwarnings("ignore::attnlab.training.device.SlowPrecisionWarning")),
])
def test_the_advice_leaves_out_what_the_run_already_does(tmp_path, settings, advice):
    with pytest.raises(TrainingDiverged) as caught:
        Trainer(_nan_loss_at_step(2), _config(steps=6, **settings), ToySource(), out_dir=tmp_path).fit()
    assert advice in str(caught.value), str(caught.value)


def test_a_resume_with_more_steps_that_trains_nothing_does_not_warn_of_the_schedule(tmp_path):
    # A run stopped early, resumed with a larger train.steps: "train.steps 20 → 40 moves the end of the cosine
    # decay (the learning rate goes ... at step 3)", then "nothing to train".
    import warnings

    from test_trainer import config

    def run(steps, resume=False):
        cfg = config(steps=steps, eval_every=1, early_stopping_patience=2, best_metric="score", best_mode="max",
                     schedule="cosine")
        return Trainer(_tiny(), cfg, ToySource(), out_dir=tmp_path, metrics_fn=lambda m: {"score": 1.0},
                       resume=resume).fit()

    assert run(20)["stopped_early"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = run(40, resume=True)
    assert summary["stopped_early"] and summary["steps"] == 3
    assert not [w for w in caught if "moves the end of the cosine decay" in str(w.message)]


def _tiny():
    from training_helpers import tiny_model

    return tiny_model()


def test_a_new_best_metric_lets_a_stopped_run_train_on_and_its_schedule_move_is_said(tmp_path):
    # The stopped run's count of evaluations without improvement silenced the schedule warning, then the new
    # best_metric reset it, and the run trained on with the decay moved and no word of it.
    import warnings

    from test_trainer import config

    def run(steps, metric, resume=False):
        cfg = config(steps=steps, eval_every=1, early_stopping_patience=2, best_metric=metric, best_mode="max",
                     schedule="cosine")
        return Trainer(_tiny(), cfg, ToySource(), out_dir=tmp_path, resume=resume,
                       metrics_fn=lambda m: {"score": 1.0, "other": 1.0}).fit()

    assert run(20, "score")["steps"] == 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run(40, "other", resume=True)["steps"] > 3
    assert any("moves the end of the cosine decay" in str(w.message) for w in caught)


@pytest.mark.parametrize("malformed", [None, 5])
def test_a_checkpoint_with_a_malformed_best_metric_resumes(tmp_path, malformed):
    import json

    from test_trainer import config

    Trainer(_tiny(), config(steps=2), ToySource(), out_dir=tmp_path).fit()
    path = tmp_path / "checkpoint" / "trainer_state.json"
    state = json.loads(path.read_text())
    state["trainer_config"]["best_metric"] = malformed  # an AttributeError traceback ('endswith')
    path.write_text(json.dumps(state))
    assert Trainer(_tiny(), config(steps=4), ToySource(), out_dir=tmp_path, resume=True).fit()["steps"] == 4
