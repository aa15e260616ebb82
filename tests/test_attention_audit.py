"""Defects an audit of the attention core found (each test failed before its fix)."""

from __future__ import annotations

import pytest
import torch

import attnlab.modules.attention as attention_module
from attnlab.modules.attention import attention


def _reference(q, k, v, mask=None, causal=False):
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores + (mask.double() if mask.dtype != torch.bool else
                           torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf")))
    if causal:
        t, s = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(t, s, dtype=torch.bool).triu(s - t + 1), float("-inf"))
    return torch.softmax(scores, -1) @ v


def test_a_training_call_after_one_in_inference_mode(monkeypatch):
    # The blocked path's kept scratch buffer (and cached causal mask), first made under torch.inference_mode (an
    # evaluation), were inference tensors: every later bf16 training call failed with "Inplace update to inference
    # tensor outside InferenceMode is not allowed".
    monkeypatch.setattr(attention_module._scratch, "buffers", {}, raising=False)
    attention_module._causal_additive.cache_clear()
    q, k, v = (torch.randn(2, 2, 16, 8, dtype=torch.bfloat16) for _ in range(3))
    with torch.inference_mode():
        attention(q, k, v, causal=True)
    grad_q = q.clone().requires_grad_()
    out, _ = attention(grad_q, k, v, causal=True)
    out.float().sum().backward()
    torch.testing.assert_close(out.double(), _reference(q, k, v, causal=True), atol=2e-2, rtol=2e-2)
    assert grad_q.grad is not None and bool(torch.isfinite(grad_q.grad).all())


@pytest.mark.parametrize("dtype, onednn", [(torch.bfloat16, False), (torch.float32, True)])
@pytest.mark.parametrize("masked", [False, True])
def test_an_empty_batch_on_the_blocked_path(monkeypatch, dtype, onednn, masked):
    # "cannot reshape tensor of 0 elements into shape [0, 2, 4, -1]" in the backward (with a mask, the forward).
    if onednn:
        monkeypatch.setattr(attention_module, "onednn_fp32_matmul_on", lambda: True)
    q, k, v = (torch.randn(0, 2, 4, 8, dtype=dtype, requires_grad=True) for _ in range(3))
    mask = torch.ones(0, 1, 1, 4, dtype=torch.bool) if masked else None
    out, _ = attention(q, k, v, mask=mask, causal=True)
    out.sum().backward()
    assert out.shape == (0, 2, 4, 8) and q.grad.shape == q.shape


@pytest.mark.parametrize("mask_dtype", [torch.float64, torch.float16])
def test_a_float_mask_of_another_dtype_on_the_fused_path(mask_dtype):
    # The fused kernel refused it ("Expected attn_mask dtype to be bool or float or to match query dtype") where
    # the explicit and blocked paths cast it: the same call worked or failed by the dispatcher's choice.
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    keep = torch.rand(2, 1, 1, 6) > 0.3
    keep[..., 0] = True
    mask = torch.zeros(2, 1, 1, 6, dtype=mask_dtype).masked_fill(~keep, float("-inf"))
    out, _ = attention(q, k, v, mask=mask)
    torch.testing.assert_close(out.double(), _reference(q, k, v, mask=mask.double()), atol=1e-5, rtol=1e-5)


def test_a_one_dimensional_mask_is_read_alike_by_every_path():
    # (S,) broadcasts to (B, H, T, S); the fused path failed with an IndexError.
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 4, 8) for _ in range(3))
    mask = torch.tensor([True, True, False, True])
    expected = _reference(q, k, v, mask=mask)
    for need_weights in (False, True):
        out, _ = attention(q, k, v, mask=mask, need_weights=need_weights)
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_bilinear_from_dot_keeps_a_float64_layer_exact():
    # Built in the default dtype, the merged layer rounded a float64 product to float32 (scores 1.6e-7 apart).
    from attnlab.modules.variants import DotScores, bilinear_from_dot

    torch.manual_seed(0)
    dot = DotScores(d_model=36, n_heads=3).double()
    merged = bilinear_from_dot(dot)
    assert merged.weight.dtype == torch.float64 and merged.key_bias.dtype == torch.float64
    x, y = torch.randn(2, 5, 36, dtype=torch.float64), torch.randn(2, 7, 36, dtype=torch.float64)
    a = dot.queries(x, None) @ dot.keys(y, None).transpose(-1, -2) / 12 ** 0.5
    b = merged.queries(x, None) @ merged.keys(y, None).transpose(-1, -2)
    centred = (a - a.mean(-1, keepdim=True)) - (b - b.mean(-1, keepdim=True))
    assert float(centred.abs().max()) < 1e-12


def test_the_cached_causal_mask_is_never_an_inference_tensor():
    # Cached for every later call: made under torch.inference_mode (an evaluation), it would be an inference
    # tensor, which autograd outside inference mode may not save for a backward.
    attention_module._causal_additive.cache_clear()
    try:
        with torch.inference_mode():
            mask = attention_module._causal_additive(5, 5, torch.bfloat16, torch.device("cpu"))
        assert not mask.is_inference()
        assert attention_module._causal_additive(5, 5, torch.bfloat16, torch.device("cpu")) is mask  # the cached one
    finally:
        attention_module._causal_additive.cache_clear()
