"""A low-overhead decoder for the common GPT: the numbers of `GPT.forward` with a KV cache up to rounding (in
fp32 within ~1e-7 of them, other kernels summing in other orders; in half precision within its rounding, so a
near tie between two tokens can go the other way), in a fraction of the framework calls.

Decoding one token at batch 1 is dominated by per-call overhead, not arithmetic: the general forward
(variants, position hooks, masks, module calls) issues ~600 ATen calls per token for a 4-layer model.
For the configurations most GPTs use (dot-product attention; learned, sinusoidal, rotary, ALiBi, T5-bias
or no positions; pre-norm blocks), `FastGPTDecoder` runs each layer as a dozen
functional calls: one fused QKV product over weights concatenated once, a rotation of queries and keys
together from tables computed once, writes into a preallocated cache, the fused attention kernel (with a
score bias computed once per token for all layers), and the MLP. `generate` picks it automatically where
it applies; anything else (Shaw relative keys, which read the queries; bilinear or Synthesizer attention;
post-norm) takes the general path. Prompts of different lengths (left-padded, with a mask) count positions
over real tokens and mask the padding, as the general forward does. Large fp32 weights on a multi-core AMD
CPU are multiplied in slices, one per thread (`_slices`). bf16 weights on a CPU: a batch of one row multiplies
them by torch's own matrix-vector kernel, oneDNN switched off for each one-token step (`_own_gemv`); more
rows, on a CPU with bf16 instructions, by oneDNN's packed copies, GELU or ReLU inside the product (`_packs`).
Half-precision weights on a CPU with bf16 instructions attend over an fp32 cache (`_fp32_cache`).

Legend: B batch, T new tokens, S cached + new, D width, H heads, Dh head width, V vocabulary.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.modules.attention import attention
from attnlab.modules.feedforward import gelu
from attnlab.modules.positions import PositionScheme, RotaryPosition
from attnlab.training.device import cpu_has_bf16, cpu_is_amd, cpu_last_level_cache_bytes, onednn_off

# Up to this many input rows (batch rows at one new token each), a sliced fp32 product multiplies each block
# of weight rows by the inputs as columns, (out/S, in)·(in, M): MKL then streams every weight row once, as
# dot products. On 2 cores of a Zen 4 the 24 products of a token at 384 wide took ~1.0 ms this way and
# ~2.1 ms as the inputs times column slices of the weight, (M, in)·(in, out/S); from 8 rows on, the latter
# was 5-10 % faster and is used there.
_FEW_ROWS = 4


class _Layer(NamedTuple):
    """One block's weights as plain tensors (pre-norm: norm1 → attention, norm2 → MLP)."""

    norm1_w: Tensor
    norm1_b: Tensor
    norm1_eps: float
    qkv_w: Tensor  # a `_weight`: a transposed view (D, 3D), (S, 3D/S, D) row blocks, or oneDNN's packed copy
    qkv_b: Tensor | None
    scale: float | None
    out_w: Tensor
    out_b: Tensor | None
    norm2_w: Tensor
    norm2_b: Tensor
    norm2_eps: float
    fc1_w: Tensor
    fc1_b: Tensor | None
    act: Callable[[Tensor], Tensor] | None  # None: oneDNN applies it in the packed fc1 product (`fc1_act`)
    fc1_act: str
    fc2_w: Tensor
    fc2_b: Tensor | None


