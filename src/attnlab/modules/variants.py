"""Attention variants: how attention scores are formed, selected by name.

Every variant produces queries (B, H, T, Dq) and keys (B, H, S, Dq) whose scaled dot product *is*
the score matrix, so every variant runs through the same `attention` function, fused kernel and
KV cache:

- `dot`: q = x·W_Q, k = y·W_K per head, scale 1/sqrt(Dh) (Vaswani et al. 2017).
- `bilinear`: the merged query-key form: per head one matrix W̃ = W_Qᵀ·W_K / sqrt(Dh), so
  score(i, j) = x_i·W̃·y_j. Queries are x·W̃ (width Dkv), keys are the raw inputs y.
- `synthesizer-dense`: Tay et al. 2020, as in CS224n 2021 a5: scores(i, ·) = ReLU(x_i·W1 + b1)·W2 + b2,
  where W2 maps to the block length, i.e. the scores are a function of the query token alone.
  Written as q_i = [a_i, 1], k_j = [W2[:, j], b2[j]].
- `synthesizer-random`: a learned (optionally frozen) T×T score matrix R per head.
  Written as q_i = R[h, i, :], k_j = one_hot(j).

Variants declare what position schemes they can work with (`supports_rotary`,
`supports_query_bias`) and whether they can attend to another sequence (`supports_cross`).
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.modules.attention import split_heads
from attnlab.modules.positions import TABLE_INIT_STD
from attnlab.registry import Registry, construct


class ScoreVariant(nn.Module):
    """Base class: the query/key side of an attention layer."""

    supports_rotary = False  # q and k are per-head vectors that rotary embeddings can rotate
    supports_query_bias = False  # relative-key bias q·a_ij is defined (queries of width Dh)
    supports_cross = False  # keys can come from another sequence
    bounded = False  # scores are defined only for positions < block_size
    scale: float | None = None  # None: 1/sqrt(Dq)

    def queries(self, x: Tensor, positions: Tensor) -> Tensor:  # (B, H, T, Dq)
        raise NotImplementedError

    def keys(self, y: Tensor, positions: Tensor) -> Tensor:  # (B, H, S, Dq)
        raise NotImplementedError

    def fused_qkv(self, v_proj: nn.Linear) -> tuple[Tensor, Tensor | None] | None:
        """For self-attention: (weight (3D, D), bias) of one projection giving [queries, keys, values] of
        head width, equal to `queries`, `keys` and `v_proj` applied one by one; None where the variant's
        queries and keys are not plain projections of the input."""
        return None


VARIANTS: Registry[type[ScoreVariant]] = Registry("attention variant")


def build_variant(name: str, *, d_model: int, n_heads: int, kv_dim: int, bias: bool,
                  block_size: int | None, **options) -> ScoreVariant:
    """Build a registered variant; `options` are its own settings (e.g. `freeze` for synthesizer-random)."""
    cls = VARIANTS.get(name)
    common = dict(d_model=d_model, n_heads=n_heads, kv_dim=kv_dim, bias=bias, block_size=block_size)
    return construct(cls, f"attention {name!r}", common, options)


# The positions tensor last found within a block size: (weak reference, version, block size). Every layer of
# a forward checks the model's one positions tensor; reading its largest value stops the host until a GPU
# catches up, so that is done once per forward. (An inference tensor has no version counter: always read.)
_in_range: tuple[weakref.ref, int, int] | None = None


def _check_positions(positions: Tensor, block_size: int, name: str) -> None:
    global _in_range
    if torch.compiler.is_compiling():  # reading a value would break the graph in every layer; the models check
        return  # their lengths against block_size (shapes, no value read) before any layer runs
    seen = _in_range
    if seen is not None and seen[0]() is positions and seen[1:] == (positions._version, block_size):
        return
    if positions.numel() and int(positions.max()) >= block_size:
        raise ConfigError(
            f"{name} attention is defined for at most block_size={block_size} positions, got position "
            f"{int(positions.max())}; shorten the input or raise block_size"
        )
    if not positions.is_inference():
        _in_range = (weakref.ref(positions), positions._version, block_size)


@VARIANTS.register("dot")
class DotScores(ScoreVariant):
    """Standard scaled dot-product scores."""

    supports_rotary = True
    supports_query_bias = True
    supports_cross = True

    def __init__(self, *, d_model: int, n_heads: int, kv_dim: int | None = None, bias: bool = True,
                 block_size: int | None = None):
        super().__init__()
        self.n_heads = n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(kv_dim or d_model, d_model, bias=bias)

    def queries(self, x: Tensor, positions: Tensor) -> Tensor:
        return split_heads(self.q_proj(x), self.n_heads)

    def keys(self, y: Tensor, positions: Tensor) -> Tensor:
        return split_heads(self.k_proj(y), self.n_heads)

    def fused_qkv(self, v_proj: nn.Linear) -> tuple[Tensor, Tensor | None] | None:
        layers = (self.q_proj, self.k_proj, v_proj)
        if self.k_proj.in_features != self.q_proj.in_features or v_proj.out_features != self.q_proj.out_features:
            return None  # keys from a memory of another width: not self-attention
        biases = [p.bias for p in layers]
        if any(bias is None for bias in biases) and not all(bias is None for bias in biases):
            return None
        bias = None if biases[0] is None else torch.cat(biases)
        return torch.cat([p.weight for p in layers]), bias


@VARIANTS.register("bilinear")
class BilinearScores(ScoreVariant):
    """Merged query-key form: score(i, j) = x_i·W̃_h·y_j (+ u_h·y_j when `bias`).

    Parameters per head: D·Dkv (versus 2·Dh·D for separate W_Q and W_K): with Dh = D/H this is
    H·D² in total instead of 2·D², i.e. more parameters as soon as H > 2, but one matrix product
    fewer per token. The optional key bias u_h makes the conversion from a `dot` layer with biases
    exact (see `bilinear_from_dot`).
    """

    supports_cross = True
    scale = 1.0  # W̃ already holds 1/sqrt(Dh)

    def __init__(self, *, d_model: int, n_heads: int, kv_dim: int | None = None, bias: bool = True,
                 block_size: int | None = None):
        super().__init__()
        kv_dim = kv_dim or d_model
        self.n_heads = n_heads
        # Initialised as the product of two default-initialised projections, like a fresh `dot` layer.
        wq = nn.Linear(d_model, d_model, bias=False).weight
        wk = nn.Linear(kv_dim, d_model, bias=False).weight
        self.weight = nn.Parameter(self._merged(wq, wk))  # (H, D, Dkv)
        self.key_bias = nn.Parameter(torch.zeros(n_heads, kv_dim)) if bias else None  # (H, Dkv)

    def _merged(self, wq: Tensor, wk: Tensor) -> Tensor:
        """Per-head W̃ = W_Q,hᵀ·W_K,h / sqrt(Dh) of (D, D) query and (D, Dkv) key projection weights."""
        h = self.n_heads
        head_dim = wq.shape[0] // h
        merged = torch.einsum("hed,hef->hdf", wq.view(h, head_dim, -1), wk.view(h, head_dim, -1))
        return merged.detach() / math.sqrt(head_dim)

    @torch.no_grad()
    def init_like_dot(self, std: float) -> None:
        """Re-draw the weight as the product of two projections drawn from N(0, std²), as a model that initialises
        its linear layers so (GPT, BERT) starts a `dot` layer: otherwise the merged weight kept the product of
        torch's default projections, and a fresh bilinear GPT's scores spread ~6x wider than a fresh dot GPT's."""
        h, d, d_kv = self.weight.shape
        wq = torch.empty(d, d, device=self.weight.device).normal_(0.0, std)
        wk = torch.empty(d, d_kv, device=self.weight.device).normal_(0.0, std)
        self.weight.copy_(self._merged(wq, wk))
        if self.key_bias is not None:
            self.key_bias.zero_()

    def queries(self, x: Tensor, positions: Tensor) -> Tensor:
        q = torch.einsum("btd,hdf->bhtf", x, self.weight)  # (B, H, T, Dkv)
        if self.key_bias is not None:
            q = q + self.key_bias[None, :, None, :]
        return q

    def keys(self, y: Tensor, positions: Tensor) -> Tensor:
        return y[:, None].expand(-1, self.n_heads, -1, -1)  # (B, H, S, Dkv)


