"""Found by the review of stop 46's own changes: Shaw relative positions rounded q·aᵀ to fp16 before scaling it (the
overflow fixed in the attention core), and a run started from a preset, resumed with a model.init_from, recorded an
init_from it never started from beside its preset."""

from __future__ import annotations

import json

import torch
from cli_helpers import run_cli
from cli_helpers import toml_str as _q

from attnlab.modules.positions import ShawRelativePosition


def test_shaw_scores_that_fit_once_scaled_stay_finite_in_fp16():
    d, h = 64, 2
    position = ShawRelativePosition(d_model=d * h, n_heads=h, max_distance=4)
    torch.manual_seed(0)
    with torch.no_grad():
        position.embedding.weight.normal_(30.0, 1.0)
    q = torch.full((1, h, 4, d), 40.0) + torch.randn(1, h, 4, d)
    positions = torch.arange(4)[None]
    exact = position.score_bias(q.double(), positions, positions, h)
    assert float(exact.max()) * 8 > 65504 > float(exact.max())  # q·aᵀ overflows fp16, q·aᵀ/√d does not
    half = position.score_bias(q.half(), positions, positions, h)
    assert torch.isfinite(half).all()
    torch.testing.assert_close(half.double(), exact, rtol=2e-3, atol=0)
    torch.testing.assert_close(position.score_bias(q, positions, positions, h).double(), exact, rtol=1e-6, atol=0)


def test_a_preset_run_resumed_with_init_from_records_its_preset_alone(capsys, tmp_path):
    base = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu",
            "--set", "train.warmup_steps=0", "--set", "train.eval_every=0"]
    pre, run = tmp_path / "pre", tmp_path / "run"
    for out in (pre, run):
        code, _, err = run_cli(capsys, "train", "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=1",
                               *base, "--set", f"train.out_dir={_q(out)}")
        assert code == 0, err
    code, _, err = run_cli(capsys, "train", "--set", f"model.init_from={_q(pre)}", "--set", "train.steps=2", *base,
                           "--set", f"train.out_dir={_q(run)}", "--resume")
    assert code == 0, err
    assert json.loads((run / "run.json").read_text(encoding="utf-8"))["model"] == {"preset": "gpt-char-tiny"}
