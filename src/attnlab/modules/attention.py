"""The attention core: the pure attention function, masks, the KV cache and multi-head attention.

Dimension legend used in shape comments:
    B batch, H heads, T query length, S key/value length, D model width, Dh head width,
    Dq query/key width of a variant (Dh for `dot`, D for `bilinear`...).

Mask convention (the same as `torch.nn.functional.scaled_dot_product_attention`): a boolean mask is
True where a query MAY attend to a key; a float mask is added to the scores. Note that
`torch.nn.MultiheadAttention` uses the opposite boolean convention (True = blocked).
"""

from __future__ import annotations

import functools
import math
import threading

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.modules.dropout import dropout as attention_dropout
from attnlab.training.device import onednn_fp32_matmul_on

# --------------------------------------------------------------------------------------------------
# Masks
# --------------------------------------------------------------------------------------------------


def causal_mask(t_q: int, t_k: int | None = None, *, device: torch.device | str | None = None) -> Tensor:
    """Square subsequent mask, (T, S) bool, True where query i may see key j.

    When there are more keys than queries (incremental decoding: S - T earlier tokens sit in a cache)
    the queries are the *last* T positions, so query i sees keys j <= i + (S - T).
    """
    t_k = t_q if t_k is None else t_k
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)


def padding_mask_from_lengths(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """(B,) lengths -> (B, S) bool, True on real tokens (right padding)."""
    max_len = int(lengths.max()) if max_len is None else max_len
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def padding_mask_from_ids(ids: Tensor, pad_id: int) -> Tensor:
    """(B, S) token ids -> (B, S) bool, True where the token is not padding."""
    return ids != pad_id


def key_mask(keep: Tensor) -> Tensor:
    """(B, S) bool keep-mask over keys -> (B, 1, 1, S), broadcastable over heads and queries."""
    return keep[:, None, None, :]


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """AND together boolean masks that broadcast to (B, H, T, S); None entries are skipped."""
    out = None
    for m in masks:
        if m is None:
            continue
        out = m if out is None else out & m
    return out


# --------------------------------------------------------------------------------------------------
# The attention function
# --------------------------------------------------------------------------------------------------

# Which implementation runs when weights are not requested. In bf16/fp16 on a CPU, torch's flash kernel is
# slow: written out with batched products, attention is faster at every length measured. Without a mask, bias
# or dropout that is `_BlockedAttention` (blocks of QUERY_BLOCK queries, causal blocks against the keys up to
# their end only, scratch matrices in buffers kept between calls). Forward + backward, causal, 2 cores of a
# Zen 4, q, k and v read from a fused projection as in a model, torch's allocator untouched (2026-11-24):
#     (B, H, T, Dh)      flash   explicit path before   _BlockedAttention
#     (8, 6, 256, 64)     26 ms       18 ms                 13 ms
#     (4, 6, 512, 64)     45          31                    21
#     (2, 6, 1024, 64)    49          55                    36
#     (1, 6, 2048, 64)    82          86                    58
# and without causality 1.25-1.5x faster than flash at 1,024-2,048 keys. Most of the difference to the path
# before is memory: written through autograd it put four (T, S) matrices per call in fresh memory, which glibc
# hands back to the kernel when freed and the kernel zeroes again at the next use; with glibc told to keep
# freed memory (`attnlab.allocator`, as the `attnlab` command does) the two were within 10 %. With a mask, a
# bias or requested weights the explicit path runs (masks and bias folded into one additive matrix), up to
# EXPLICIT_MAX_KEYS keys. In fp32 the fused kernel runs (the blocked path measured 0.96-1.12x its speed), except
# while fp32 products go to oneDNN (`_onednn_fp32`): the fused kernel took 33 ms at (8, 6, 256, 64) there
# against 21 without, the blocked path 23, and an fp32 training step at 6 layers x 384 wide, block 256, batch
# 8 went 842-900 -> 791-820 ms. With dropout on a CPU the explicit path runs at every dtype: there the fused
# kernel falls back to its math path and torch's slow dropout, and the explicit path with attnlab's `dropout`
# was 1.4-2.0x faster (fp32, forward + backward, dropout 0.1, `benchmarks/bench_dropout.py`). On GPUs the
# fused kernel runs.
EXPLICIT_MAX_KEYS = 512
QUERY_BLOCK = 256  # queries per block of the blocked paths
WORKSPACE_BYTES = 32 << 20  # the most each of `_BlockedAttention`'s two kept scratch buffers may hold
KEPT_PROBABILITY_BYTES = 512 << 20  # beyond 512 keys, the most probabilities one call may keep for its backward


def prefers_explicit(q: Tensor, s: int) -> bool:
    """True where the explicit path beats `scaled_dot_product_attention` (half precision on CPU, S <= 512)."""
    return _half_on_cpu(q) and s <= EXPLICIT_MAX_KEYS


def _half_on_cpu(q: Tensor) -> bool:
    return q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)