class FastGPTDecoder:
    """Incremental decoding for a `GPT` that `supports` accepts (a snapshot of its weights: build it for
    one `generate` call, after training, and do not change the model while it is in use).

    Args:
        model: the GPT, in eval mode.
        batch: rows decoded together.
        capacity: the most positions the cache will hold (prompt + new tokens).
        mask: for rows of different lengths, a (batch, capacity) 1/0 mask of real tokens over every position
            the cache will hold (left padding: zeros first); None when every row is real from position 0.
    """

    def __init__(self, model: nn.Module, batch: int, capacity: int, mask: Tensor | None = None,
                 _fused: list[tuple[Tensor, Tensor | None]] | None = None):
        fused = _fused if _fused is not None else (_fused_layers(model) if _structure_supported(model) else None)
        if fused is None:
            raise ValueError("FastGPTDecoder needs a pre-norm GPT with dot attention and learned, sinusoidal, "
                             "rotary, ALiBi, T5-bias or no positions")
        c = model.config
        self.n_heads, self.head_dim = c.n_heads, c.d_model // c.n_heads
        self.pos = 0
        weight = model.lm_head.weight
        self.slices = split = _slices(weight, fused, model.blocks.layers)
        # One row of bf16: torch's own matrix-vector kernel (`_own_gemv`); more rows: oneDNN's packed copies.
        self.own_gemv = one_row_of_own_gemv(weight, batch)
        self.packed = pack = batch if not self.own_gemv and _packs(weight) else 0
        packs = iter(_packed_weights(model, fused, pack)) if pack else None  # taken in the order below
        self.layers = []
        for layer, (qkv_w, qkv_b) in zip(model.blocks.layers, fused):  # (3D, D), (3D,)
            attn = layer.self_attn
            norm1, norm2, ff = layer.attn_block.norm, layer.ff_block.norm, layer.ff
            # Plain tensors and functions, not modules: a module call costs microseconds of Python per token.
            self.layers.append(_Layer(
                norm1.weight, norm1.bias, norm1.eps, *_weight(qkv_w, qkv_b, split, packs), attn.scores.scale,
                *_weight(attn.out_proj.weight, attn.out_proj.bias, split, packs), norm2.weight, norm2.bias,
                norm2.eps, *_weight(ff.fc1.weight, ff.fc1.bias, split, packs),
                *_activation(ff.act, pack), *_weight(ff.fc2.weight, ff.fc2.bias, split, packs)))
        shape = (len(self.layers), batch, self.n_heads, capacity, self.head_dim)
        self._cache_dtype = torch.float32 if pack or _fp32_cache(weight) else weight.dtype
        self.k = weight.new_empty(shape, dtype=self._cache_dtype)
        self.v = weight.new_empty(shape, dtype=self._cache_dtype)
        self._k_layers, self._v_layers = self.k.unbind(0), self.v.unbind(0)  # per-layer views, taken once
        self._width = (c.d_model,)
        limit = getattr(model, "max_len", None)
        if limit is not None and capacity > limit:
            raise ValueError(f"capacity {capacity} is beyond the model's {limit} positions")
        # The embedding of token i at position p is scale·E[i] + P[p] for the additive schemes accepted
        # here: P is computed once for every position of the cache, and the model's embedding modules
        # (four module calls per token) are not called.
        with torch.no_grad():
            zeros = weight.new_zeros(1, capacity, c.d_model)
            positions = torch.arange(capacity, device=weight.device)[None]
            self._position_table = model.position.embed(zeros, positions)[0]  # (capacity, D)
        self._token_table, self._token_scale = model.embed.token.weight, model.embed.scale
        final = model.blocks.norm
        self._final = (final.weight, final.bias, final.eps, *_weight(weight, model.lm_head.bias, 1, packs))
        self._positions = positions  # (1, capacity)
        self._keep = None
        if mask is not None:
            from attnlab.models.common import positions_from_mask

            if mask.shape != (batch, capacity):
                raise ValueError(f"mask must be (batch, capacity) = ({batch}, {capacity}), got {tuple(mask.shape)}")
            self._positions = positions_from_mask(mask)  # (B, capacity): each row counts its real tokens
            self._keep = mask.bool()[:, None, None, :]  # (B, 1, 1, capacity)
        self._rotary = _rotary_tables(model.position, capacity, weight.dtype, weight.device)
        scheme = type(model.position)
        self._bias_scheme = model.position if scheme.score_bias is not PositionScheme.score_bias else None

    @staticmethod
    def supports(model: nn.Module) -> bool:
        """Whether `model` is a GPT this decoder reproduces exactly (checked by structure, not by name): built by
        attnlab as it is, without hooks, modules swapped in or a subclass of the user's (`generate` then takes
        the model's own forward, so that they take effect)."""
        return _structure_supported(model) and _fused_layers(model) is not None

    @classmethod
    def for_model(cls, model: nn.Module, batch: int, capacity: int,
                  mask: Tensor | None = None) -> FastGPTDecoder | None:
        """The decoder for `model`, or None where `supports` says no; the fused QKV weights are built once,
        for the check and the decoder both."""
        fused = _fused_layers(model) if _structure_supported(model) else None
        return None if fused is None else cls(model, batch, capacity, mask, _fused=fused)

    @torch.no_grad()
    def step(self, ids: Tensor) -> Tensor:
        """Feed (B, T) new tokens (the whole prompt first, then one token at a time); return the (B, V)
        logits of the last one."""
        b, t = ids.shape
        start, end = self.pos, self.pos + t
        if t > 1 and start:
            raise ValueError("after the prompt, feed one token at a time")
        if end > self.k.shape[3]:
            raise ValueError(f"the cache holds {self.k.shape[3]} positions; build the decoder with more capacity")
        with onednn_off(self.own_gemv and t == 1):  # one row: torch's own bf16 matrix-vector kernel
            return self._step(ids, start, end)

    def _step(self, ids: Tensor, start: int, end: int) -> Tensor:
        b, t = ids.shape
        x = F.embedding(ids, self._token_table)  # (B, T, D)
        if self._token_scale != 1.0:
            x = x * self._token_scale
        rows = self._positions[:, start:end]  # (1|B, T)
        pe = self._position_table[start:end] if self._keep is None else self._position_table[rows]  # (T|B·T, D)
        x = (x + pe).view(b * t, -1)  # (B·T, D): 2-D throughout
        h_, dh, width = self.n_heads, self.head_dim, self._width
        ln = torch.layer_norm  # F.layer_norm's Python wrapper costs a microsecond a call
        if self._rotary is not None:
            cos, sin, half = self._rotary
            if self._keep is None:
                cos, sin = cos[start:end], sin[start:end]  # (T, Dh)
            else:
                cos, sin = cos[rows][:, None], sin[rows][:, None]  # (B, 1, T, Dh): each row's own positions
        keep = None if self._keep is None else self._keep[..., :end]  # (B, 1, 1, S)
        bias = bias_mask = None
        for p, k_cache, v_cache in zip(self.layers, self._k_layers, self._v_layers):
            qkv = _affine(ln(x, width, p.norm1_w, p.norm1_b, p.norm1_eps), p.qkv_w, p.qkv_b)  # (B·T, 3D)
            if t == 1:  # rows laid out (3, H, Dh): one view gives (B, 3, H, 1, Dh)
                qkv = qkv.view(b, 3, h_, 1, dh).transpose(0, 1)  # (3, B, H, 1, Dh)
            else:
                qkv = qkv.view(b, t, 3, h_, dh).permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
            if self._rotary is not None:
                # Queries and keys rotated together. The scheme computes x·cos + cat(-x₂, x₁)·sin; here
                # roll(x)·sin with the sign folded into sin, which is the same numbers (a sign flip is exact).
                qk = qkv[:2]
                q, k = (qk * cos + qk.roll(half, -1) * sin).unbind(0)
                v = qkv[2]
            else:
                q, k, v = qkv
            k_cache[:, :, start:end] = k
            v_cache[:, :, start:end] = v
            if q.dtype != self._cache_dtype:
                q = q.to(self._cache_dtype)
            k_all, v_all = k_cache[:, :, :end], v_cache[:, :, :end]
            if self._bias_scheme is not None and bias is None:
                # The same bias for every layer (schemes without query_bias do not read the queries).
                bias = self._bias_scheme.score_bias(q, rows, self._positions[:, :end], h_)
                bias_mask = bias.to(q.dtype)
            if bias is None and keep is None:
                # A prompt starts at position 0, so the square causal mask is exact; one new token sees all.
                a = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=t > 1, scale=p.scale)
            elif t == 1 and keep is None:
                a = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=bias_mask, scale=p.scale)
            else:  # a prompt with a bias, or padding: masks and bias folded together as the general forward does
                a, _ = attention(q, k_all, v_all, mask=keep, bias=bias, causal=t > 1, scale=p.scale)
            a = a.reshape(b, -1) if t == 1 else a.transpose(1, 2).reshape(b * t, -1)  # (B·T, D)
            if a.dtype != x.dtype:
                a = a.to(x.dtype)
            x = x + _affine(a, p.out_w, p.out_b)
            h = ln(x, width, p.norm2_w, p.norm2_b, p.norm2_eps)
            h = _affine(h, p.fc1_w, p.fc1_b, p.fc1_act)
            x = x + _affine(h if p.act is None else p.act(h), p.fc2_w, p.fc2_b)
        self.pos = end
        norm_w, norm_b, eps, head_w, head_b = self._final
        last = x if t == 1 else x.view(b, t, -1)[:, -1]
        return _affine(ln(last, width, norm_w, norm_b, eps), head_w, head_b)  # (B, V)


