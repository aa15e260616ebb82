"""Attention variants against direct implementations: the bilinear form converted from a `dot` layer
is exact, the Synthesizers equal their formulas from the paper / CS224n a5, the parameter counts
match the modules, and the registry, compatibility table and block limits raise ConfigErrors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.errors import ConfigError
from attnlab.modules.attention import KVCache, MultiHeadAttention, key_mask, padding_mask_from_lengths
from attnlab.modules.blocks import LayerSpec
from attnlab.modules.positions import POSITIONS, check_compatible
from attnlab.modules.variants import VARIANTS, bilinear_from_dot, build_variant, variant_parameter_count

ATOL = 1e-5
D, H = 16, 4


# --------------------------------------------------------------------------------------------------
# Bilinear
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False], ids=["biases", "no-biases"])
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_bilinear_from_dot_is_exact(kind, bias, perturb):
    kv_dim = 12 if kind == "cross" else None
    dot = perturb(MultiHeadAttention(D, H, bias=bias, kv_dim=kv_dim))
    bil = MultiHeadAttention(D, H, variant="bilinear", bias=bias, kv_dim=kv_dim).eval()
    bil.scores = bilinear_from_dot(dot.scores)
    bil.v_proj.load_state_dict(dot.v_proj.state_dict())
    bil.out_proj.load_state_dict(dot.out_proj.state_dict())
    assert bil.scores.weight.shape == (H, D, kv_dim or D)
    assert (bil.scores.key_bias is not None) == bias

    x = torch.randn(2, 7, D)
    if kind == "self":
        memory, kw = None, {"causal": True, "mask": key_mask(padding_mask_from_lengths(torch.tensor([7, 5])))}
    else:
        memory = torch.randn(2, 9, kv_dim)
        kw = {"mask": key_mask(padding_mask_from_lengths(torch.tensor([9, 4])))}
    expected, expected_w = dot(x, memory, need_weights=True, **kw)
    got, got_w = bil(x, memory, need_weights=True, **kw)
    fused, _ = bil(x, memory, **kw)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(fused, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(got_w, expected_w, atol=ATOL, rtol=0)


def test_bilinear_scores_are_x_w_y():
    """score_h(i, j) = x_i·W̃_h·y_j + u_h·y_j, with no further scaling."""
    mha = MultiHeadAttention(D, H, variant="bilinear", kv_dim=12)
    with torch.no_grad():
        mha.scores.key_bias.normal_()
    x, y = torch.randn(1, 3, D), torch.randn(1, 5, 12)
    _, w = mha(x, y, need_weights=True)
    w_tilde, u = mha.scores.weight, mha.scores.key_bias
    scores = torch.einsum("td,hdf,sf->hts", x[0], w_tilde, y[0]) + (u @ y[0].T)[:, None, :]
    torch.testing.assert_close(w[0], scores.softmax(-1), atol=ATOL, rtol=0)


# --------------------------------------------------------------------------------------------------
# Parameter counts
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kv_dim", [None, 12], ids=["self", "kv12"])
@pytest.mark.parametrize("bias", [True, False], ids=["biases", "no-biases"])
@pytest.mark.parametrize("variant", VARIANTS.names())
def test_variant_parameter_count_matches_numel(variant, bias, kv_dim):
    scores = build_variant(variant, d_model=D, n_heads=H, kv_dim=kv_dim or D, bias=bias, block_size=10)
    numel = sum(p.numel() for p in scores.parameters())
    assert variant_parameter_count(variant, D, H, kv_dim=kv_dim, bias=bias, block_size=10) == numel


@pytest.mark.parametrize("n_heads", [1, 2, 4, 8])
def test_bilinear_parameter_trade_off(n_heads):
    """Without biases: dot has 2·D² query/key parameters, bilinear H·D² (more as soon as H > 2)."""
    d = 32
    dot = variant_parameter_count("dot", d, n_heads, bias=False)
    bil = variant_parameter_count("bilinear", d, n_heads, bias=False)
    assert dot == 2 * d * d and bil == n_heads * d * d
    assert (bil > dot) == (n_heads > 2) and (bil == dot) == (n_heads == 2)


def test_parameter_count_of_unknown_variant_names_the_known_ones():
    with pytest.raises(ConfigError, match="synthesizer-dense"):
        variant_parameter_count("linear", D, H)


# --------------------------------------------------------------------------------------------------
# Synthesizers
# --------------------------------------------------------------------------------------------------


def _heads(x):  # (B, T, D) -> (B, H, T, Dh)
    b, t, _ = x.shape
    return x.view(b, t, H, -1).transpose(1, 2)


def _finish(mha, scores, x, causal):
    """softmax(scores + causal) · V, merged and projected: the part every variant shares."""
    t = x.shape[1]
    if causal:
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    weights = scores.softmax(-1)
    out = weights @ _heads(mha.v_proj(x))
    return mha.out_proj(out.transpose(1, 2).reshape(x.shape)), weights


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_dense_synthesizer_equals_direct_implementation(causal, perturb):
    block, t = 12, 7
    mha = perturb(MultiHeadAttention(D, H, variant="synthesizer-dense", block_size=block), std=0.5)
    s = mha.scores
    assert s.w2.shape == (D // H, block) and s.b2.shape == (block,)
    x = torch.randn(2, t, D)
    a = _heads(F.relu(x @ s.w1.weight.T + s.w1.bias))  # (B, H, T, Dh): the ReLU output split per head
    scores = a @ s.w2[:, :t] + s.b2[:t]  # W2 shared by the heads
    expected, expected_w = _finish(mha, scores, x, causal)
    got, got_w = mha(x, causal=causal, need_weights=True)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(got_w, expected_w, atol=ATOL, rtol=0)
    torch.testing.assert_close(mha(x, causal=causal)[0], expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_random_synthesizer_equals_direct_implementation(causal, perturb):
    block, t = 12, 7
    mha = perturb(MultiHeadAttention(D, H, variant="synthesizer-random", block_size=block), std=1.0)
    table = mha.scores.table
    assert table.shape == (H, block, block) and table.requires_grad
    x = torch.randn(2, t, D)
    expected, expected_w = _finish(mha, table[:, :t, :t].expand(2, -1, -1, -1), x, causal)
    got, got_w = mha(x, causal=causal, need_weights=True)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(got_w, expected_w, atol=ATOL, rtol=0)
    # The scores do not depend on the tokens: shuffling x leaves the weights unchanged.
    _, shuffled_w = mha(x[:, torch.randperm(t)], causal=causal, need_weights=True)
    torch.testing.assert_close(shuffled_w, got_w, atol=0, rtol=0)


def test_random_synthesizer_freeze_option():
    mha = MultiHeadAttention(D, H, variant="synthesizer-random", block_size=8,
                             variant_options={"freeze": True})
    assert not mha.scores.table.requires_grad
    before = mha.scores.table.clone()
    opt = torch.optim.SGD(mha.parameters(), lr=1.0)
    mha(torch.randn(2, 6, D), causal=True)[0].sum().backward()
    opt.step()
    assert mha.scores.table.grad is None
    assert torch.equal(mha.scores.table, before)
    assert mha.v_proj.weight.grad is not None
    # The option reaches the layers through LayerSpec too.
    spec = LayerSpec(d_model=D, n_heads=H, d_ff=32, attention="synthesizer-random", block_size=8,
                     attention_options={"freeze": True})
    assert not spec.attention_module().scores.table.requires_grad


@pytest.mark.parametrize("variant", ["synthesizer-dense", "synthesizer-random"])
def test_synthesizer_positions_past_block_size_raise(variant):
    mha = MultiHeadAttention(D, H, variant=variant, block_size=6)
    mha(torch.randn(1, 6, D), causal=True)  # exactly block_size is fine
    with pytest.raises(ConfigError, match="block_size=6"):
        mha(torch.randn(1, 7, D), causal=True)
    cache = KVCache()
    mha(torch.randn(1, 6, D), causal=True, cache=cache)
    with pytest.raises(ConfigError, match="block_size=6"):  # the 7th token, through the cache
        mha(torch.randn(1, 1, D), causal=True, cache=cache)


@pytest.mark.parametrize("variant", ["synthesizer-dense", "synthesizer-random"])
def test_synthesizer_reads_the_positions_once_per_forward(variant, monkeypatch):
    """Every layer checks the model's one positions tensor against its block size: the largest position is
    read back from the device (a GPU sync) once per forward; a tensor changed in place is checked again."""
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.modules.variants import _check_positions

    model = GPT(GPTConfig(vocab_size=11, block_size=8, d_model=16, n_heads=2, n_layers=3, attention=variant))
    reads = []
    real_max = torch.Tensor.max
    monkeypatch.setattr(torch.Tensor, "max", lambda self, *a, **k: reads.append(1) or real_max(self, *a, **k))
    model(torch.randint(0, 11, (2, 8)))
    assert len(reads) == 1  # not once or twice a layer
    positions = torch.arange(8)[None]
    _check_positions(positions, 8, variant)
    positions += 1  # now position 8 is there: refused, not passed as checked before
    with pytest.raises(ConfigError, match="block_size=8"):
        _check_positions(positions, 8, variant)
    other = torch.arange(8)[None]
    _check_positions(other, 8, variant)
    with pytest.raises(ConfigError, match="block_size=4"):  # the same tensor against a smaller block
        _check_positions(other, 4, variant)


@pytest.mark.parametrize("variant", ["synthesizer-dense", "synthesizer-random"])
def test_synthesizer_needs_block_size(variant):
    with pytest.raises(ConfigError, match="block_size"):
        MultiHeadAttention(D, H, variant=variant)


def test_synthesizer_cache_attends_like_the_causal_mask():
    """With a cache, query i of the random synthesizer reads row i of R over keys 0..i."""
    mha = MultiHeadAttention(D, H, variant="synthesizer-random", block_size=8)
    x = torch.randn(1, 5, D)
    cache = KVCache()
    mha(x[:, :4], causal=True, cache=cache)
    _, w = mha(x[:, 4:], causal=True, cache=cache, need_weights=True)
    torch.testing.assert_close(w[0, :, 0], mha.scores.table[:, 4, :5].softmax(-1), atol=ATOL, rtol=0)


# --------------------------------------------------------------------------------------------------
# Registry and compatibility
# --------------------------------------------------------------------------------------------------


def test_unknown_variant_names_the_known_ones():
    with pytest.raises(ConfigError) as info:
        MultiHeadAttention(D, H, variant="bilnear")
    message = str(info.value)
    assert "bilnear" in message and "did you mean 'bilinear'" in message
    for name in VARIANTS.names():
        assert name in message


def test_unknown_variant_option_names_the_known_ones():
    with pytest.raises(ConfigError, match="freez.*freeze"):
        MultiHeadAttention(D, H, variant="synthesizer-random", block_size=8, variant_options={"freez": True})
    with pytest.raises(ConfigError, match="no option 'freeze'"):
        MultiHeadAttention(D, H, variant="dot", variant_options={"freeze": True})


def test_d_model_must_divide_into_heads():
    with pytest.raises(ConfigError, match="divisible"):
        MultiHeadAttention(18, 4)


def test_compatibility_table():
    """Rotary and Shaw relative keys need per-head q/k of the head width: only `dot` has them."""
    assert set(VARIANTS.names()) == {"dot", "bilinear", "synthesizer-dense", "synthesizer-random"}
    for variant in VARIANTS.names():
        for position in POSITIONS.names():
            if variant != "dot" and position in ("rotary", "relative"):
                with pytest.raises(ConfigError, match="use it with attention 'dot'"):
                    check_compatible(variant, position)
            else:
                check_compatible(variant, position)



@pytest.mark.parametrize("variant", ["synthesizer-dense", "synthesizer-random"])
def test_a_synthesizer_refuses_to_attend_to_another_sequence(variant):
    # Its scores depend on key positions alone, so every memory was attended to alike, with no error; the flag
    # supports_cross = False was read by the decoder layer (which takes `dot` for them) but not by the module.
    from attnlab.modules.attention import MultiHeadAttention
    mha = MultiHeadAttention(16, 2, variant=variant, block_size=8)
    x = torch.randn(1, 3, 16)
    assert mha(x)[0].shape == (1, 3, 16)
    with pytest.raises(ConfigError, match=f"attention '{variant}' cannot attend to another sequence"):
        mha(x, torch.randn(1, 5, 16))