def _onednn_fp32(q: Tensor) -> bool:
    """fp32 on a CPU while fp32 products go to oneDNN (`attnlab.training.device.fast_fp32_matmul`, as fp32
    training of wide models does): torch's flash kernel then runs its many small products through oneDNN,
    each paying oneDNN's per-call cost."""
    return q.device.type == "cpu" and q.dtype == torch.float32 and onednn_fp32_matmul_on()


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    causal: bool = False,
    dropout: float = 0.0,
    scale: float | None = None,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(q·kᵀ·scale + bias + mask) · v.

    Args:
        q: (B, H, T, Dq) queries.
        k: (B, H, S, Dq) keys.
        v: (B, H, S, Dv) values.
        mask: boolean, True = may attend (or float, added to the scores), broadcastable to (B, H, T, S).
        bias: float scores added before the softmax (relative positions, ALiBi...), broadcastable.
        causal: forbid query i from seeing keys after it (bottom-right aligned when S > T).
        dropout: dropout probability on the attention weights (pass 0.0 in eval mode).
        scale: score multiplier; default 1/sqrt(Dq).
        need_weights: also return the (B, H, T, S) weights. This takes the explicit path; otherwise the
            fastest path measured for the device, dtype and shape runs: torch's fused
            `scaled_dot_product_attention`, or in half precision on a CPU a blocked or explicit one (see the
            notes above EXPLICIT_MAX_KEYS). All give the same numbers up to rounding; with dropout, the same
            distribution (each path draws its dropout masks in its own way).

    Returns:
        (out (B, H, T, Dv), weights or None). A query whose keys are all masked gets a zero output
        (and zero weights), never NaN.
    """
    if mask is not None and mask.dtype != torch.bool and not mask.is_floating_point():
        raise ConfigError(f"attention mask must be boolean (True = may attend) or float (added to the scores), "
                          f"got {mask.dtype}; for a 0/1 mask of real tokens pass mask.bool()")
    if mask is not None and mask.dim() < 4:  # broadcasting's leading ones, so every path reads it alike
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    t, s = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if causal and t == 1:
        causal = False  # one query, the newest: it may see every key
    # Only a user mask (or causal with more queries than keys) can hide every key of a row.
    may_hide_rows = mask is not None or (causal and t > s)

    # (Under torch.compile first: reading torch's oneDNN switch in `_onednn_fp32` would break the graph.)
    if (not torch.compiler.is_compiling() and (_half_on_cpu(q) or _onednn_fp32(q))
            and k.dtype == v.dtype == q.dtype and bias is None
            and not need_weights and (t == s or not causal) and t and s and q.shape[:-2].numel()
            and _blockable(mask, q, s)):
        # Blocked paths, unless keeping every probability for the backward would take more memory than
        # KEPT_PROBABILITY_BYTES at a length torch's flash kernel (memory linear in T) also serves well. (With
        # dropout on a CPU, which that kernel does not take, the explicit path serves those lengths instead,
        # keeping about twice what the blocked causal path would: a trade of memory for speed left unmeasured.)
        keep = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        kept = q.shape[:-2].numel() * t * s * q.element_size() // (2 if causal and mask is None else 1)
        if s <= EXPLICIT_MAX_KEYS or not keep or kept <= KEPT_PROBABILITY_BYTES:
            if dropout == 0:
                if mask is None:
                    return _BlockedAttention.apply(q, k, v, scale, causal, keep, None, None), None
                additive, hidden = _block_mask(mask, q.dtype, t, s, causal)
                return _BlockedAttention.apply(q, k, v, scale, causal, keep, additive, hidden), None
            if causal and s > EXPLICIT_MAX_KEYS and _half_on_cpu(q) and mask is None:
                return _blocked_causal_attention(q, k, v, dropout=dropout, scale=scale), None
    if need_weights or prefers_explicit(q, s) or (dropout > 0 and q.device.type == "cpu"):
        return _explicit_attention(q, k, v, mask=mask, bias=bias, causal=causal, dropout=dropout, scale=scale,
                                   need_weights=need_weights, may_hide_rows=may_hide_rows)

    # Fold causality, the boolean mask and the additive bias into one attn_mask for the fused kernel, which takes
    # a float mask only in the queries' dtype (the other paths cast it).
    attn_mask = mask if mask is None or mask.dtype == torch.bool else mask.to(q.dtype)
    if causal and (mask is not None or bias is not None or t != s):
        cm = causal_mask(t, s, device=q.device)
        attn_mask = cm if attn_mask is None else _and_masks(attn_mask, cm)
        causal = False
    if bias is not None:
        bias = bias.to(q.dtype)
        attn_mask = bias if attn_mask is None else _add_bias(attn_mask, bias)

    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=dropout, is_causal=causal and t == s, scale=scale
    )
    if may_hide_rows:
        # Rows whose keys are all masked: the kernels disagree (NaN or a mean of values); make them 0.
        visible = _any_visible(attn_mask, s)
        if visible is not None:
            out = out.masked_fill(~visible, 0.0)
    return out, None


def _explicit_attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor | None, bias: Tensor | None,
                        causal: bool, dropout: float, scale: float, need_weights: bool,
                        may_hide_rows: bool) -> tuple[Tensor, Tensor | None]:
    """softmax(q·kᵀ·scale + additive mask)·v written out, returning the weights on request.

    Causality, the boolean mask and the bias become one additive float mask (0 where visible, -inf where
    not, plus the bias) that enters the score product as the input of `baddbmm`: scaling and masking
    then cost no pass of their own over the (T, S) scores.
    """
    t, s = q.shape[-2], k.shape[-2]
    # Under torch.compile the mask is traced into the graph: the cache wrapper would only draw a warning.
    causal_additive = _causal_additive.__wrapped__ if torch.compiler.is_compiling() else _causal_additive
    additive = causal_additive(t, s, q.dtype, q.device) if causal else None  # (T, S)
    for extra in (mask, bias):
        if extra is not None:
            extra = _as_additive(extra, q.dtype)
            additive = extra if additive is None else additive + extra
    scores = _masked_scores(q, k, scale, additive)  # (B, H, T, S)
    visible = _any_visible(additive, s) if (may_hide_rows and additive is not None) else None
    if visible is not None:
        # Rows with every key masked: a softmax over all -inf is NaN, which would reach the
        # gradients of q, k and the bias through the addition even if zeroed afterwards. Give
        # those rows finite scores (cutting their gradient), then zero their weights.
        scores = scores.masked_fill(~visible, 0.0)
    # In half precision the softmax kernel accumulates in fp32 and rounds its output once, as a softmax of
    # the scores cast to fp32 would, without two casts of the full (T, S) matrix.
    weights = torch.softmax(scores, dim=-1)
    if visible is not None:
        weights = weights.masked_fill(~visible, 0.0)
    dropped = attention_dropout(weights, dropout)
    return torch.matmul(dropped, v), (weights if need_weights else None)


def _blocked_causal_attention(q: Tensor, k: Tensor, v: Tensor, *, dropout: float, scale: float) -> Tensor:
    """Causal self-attention (T = S) one block of QUERY_BLOCK queries at a time: block [i, e) attends to
    keys [0, e) only, so the fully masked part of the score matrix is never computed. Each block is the
    explicit path with its causal mask bottom-right aligned (query i + j sees keys up to i + j), so the
    result equals the full product. (With dropout; without, `_BlockedAttention` does the same faster.)"""
    t = q.shape[-2]
    blocks = []
    for i in range(0, t, QUERY_BLOCK):
        e = min(i + QUERY_BLOCK, t)
        out, _ = _explicit_attention(q[:, :, i:e], k[:, :, :e], v[:, :, :e], mask=None, bias=None, causal=True,
                                     dropout=dropout, scale=scale, need_weights=False, may_hide_rows=False)
        blocks.append(out)
    return torch.cat(blocks, dim=2)  # (B, H, T, Dv)


class _BlockedAttention(torch.autograd.Function):
    """softmax(q·kᵀ·scale [+ causal mask])·v for half precision on a CPU (and fp32 while fp32 products go to
    oneDNN, see `_onednn_fp32`), forward and backward written out, one block of QUERY_BLOCK queries at a time
    (causal: each block against the keys up to its end only).

    The products and kernels of `_explicit_attention` (in half precision: products accumulated in fp32, the
    softmax and its backward computed in fp32 internally), arranged to touch little fresh memory: only each
    block's probabilities are kept for the backward (`keep`); the scores, and in the backward the gradients of
    probabilities and scores, go into two scratch buffers that live between calls (per thread, each at most
    WORKSPACE_BYTES: blocks get fewer queries where a buffer would be larger). The gradients of keys and values add
    every block's term (each a product in the inputs' dtype) into fp32 sums, rounded once at the end.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool, keep: bool,
                additive: Tensor | None, hidden: Tensor | None) -> Tensor:
        b, h, t, d = q.shape
        s, dv = k.shape[-2], v.shape[-1]
        q3, k3, v3 = q.reshape(b * h, t, d), k.reshape(b * h, s, d), v.reshape(b * h, s, dv)
        rows = _block_rows(b * h, t, s, q.dtype)
        scores = _workspace(0, b * h * rows * s, q.dtype, q.device)
        out = q.new_empty(b * h, t, dv)
        probs = []
        for i in range(0, t, rows):
            e = min(i + rows, t)
            keys = e if causal else s
            # Probabilities kept for the backward get memory of their own: the scratch buffer serves the next
            # block and the next call.
            p = _block_probabilities(scores, q3, k3, i, e, keys, scale, causal, fresh=keep,
                                     masks=(b, additive, hidden))
            if keep:
                probs.append(p)
            if rows >= t:  # one block: straight into the output
                torch.bmm(p, v3, out=out)
            else:  # a product written into the strided rows would run as one small product per matrix
                out[:, i:e] = torch.bmm(p, v3[:, :keys])
        if keep:
            ctx.save_for_backward(q3, k3, v3, *probs)
            ctx.args = (b, h, rows, scale)
        return out.view(b, h, t, dv)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        q3, k3, v3, *probs = ctx.saved_tensors
        b, h, rows, scale = ctx.args
        t, s = q3.shape[1], k3.shape[1]
        g3 = grad.reshape(q3.shape[0], t, v3.shape[-1])
        scratch = _workspace(1, max(p.numel() for p in probs), q3.dtype, q3.device)
        if len(probs) == 1:
            p = probs[0]
            ds = _score_gradients(scratch, p, g3, v3)
            dq = torch.baddbmm(q3, ds, k3, beta=0, alpha=scale)
            dk = torch.baddbmm(k3, ds.transpose(1, 2), q3, beta=0, alpha=scale)
            dv = torch.bmm(p.transpose(1, 2), g3)
        else:
            # Keys and values collect a term from every block (a product in the inputs' dtype): summed in fp32,
            # the sums rounded once at the end.
            dq = torch.empty_like(q3)
            dk, dv = (x.new_zeros(x.shape, dtype=torch.float32) for x in (k3, v3))
            for p, i in zip(probs, range(0, t, rows)):
                e, keys = i + p.shape[1], p.shape[2]
                g = g3[:, i:e]
                ds = _score_gradients(scratch, p, g, v3[:, :keys])
                dq[:, i:e] = torch.baddbmm(q3[:, i:e], ds, k3[:, :keys], beta=0, alpha=scale)
                dk[:, :keys] += torch.baddbmm(k3[:, :keys], ds.transpose(1, 2), q3[:, i:e], beta=0, alpha=scale)
                dv[:, :keys] += torch.bmm(p.transpose(1, 2), g)
            dk, dv = dk.to(q3.dtype), dv.to(q3.dtype)
        return (dq.view(b, h, t, -1), dk.view(b, h, s, -1), dv.view(b, h, s, -1), None, None, None, None, None)


