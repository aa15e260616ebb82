"""The attention core against references: the fused kernel against the explicit path and a naive
softmax, `MultiHeadAttention` against `torch.nn.MultiheadAttention` with copied weights, and the
invariances every stack must keep (KV cache = full pass, causality, gradients reach every parameter,
batched = unbatched with right or left padding, relative schemes blind to a shift of all positions)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.errors import ConfigError
from attnlab.models.common import positions_from_mask
from attnlab.models.transformer import Seq2SeqTransformer, TransformerConfig
from attnlab.modules.attention import (
    KVCache,
    MultiHeadAttention,
    attention,
    causal_mask,
    combine_masks,
    key_mask,
    padding_mask_from_ids,
    padding_mask_from_lengths,
)
from attnlab.modules.blocks import Decoder, Encoder, LayerSpec
from attnlab.modules.positions import POSITIONS, build_position, check_compatible
from attnlab.modules.variants import VARIANTS

ATOL = 1e-5
D, H = 16, 4  # model width and heads of every tiny module here
POSITION_OPTIONS = {  # small enough that T <= 12 reaches the clipping
    "relative": {"max_distance": 3},
    "t5-bias": {"num_buckets": 8, "max_distance": 8},
}


def skip_incompatible(variant: str, position: str | None) -> None:
    if position is None:
        return
    try:
        check_compatible(variant, position)
    except ConfigError as e:
        pytest.skip(f"incompatible pair: {e}")


def tiny_config(variant: str = "dot", position: str = "sinusoidal", **overrides) -> TransformerConfig:
    fields = dict(
        src_vocab_size=32, tgt_vocab_size=32, d_model=D, n_heads=H, d_ff=32, n_encoder_layers=2,
        n_decoder_layers=2, dropout=0.0, max_len=16, attention=variant, position=position,
        position_options=dict(POSITION_OPTIONS.get(position, {})),
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


# --------------------------------------------------------------------------------------------------
# Masks
# --------------------------------------------------------------------------------------------------


def test_mask_helpers():
    assert torch.equal(causal_mask(3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool))
    # Bottom-right aligned: 2 queries after 3 cached keys.
    assert torch.equal(causal_mask(2, 5), torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool))
    lengths = padding_mask_from_lengths(torch.tensor([3, 1]), 4)
    assert torch.equal(lengths, torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool))
    ids = padding_mask_from_ids(torch.tensor([[5, 6, 0], [0, 7, 0]]), pad_id=0)
    assert torch.equal(ids, torch.tensor([[1, 1, 0], [0, 1, 0]], dtype=torch.bool))
    assert key_mask(lengths).shape == (2, 1, 1, 4)
    both = combine_masks(None, key_mask(lengths), causal_mask(4), None)
    assert both.shape == (2, 1, 4, 4)
    assert torch.equal(both[0, 0], causal_mask(4) & lengths[0])
    assert combine_masks(None, None) is None


# --------------------------------------------------------------------------------------------------
# attention(): fused == explicit == naive
# --------------------------------------------------------------------------------------------------


def _naive(q, k, v, allowed, bias, scale):
    """softmax over the allowed keys of q·kᵀ·scale + bias, computed one row at a time in float64."""
    b, h, t, _ = q.shape
    out = torch.zeros(b, h, t, v.shape[-1], dtype=torch.float64)
    weights = torch.zeros(b, h, t, k.shape[-2], dtype=torch.float64)
    allowed = allowed.expand(b, h, t, k.shape[-2])
    for bi in range(b):
        for hi in range(h):
            for i in range(t):
                keep = allowed[bi, hi, i]
                if not keep.any():
                    continue
                s = (k[bi, hi].double() @ q[bi, hi, i].double()) * scale
                if bias is not None:
                    s = s + bias.expand(b, h, t, -1)[bi, hi, i].double()
                w = torch.softmax(s[keep], dim=0)
                weights[bi, hi, i, keep] = w
                out[bi, hi, i] = w @ v[bi, hi, keep].double()
    return out.float(), weights.float()


def _attention_case(name: str):
    """(q, k, v, kwargs for attention(), allowed (B|1, H|1, T, S) bool, additive bias or None, scale)."""
    b, dh = 2, 8
    t, s = {"causal-cache": (3, 8), "causal-short-keys": (6, 4), "padding": (5, 7)}.get(name, (6, 6))
    q, k, v = torch.randn(b, H, t, dh), torch.randn(b, H, s, dh), torch.randn(b, H, s, dh)
    rows, cols = torch.arange(t)[:, None], torch.arange(s)[None, :]
    causal = cols <= rows + (s - t)  # computed here, not with causal_mask
    keep = torch.arange(s)[None, :] < torch.tensor([s, s - 3])[:, None]  # batch row 1 right-padded
    bias = torch.randn(1, H, t, s)
    everything = torch.ones(1, 1, t, s, dtype=torch.bool)
    kw: dict = {}
    allowed, used_bias, scale = everything, None, 1 / math.sqrt(dh)
    if name in ("causal", "causal-cache", "causal-short-keys"):
        kw, allowed = {"causal": True}, causal[None, None]
    elif name == "padding":
        kw, allowed = {"mask": key_mask(keep)}, keep[:, None, None, :] & everything
    elif name == "bias":
        kw, used_bias = {"bias": bias}, bias
    elif name == "bias-causal-padding":
        kw = {"bias": bias, "causal": True, "mask": key_mask(keep)}
        allowed, used_bias = causal[None, None] & keep[:, None, None, :], bias
    elif name == "float-mask":
        hidden = torch.rand(1, 1, t, s) < 0.3
        hidden[..., 0] = False  # every row keeps a key
        float_mask = torch.randn(1, 1, t, s).masked_fill(hidden, float("-inf"))
        kw, allowed, used_bias = {"mask": float_mask}, ~hidden, float_mask.masked_fill(hidden, 0.0)
    elif name == "scale":
        kw, scale = {"scale": 0.37}, 0.37
    elif name == "scale-causal-bias":
        kw = {"scale": 2.0, "causal": True, "bias": bias}
        allowed, used_bias, scale = causal[None, None], bias, 2.0
    return q, k, v, kw, allowed, used_bias, scale


ATTENTION_CASES = ["plain", "causal", "causal-cache", "causal-short-keys", "padding", "bias",
                   "bias-causal-padding", "float-mask", "scale", "scale-causal-bias"]


@pytest.mark.parametrize("case", ATTENTION_CASES)
def test_fused_equals_explicit_equals_naive(case):
    q, k, v, kw, allowed, bias, scale = _attention_case(case)
    fused, none = attention(q, k, v, **kw)
    explicit, weights = attention(q, k, v, need_weights=True, **kw)
    assert none is None
    torch.testing.assert_close(fused, explicit, atol=ATOL, rtol=0)
    ref_out, ref_w = _naive(q, k, v, allowed, bias, scale)
    torch.testing.assert_close(explicit, ref_out, atol=ATOL, rtol=0)
    torch.testing.assert_close(weights, ref_w, atol=ATOL, rtol=0)
    # Rows sum to 1, or to exactly 0 where no key is visible (only "causal-short-keys" has such rows).
    visible = allowed.expand_as(weights).any(-1)
    sums = weights.sum(-1)
    torch.testing.assert_close(sums[visible], torch.ones_like(sums[visible]), atol=ATOL, rtol=0)
    assert (sums[~visible] == 0).all()
    assert bool((~visible).any()) == (case == "causal-short-keys")
    assert (weights[~allowed.expand_as(weights)] == 0).all()


@pytest.mark.parametrize("case", ATTENTION_CASES)
def test_fused_and_explicit_paths_have_the_same_gradients(case):
    """The explicit path folds masks and bias into the score product (baddbmm); the gradients of q, k, v
    and of a bias must still equal the fused kernel's, broadcast dimensions summed."""
    q, k, v, kw, _, _, _ = _attention_case(case)
    grads = []
    for need_weights in (False, True):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        call = dict(kw)
        if "bias" in call:
            call["bias"] = call["bias"].clone().requires_grad_()
            leaves.append(call["bias"])
        out, _ = attention(*leaves[:3], need_weights=need_weights, **call)
        out.pow(2).sum().backward()
        grads.append([t.grad for t in leaves])
    for fused, explicit in zip(*grads):
        torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("case", ["plain", "causal", "padding", "bias-causal-padding"])