# The torch modules a GPT is built of; any other (a user's adapter, a norm swapped in, a parametrized weight) is
# computed by its own code, which the decoder, reading weights as tensors, would skip.
_TORCH_PARTS = (nn.ModuleList, nn.Linear, nn.Embedding, nn.LayerNorm)


def _as_built(model: nn.Module) -> bool:
    """Whether `model` computes exactly what attnlab's own code does: every module of a class attnlab builds (no
    subclass of the user's, whose forward may differ, nor a forward set on a module itself), and no forward hooks,
    global or on a module (steering, activation patching), which the decoder would not call."""
    hooks = torch.nn.modules.module
    if getattr(hooks, "_global_forward_hooks", None) or getattr(hooks, "_global_forward_pre_hooks", None):
        return False
    for module in model.modules():
        kind = type(module)
        if not (kind.__module__.startswith("attnlab.") or kind in _TORCH_PARTS):
            return False
        if module._forward_hooks or module._forward_pre_hooks or "forward" in vars(module):
            return False
    return True


def _structure_supported(model: nn.Module) -> bool:
    """A pre-norm GPT with a final norm as attnlab builds it (`_as_built`), and a position scheme that adds to the
    embeddings, rotates queries and keys as rotary does, or adds a score bias that does not read the queries."""
    from attnlab.models.gpt import GPT

    if not isinstance(model, GPT) or model.config.norm != "pre" or model.blocks.norm is None or not _as_built(model):
        return False
    position = model.position
    scheme = type(position)
    additive = scheme.embed is PositionScheme.embed or position.adds_to_embeddings
    rotation = isinstance(position, RotaryPosition) or (scheme.rotate_q is PositionScheme.rotate_q
                                                        and scheme.rotate_k is PositionScheme.rotate_k)
    bias = scheme.score_bias is PositionScheme.score_bias or not position.query_bias
    return additive and rotation and bias