def _block_probabilities(scores: Tensor, q3: Tensor, k3: Tensor, i: int, e: int, keys: int, scale: float,
                         causal: bool, fresh: bool, masks: tuple[int, Tensor | None, Tensor | None]) -> Tensor:
    """softmax(scale·q[i:e]·k[:keys]ᵀ [+ the block's causal mask, bottom-right aligned] [+ a mask]),
    (B·H, e - i, keys): the scores in the scratch buffer `scores`, the probabilities in a new tensor if
    `fresh`, else over them. `masks` is (B, the additive mask of `_block_mask` or None, its hidden rows or
    None): rows that see no key get probabilities 0."""
    out = scores[: q3.shape[0] * (e - i) * keys].view(q3.shape[0], e - i, keys)
    kt = k3[:, :keys].transpose(1, 2)
    if causal:
        # The block's mask, (e - i, keys) bottom-right aligned, is the last `keys` columns of the (e - i, T)
        # one: a view, so one mask serves every full block of a call.
        t = q3.shape[1]
        mask = _causal_additive(e - i, t, q3.dtype, q3.device)[:, t - keys:]
        torch.baddbmm(mask, q3[:, i:e], kt, alpha=scale, out=out)
    else:
        torch.baddbmm(out, q3[:, i:e], kt, beta=0, alpha=scale, out=out)
    b, additive, hidden = masks
    hidden_rows = None
    if additive is not None:
        per_pair = out.view(b, -1, e - i, keys)  # (B, H, rows, keys)
        per_pair += additive[:, :, i:e, :keys] if additive.shape[2] > 1 else additive[..., :keys]
        if hidden is not None:
            hidden_rows = hidden[:, :, i:e]  # (B, 1|H, rows, 1): all -inf, their softmax NaN until zeroed below
    if fresh:
        p = torch._softmax(out, -1, False)
    else:
        p = torch.ops.aten._softmax.out(out, -1, False, out=out)  # in place: each row is read, then written
    if hidden_rows is not None:
        p.view(b, -1, e - i, keys).masked_fill_(hidden_rows, 0.0)
    return p


