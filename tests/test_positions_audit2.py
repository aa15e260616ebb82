"""Position schemes, second audit (stop 43): a model taken to bf16 and back to fp32 kept bf16-rounded tables of
its computed positions (sinusoidal, rotary, ALiBi), so the same offset scored differently inside the table and
beyond it, where positions are computed afresh. Every conversion to a float dtype now recomputes them."""

from __future__ import annotations

import pytest
import torch

from attnlab.modules.positions import build_position


@pytest.mark.parametrize("name", ["sinusoidal", "rotary", "alibi"])
def test_a_bf16_round_trip_gives_back_the_exact_tables(name):
    scheme = build_position(name, d_model=48, n_heads=12, max_len=64, causal=True)  # 12: slopes 2^-0.5...
    fresh = {key: getattr(scheme, key).clone() for key in scheme.computed_buffers}
    scheme.to(torch.bfloat16)
    assert all(getattr(scheme, key).dtype == torch.bfloat16 for key in fresh)
    scheme.to(torch.float32)
    for key, value in fresh.items():
        assert getattr(scheme, key).dtype == torch.float32
        torch.testing.assert_close(getattr(scheme, key), value, rtol=0, atol=0, msg=key)


def test_rotary_scores_one_offset_alike_across_the_tables_end_after_a_round_trip():
    scheme = build_position("rotary", d_model=24, n_heads=6, max_len=8, causal=True).to(torch.bfloat16).float()
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 4), torch.randn(1, 1, 1, 4)

    def score(i, j):
        return (scheme.rotate_q(q, torch.tensor([[i]])) * scheme.rotate_k(k, torch.tensor([[j]]))).sum()

    torch.testing.assert_close(score(7, 6), score(9, 8), rtol=0, atol=1e-6)  # inside the table, beyond it
