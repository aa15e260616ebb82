"""A run that diverges is told what to change, less what it already does: an fp32 run with gradient clipping
(the default) was told to "enable grad_clip or use precision = fp32"."""

from __future__ import annotations

import pytest
from test_training_audit import _config, _nan_loss_at_step
from training_helpers import ToySource

from attnlab.training import Trainer, TrainingDiverged
from attnlab.training.device import cpu_has_bf16


@pytest.mark.parametrize("settings, advice", [
    (dict(grad_clip=1.0, precision="fp32"), "; lower lr or raise warmup_steps ("),
    (dict(grad_clip=0.0, precision="fp32"), "; lower lr, raise warmup_steps or enable grad_clip ("),
    pytest.param(dict(grad_clip=1.0, precision="bf16"), '; lower lr, raise warmup_steps or use precision = "fp32" (',
                 marks=pytest.mark.skipif(not cpu_has_bf16(), reason="bf16 training needs a CPU with bf16")),
])
def test_the_advice_leaves_out_what_the_run_already_does(tmp_path, settings, advice):
    with pytest.raises(TrainingDiverged) as caught:
        Trainer(_nan_loss_at_step(2), _config(steps=6, **settings), ToySource(), out_dir=tmp_path).fit()
    assert advice in str(caught.value), str(caught.value)