def test_half_precision_dispatch_matches_the_fused_kernel(case):
    """On CPU in bf16 the dispatcher takes the explicit path (faster there); it must agree with SDPA's
    bf16 result within bf16 rounding, forward and backward."""
    import torch.nn.functional as F

    from attnlab.modules.attention import prefers_explicit

    q, k, v, kw, allowed, bias, scale = _attention_case(case)
    q, k, v = (x.detach().bfloat16().requires_grad_() for x in (q, k, v))
    assert prefers_explicit(q, k.shape[-2]) and not prefers_explicit(q.float(), k.shape[-2])
    assert not prefers_explicit(q, 4096)
    if kw.get("bias") is not None:
        kw = {**kw, "bias": kw["bias"].bfloat16()}
    out, _ = attention(q, k, v, **kw)
    qr, kr, vr = (x.detach().clone().requires_grad_() for x in (q, k, v))
    mask = torch.zeros(allowed.shape, dtype=torch.bfloat16).masked_fill(~allowed, float("-inf"))
    if kw.get("bias") is not None:
        mask = mask + kw["bias"]
    ref = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=mask, scale=scale)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    for a, b in ((q, qr), (k, kr), (v, vr)):
        torch.testing.assert_close(a.grad.float(), b.grad.float(), atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("how", ["mask", "mask+bias", "causal-short-keys", "causal-short-keys+bias"])
def test_fully_masked_rows_are_zero_with_finite_gradients(how, need_weights):
    b, t, s, dh = 2, 5, 6, 8
    if how.startswith("causal-short-keys"):
        t, s = 6, 4  # queries 0 and 1 come before every key
    q, k, v = (torch.randn(b, H, n, dh, requires_grad=True) for n in (t, s, s))
    bias = torch.randn(1, H, t, s, requires_grad=True) if how.endswith("+bias") else None
    if how.startswith("mask"):
        mask = torch.ones(b, 1, t, s, dtype=torch.bool)
        mask[0, :, 2] = False  # one query row of batch 0 sees nothing
        mask[1] = False  # batch 1 sees nothing at all
        out, _ = attention(q, k, v, mask=mask, bias=bias, need_weights=need_weights)
        dead = [out[0, :, 2], out[1]]
        live = [out[0, :, :2], out[0, :, 3:]]
    else:
        out, _ = attention(q, k, v, causal=True, bias=bias, need_weights=need_weights)
        dead, live = [out[:, :, :2]], [out[:, :, 2:]]
    assert torch.isfinite(out).all()
    assert all((d == 0).all() for d in dead)
    assert all((x != 0).any() for x in live)
    (out * torch.randn_like(out)).sum().backward()
    for name, tensor in [("q", q), ("k", k), ("v", v), ("bias", bias)]:
        if tensor is not None:
            assert torch.isfinite(tensor.grad).all(), f"non-finite gradient for {name}"


@pytest.mark.parametrize("need_weights", [False, True], ids=["fused", "explicit"])
@pytest.mark.parametrize("how", ["mask", "mask+bias", "causal-short-keys"])
def test_masked_attention_off_the_cpu_reads_nothing_back(how, need_weights):
    """On a GPU, looking whether any row is fully masked would stop the host every layer of every step: off the
    CPU the rows are zeroed unread. Meta tensors stand in for a GPU's (reading one raises)."""
    b, t, s, dh = 2, 5, 6, 8
    if how == "causal-short-keys":
        t, s = 6, 4
    q, k, v = (torch.randn(b, H, n, dh, device="meta") for n in (t, s, s))
    mask = torch.ones(b, 1, 1, s, dtype=torch.bool, device="meta") if how.startswith("mask") else None
    bias = torch.randn(1, H, t, s, device="meta") if how.endswith("+bias") else None
    out, weights = attention(q, k, v, mask=mask, bias=bias, causal=how.startswith("causal"),
                             need_weights=need_weights)
    assert out.shape == (b, H, t, dh) and out.device.type == "meta"
    assert (weights is not None) == need_weights


# --------------------------------------------------------------------------------------------------
# MultiHeadAttention == torch.nn.MultiheadAttention
# --------------------------------------------------------------------------------------------------


def _torch_twin(ours: MultiHeadAttention, kdim: int | None = None) -> nn.MultiheadAttention:
    """nn.MultiheadAttention holding our weights (q, k, v packed in in_proj_* unless kdim differs)."""
    ref = nn.MultiheadAttention(D, H, batch_first=True, kdim=kdim, vdim=kdim)
    qp, kp, vp = ours.scores.q_proj, ours.scores.k_proj, ours.v_proj
    with torch.no_grad():
        if ref._qkv_same_embed_dim:
            ref.in_proj_weight.copy_(torch.cat([qp.weight, kp.weight, vp.weight]))
        else:
            ref.q_proj_weight.copy_(qp.weight)
            ref.k_proj_weight.copy_(kp.weight)
            ref.v_proj_weight.copy_(vp.weight)
        ref.in_proj_bias.copy_(torch.cat([qp.bias, kp.bias, vp.bias]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    return ref.eval()


MHA_CASES = ["self-causal", "self-padding", "self-causal-padding", "self-causal-left-padding",
             "cross-padding", "cross-kdim-padding"]


@pytest.mark.parametrize("case", MHA_CASES)
def test_multihead_attention_matches_torch(case, perturb):
    t = 7
    kdim = 12 if "kdim" in case else None
    ours = perturb(MultiHeadAttention(D, H, kv_dim=kdim))
    ref = _torch_twin(ours, kdim)
    x = torch.randn(2, t, D)
    memory = torch.randn(2, 9, kdim or D) if case.startswith("cross") else None
    s = t if memory is None else memory.shape[1]
    if "left-padding" in case:
        keep = torch.arange(s)[None, :] >= torch.tensor([0, 3])[:, None]  # True = real token
    else:
        keep = padding_mask_from_lengths(torch.tensor([s, s - 4]), s)
    causal = "causal" in case
    our_mask = key_mask(keep) if "padding" in case else None
    torch_kw = {"key_padding_mask": ~keep} if "padding" in case else {}  # True = BLOCKED in torch
    if causal:
        torch_kw["attn_mask"] = ~causal_mask(t)
    src = x if memory is None else memory

    fused, _ = ours(x, memory, mask=our_mask, causal=causal)
    explicit, weights = ours(x, memory, mask=our_mask, causal=causal, need_weights=True)
    expected, expected_w = ref(x, src, src, need_weights=True, average_attn_weights=False, **torch_kw)

    allowed = torch.ones(2, t, s, dtype=torch.bool) & keep[:, None, :]
    if causal:
        allowed = allowed & causal_mask(t)
    visible = allowed.any(-1)  # (B, T): torch gives NaN on the other rows, we give 0
    assert bool((~visible).any()) == ("left-padding" in case)
    for out in (fused, explicit):  # a row that sees no key gets a zero context, so only the output bias
        torch.testing.assert_close(out[~visible], ours.out_proj.bias.expand_as(out[~visible]), atol=0, rtol=0)
    torch.testing.assert_close(fused[visible], expected[visible], atol=ATOL, rtol=0)
    torch.testing.assert_close(explicit[visible], expected[visible], atol=ATOL, rtol=0)
    ours_w, ref_w = weights.transpose(1, 2)[visible], expected_w.transpose(1, 2)[visible]  # (N, H, S)
    torch.testing.assert_close(ours_w, ref_w, atol=ATOL, rtol=0)


# --------------------------------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------------------------------


def test_kv_cache_grows_keeps_content_and_reorders():
    cache = KVCache(capacity=2)
    ks = [torch.randn(3, H, n, 4) for n in (1, 2, 3)]
    vs = [torch.randn(3, H, n, 5) for n in (1, 2, 3)]
    for k, v in zip(ks, vs):
        all_k, all_v = cache.update(k, v)
    torch.testing.assert_close(all_k, torch.cat(ks, 2), atol=0, rtol=0)
    torch.testing.assert_close(all_v, torch.cat(vs, 2), atol=0, rtol=0)
    assert cache.length == 6
    cache.reorder(torch.tensor([2, 0]))
    k, v = cache.get()
    torch.testing.assert_close(k, torch.cat(ks, 2)[[2, 0]], atol=0, rtol=0)
    torch.testing.assert_close(v, torch.cat(vs, 2)[[2, 0]], atol=0, rtol=0)
    static = KVCache(static=True)
    assert not static.ready
    static.update(ks[2], vs[2])
    assert static.ready and static.length == 3


def test_kv_cache_key_positions_continue_and_follow_reordered_rows():
    cache = KVCache()
    cache.update(torch.randn(2, H, 3, 4), torch.randn(2, H, 3, 4))
    cache.update(torch.randn(2, H, 2, 4), torch.randn(2, H, 2, 4))
    assert cache.positions.tolist() == [[0, 1, 2, 3, 4]]  # no positions given: after the cached keys
    rows = KVCache()
    rows.update(torch.randn(2, H, 3, 4), torch.randn(2, H, 3, 4), torch.tensor([[0, 0, 1], [0, 1, 2]]))
    rows.update(torch.randn(2, H, 1, 4), torch.randn(2, H, 1, 4), torch.tensor([[2], [3]]))
    rows.reorder(torch.tensor([1, 0]))
    assert rows.positions.tolist() == [[0, 1, 2, 3], [0, 0, 1, 2]]  # each row keeps its own positions


CACHE_POSITIONS = [None, "rotary", "relative", "t5-bias", "alibi"]


@pytest.mark.parametrize("chunk", [1, 3])
@pytest.mark.parametrize("position", CACHE_POSITIONS, ids=lambda p: p or "no-position")
@pytest.mark.parametrize("variant", VARIANTS.names())
def test_kv_cache_matches_full_causal_pass(variant, position, chunk, perturb):
    skip_incompatible(variant, position)
    t = 10
    mha = perturb(MultiHeadAttention(D, H, variant=variant, block_size=16))
    scheme = None
    if position is not None:
        scheme = perturb(build_position(position, d_model=D, n_heads=H, max_len=16, causal=True,
                                        **POSITION_OPTIONS.get(position, {})))
    x = torch.randn(2, t, D)
    full, full_w = mha(x, causal=True, position=scheme, need_weights=True)
    cache, outs = KVCache(), []
    for i in range(0, t, chunk):
        out, w = mha(x[:, i:i + chunk], causal=True, position=scheme, cache=cache, need_weights=i % 2 == 0)
        outs.append(out)
        if w is not None:  # the explicit path through the cache gives the rows of the full weights
            n = w.shape[-1]
            torch.testing.assert_close(w, full_w[:, :, i:i + chunk, :n], atol=ATOL, rtol=0)
            assert (full_w[:, :, i:i + chunk, n:] == 0).all()
    assert cache.length == t
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=ATOL, rtol=0)


# --------------------------------------------------------------------------------------------------
# Causality, gradients, batching: every variant x every position scheme
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", ["encoder-causal", "seq2seq-decoder"])
@pytest.mark.parametrize("position", POSITIONS.names())
@pytest.mark.parametrize("variant", VARIANTS.names())
def test_causality(variant, position, stack, perturb):
    """Changing the inputs after position t changes no output at or before t, for every t."""
    skip_incompatible(variant, position)
    t_len = 8
    if stack == "encoder-causal":
        spec = LayerSpec(d_model=D, n_heads=H, d_ff=32, dropout=0.0, attention=variant, block_size=16)
        encoder = perturb(Encoder(spec, 2, final_norm=True))
        scheme = perturb(build_position(position, d_model=D, n_heads=H, max_len=16, causal=True,
                                        **POSITION_OPTIONS.get(position, {})))
        positions = torch.arange(t_len)[None, :]

        def run(tokens):  # here the "tokens" are already embedded: (N, T, D) floats
            x = scheme.embed(tokens, positions)
            return encoder(x, causal=True, positions=positions, position=scheme)[0]

        base = torch.randn(1, t_len, D)
        changed = base.repeat(t_len, 1, 1)
        for t in range(t_len):
            changed[t, t + 1:] = torch.randn(t_len - t - 1, D)
    else:
        model = perturb(Seq2SeqTransformer(tiny_config(variant, position)))
        memory = model.encode(torch.randint(3, 32, (1, 5)))[0]

        def run(tokens):
            return model.decode(tokens, memory.expand(tokens.shape[0], -1, -1))[0]

        base = torch.randint(3, 32, (1, t_len))
        changed = base.repeat(t_len, 1)
        for t in range(t_len):
            changed[t, t + 1:] = 3 + (changed[t, t + 1:] - 3 + torch.randint(1, 29, (t_len - t - 1,))) % 29

    expected, got = run(base)[0], run(changed)
    for t in range(t_len):
        torch.testing.assert_close(got[t, : t + 1], expected[: t + 1], atol=ATOL, rtol=0)
        if t < t_len - 1:  # the change does reach the later outputs (the test is not vacuous)
            assert not torch.allclose(got[t, t + 1:], expected[t + 1:], atol=1e-3)


def _assert_every_parameter_has_gradient(module: nn.Module, frozen: tuple[str, ...] = ()) -> None:
    seen_frozen = []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            seen_frozen.append(name)
            assert p.grad is None, name
            continue
        assert p.grad is not None, f"{name} received no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
    assert all(any(name.endswith(f) for f in frozen) for name in seen_frozen), seen_frozen
    if frozen:
        assert seen_frozen, "expected frozen parameters"


@pytest.mark.parametrize("freeze", [False, True], ids=["trainable", "frozen"])
@pytest.mark.parametrize("variant", VARIANTS.names())
def test_every_stack_parameter_gets_gradient(variant, freeze):
    if freeze and variant != "synthesizer-random":
        pytest.skip("only synthesizer-random has a freeze option")
    options = {"freeze": True} if freeze else {}
    spec = LayerSpec(d_model=D, n_heads=H, d_ff=32, dropout=0.0, attention=variant, block_size=16,
                     attention_options=options)
    encoder = Encoder(spec, 2, final_norm=True)
    decoder = Decoder(spec, 2, final_norm=True, memory_dim=D)
    keep = padding_mask_from_lengths(torch.tensor([7, 5]), 7)
    memory, _, _ = encoder(torch.randn(2, 7, D), mask=key_mask(keep))
    out, _, _, _ = decoder(torch.randn(2, 6, D), memory, memory_mask=key_mask(keep))
    (out * torch.randn_like(out)).sum().backward()
    frozen = ("scores.table",) if freeze else ()
    _assert_every_parameter_has_gradient(encoder, frozen)
    _assert_every_parameter_has_gradient(decoder, frozen)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-embeddings", "separate-embeddings"])
@pytest.mark.parametrize("position", POSITIONS.names())
@pytest.mark.parametrize("variant", VARIANTS.names())
def test_every_model_parameter_gets_gradient(variant, position, shared):
    skip_incompatible(variant, position)
    overrides = {} if shared else dict(share_embeddings=False, tie_output=False, output_bias=True,
                                       tgt_vocab_size=24)
    if variant == "synthesizer-random" and not shared:
        overrides["attention_options"] = {"freeze": True}
    model = Seq2SeqTransformer(tiny_config(variant, position, **overrides))
    src = torch.randint(3, 24, (2, 7))
    src[1, 5:] = 0
    tgt = torch.randint(3, 24, (2, 6))
    out = model(src, tgt, padding_mask_from_ids(src, 0), labels=tgt)
    out.loss.backward()
    frozen = ("scores.table",) if "attention_options" in overrides else ()
    _assert_every_parameter_has_gradient(model, frozen)


@pytest.mark.parametrize("position", POSITIONS.names())
@pytest.mark.parametrize("variant", VARIANTS.names())
def test_batched_equals_unbatched(variant, position, perturb):
    """Two right-padded sequences in one batch give, on real positions, what each gives alone."""
    skip_incompatible(variant, position)
    model = perturb(Seq2SeqTransformer(tiny_config(variant, position)))
    src_len, tgt_len = [9, 5], [7, 4]
    src = torch.randint(3, 32, (2, max(src_len)))
    tgt = torch.randint(3, 32, (2, max(tgt_len)))
    for b in range(2):
        src[b, src_len[b]:] = 0
        tgt[b, tgt_len[b]:] = 0
    batched = model(src, tgt, padding_mask_from_ids(src, 0)).logits
    for b in range(2):
        alone = model(src[b:b + 1, : src_len[b]], tgt[b:b + 1, : tgt_len[b]]).logits
        torch.testing.assert_close(batched[b, : tgt_len[b]], alone[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("position", ["rotary", "relative", "t5-bias", "alibi"])
def test_relative_schemes_ignore_a_shift_of_every_position(position, causal, perturb):
    """Given positions p + c for queries and (by default) keys, a relative scheme sees p."""
    mha = perturb(MultiHeadAttention(D, H))
    scheme = perturb(build_position(position, d_model=D, n_heads=H, max_len=32, causal=causal,
                                    **POSITION_OPTIONS.get(position, {})))
    x = torch.randn(2, 7, D)
    expected, _ = mha(x, causal=causal, position=scheme)
    shifted, _ = mha(x, causal=causal, position=scheme, positions=torch.arange(5, 12)[None, :])
    torch.testing.assert_close(shifted, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("position", POSITIONS.names())
@pytest.mark.parametrize("variant", VARIANTS.names())
def test_left_padded_batch_equals_unbatched(variant, position, causal, perturb):
    """Left padding with positions counted over real tokens (`positions_from_mask`) changes nothing."""
    skip_incompatible(variant, position)
    spec = LayerSpec(d_model=D, n_heads=H, d_ff=32, dropout=0.0, attention=variant, block_size=16)
    encoder = perturb(Encoder(spec, 2, final_norm=True))
    scheme = perturb(build_position(position, d_model=D, n_heads=H, max_len=16, causal=causal,
                                    **POSITION_OPTIONS.get(position, {})))

    def run(x, keep=None):
        positions = torch.arange(x.shape[1])[None, :] if keep is None else positions_from_mask(keep)
        mask = None if keep is None else key_mask(keep)
        return encoder(scheme.embed(x, positions), mask=mask, causal=causal, positions=positions,
                       position=scheme)[0]

    lengths = [8, 5]
    x = torch.randn(2, 8, D)
    keep = torch.arange(8)[None, :] >= torch.tensor([8 - n for n in lengths])[:, None]
    batched = run(x, keep)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(batched[b, 8 - n:], run(x[b:b + 1, 8 - n:])[0], atol=ATOL, rtol=0)


def test_fused_qkv_projection_equals_separate_projections():
    """Self-attention with `dot` takes one fused QKV product; it must equal queries, keys and values
    projected one by one (the path every other variant and cross-attention take)."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16, requires_grad=True)
    fused_out, _ = mha(x, causal=True)
    positions = torch.arange(5)[None]
    q, k = mha.scores.queries(x, positions), mha.scores.keys(x, positions)
    v = mha.v_proj(x).view(2, 5, 4, 4).transpose(1, 2)
    ref, _ = attention(q, k, v, causal=True)
    separate_out = mha.out_proj(ref.transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(fused_out, separate_out, atol=1e-6, rtol=1e-6)
    fused_grad = torch.autograd.grad(fused_out.sum(), mha.scores.q_proj.weight)[0]
    separate_grad = torch.autograd.grad(separate_out.sum(), mha.scores.q_proj.weight)[0]
    torch.testing.assert_close(fused_grad, separate_grad, atol=1e-6, rtol=1e-6)
    cross = MultiHeadAttention(16, 4, kv_dim=8)  # keys and values from a memory of another width
    assert cross.scores.fused_qkv(cross.v_proj) is None


def test_blocked_causal_path_equals_the_full_product(monkeypatch):
    """Long causal self-attention in half precision on CPU runs one block of queries at a time, each
    seeing only the keys up to its end; it must equal the full masked product, values and gradients."""
    import attnlab.modules.attention as core

    monkeypatch.setattr(core, "QUERY_BLOCK", 4)
    monkeypatch.setattr(core, "EXPLICIT_MAX_KEYS", 8)  # T = 10 keys: past the plain explicit path
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 10, 8, generator=g) for _ in range(3))
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        grads = []
        outs = []
        for blocked in (True, False):
            leaves = [t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v)]
            out = core._blocked_causal_attention(*leaves, dropout=0.0, scale=8 ** -0.5) if blocked \
                else attention(*leaves, causal=True, need_weights=True)[0]
            out.float().pow(2).sum().backward()
            outs.append(out.float())
            grads.append([t.grad.float() for t in leaves])
        torch.testing.assert_close(outs[0], outs[1], atol=tol, rtol=tol)
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, atol=tol, rtol=tol)
    # The dispatcher takes the blocked path for bf16 on CPU beyond EXPLICIT_MAX_KEYS; it agrees with SDPA.
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    ours = attention(qb, kb, vb, causal=True)[0].float()
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ours, ref, atol=3e-2, rtol=3e-2)


# --------------------------------------------------------------------------------------------------
# The blocked half-precision path (`_BlockedAttention`): scratch buffers kept between calls
# --------------------------------------------------------------------------------------------------


def _record_blocked_calls(monkeypatch) -> list[tuple]:
    """The arguments of every `_BlockedAttention.apply` call from now on (the calls still run)."""
    import attnlab.modules.attention as core

    calls = []
    real_apply = core._BlockedAttention.apply
    monkeypatch.setattr(core._BlockedAttention, "apply", lambda *a: calls.append(a) or real_apply(*a))
    return calls


def _float64_reference(q, k, v, causal, grad):
    """Output and q/k/v gradients of the full masked product in float64."""
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
    out.backward(grad.double())
    return [out.detach()] + [x.grad for x in leaves]


@pytest.mark.parametrize("shape", [
    # (B, H, T, S, Dq, Dv, causal, queries per block)
    (2, 3, 10, 10, 8, 8, True, 4),      # three causal blocks, the last one short
    (2, 3, 10, 10, 8, 8, True, 64),     # one block
    (2, 3, 10, 7, 8, 6, False, 4),      # cross-shaped: more queries than keys, values of another width
    (1, 2, 5, 12, 8, 8, False, 64),
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_blocked_half_path_matches_float64(monkeypatch, shape, dtype):
    """Half precision on a CPU without mask, bias, dropout or weights runs `_BlockedAttention`: its output and
    gradients must match the float64 product as closely as the explicit half path does."""
    import attnlab.modules.attention as core

    b, h, t, s, dq, dv, causal, rows = shape
    monkeypatch.setattr(core, "QUERY_BLOCK", rows)
    calls = _record_blocked_calls(monkeypatch)
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(b, h, t, dq, generator=g), torch.randn(b, h, s, dq, generator=g), \
        torch.randn(b, h, s, dv, generator=g)
    grad = torch.randn(b, h, t, dv, generator=g)
    ref = _float64_reference(q, k, v, causal, grad)
    errors = {}
    for name, weights in (("blocked", False), ("explicit", True)):
        leaves = [x.to(dtype).requires_grad_() for x in (q, k, v)]
        out, _ = attention(*leaves, causal=causal, need_weights=weights)
        out.backward(grad.to(dtype))
        errors[name] = [float((a.detach().double() - r).norm() / r.norm())
                        for a, r in zip([out] + [x.grad for x in leaves], ref)]
    assert len(calls) == 1  # the blocked path ran once (not for need_weights)
    for blocked, explicit in zip(errors["blocked"], errors["explicit"]):
        assert blocked < 1.5 * explicit + 1e-3, errors


def test_blocked_half_path_keeps_each_call_apart(monkeypatch):
    """Two attention layers run forward one after the other and backward in reverse order: each must keep
    its own probabilities, not views of the scratch buffer the next call overwrites (mutant: saving the
    scratch view instead of a copy). Bit-equal to each layer computed and differentiated on its own."""
    import attnlab.modules.attention as core

    monkeypatch.setattr(core, "QUERY_BLOCK", 4)
    g = torch.Generator().manual_seed(1)
    q1, k1, v1, q2, k2 = (torch.randn(2, 2, 10, 8, generator=g).bfloat16().requires_grad_() for _ in range(5))
    grad = torch.randn(2, 2, 10, 8, generator=g).bfloat16()

    def layer2(x):
        return attention(q2, k2, x, causal=True)[0]

    out = layer2(attention(q1, k1, v1, causal=True)[0])
    out.backward(grad)
    stacked = [x.grad.clone() for x in (q1, k1, v1, q2, k2)]
    for x in (q1, k1, v1, q2, k2):
        x.grad = None
    mid = attention(q1, k1, v1, causal=True)[0]
    m = mid.detach().requires_grad_()
    layer2(m).backward(grad)
    mid.backward(m.grad)
    for a, b in zip(stacked, [x.grad for x in (q1, k1, v1, q2, k2)]):
        assert torch.equal(a, b)


def test_blocked_half_path_without_gradients_gives_the_same_output(monkeypatch):
    """Under no_grad nothing is kept (the probabilities stay in the scratch buffer): the output is the same."""
    import attnlab.modules.attention as core

    monkeypatch.setattr(core, "QUERY_BLOCK", 4)
    q, k, v = (torch.randn(2, 3, 9, 8).bfloat16() for _ in range(3))
    with torch.no_grad():
        plain = attention(q, k, v, causal=True)[0]
    tracked = attention(*(x.requires_grad_() for x in (q, k, v)), causal=True)[0]
    assert torch.equal(plain, tracked.detach())


def test_blocked_half_path_scratch_buffers_are_bounded(monkeypatch):
    """Blocks shrink so that a block's scores fit WORKSPACE_BYTES (down to 32 queries); a block larger than
    that gets a buffer of its own that is not kept. Either way the result is unchanged."""
    import attnlab.modules.attention as core

    assert core._block_rows(48, 256, 256, torch.bfloat16) == 256  # 6 MiB of scores: one block
    assert core._block_rows(6, 2048, 2048, torch.bfloat16) == core.QUERY_BLOCK
    assert core._block_rows(48, 2048, 2048, torch.bfloat16) == 170  # 32 MiB / (48 · 2,048 · 2 bytes)
    monkeypatch.setattr(core, "WORKSPACE_BYTES", 64 * 100 * 2)
    assert core._block_rows(1, 100, 100, torch.bfloat16) == 64
    assert core._block_rows(4, 100, 100, torch.bfloat16) == 32  # 16 would fit: 32 is the floor
    kept = core._workspace(5, 64 * 100, torch.bfloat16, torch.device("cpu"))
    assert core._workspace(5, 10, torch.bfloat16, torch.device("cpu")).data_ptr() == kept.data_ptr()
    big = core._workspace(5, 64 * 100 + 1, torch.bfloat16, torch.device("cpu"))
    assert big.data_ptr() != kept.data_ptr()
    assert core._workspace(5, 10, torch.bfloat16, torch.device("cpu")).data_ptr() == kept.data_ptr()

    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(4, 1, 100, 8, generator=g).bfloat16().requires_grad_() for _ in range(3))
    out, _ = attention(q, k, v, causal=True)  # blocks of 32 queries, buffers beyond the limit
    out.float().sum().backward()
    grads = [x.grad for x in (q, k, v)]
    monkeypatch.setattr(core, "WORKSPACE_BYTES", 32 << 20)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    ref, _ = attention(*leaves, causal=True, need_weights=True)
    ref.float().sum().backward()
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    for a, b in zip(grads, [x.grad for x in leaves]):
        torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("call", ["learned-mask", "3-d-mask", "bias", "dropout", "weights", "fp32", "causal-cross"])
def test_blocked_half_path_is_not_taken_where_it_does_not_apply(monkeypatch, call):
    """Float masks that need a gradient, masks of other ranks, biases, dropout, requested weights, fp32, and
    causal attention with T != S keep their paths."""
    import attnlab.modules.attention as core

    monkeypatch.setattr(core._BlockedAttention, "apply", lambda *a: pytest.fail(f"{call}: blocked path taken"))
    q, k, v = (torch.randn(1, 2, 6, 8).bfloat16() for _ in range(3))
    kw: dict = {"causal": True}
    if call == "learned-mask":
        kw["mask"] = torch.zeros(1, 1, 1, 6).bfloat16().requires_grad_()
    elif call == "3-d-mask":
        kw["mask"] = torch.ones(1, 6, 6, dtype=torch.bool)
    elif call == "bias":
        kw["bias"] = torch.zeros(1, 2, 6, 6).bfloat16()
    elif call == "dropout":
        kw["dropout"] = 0.1
    elif call == "weights":
        kw["need_weights"] = True
    elif call == "fp32":
        q, k, v = q.float(), k.float(), v.float()
    else:
        k, v = k[:, :, :4], v[:, :, :4]  # fewer keys than queries: the explicit path's offset mask
        q = q[:, :, :3]
    out, _ = attention(q, k, v, **kw)
    assert torch.isfinite(out.float()).all()


def test_long_half_attention_keeps_bounded_memory(monkeypatch):
    """Beyond EXPLICIT_MAX_KEYS, where keeping every probability for the backward would exceed
    KEPT_PROBABILITY_BYTES, the fused kernel (memory linear in T) runs instead; without gradients, or below
    the limit, the blocked path runs, causal or not."""
    import attnlab.modules.attention as core

    calls = _record_blocked_calls(monkeypatch)  # argument 4: causal
    monkeypatch.setattr(core, "EXPLICIT_MAX_KEYS", 8)
    q, k, v = (torch.randn(1, 2, 16, 8).bfloat16().requires_grad_() for _ in range(3))
    attention(q, k, v, causal=True)
    attention(q, k, v)
    assert [a[4] for a in calls] == [True, False]
    monkeypatch.setattr(core, "KEPT_PROBABILITY_BYTES", 2 * 16 * 16 * 2 // 2 - 1)  # one byte short (causal)
    out, _ = attention(q, k, v, causal=True)
    assert [a[4] for a in calls] == [True, False]
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(out, ref)
    with torch.no_grad():
        attention(q, k, v, causal=True)
    assert [a[4] for a in calls] == [True, False, True]


def test_fp32_attention_under_onednn_products_takes_the_blocked_path(monkeypatch):
    """While fp32 products go to oneDNN (fp32 training of wide models), fp32 attention without a mask runs
    `_BlockedAttention` (torch's flash kernel is slow there) and matches float64; outside it, the fused kernel."""
    import attnlab.modules.attention as core
    from attnlab.training.device import fast_fp32_matmul, onednn_fp32_is_exact

    if not onednn_fp32_is_exact():
        pytest.skip("oneDNN's fp32 products are not exact fp32 on this CPU: attnlab never turns them on")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 40, 16, generator=g).requires_grad_() for _ in range(3))
    grad = torch.randn(2, 3, 40, 16, generator=g)
    ref = _float64_reference(q, k, v, True, grad)
    calls = _record_blocked_calls(monkeypatch)
    attention(q.detach(), k.detach(), v.detach(), causal=True)
    assert not calls and not core._onednn_fp32(q)
    with fast_fp32_matmul("cpu") as on:
        assert on and core._onednn_fp32(q)
        out, _ = attention(q, k, v, causal=True)
        out.backward(grad)
    assert len(calls) == 1
    for a, r in zip([out] + [x.grad for x in (q, k, v)], ref):
        torch.testing.assert_close(a.detach().double(), r, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("t, s", [(0, 0), (0, 5), (3, 0)])
def test_half_attention_with_no_queries_or_no_keys(t, s):
    """Empty query or key lengths keep working in half precision (the blocked path needs at least one of each:
    mutant: dropping its `t and s` guard makes the block loop step by 0)."""
    q = torch.randn(1, 2, t, 8).bfloat16().requires_grad_()
    k, v = (torch.randn(1, 2, s, 8).bfloat16().requires_grad_() for _ in range(2))
    out, _ = attention(q, k, v, causal=t == s)
    out.float().sum().backward()
    assert out.shape == (1, 2, t, 8) and not out.float().abs().sum()


@pytest.mark.parametrize("case", ["right-padding", "left-padding", "documents", "per-head", "float"])
@pytest.mark.parametrize("causal", [True, False])
def test_blocked_path_with_masks_matches_the_explicit_path(monkeypatch, case, causal):
    """Under oneDNN's fp32 products (fp32 training of wide models) key padding, document masks (one per row),
    per-head and float masks run on the blocked path; rows that see no key (left padding under causality)
    give zeros and zero, finite gradients, as the explicit path. In half precision masks keep the explicit
    path (see `_blockable`)."""
    import attnlab.modules.attention as core
    from attnlab.training.device import fast_fp32_matmul, onednn_fp32_is_exact

    if not onednn_fp32_is_exact():
        pytest.skip("oneDNN's fp32 products are not exact fp32 on this CPU: attnlab never turns them on")

    monkeypatch.setattr(core, "QUERY_BLOCK", 4)
    calls = _record_blocked_calls(monkeypatch)
    b, h, t, d = 3, 2, 10, 8
    g = torch.Generator().manual_seed(4)
    lengths = torch.tensor([10, 6, 3])
    right = torch.arange(t)[None] < lengths[:, None]  # (B, S)
    if case == "right-padding":
        mask = right[:, None, None, :]
    elif case == "left-padding":
        mask = right.flip(-1)[:, None, None, :]  # leading pad keys: early causal rows see nothing
    elif case == "documents":
        doc = torch.tensor([[0] * 4 + [1] * 6, [0] * 7 + [1] * 3, [0] * 10])
        mask = (doc[:, :, None] == doc[:, None, :])[:, None]  # (B, 1, T, S)
    elif case == "per-head":
        mask = torch.rand(b, h, t, t, generator=g) > 0.3
    else:
        mask = torch.zeros(b, 1, 1, t).masked_fill(~right[:, None, None, :], float("-inf"))
    q, k, v = (torch.randn(b, h, t, d, generator=g) for _ in range(3))
    grad = torch.randn(b, h, t, d, generator=g)
    leaves = [x.bfloat16().requires_grad_() for x in (q, k, v)]
    attention(*leaves, mask=mask if mask.dtype == torch.bool else mask.bfloat16(), causal=causal)
    assert not calls  # half precision with a mask: the explicit path
    results = []
    for weights in (False, True):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        with fast_fp32_matmul("cpu"):
            out, _ = attention(*leaves, mask=mask, causal=causal, need_weights=weights)
            out.backward(grad)
        results.append([out] + [x.grad for x in leaves])
    assert len(calls) == 1
    for blocked, explicit in zip(*results):
        assert torch.isfinite(blocked).all()
        torch.testing.assert_close(blocked.detach(), explicit.detach(), atol=1e-5, rtol=1e-4)
    if case == "left-padding" and causal:
        assert (results[0][0][2, :, :7] == 0).all()  # row 2's first 7 keys are padding


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("variant", ["synthesizer-dense", "dot"])
def test_bf16_autocast_training_with_document_masks_on_every_variant(variant, packed):
    """Under bf16 autocast a variant may hand attention keys of another dtype (the Synthesizer's position
    weights stay fp32): the blocked path takes only matching dtypes, the rest keeps the explicit path, whose
    products autocast. A packed batch (document masks) trains forward and backward on either."""
    from attnlab.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=12, d_model=16, n_heads=2, n_layers=2, attention=variant))
    ids = torch.randint(0, 11, (2, 12))
    documents = torch.tensor([[0] * 5 + [1] * 7, [0] * 12])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(ids, labels=ids, document_ids=documents if packed else None).loss
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters()
                                        if p.grad is not None)


def test_fp32_attention_on_a_torch_without_the_onednn_precision_switch(monkeypatch):
    """Older torch (pyproject allows 2.4) has no `torch.backends.mkldnn.matmul`: fp32 attention must not ask
    it for anything it lacks (mutant: reading `.matmul.fp32_precision` directly raises there)."""
    import types

    import attnlab.modules.attention as core

    monkeypatch.setattr(torch.backends, "mkldnn", types.SimpleNamespace(is_available=lambda: False))
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    assert not core._onednn_fp32(q)
    out, _ = attention(q, k, v, causal=True)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("need_weights", [False, True])
def test_an_integer_mask_is_refused_on_every_path(need_weights):
    """A 0/1 integer mask is neither a boolean mask nor an additive one: the explicit path would have added it to
    the scores (1 for a kept key, 0 for a hidden one) and the fused path failed inside torch."""
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ConfigError, match="mask.bool()"):
        attention(q, q, q, mask=torch.ones(1, 1, 3, 3, dtype=torch.long), need_weights=need_weights)
