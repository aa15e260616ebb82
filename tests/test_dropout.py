"""attnlab's dropout: torch's semantics (drop with probability p, scale the rest by 1 / (1 - p), identity in
evaluation) with its faster CPU path, which rounds p to a multiple of 1/65536 and draws 16 bits an element."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnlab.modules.dropout as dropout_module
from attnlab.models.registry import build_model, get_preset, preset_names
from attnlab.modules.attention import attention
from attnlab.modules.dropout import DROPOUT_MIN_ELEMENTS, Dropout, _keep, dropout

N = 1 << 20  # elements: the drop rate is then known to ~0.0003 (one standard deviation at p = 0.1)


@pytest.fixture
def torch_dropout_calls(monkeypatch):
    """Counts the calls that fell back to torch's dropout."""
    calls, real = [], F.dropout

    def spy(x, p, training=True, inplace=False):
        calls.append((tuple(x.shape), p))
        return real(x, p, training, inplace)

    monkeypatch.setattr(dropout_module.F, "dropout", spy)
    return calls


@pytest.mark.parametrize("p", [0.1, 0.25, 0.5, 0.9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_drops_a_share_p_and_scales_the_rest_so_the_mean_is_kept(p, dtype, torch_dropout_calls):
    torch.manual_seed(0)
    x = torch.ones(N, dtype=dtype)
    out = dropout(x, p)
    assert not torch_dropout_calls  # the fast path ran
    assert out.dtype == dtype and out.shape == x.shape
    q = round(p * 65536) / 65536  # the rounded probability
    dropped = (out == 0).double().mean().item()
    assert abs(dropped - q) < 5 * math.sqrt(q * (1 - q) / N)
    kept = out[out != 0]
    torch.testing.assert_close(kept.float(), torch.full_like(kept.float(), 1 / (1 - q)).to(dtype).float())
    # Each element's expectation is its input: the mean of many stays at 1 (5 standard deviations).
    assert abs(out.double().mean().item() - 1) < 5 * math.sqrt(q / (1 - q) / N)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 1 / 65536, 65535 / 65536])
def test_the_rounded_probability_is_exact_over_every_16_bit_number(p):
    """Each of the 65,536 values a lane can take is kept or dropped: exactly round(p * 65536) are dropped."""
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    drop = round(p * 65536)
    kept = _keep(every, drop)
    assert kept.dtype == torch.int16 and int(kept.sum()) == 65536 - drop
    assert not kept[:drop].any() and kept[drop:].all()  # the lowest `drop` values go