@torch.no_grad()
def bilinear_from_dot(dot: DotScores) -> BilinearScores:
    """Merge a `dot` layer's W_Q, W_K into per-head W̃ = W_Q,hᵀ·W_K,h / sqrt(Dh).

    Exact, biases included: with biases the score is
        (W_Q x + b_Q)·(W_K y + b_K) / sqrt(Dh)
          = xᵀ W̃ y  +  (W_Kᵀ b_Q / sqrt(Dh))·y  +  (W_Qᵀ b_K / sqrt(Dh))·x  +  b_Q·b_K / sqrt(Dh).
    The second term depends on the key and becomes the bilinear layer's key bias u_h; the last two
    depend only on the query (or on nothing), shift every score of a row equally and vanish in the
    softmax, so they are dropped.
    """
    h = dot.n_heads
    d_model = dot.q_proj.in_features
    kv_dim = dot.k_proj.in_features
    dh = d_model // h
    has_bias = dot.q_proj.bias is not None
    weight = dot.q_proj.weight
    # The dot layer's dtype and device: built in the defaults, a float64 layer's product was rounded to float32.
    out = BilinearScores(d_model=d_model, n_heads=h, kv_dim=kv_dim, bias=has_bias).to(weight.device, weight.dtype)
    wq = dot.q_proj.weight.view(h, dh, d_model)
    wk = dot.k_proj.weight.view(h, dh, kv_dim)
    out.weight.copy_(torch.einsum("hed,hef->hdf", wq, wk) / math.sqrt(dh))
    if has_bias:
        bq = dot.q_proj.bias.view(h, dh)
        out.key_bias.copy_(torch.einsum("he,hef->hf", bq, wk) / math.sqrt(dh))
    return out