def _rotary_tables(position: nn.Module, capacity: int, dtype: torch.dtype,
                   device: torch.device) -> tuple[Tensor, Tensor, int] | None:
    """(cos, signed sin, half) over every position of the cache for a rotary scheme, in the weights' dtype:
    the scheme's own angles, sin negated on the first half of the channels."""
    if not isinstance(position, RotaryPosition):
        return None
    cos, sin = position.angles_at(torch.arange(capacity, device=device))  # (capacity, Dh)
    half = cos.shape[-1] // 2
    sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)
    return cos.to(dtype), sin.to(dtype), half


def _fused_layers(model: nn.Module) -> list[tuple[Tensor, Tensor | None]] | None:
    """Each layer's fused QKV (weight, bias), or None if a layer's variant has none (a variant with a fused
    QKV projection declares its queries and keys plain projections of the input)."""
    fused = []
    for layer in model.blocks.layers:
        pair = layer.self_attn.scores.fused_qkv(layer.self_attn.v_proj)
        if pair is None:
            return None
        fused.append(pair)
    return fused


def _slices(weight: Tensor, fused: list[tuple[Tensor, Tensor | None]], layers: nn.Module) -> int:
    """How many slices `_weight` cuts each weight into: one per CPU thread for fp32 weights larger than a
    quarter of the last-level cache, else one.

    At batch 1 every product is a matrix-vector product, and the BLAS (MKL) runs it on one core. Where the
    weights stream from memory, one core reads ~14-20 GB/s and two together ~30-40; a batched product over S
    blocks of the weight's rows is spread over the threads by torch. On 2 cores of a Zen 4 the six layers of
    shape B (384 wide, 42 MB) took ~1.0 ms per token this way instead of 3.7 unsliced. The L3 of a shared
    VM is shared with other tenants' cores, so weights stream from memory well below its size: decoding at
    256 wide (13 MB) ran 23-30 % faster sliced, at 192 wide (7 MB) the same, at 128 and 160 (3-5 MB) 4-23 %
    slower, the threads' start-up outweighing the reads. Half-precision matrix-vector products are threaded
    already. AMD CPUs only: on 2 cores of an Intel Ice Lake (48 MB of L3), MKL's batched products ran the blocks
    slower than its unsliced matrix-vector products, and shape B decoded 188-205 tokens/s sliced against 309-357
    unsliced (six runs each in turns, 2026-12-07)."""
    threads = torch.get_num_threads()
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or threads < 2 or not cpu_is_amd():
        return 1
    size = sum(w.numel() * w.element_size() for w, _ in fused)
    size += sum(p.numel() * p.element_size() for layer in layers
                for p in (layer.self_attn.out_proj.weight, layer.ff.fc1.weight, layer.ff.fc2.weight))
    return min(threads, 16) if size > cpu_last_level_cache_bytes() // 4 else 1