def test_the_four_numbers_of_one_draw_are_independent():
    """The 16-bit lanes of one 64-bit draw give neighbouring elements: their masks must not be correlated."""
    torch.manual_seed(1)
    p = 0.5
    dropped = dropout(torch.ones(N), p) == 0
    lanes = dropped.view(-1, 4).double()
    for i in range(4):
        for j in range(i + 1, 4):
            both = (lanes[:, i] * lanes[:, j]).mean().item()
            assert abs(both - p * p) < 5 * math.sqrt(p * p * (1 - p * p) / (N // 4))
    # ... nor the same lane across draws: every lane drops at the same rate.
    for i in range(4):
        assert abs(lanes[:, i].mean().item() - p) < 5 * math.sqrt(p * (1 - p) / (N // 4))


def test_the_same_seed_gives_the_same_mask_and_another_draw_another():
    x = torch.randn(64, 128)
    torch.manual_seed(3)
    a, b = dropout(x, 0.1), dropout(x, 0.1)
    torch.manual_seed(3)
    torch.testing.assert_close(dropout(x, 0.1), a, rtol=0, atol=0)
    assert not torch.equal(a, b)


def test_the_mask_does_not_depend_on_the_thread_count():
    x = torch.randn(256, 384)
    threads = torch.get_num_threads()
    try:
        torch.manual_seed(4)
        one = [torch.set_num_threads(1), dropout(x, 0.2)][1]
        torch.manual_seed(4)
        many = [torch.set_num_threads(max(2, threads)), dropout(x, 0.2)][1]
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(one, many, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradient_is_the_mask_times_the_scale(dtype):
    torch.manual_seed(5)
    x = (torch.rand(64, 128) + 0.5).to(dtype).requires_grad_()  # no zeros: a zero output means dropped
    out = dropout(x, 0.3)
    g = torch.randn_like(out)
    out.backward(g)
    q = round(0.3 * 65536) / 65536
    expected = g * (out != 0) / (1 - q)
    torch.testing.assert_close(x.grad.float(), expected.float(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-6,
                               atol=0)


def test_a_non_contiguous_input_keeps_its_values_where_kept():
    torch.manual_seed(6)
    x = torch.randn(128, 96).t()  # (96, 128), strided
    out = dropout(x, 0.1)
    kept = out != 0
    q = round(0.1 * 65536) / 65536
    torch.testing.assert_close(out[kept], x[kept] / (1 - q))


def test_identity_in_evaluation_and_at_p_zero(torch_dropout_calls):
    x = torch.randn(64, 128)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    module = Dropout(0.5).eval()
    assert module(x) is x
    assert not torch_dropout_calls


@pytest.mark.parametrize("case", ["small", "rounding", "one", "meta"])
def test_torch_dropout_serves_what_the_fast_path_would_not(case, torch_dropout_calls):
    """Small tensors, a probability that rounding to 1/65536 would move by more than 0.1 %, p = 1, and devices
    other than the CPU (here `meta`, standing for a GPU) take torch's dropout."""
    x, p = torch.randn(64, 128), 0.1
    if case == "small":
        x = torch.randn(DROPOUT_MIN_ELEMENTS - 1)
    elif case == "rounding":
        p = 0.001  # 65.536 / 65536: rounding to 66 moves it by 0.7 %
    elif case == "one":
        p = 1.0
    else:
        x = torch.empty(64, 128, device="meta")
    out = dropout(x, p)
    assert torch_dropout_calls == [(tuple(x.shape), p)]
    if case == "one":
        assert not out.any()


def test_a_probability_that_rounding_keeps_within_a_thousandth_takes_the_fast_path(torch_dropout_calls):
    dropout(torch.randn(64, 128), 0.01)  # 655.36 -> 655: 0.05 %
    assert not torch_dropout_calls


def test_the_module_is_nn_dropout_with_the_same_settings():
    module = Dropout(0.2)
    assert isinstance(module, nn.Dropout) and module.p == 0.2 and repr(module) == "Dropout(p=0.2, inplace=False)"
    assert not list(module.parameters()) and not module.state_dict()
    x = torch.randn(64, 128)
    torch.manual_seed(7)
    a = module(x)
    torch.manual_seed(7)
    torch.testing.assert_close(a, dropout(x, 0.2), rtol=0, atol=0)
    inplace = Dropout(0.2, inplace=True)  # torch's in-place dropout: the caller asked for its memory behaviour
    y = x.clone()
    assert inplace(y) is y


@pytest.mark.parametrize("name", preset_names())
def test_every_model_drops_out_through_attnlab_dropout(name):
    _, config = get_preset(name)
    small = {"vocab_size": 100, "src_vocab_size": 100, "tgt_vocab_size": 100, "d_model": 8 * config.n_heads,
             "d_ff": 16}  # the big presets' layout at a size that builds in milliseconds
    model = build_model(config.replace(**{k: v for k, v in small.items() if hasattr(config, k)}))
    plain = [n for n, m in model.named_modules() if type(m) is nn.Dropout]
    assert not plain, f"{name}: torch's nn.Dropout at {plain}"


def test_attention_dropout_on_a_cpu_takes_the_explicit_path_and_keeps_the_mean(monkeypatch):
    """torch's fused kernel with dropout runs its slow dropout on a CPU; the explicit path uses `dropout`."""

    def refuse(*args, **kwargs):
        raise AssertionError("the fused kernel ran")

    monkeypatch.setattr("attnlab.modules.attention.F.scaled_dot_product_attention", refuse)
    torch.manual_seed(8)
    b, h, t, d = 8, 4, 64, 16
    q = k = torch.zeros(b, h, t, d)  # equal scores: every weight 1/t
    v = torch.ones(b, h, t, d)
    out, _ = attention(q, k, v, dropout=0.25)
    # Each output is the sum of t weights 1/t, each dropped with 1/4 and else scaled by 4/3: mean 1.
    assert abs(out.mean().item() - 1) < 0.01
    assert out.std().item() > 0.01  # and it varies: the weights were dropped


def test_attention_without_dropout_still_takes_the_fused_kernel_in_fp32(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr("attnlab.modules.attention.F.scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q = torch.randn(2, 2, 8, 4)
    attention(q, q, q, causal=True)
    assert calls == [1]
