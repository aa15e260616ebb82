"""Position schemes, selected by name.

One interface, three ways of injecting order (a scheme may use any of them):
- `embed(x, positions)`: add a vector to the token embeddings (sinusoidal, learned);
- `rotate_q` / `rotate_k`: transform queries and keys (rotary);
- `score_bias(q, q_pos, k_pos, n_heads)`: add to the attention scores (Shaw relative keys, T5
  buckets, ALiBi).

Positions are absolute token indices, (B|1, T) long tensors, so left-padded batches and cached
decoding use the same code. A model owns one scheme and passes it to every attention layer: the
relative tables (Shaw, T5) are therefore shared by all layers, as T5 does.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.modules.attention import PositionHook
from attnlab.registry import Registry, construct


class PositionScheme(nn.Module, PositionHook):
    """Base: every method is a no-op, so a scheme overrides only what it uses."""

    adds_to_embeddings = False
    rotates_qk = False  # needs a variant with per-head q/k (`supports_rotary`)
    query_bias = False  # its bias reads the queries (`supports_query_bias`)
    max_len: int | None = None  # longest position it can represent (None: unbounded)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x

    def rotate_q(self, q: Tensor, positions: Tensor) -> Tensor:
        return q

    def rotate_k(self, k: Tensor, positions: Tensor) -> Tensor:
        return k

    def score_bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor, n_heads: int) -> Tensor | None:
        return None

    # Buffers computed from a formula (in float64 on the CPU) and kept in float32. A conversion only rounds or
    # widens the values it has: `.double()` would give a float64 model positions to float32's precision, and a
    # model taken to bf16 and back kept bf16's rounding (the same offset then scored otherwise inside the table
    # than beyond it, where positions are computed afresh). So every conversion computes them afresh.
    computed_buffers: tuple[str, ...] = ()

    def compute_buffers(self) -> dict[str, Tensor]:
        """The float64 CPU values of the buffers named in `computed_buffers`."""
        return {}

    def _register_computed(self) -> None:
        """Register the computed buffers in float32 (float64 where that is torch's default dtype) on torch's default
        device; computed on the CPU, also under a `with torch.device("meta")` block, which counts parameters."""
        for name, value in self.compute_buffers().items():
            value = value.to(_table_dtype(torch.get_default_dtype())).to(torch.get_default_device())
            self.register_buffer(name, value, persistent=False)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        converted = [name for name in self.computed_buffers
                     if getattr(self, name).is_floating_point() and getattr(self, name).device.type != "meta"]
        if converted:
            values = self.compute_buffers()
            for name in converted:
                now = getattr(self, name)
                setattr(self, name, values[name].to(device=now.device, dtype=now.dtype))
        return self


POSITIONS: Registry[type[PositionScheme]] = Registry("position scheme")
# The std of a learned position table's first draw (learned, Shaw relative, T5 bias), GPT-2's initializer range;
# a model of another init std rescales its tables (see `GPT._init_weights`).
TABLE_INIT_STD = 0.02


def build_position(name: str, *, d_model: int, n_heads: int, max_len: int, causal: bool,
                   **options) -> PositionScheme:
    """Build a registered scheme. `causal` tells bias schemes whether keys after the query exist.

    `options` are the scheme's own settings (e.g. `base` for sinusoidal, `max_distance` for
    relative); an option the scheme does not have raises a ConfigError naming the ones it has.
    """
    cls = POSITIONS.get(name)
    return construct(cls, f"position {name!r}", dict(d_model=d_model, n_heads=n_heads,
                                 max_len=max_len, causal=causal), options)


@POSITIONS.register("none")
class NoPosition(PositionScheme):
    def __init__(self):
        super().__init__()


# ------------------------------------------------------------------------------------------------
# Sinusoidal
# ------------------------------------------------------------------------------------------------


def sinusoidal_frequencies(d_model: int, base: float = 10000.0) -> Tensor:
    """ω_m = base^(-2m/d) for m = 0 .. d/2-1."""
    if d_model % 2:
        raise ConfigError(f"sinusoidal positions need an even width, got {d_model}")
    return base ** (-torch.arange(0, d_model, 2, dtype=torch.float64, device="cpu") / d_model)


def sinusoidal_table(positions: Tensor, d_model: int, base: float = 10000.0, *,
                     dtype: torch.dtype = torch.float32) -> Tensor:
    """PE[p, 2m] = sin(p·ω_m), PE[p, 2m+1] = cos(p·ω_m); shape positions.shape + (d_model,), of `dtype` on
    the positions' device (computed in float64 on the CPU: MPS has no float64)."""
    angles = positions.detach().to("cpu", torch.float64)[..., None] * sinusoidal_frequencies(d_model, base)
    pe = torch.stack([angles.sin(), angles.cos()], dim=-1)  # (..., d/2, 2)
    return pe.flatten(-2).to(dtype).to(positions.device)


