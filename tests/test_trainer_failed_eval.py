"""An evaluation that fails keeps the steps trained (stop 43, training-engine and Python API audits): with the
default eval_every = 0 the only evaluation comes after the last step, and a metrics function's error, an evaluation
batch without labels or a misspelt best_metric there lost the whole run (no checkpoint written). A best_metric that
an eval source alone cannot give is now refused before training, and early stopping that cannot act is warned of."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from training_helpers import ToySource, tiny_model

from attnlab.errors import ConfigError, DataError
from attnlab.training import Trainer, TrainerConfig
from attnlab.training.checkpoint import load_model

NOTES = pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11's")


def _config(**changes):
    return TrainerConfig(**{"steps": 4, "batch_size": 8, "lr": 1e-2, "warmup_steps": 0, "progress": False,
                            "device": "cpu", "precision": "fp32", **changes})


class Flaky:
    """A metrics function that fails until told to work."""

    def __init__(self):
        self.works = False

    def __call__(self, model):
        if not self.works:
            raise ZeroDivisionError("division by zero in the user's metric")
        return {"score": 1.0}


@NOTES
@pytest.mark.parametrize("eval_every", [0, 2])
def test_a_failing_evaluation_saves_the_steps_trained_and_the_resume_redoes_it(tmp_path, eval_every):
    metric = Flaky()
    trainer = Trainer(tiny_model(), _config(eval_every=eval_every), ToySource(), eval_source=ToySource(),
                      metrics_fn=metric, out_dir=tmp_path / "run")
    with pytest.raises(ZeroDivisionError) as info:
        trainer.fit()
    step = eval_every or 4
    assert info.value.__notes__ == [f"the {step} steps trained are saved in {tmp_path / 'run' / 'checkpoint'}, with "
                                    "this evaluation to redo: fix it and resume"]
    for name, value in load_model(tmp_path / "run").state_dict().items():
        torch.testing.assert_close(value, trainer.model.state_dict()[name], rtol=0, atol=0, msg=name)
    metric.works = True
    resumed = Trainer(tiny_model(seed=1), _config(eval_every=eval_every), ToySource(), eval_source=ToySource(),
                      metrics_fn=metric, out_dir=tmp_path / "run", resume=True)
    summary = resumed.fit()
    assert summary["start_step"] == step and summary["redid_eval"] and summary["steps"] == 4
    assert summary["final_eval"]["score"] == 1.0

    # the same run without the failure ends with the same weights
    metric = Flaky()
    metric.works = True
    whole = Trainer(tiny_model(), _config(eval_every=eval_every), ToySource(), eval_source=ToySource(),
                    metrics_fn=metric, out_dir=tmp_path / "whole")
    whole.fit()
    for name, value in whole.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[name], value, rtol=0, atol=0, msg=name)


def test_a_best_metric_an_eval_source_alone_cannot_give_is_refused_before_training(tmp_path):
    trainer = Trainer(tiny_model(), _config(best_metric="acuracy", best_mode="max"), ToySource(),
                      eval_source=ToySource(), out_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"^best_metric 'acuracy' is not a metric this run evaluates"):
        trainer.fit()
    assert trainer.step == 0 and not (tmp_path / "run" / "checkpoint").exists()


def test_early_stopping_on_the_default_best_metric_with_only_a_metrics_function_is_warned_of(tmp_path):
    trainer = Trainer(tiny_model(), _config(eval_every=1, early_stopping_patience=2), ToySource(),
                      metrics_fn=lambda model: {"accuracy": 50.0}, out_dir=tmp_path / "run")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit()
    said = [str(w.message) for w in caught if "early_stopping_patience" in str(w.message)]
    assert said == ["train.early_stopping_patience = 2 cannot stop this run: only metrics_fn evaluates it, and "
                    "best_metric = 'loss' is none of its values (accuracy); set best_metric to one of them (and "
                    "best_mode), or give an eval_source"]


def test_early_stopping_on_a_loss_a_metrics_function_gives_is_not_warned_of_and_stops(tmp_path):
    losses = iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    trainer = Trainer(tiny_model(), _config(steps=6, eval_every=1, early_stopping_patience=2), ToySource(),
                      metrics_fn=lambda model: {"loss": next(losses)}, out_dir=tmp_path / "run")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = trainer.fit()
    assert not [w for w in caught if "early_stopping_patience" in str(w.message)]
    assert summary["stopped_early"] and summary["steps"] == 3


KEPT = "the 4 steps trained are saved in runs/x/checkpoint, with this evaluation to redo: fix it and resume"


@NOTES
@pytest.mark.parametrize("error, begins", [
    (DataError("the model returned no loss for an evaluation batch"),
     "attnlab: error: the model returned no loss for an evaluation batch; "),
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), "attnlab: error: out of memory; "),
], ids=["attnlab-error", "out-of-memory"])
def test_the_command_line_adds_what_was_kept_to_its_one_line(capsys, monkeypatch, error, begins):
    from cli_helpers import one_line_error

    from attnlab.training import recipe

    def failing(run, resume=False):
        error.add_note(KEPT)
        raise error

    monkeypatch.setattr(recipe, "train_run", failing)
    line = one_line_error(capsys, "train")
    assert line.startswith(begins) and line.endswith(f"; {KEPT}"), line