def one_row_of_own_gemv(weight: Tensor | None, rows: int) -> bool:
    """Whether a forward of `rows` rows (batch × new tokens) with weights like `weight` should run with oneDNN
    switched off (`onednn_off`), its products then taking torch's own matrix-vector kernel: one row of bf16
    weights on a CPU (`_own_gemv`). Also for the general forward with a KV cache: a GPT with Shaw relative
    positions at 384 wide, 6 layers, bf16, batch 1 decoded 100 tokens in 2.93 ms a token against 5.22
    (learned positions through the general forward: 2.90 against 4.74; 600 tokens at block 1,024: 3.53
    against 6.84), the same tokens."""
    return weight is not None and rows == 1 and _own_gemv(weight)


def _own_gemv(weight: Tensor) -> bool:
    """Whether steps of one row multiply by torch's own bf16 matrix-vector kernel, with oneDNN switched off
    for the step: bf16 weights on a CPU.

    On a CPU with bf16 instructions torch sends bf16 products to oneDNN, whose every call from Python costs
    ~14 µs beyond its arithmetic (a 64 × 64 product of packed weights took 13.4-14 µs on the Zen 4, the
    primitive itself 3-6 µs at 384 × 384 by ONEDNN_VERBOSE). Without oneDNN, a product of one row takes
    torch's own kernel (fp32 sums of bf16 products, on every thread; the one CPUs without bf16 instructions
    always take): 384 × 384 in 13 µs against 18 packed, and decoding 200 tokens in turns with the packed
    path went 0.87 -> 0.47 ms a token at 128 wide, 1.47 -> 1.04 at 256, 1.79 -> 1.50 at 384 (6 layers), the
    same tokens. Products of more rows keep oneDNN: torch's own kernel for them is a plain loop (see
    `onednn_off` for the switch's scope)."""
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16