@VARIANTS.register("synthesizer-dense")
class DenseSynthesizerScores(ScoreVariant):
    """Dense Synthesizer (Tay et al. 2020) in the CS224n 2021 a5 form.

    a = ReLU(x·W1 + b1) split into heads (B, H, T, Dh); scores = a·W2[:, :S] + b2[:S], with W2 of
    shape (Dh, block_size) shared by the heads (a5's has block_size - 1 columns, one fewer than its inputs
    can be long; here every position up to block_size has one: 33 parameters a layer more at Dh = 32).
    Scores depend on the query token and the key *position*, never on the key token.
    """

    bounded = True
    scale = 1.0

    def __init__(self, *, d_model: int, n_heads: int, kv_dim: int | None = None, bias: bool = True,
                 block_size: int | None = None):
        super().__init__()
        if block_size is None:
            raise ConfigError("synthesizer-dense attention needs block_size (the longest sequence)")
        self.n_heads, self.block_size = n_heads, block_size
        head_dim = d_model // n_heads
        self.w1 = nn.Linear(d_model, d_model, bias=bias)
        self.w2 = nn.Parameter(torch.empty(head_dim, block_size).uniform_(-1e-3, 1e-3))
        self.b2 = nn.Parameter(torch.zeros(block_size))

    def queries(self, x: Tensor, positions: Tensor) -> Tensor:
        a = split_heads(F.relu(self.w1(x)), self.n_heads)  # (B, H, T, Dh)
        return F.pad(a, (0, 1), value=1.0)  # (B, H, T, Dh+1): the trailing 1 picks up b2

    def keys(self, y: Tensor, positions: Tensor) -> Tensor:
        _check_positions(positions, self.block_size, "synthesizer-dense")
        table = torch.cat([self.w2, self.b2[None]], dim=0).t()  # (block, Dh+1)
        # A lookup, not table[positions]: per-row positions (padded or packed batches) repeat, and the indexing
        # backward adds the repeats in a thread-dependent order on the CPU, so runs would not reproduce.
        k = F.embedding(positions, table)  # (B|1, S, Dh+1)
        return k[:, None].expand(y.shape[0], self.n_heads, -1, -1)  # (B, H, S, Dh+1)


@VARIANTS.register("synthesizer-random")
class RandomSynthesizerScores(ScoreVariant):
    """Random Synthesizer: a learned (or, with `freeze=True`, fixed random) score matrix R per head."""

    bounded = True
    scale = 1.0

    def __init__(self, *, d_model: int, n_heads: int, kv_dim: int | None = None, bias: bool = True,
                 block_size: int | None = None, freeze: bool = False):
        super().__init__()
        if block_size is None:
            raise ConfigError("synthesizer-random attention needs block_size (the longest sequence)")
        self.n_heads, self.block_size = n_heads, block_size
        self.table = nn.Parameter(torch.randn(n_heads, block_size, block_size) * TABLE_INIT_STD,
                                  requires_grad=not freeze)  # (H, block, block)

    def queries(self, x: Tensor, positions: Tensor) -> Tensor:
        _check_positions(positions, self.block_size, "synthesizer-random")
        h, block = self.n_heads, self.block_size
        rows = self.table.transpose(0, 1).reshape(block, h * block)  # row i: every head's scores of query i
        q = F.embedding(positions, rows).view(*positions.shape, h, block)  # a lookup: see DenseSynthesizerScores
        return q.permute(0, 2, 1, 3).expand(x.shape[0], -1, -1, -1)  # (B, H, T, block)

    def keys(self, y: Tensor, positions: Tensor) -> Tensor:
        _check_positions(positions, self.block_size, "synthesizer-random")
        # one_hot takes int64 alone; int32 positions, which every other variant takes, failed here.
        k = F.one_hot(positions.long(), self.block_size).to(self.table.dtype)  # (B|1, S, block)
        return k[:, None].expand(y.shape[0], self.n_heads, -1, -1)  # (B, H, S, block)


def variant_parameter_count(name: str, d_model: int, n_heads: int, *, kv_dim: int | None = None,
                            bias: bool = True, block_size: int | None = None) -> int:
    """Parameters of the query/key side of one layer (the value and output projections excluded)."""
    kv_dim = kv_dim or d_model
    dh = d_model // n_heads
    if name == "dot":
        return d_model * d_model + kv_dim * d_model + (2 * d_model if bias else 0)
    if name == "bilinear":
        return n_heads * d_model * kv_dim + (n_heads * kv_dim if bias else 0)
    if name == "synthesizer-dense":
        return d_model * d_model + (d_model if bias else 0) + dh * block_size + block_size
    if name == "synthesizer-random":
        return n_heads * block_size * block_size
    raise ConfigError(VARIANTS.unknown_message(name))