def _blockable(mask: Tensor | None, q: Tensor, s: int) -> bool:
    """Whether `_BlockedAttention` takes this mask: none, or under oneDNN's fp32 products (`_onednn_fp32`) a
    boolean mask or constant float one of shape (B | 1, H | 1, T | 1, S) (key padding, document masks).

    Masks in half precision keep the explicit path: with freed memory kept (the `attnlab` command) the two
    measured the same there (20 rows of 128 with document masks, bf16, forward + backward: 4.3-5.3 ms
    against 4.6-4.9), and the blocked path rounds the gradients of queries and keys once where the explicit
    path rounds them twice: the quick knowledge run, which trains on such masks, then took another course
    (vanilla attention 19 % instead of the 29 % of five runs). Under oneDNN's fp32 products the flash kernel
    is slow with masks too: (8, 6, 256, 64) with key padding 31 -> 20 ms, 20 rows of 128 with document
    masks 25 -> 6.7 ms."""
    if mask is None:
        return True
    if q.dtype != torch.float32:
        return False
    if mask.dim() != 4 or mask.requires_grad or (mask.dtype != torch.bool and not mask.is_floating_point()):
        return False
    b, h, t = q.shape[:3]
    return (mask.shape[0] in (1, b) and mask.shape[1] in (1, h) and mask.shape[2] in (1, t)
            and mask.shape[3] == s)