def _fp32_cache(weight: Tensor) -> bool:
    """Whether the keys and values of half-precision weights are cached in fp32 (the same values, exactly)
    and attended in fp32: on a CPU with bf16 instructions.

    There torch's bf16 attention kernel for one query took 76 µs at 208 keys on the Zen 4 where its fp32 one
    took 16 (13 against 9 at 16 keys). Decoding 900 tokens at 384 wide with packed weights ran 329 -> 421
    tokens/s (200 tokens: within noise); 200 tokens in turns with a cache in the weights' dtype: fp16 weights
    1.59 -> 1.36 ms a token at 384 wide and 0.46 -> 0.42 at 128; bf16 weights with torch's own
    matrix-vector kernel 1.39 -> 1.34 at 384, 0.415 -> 0.427 at 128 (the two casts a layer outweigh the
    attention there). On the AVX2 Zen 3, without bf16 instructions, an fp32 cache for bf16 weights measured
    0.996x at 384 wide and 1.06x slower at 128, so the cache keeps the weights' dtype there."""
    return weight.device.type == "cpu" and weight.dtype in (torch.bfloat16, torch.float16) and cpu_has_bf16()


def _packs(weight: Tensor) -> bool:
    """Whether to multiply by oneDNN's packed copies of the weights: bf16 weights on a CPU with bf16
    instructions, where torch's own bf16 product for a few rows is slow.

    At batch 1 on 2 cores of an AMD Zen 4 (AVX-512 bf16), a (384, 1536) product took 48-73 µs through
    `addmm` and 24-27 through oneDNN with the weight reordered once (the same bits); decoding at 384 wide ran
    330 -> 482 tokens/s, at 128 wide no faster nor slower. The price is a packed copy of every weight, kept
    with the model between `generate` calls (`_packed_weights`). Elsewhere (fp32, fp16, a CPU without bf16
    instructions, a GPU) the plain product stays. A batch of one row takes torch's own kernel instead
    (`_own_gemv`): faster still at every width measured."""
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and cpu_has_bf16()
            and _onednn_linear_works())


@functools.lru_cache(maxsize=1)
def _onednn_linear_works() -> bool:
    """Whether this torch build has oneDNN's packed bf16 linear and it gives F.linear's numbers (checked
    once on a small product, so a build without it, or one that computes differently, keeps the plain one)."""
    try:
        g = torch.Generator().manual_seed(0)
        w, b, x = (torch.randn(*shape, generator=g).bfloat16() for shape in ((48, 32), (48,), (3, 32)))
        y = _affine(x, torch.ops.mkldnn._reorder_linear_weight(w, 1), b)
        return bool(torch.equal(y, F.linear(x, w, b)))
    except (AttributeError, RuntimeError):
        return False


