"""Second attention-core audit: in half precision the explicit path (asked for weights, or with dropout) rounded
the unscaled q·kᵀ to fp16 before scaling it, so a score that fits once scaled overflowed to inf and the output was
NaN, where the default path and torch's SDPA scale inside the product and stay finite."""

from __future__ import annotations

import pytest
import torch

from attnlab.modules.attention import attention


def _large_scores(dtype):
    torch.manual_seed(0)
    d = 64
    q = torch.full((1, 2, 4, d), 40.0)
    k = torch.full((1, 2, 4, d), 30.0) + torch.randn(1, 2, 4, d)
    v = torch.randn(1, 2, 4, d)
    assert float((q @ k.transpose(-1, -2)).max()) > 65504 > float((q @ k.transpose(-1, -2)).max()) / d**0.5
    return (x.to(dtype) for x in (q, k, v))


def test_weights_of_large_fp16_scores_are_finite_and_equal_the_default_paths():
    q, k, v = _large_scores(torch.float16)
    expected, _ = attention(q, k, v)
    reference = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 8, -1) @ v.double()
    out, weights = attention(q, k, v, need_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    torch.testing.assert_close(out, expected, atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(out.double(), reference, atol=5e-3, rtol=5e-3)
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)), atol=2e-3, rtol=0)


def test_dropout_on_large_fp16_scores_stays_finite():
    q, k, v = (x.repeat(1, 1, 256, 1) for x in _large_scores(torch.float16))
    torch.manual_seed(1)
    out, _ = attention(q, k, v, dropout=0.1)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_weights_path_still_equals_the_fused_one(dtype):
    torch.manual_seed(2)
    q, k, v = (torch.randn(2, 3, 7, 16, dtype=dtype) for _ in range(3))
    fused, _ = attention(q, k, v)
    explicit, weights = attention(q, k, v, need_weights=True)
    torch.testing.assert_close(explicit, fused)
    torch.testing.assert_close(weights, torch.softmax(q @ k.transpose(-1, -2) / 4, -1))


@pytest.mark.parametrize(("args", "said"), [
    ({"n_heads": 0}, "n_heads must be a whole number of at least 1, got 0"),
    ({"n_heads": -4}, "n_heads must be a whole number of at least 1, got -4"),
    ({"n_heads": 4, "dropout": -0.5}, "dropout is a probability from 0 up to (not including) 1, got -0.5"),
    ({"n_heads": 4, "dropout": 1.5}, "dropout is a probability from 0 up to (not including) 1, got 1.5"),
])
def test_a_hand_built_attention_module_refuses_impossible_arguments_in_one_line(args, said):
    # (Python API audit 4) 0 heads divided by zero, -4 and -0.5 failed later in torch's words, 1.5 at the first step
    from attnlab.errors import ConfigError
    from attnlab.modules.attention import MultiHeadAttention

    with pytest.raises(ConfigError) as caught:
        MultiHeadAttention(16, **args)
    assert str(caught.value) == said