def _block_mask(mask: Tensor, dtype: torch.dtype, t: int, s: int, causal: bool) -> tuple[Tensor, Tensor | None]:
    """A mask for `_BlockedAttention`: (additive (B|1, H|1, T|1, S) of `dtype`, and the (B|1, H|1, T, 1)
    rows that see no key at all, causality included, or None where every row sees one)."""
    allowed = mask if mask.dtype == torch.bool else mask > float("-inf")
    if causal:
        allowed = allowed & causal_mask(t, s, device=mask.device)
    visible = _any_visible(allowed, s)
    hidden = None if visible is None else ~visible.expand(*visible.shape[:2], t, 1)
    return _as_additive(mask, dtype), hidden


def _score_gradients(scratch: Tensor, p: Tensor, g: Tensor, v: Tensor) -> Tensor:
    """The gradient of a block's scores, p ⊙ (g·vᵀ - rowsum(p ⊙ g·vᵀ)), computed in the scratch buffer."""
    dp = torch.bmm(g, v.transpose(1, 2), out=scratch[: p.numel()].view(p.shape))
    return torch.ops.aten._softmax_backward_data.out(dp, p, -1, p.dtype, grad_input=dp)  # in place, row by row


def _block_rows(pairs: int, t: int, s: int, dtype: torch.dtype) -> int:
    """Queries per block: QUERY_BLOCK (or T, if fewer), fewer where a block's (pairs, rows, S) scores would
    exceed the scratch buffer's WORKSPACE_BYTES, down to 32 or QUERY_BLOCK if smaller (past that the buffer
    is allocated per call)."""
    fit = WORKSPACE_BYTES // max(1, pairs * s * torch.finfo(dtype).bits // 8)
    return min(t, max(min(QUERY_BLOCK, fit), min(32, QUERY_BLOCK)))