def _weight(w: Tensor, b: Tensor | None, split: int, packs: Iterator[Tensor] | None = None
            ) -> tuple[Tensor, Tensor | None]:
    """A Linear's (out, in) weight and bias as `_affine` takes them. With one slice, the transposed weight
    (in, out), a view; with S, the weight as S blocks of rows (S, out/S, in) and the bias as (S, out/S, 1),
    views.
    A width S does not divide takes the largest slice count below S that does. With `packs`, the next of
    oneDNN's packed copies instead (see `_packs`, `_packed_weights`)."""
    if packs is not None:
        return next(packs), b
    out = w.shape[0]
    s = next(s for s in range(split, 0, -1) if out % s == 0)
    if s == 1:
        return w.t(), b
    return w.view(s, out // s, -1), (b.view(s, out // s, 1) if b is not None else None)


# The packed weights of each model, kept from one `generate` call to the next: (rows per product, copies of
# the weights they were packed from, the packed copies). At 384 wide and 6 layers on the Zen 4, in turns with
# a model packed anew for every call: 20 tokens 2.40-2.54 -> 1.89-1.96 ms a token, 200 tokens 1.72 -> 1.65;
# comparing the weights with the kept copies, bit for bit, takes ~1.5 ms a call. Models whose weights pass
# PACK_CACHE_BYTES are packed anew for every call.
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
PACK_CACHE_BYTES = 256 << 20


def _packed_weights(model: nn.Module, fused: list[tuple[Tensor, Tensor | None]], rows: int) -> list[Tensor]:
    """oneDNN's packed copies of the model's weights for products of `rows` rows, in the order the decoder
    takes them (each layer's fused QKV, output, MLP in and MLP out weights, then the head's).

    They are kept with the model and reused while its weights hold the same values: compared bit for bit
    (`_same_bits`) with copies taken at packing time, so any change (an optimizer step, `load_state_dict`, a write
    through `.data`, which no version counter sees) packs anew. The price of keeping them: two copies of the
    weights while the model lives."""
    weights = []
    for layer, (qkv_w, _) in zip(model.blocks.layers, fused):
        weights += [qkv_w, layer.self_attn.out_proj.weight, layer.ff.fc1.weight, layer.ff.fc2.weight]
    weights = [w.detach() for w in weights + [model.lm_head.weight]]
    hit = _PACKED.get(model)
    if hit is not None and hit[0] == rows and len(hit[1]) == len(weights) and all(
            _same_bits(a, w) for a, w in zip(hit[1], weights)):
        return hit[2]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in weights]
    if sum(w.numel() * w.element_size() for w in weights) <= PACK_CACHE_BYTES:
        _PACKED[model] = (rows, [w.clone() for w in weights], packed)
    else:
        _PACKED.pop(model, None)
    return packed


def _same_bits(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors hold the same bits, compared 8 bytes at a time where their layout allows (torch's
    bf16 comparison read ~3.5 GB/s on the Zen 4, an int64 view ~20)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_contiguous() and b.is_contiguous() and a.numel() * a.element_size() % 8 == 0:
        return torch.equal(a.reshape(-1).view(torch.int64), b.reshape(-1).view(torch.int64))
    return torch.equal(a, b)


def _activation(act: Callable[[Tensor], Tensor], pack: int) -> tuple[Callable[[Tensor], Tensor] | None, str]:
    """(act, "none"), or (None, oneDNN's name) for an activation the packed product applies itself.

    Fused, the exact GELU is computed on the fp32 sum before it is rounded to bf16, once instead of twice
    (no less accurate), and a separate call (~17 µs for 1,536 values on the Zen 4) is saved."""
    if pack and act is gelu:
        return None, "gelu"
    if pack and act is F.relu:
        return None, "relu"
    return act, "none"


def _affine(x: Tensor, w: Tensor, b: Tensor | None, act: str = "none") -> Tensor:
    """x·wᵀ + b for 2-D x (M, in) and a weight from `_weight`: one BLAS call, none of F.linear's reshapes.
    A packed weight's product may apply an activation (`_activation`)."""
    if w.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, w, b, act, [], "none" if act == "gelu" else "")
    if w.dim() == 2:
        return torch.addmm(b, x, w) if b is not None else torch.mm(x, w)
    m = x.shape[0]
    if m <= _FEW_ROWS:  # each block of weight rows times the input columns: (S, out/S, in)·(in, M)
        xs = x.t().expand(w.shape[0], -1, -1)  # (S, in, M): the same input for every block, no copy
        y = torch.baddbmm(b, w, xs) if b is not None else torch.bmm(w, xs)  # (S, out/S, M)
        return y.view(1, -1) if m == 1 else y.view(-1, m).t().contiguous()  # (M, out)
    xs = x.expand(w.shape[0], *x.shape)  # (S, M, in)
    wt = w.transpose(1, 2)  # (S, in, out/S)
    y = torch.baddbmm(b.transpose(1, 2), xs, wt) if b is not None else torch.bmm(xs, wt)  # (S, M, out/S)
    return y.transpose(0, 1).reshape(m, -1)  # (M, out)