def sinusoidal_rotation(k: int, d_model: int, base: float = 10000.0) -> Tensor:
    """A(k): the (d, d) block-diagonal matrix with PE[i + k] = A(k)·PE[i] for every i.

    Each pair (sin pω, cos pω) is rotated by the angle kω:
        sin((p+k)ω) =  cos(kω)·sin(pω) + sin(kω)·cos(pω)
        cos((p+k)ω) = -sin(kω)·sin(pω) + cos(kω)·cos(pω)
    so A(k) depends on k only, never on i: a fixed linear map takes any position to the one k later.
    """
    angles = k * sinusoidal_frequencies(d_model, base)
    c, s = angles.cos(), angles.sin()
    blocks = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)  # (d/2, 2, 2)
    return torch.block_diag(*blocks).float()


@POSITIONS.register("sinusoidal")
class SinusoidalPosition(PositionScheme):
    """Fixed sinusoids added to the embeddings (Vaswani et al. 2017); `base` is 10000 in the paper."""

    adds_to_embeddings = True
    computed_buffers = ("table",)

    def __init__(self, *, d_model: int, max_len: int = 1024, base: float = 10000.0):
        super().__init__()
        _check_base("sinusoidal", base)
        self.d_model, self.base, self.table_len = d_model, base, max_len
        self._register_computed()

    def compute_buffers(self) -> dict[str, Tensor]:
        positions = torch.arange(self.table_len, device="cpu")
        return {"table": sinusoidal_table(positions, self.d_model, self.base, dtype=torch.float64)}

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        # Under torch.compile computed, not looked up: reading the largest position would break the graph.
        if positions.numel() and (torch.compiler.is_compiling() or int(positions.max()) >= self.table.shape[0]):
            pe = sinusoidal_table(positions, self.d_model, self.base,  # beyond the table
                                  dtype=_table_dtype(self.table.dtype)).to(x.device)
        else:
            pe = self.table[positions]
        return x + pe.to(x.dtype)


@POSITIONS.register("learned")
class LearnedPosition(PositionScheme):
    """A learned vector per absolute position (GPT, BERT); cannot go beyond `max_len`."""

    adds_to_embeddings = True

    def __init__(self, *, d_model: int, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=TABLE_INIT_STD)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.embedding(positions)


# ------------------------------------------------------------------------------------------------
# Rotary
# ------------------------------------------------------------------------------------------------