_scratch = threading.local()


def _workspace(slot: int, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """n elements of a scratch buffer kept between calls (per thread, dtype and device; contents undefined);
    a fresh one, not kept, where n elements exceed WORKSPACE_BYTES."""
    if n * torch.finfo(dtype).bits // 8 > WORKSPACE_BYTES:
        return torch.empty(n, dtype=dtype, device=device)
    buffers = _scratch.__dict__.setdefault("buffers", {})
    key = (slot, dtype, device)
    buf = buffers.get(key)
    if buf is None or buf.numel() < n:
        # Never an inference tensor (one made under torch.inference_mode), which no later call outside it
        # could write: a bf16 training step after an evaluation in inference mode failed so.
        with torch.inference_mode(False):
            buf = buffers[key] = torch.empty(n, dtype=dtype, device=device)
    return buf[:n]


@functools.lru_cache(maxsize=16)
def _causal_additive(t: int, s: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(T, S): 0 where query i may see key j (bottom-right aligned, as `causal_mask`), -inf elsewhere.
    Built once per shape, dtype and device: every layer of every step reuses it (never written to), so never
    as an inference tensor, which autograd outside inference mode could not use."""
    with torch.inference_mode(False):
        return _as_additive(causal_mask(t, s, device=device), dtype)


def _as_additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask (True = visible) as 0 / -inf scores of `dtype`; a float mask or bias as `dtype`."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    return mask.to(dtype)


def _masked_scores(q: Tensor, k: Tensor, scale: float, additive: Tensor | None) -> Tensor:
    """scale·q·kᵀ + additive, (B, H, T, S), as one batched product over the B·H (batch, head) pairs."""
    b, h, t, d = q.shape
    s = k.shape[-2]
    q3 = q.reshape(b * h, t, d)
    kt = k.reshape(b * h, s, d).transpose(1, 2)
    if additive is None:  # scaled inside the product: q·kᵀ scaled after it overflowed fp16 where scale·q·kᵀ fits
        return torch.baddbmm(q3.new_zeros(()), q3, kt, beta=0, alpha=scale).view(b, h, t, s)
    if additive.shape[:-2].numel() == 1 and not additive.requires_grad:
        additive = additive.reshape(additive.shape[-2:])  # the same for every pair: broadcast, no copy
    else:
        additive = additive.expand(b, h, t, s).reshape(b * h, t, s)
    return torch.baddbmm(additive, q3, kt, alpha=scale).view(b, h, t, s)


def _and_masks(a: Tensor, b: Tensor) -> Tensor:
    if a.dtype == torch.bool:
        return a & b
    return a.masked_fill(~b, float("-inf"))  # float mask with a boolean one


def _add_bias(mask: Tensor, bias: Tensor) -> Tensor:
    if mask.dtype == torch.bool:
        return bias.masked_fill(~mask, float("-inf"))
    return mask + bias


def _any_visible(attn_mask: Tensor, s: int) -> Tensor | None:
    """(…, T, 1) bool: True where a query row has at least one visible key; None if all rows do. Only on the CPU is
    that last case looked for, and not under torch.compile: on a GPU the answer would stop the host until the device
    caught up (every layer of every step), under compile it would break the graph, and zeroing rows of a mask that
    is all True changes nothing."""
    visible = attn_mask.any(dim=-1, keepdim=True) if attn_mask.dtype == torch.bool \
        else (attn_mask > float("-inf")).any(dim=-1, keepdim=True)
    if visible.device.type == "cpu" and not torch.compiler.is_compiling() and bool(visible.all()):
        return None
    return visible


# --------------------------------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------------------------------


class KVCache:
    """Keys and values of one attention layer during incremental decoding.

    Self-attention caches grow by the new tokens at each step, into preallocated buffers (doubling
    when full) so decoding does no per-token concatenation. Cross-attention caches (`static=True`)
    hold the projected encoder memory, computed once.
    """

    def __init__(self, *, static: bool = False, capacity: int = 0):
        self.static = static
        self.capacity = capacity
        self._k: Tensor | None = None
        self._v: Tensor | None = None
        self._positions: Tensor | None = None  # (B|1, S) absolute positions of the cached keys
        self.length = 0

    @property
    def ready(self) -> bool:
        """True when a static cache has been filled."""
        return self._k is not None

    def update(self, k: Tensor, v: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Append (B, H, T, *) keys/values (at absolute `positions`, (B|1, T); default: after the cached
        ones; a static cache keeps no positions); return all cached keys/values, (B, H, S, *)."""
        if self.static:
            self._k, self._v, self.length = k, v, k.shape[-2]
            return k, v
        new = k.shape[-2]
        self._add_positions(positions, new, k.device)
        need = self.length + new
        if self._k is None or need > self._k.shape[-2] or self._k.shape[0] != k.shape[0]:
            cap = max(need, self.capacity, 2 * (self._k.shape[-2] if self._k is not None else 0))
            bk = k.new_empty(*k.shape[:-2], cap, k.shape[-1])
            bv = v.new_empty(*v.shape[:-2], cap, v.shape[-1])
            if self._k is not None and self.length:
                bk[..., : self.length, :] = self._k[..., : self.length, :]
                bv[..., : self.length, :] = self._v[..., : self.length, :]
            self._k, self._v = bk, bv
        self._k[..., self.length : need, :] = k
        self._v[..., self.length : need, :] = v
        self.length = need
        return self._k[..., :need, :], self._v[..., :need, :]

    def _add_positions(self, positions: Tensor | None, new: int, device: torch.device) -> None:
        if positions is None:
            positions = torch.arange(self.length, self.length + new, device=device)[None, :]
        if self._positions is None:
            self._positions = positions
            return
        rows = max(self._positions.shape[0], positions.shape[0])
        self._positions = torch.cat([self._positions.expand(rows, -1), positions.expand(rows, -1)], dim=1)

    @property
    def positions(self) -> Tensor | None:
        """(B|1, S) absolute positions of the cached keys (those given to `update`), or None when empty."""
        return self._positions

    def get(self) -> tuple[Tensor, Tensor]:
        assert self._k is not None and self._v is not None
        return self._k[..., : self.length, :], self._v[..., : self.length, :]

    def reorder(self, index: Tensor) -> None:
        """Select batch rows (beam search)."""
        if self._k is not None:
            self._k = self._k.index_select(0, index)
            self._v = self._v.index_select(0, index)
        if self._positions is not None and self._positions.shape[0] > 1:
            self._positions = self._positions.index_select(0, index)


# --------------------------------------------------------------------------------------------------
# Multi-head attention
# --------------------------------------------------------------------------------------------------


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    b, t, d = x.shape  # the head width given, not -1, which an empty batch or sequence cannot infer
    return x.view(b, t, n_heads, d // n_heads).transpose(1, 2)  # (B, H, T, Dh)


def merge_heads(x: Tensor) -> Tensor:
    b, h, t, dh = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dh)  # (B, T, D)


class MultiHeadAttention(nn.Module):
    """Multi-head attention: self-attention, or cross-attention when `memory` is given.

    The variant (how scores are formed: `dot`, `bilinear`, `synthesizer-dense`...) owns the
    query/key side; this module owns the value and output projections, the cache and the call to
    `attention`. A position scheme (rotary, relative bias...) is passed to `forward` by the model,
    which owns it, so one scheme can serve every layer.

    Args:
        d_model: model width D.
        n_heads: number of heads H (D must be divisible by H).
        variant: name of an attention variant registered in `attnlab.modules.variants`.
        dropout: dropout on attention weights.
        bias: whether projections carry biases.
        kv_dim: width of the memory for cross-attention (default D).
        block_size: longest sequence (needed by variants whose scores are defined over positions).
        variant_options: extra keyword arguments for the variant (e.g. `freeze=True`).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        variant: str = "dot",
        dropout: float = 0.0,
        bias: bool = True,
        kv_dim: int | None = None,
        block_size: int | None = None,
        variant_options: dict | None = None,
    ):
        super().__init__()
        from attnlab.modules.variants import build_variant

        if not (isinstance(n_heads, int) and n_heads >= 1):  # 0 divided by zero below, -4 failed in torch's words
            raise ConfigError(f"n_heads must be a whole number of at least 1, got {n_heads!r}")
        if d_model % n_heads:
            raise ConfigError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if not 0 <= dropout < 1:  # torch said "dropout > 0" of -0.5, and 1.5 failed at the first training step
            raise ConfigError(f"dropout is a probability from 0 up to (not including) 1, got {dropout!r}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.variant = variant
        kv_dim = d_model if kv_dim is None else kv_dim
        self.scores = build_variant(
            variant, d_model=d_model, n_heads=n_heads, kv_dim=kv_dim, bias=bias,
            block_size=block_size, **(variant_options or {}),
        )
        self.v_proj = nn.Linear(kv_dim, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.dropout = dropout

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        positions: Tensor | None = None,
        key_positions: Tensor | None = None,
        position: PositionHook | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from `x` (B, T, D) to itself, or to `memory` (B, S, Dkv).

        Args:
            mask: boolean (True = may attend) broadcastable to (B, H, T, S) over ALL keys seen,
                including cached ones.
            causal: add the square subsequent mask (offset-aware with a cache).
            positions: (B|1, T) absolute positions of the queries (default 0..T-1, after the cache).
            key_positions: (B|1, S) absolute positions of all keys (default: the same as positions
                for self-attention, continued from the cache).
            position: the model's position scheme, to rotate q/k or add a score bias.
            cache: a KVCache to read and extend (incremental decoding).
            need_weights: return (B, H, T, S) attention weights (explicit path).

        Returns:
            (output (B, T, D), weights or None)
        """
        cross = memory is not None
        if cross and not type(self.scores).supports_cross:
            # Its scores depend on key positions alone: every memory would be attended to alike.
            raise ConfigError(f"attention {self.variant!r} cannot attend to another sequence (memory); "
                              "use a variant that supports cross-attention, such as 'dot'")
        b, t, _ = x.shape
        past = cache.length if (cache is not None and not cache.static) else 0
        if positions is None:
            positions = torch.arange(past, past + t, device=x.device)[None, :]  # (1, T)

        fused = None if cross else self.scores.fused_qkv(self.v_proj)
        if fused is not None:
            # One product for queries, keys and values (fewer calls, one larger matmul).
            # Split on the (B, T, 3, H, Dh) layout, then transposed: the backward stacks the three gradients
            # straight into that layout (one copy); a permute to (3, B, H, T, Dh) first cost a second one.
            qkv = F.linear(x, *fused).view(b, t, 3, self.n_heads, self.head_dim)
            q, k, v = (part.transpose(1, 2) for part in qkv.unbind(2))  # 3 × (B, H, T, Dh)
        else:
            q = self.scores.queries(x, positions)  # (B, H, T, Dq)
        if cross and cache is not None and cache.ready:
            k, v = cache.get()
        else:
            src = memory if cross else x
            src_pos = positions if not cross else torch.arange(src.shape[1], device=x.device)[None, :]
            if fused is None:
                k = self.scores.keys(src, src_pos)  # (B, H, T_new, Dq)
                v = split_heads(self.v_proj(src), self.n_heads)  # (B, H, T_new, Dh)
            if position is not None and not cross:
                k = position.rotate_k(k, src_pos)
            if cache is not None:
                k, v = cache.update(k, v, src_pos)
        if position is not None and not cross:
            q = position.rotate_q(q, positions)
            if key_positions is None:
                # Without cached keys, the keys are the queries' own tokens (the positions that
                # rotated k above); after a cache, the positions each cached key was given.
                key_positions = positions if past == 0 else cache.positions
            bias = position.score_bias(q, positions, key_positions, self.n_heads)
        else:
            bias = None
        out, weights = attention(
            q, k, v, mask=mask, bias=bias, causal=causal and not cross,
            dropout=self.dropout if self.training else 0.0, scale=self.scores.scale,
            need_weights=need_weights,
        )
        return self.out_proj(merge_heads(out)), weights


class PositionHook:
    """What attention asks of a position scheme (implemented by `attnlab.modules.positions`)."""

    def rotate_q(self, q: Tensor, positions: Tensor) -> Tensor:  # pragma: no cover - interface
        return q

    def rotate_k(self, k: Tensor, positions: Tensor) -> Tensor:  # pragma: no cover - interface
        return k

    def score_bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor, n_heads: int) -> Tensor | None:
        return None  # pragma: no cover - interface