@POSITIONS.register("rotary")
class RotaryPosition(PositionScheme):
    """Rotary embeddings (Su et al. 2021): rotate each (q, k) channel pair by position·ω.

    The score q_i·k_j then depends on i - j only. Channel m is paired with channel m + Dh/2 (the half-split
    layout of GPT-NeoX and LLaMA); RoFormer pairs channels 2i and 2i + 1. The two are one fixed permutation of
    the query and key channels apart: the same model trained from scratch, but weights trained in the
    interleaved layout need their q and k projections' rows permuted to load here.
    """

    rotates_qk = True
    computed_buffers = ("cos", "sin")

    def __init__(self, *, d_model: int, n_heads: int, max_len: int = 1024, base: float = 10000.0):
        super().__init__()
        _check_base("rotary", base)
        self.head_dim = d_model // n_heads
        if self.head_dim % 2:
            raise ConfigError(f"rotary positions need an even head width, got {self.head_dim}")
        # A float64 CPU tensor, not a buffer: `.to(device)` leaves it on the CPU (MPS has no float64), where
        # angles beyond the tables are computed.
        self.inv_freq = base ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float64, device="cpu")
                                 / self.head_dim)
        self.table_len = max_len
        self._register_computed()
        self._memo: tuple[Tensor, tuple[int, bool], tuple[Tensor, Tensor]] | None = None  # see angles_at

    def _apply(self, fn, recurse=True):
        self._memo = None  # angles kept from before a conversion have the old dtype or device
        return super()._apply(fn, recurse)

    def compute_buffers(self) -> dict[str, Tensor]:
        cos, sin = self._angles(torch.arange(self.table_len, device="cpu"), torch.float64)
        return {"cos": cos, "sin": sin}

    def _angles(self, positions: Tensor, dtype: torch.dtype, device: torch.device | str = "cpu"
                ) -> tuple[Tensor, Tensor]:
        ang = positions.detach().to(device, torch.float64)[..., None] * self.inv_freq.to(device)
        ang = torch.cat([ang, ang], dim=-1)  # (..., Dh)
        return ang.cos().to(dtype).to(positions.device), ang.sin().to(dtype).to(positions.device)

    def angles_at(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(cos, sin) of shape positions.shape + (Dh,), float32 (float64 in a float64 model): from the tables,
        or computed beyond them.

        A forward rotates the queries and keys of every layer by the same positions tensor: the angles of
        the last one asked for are kept (until it changes in place), so that they are gathered, and its
        largest position read back from the device (a wait for a GPU), once per forward, not twice a layer."""
        if torch.compiler.is_compiling():
            # Computed where the positions are, not looked up or kept: reading the largest position, the version
            # counter or the memo would break the graph in every layer (the compiled graph computes them once).
            device = "cpu" if positions.device.type == "mps" else positions.device  # MPS has no float64
            return self._angles(positions, _table_dtype(self.cos.dtype), device)
        # An inference tensor has no version counter to tell an in-place change by: not kept. Angles kept
        # under inference mode are not handed out outside it, where autograd refuses them.
        key = None if positions.is_inference() else (positions._version, torch.is_inference_mode_enabled())
        memo = self._memo
        if key is not None and memo is not None and memo[0] is positions and memo[1] == key:
            return memo[2]
        if positions.numel() and int(positions.max()) >= self.cos.shape[0]:
            angles = self._angles(positions, _table_dtype(self.cos.dtype))
        else:
            angles = self.cos[positions], self.sin[positions]
        self._memo = None if key is None else (positions, key, angles)
        return angles

    def _rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        cos, sin = self.angles_at(positions)  # (B|1, T, Dh)
        cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)  # (B|1, 1, T, Dh)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def rotate_q(self, q: Tensor, positions: Tensor) -> Tensor:
        return self._rotate(q, positions)

    def rotate_k(self, k: Tensor, positions: Tensor) -> Tensor:
        return self._rotate(k, positions)


# ------------------------------------------------------------------------------------------------
# Score biases
# ------------------------------------------------------------------------------------------------


def _relative(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    return k_pos[:, None, :] - q_pos[:, :, None]  # (B|1, T, S): j - i


@POSITIONS.register("relative")
class ShawRelativePosition(PositionScheme):
    """Shaw et al. 2018 relative key embeddings: e_ij = q_i·(k_j + a_{clip(j-i)}) / sqrt(Dh).

    a has one learned vector per clipped distance in [-max_distance, max_distance], shared by heads (and,
    as every table here, by the layers; Shaw et al. kept one per layer). The key term only: the paper's
    value term (a^V added to the values) is not implemented, which its own ablation found to matter little.
    Computed as q·Aᵀ (B, H, T, 2K+1) then gathered by distance: no (T, S, Dh) tensor is built.
    """

    query_bias = True

    def __init__(self, *, d_model: int, n_heads: int, max_distance: int = 16):
        super().__init__()
        if max_distance < 1:
            raise ConfigError(f"relative positions: max_distance (the farthest distance told apart) must be at "
                              f"least 1, got {max_distance}")
        if max_distance > 1 << 30:  # its table has 2·max_distance + 1 rows (2**63 - 1 overflowed torch's sizes)
            raise ConfigError(f"relative positions: max_distance {max_distance:,} is beyond any sequence's length; "
                              f"give at most {1 << 30:,}")
        self.max_distance = max_distance
        self.embedding = nn.Embedding(2 * max_distance + 1, d_model // n_heads)
        nn.init.normal_(self.embedding.weight, std=TABLE_INIT_STD)

    def score_bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor, n_heads: int) -> Tensor:
        idx = _relative(q_pos, k_pos).clamp(-self.max_distance, self.max_distance) + self.max_distance
        # The table scaled before the product (in its own dtype): q·aᵀ scaled after it overflowed fp16 where
        # q·aᵀ/√d fits, as q·kᵀ is scaled inside its product.
        table = (self.embedding.weight / math.sqrt(q.shape[-1])).t().to(q.dtype)
        qa = torch.matmul(q, table)  # (B, H, T, 2K+1)
        b, h, t, _ = qa.shape
        idx = idx[:, None].expand(b, h, t, idx.shape[-1])  # (B, H, T, S)
        return torch.gather(qa, -1, idx)


def _check_base(name: str, base: float) -> None:
    if not base > 1:  # base <= 0: no logarithm; base 1: every frequency the same, positions indistinct
        raise ConfigError(f"{name} positions: base must be a number larger than 1, got {base}")


def t5_bucket(relative: Tensor, *, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """Map distances j - i to buckets: exact for small distances, log-spaced up to max_distance."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)  # only the past counts
    exact = num_buckets // 2
    is_small = distance < exact
    log_ratio = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    large = exact + (log_ratio * (num_buckets - exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


@POSITIONS.register("t5-bias")
class T5RelativeBias(PositionScheme):
    """T5's bucketed relative bias (Raffel et al. 2020): one learned scalar per (bucket, head)."""

    def __init__(self, *, n_heads: int, causal: bool, num_buckets: int = 32,
                 max_distance: int = 128):
        super().__init__()
        self.bidirectional = not causal
        # Each direction's buckets: the first half exact distances (at least one), the rest log-spaced up to
        # max_distance, which must lie beyond the exact ones (t5_bucket divides by log(max_distance / exact)).
        per_side = num_buckets // 2 if self.bidirectional else num_buckets
        if per_side < 2:
            least = 4 if self.bidirectional else 2
            raise ConfigError(f"t5-bias: num_buckets must be at least {least} "
                              f"({'bidirectional' if self.bidirectional else 'causal'} attention), got {num_buckets}")
        if max_distance <= per_side // 2:
            raise ConfigError(f"t5-bias: max_distance must be larger than the {per_side // 2} exact distances of "
                              f"num_buckets = {num_buckets}, got {max_distance}")
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.embedding = nn.Embedding(num_buckets, n_heads)
        nn.init.normal_(self.embedding.weight, std=TABLE_INIT_STD)

    def score_bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor, n_heads: int) -> Tensor:
        buckets = t5_bucket(_relative(q_pos, k_pos), bidirectional=self.bidirectional,
                            num_buckets=self.num_buckets, max_distance=self.max_distance)
        return self.embedding(buckets).permute(0, 3, 1, 2)  # (B|1, H, T, S)


def alibi_slopes(n_heads: int, dtype: torch.dtype | None = None) -> Tensor:
    """Press et al. 2022: geometric slopes 2^(-8/n), 2^(-16/n)...; for a non-power-of-two head count,
    the slopes of the next lower power of two followed by every other slope of the next higher one.
    Of `dtype` (default: torch's default dtype)."""
    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        return torch.tensor(power_of_two(n_heads), dtype=dtype)
    low = 2 ** math.floor(math.log2(n_heads))
    return torch.tensor(power_of_two(low) + power_of_two(2 * low)[0::2][: n_heads - low], dtype=dtype)


@POSITIONS.register("alibi")
class ALiBiPosition(PositionScheme):
    """ALiBi: a fixed, head-specific linear penalty -m_h·|i - j| on the scores; no parameters.

    Press et al. define it for causal models (-m_h·(i - j), j ≤ i). Without causality the penalty is symmetric,
    so it is the model's only position signal and cannot tell a sequence from its reverse: an encoder with
    bidirectional ALiBi maps a reversed input to its reversed outputs (a mean-pooled classifier scores "dog
    bites man" as "man bites dog"). Pair it with a causal mask, or another scheme for an encoder."""

    computed_buffers = ("slopes",)

    def __init__(self, *, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def compute_buffers(self) -> dict[str, Tensor]:
        return {"slopes": alibi_slopes(self.n_heads, torch.float64)}

    def score_bias(self, q: Tensor, q_pos: Tensor, k_pos: Tensor, n_heads: int) -> Tensor:
        distance = _relative(q_pos, k_pos).abs().to(torch.float32)  # (B|1, T, S)
        return -self.slopes[None, :, None, None] * distance[:, None]  # (B|1, H, T, S)


def _table_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype computed position values are kept in, for a model or table of `dtype`: float64 for float64
    (a model built or converted for float64 throughout), else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def compatible_pairs() -> list[tuple[str, str]]:
    """Every (attention variant, position scheme) pair of the registries that `check_compatible` accepts."""
    from attnlab.modules.variants import VARIANTS

    pairs = []
    for variant in VARIANTS.names():
        for position in POSITIONS.names():
            try:
                check_compatible(variant, position)
            except ConfigError:
                continue
            pairs.append((variant, position))
    return pairs


# What a model passes to every attention variant and position scheme itself: not theirs to take as options.
_MODEL_GIVEN = {"attention_options": ("d_model", "n_heads", "kv_dim", "bias", "block_size"),
                "position_options": ("d_model", "n_heads", "max_len", "causal")}


def check_compatible(variant: str, position: str, attention_options: dict | None = None,
                     position_options: dict | None = None) -> None:
    """Raise a ConfigError when an attention variant cannot work with a position scheme, or an options table
    sets what the model passes itself (the call failed with "got multiple values for keyword argument")."""
    from attnlab.modules.variants import VARIANTS

    for table, options in (("attention_options", attention_options), ("position_options", position_options)):
        taken = [key for key in options or {} if key in _MODEL_GIVEN[table]]
        if taken:
            raise ConfigError(f"model.{table} sets {taken[0]!r}, which the model gives every {table.split('_')[0]} "
                              "itself (from its width, heads, bias, length and mask settings); drop it from "
                              f"model.{table}")

    v, p = VARIANTS.get(variant), POSITIONS.get(position)
    if p.rotates_qk and not v.supports_rotary:
        raise ConfigError(f"position {position!r} rotates per-head queries and keys, which attention "
                          f"variant {variant!r} does not have; use it with attention 'dot'")
    if p.query_bias and not v.supports_query_bias:
        raise ConfigError(f"position {position!r} needs per-head queries of the head width, which "
                          f"attention variant {variant!r} does not have; use it with attention 'dot'")
