"""Transformer layers: the encoder layer (self-attention + feed-forward, causal or not) and the
decoder layer (masked self-attention + cross-attention + feed-forward), with post-norm (the
original paper: x = norm(x + sublayer(x))) or pre-norm (x = x + sublayer(norm(x))).

Shapes: x (B, T, D); memory (B, S, D); masks boolean, True = may attend.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from torch import Tensor, nn

from attnlab.errors import ConfigError
from attnlab.modules.attention import KVCache, MultiHeadAttention, PositionHook
from attnlab.modules.dropout import Dropout
from attnlab.modules.feedforward import FeedForward

NORM_PLACEMENTS = ("post", "pre")


@dataclass(frozen=True)
class LayerSpec:
    """Everything one layer needs; model configs derive it (`config.layer_spec()`)."""

    d_model: int
    n_heads: int
    d_ff: int
    dropout: float = 0.1  # on each sublayer's output, before the residual addition
    attention_dropout: float = 0.0
    ff_dropout: float | None = None  # inside the feed-forward, after the activation (None: = dropout)
    activation: str = "relu"
    norm: str = "post"
    attention: str = "dot"
    attention_options: dict = field(default_factory=dict)
    bias: bool = True
    layer_norm_eps: float = 1e-5
    block_size: int | None = None

    def __post_init__(self):
        if self.norm not in NORM_PLACEMENTS:
            raise ConfigError(f"norm: unknown placement {self.norm!r}; choose one of: post, pre")

    @classmethod
    def from_config(cls, config: object, **overrides: object) -> LayerSpec:
        """The spec of a model config: every LayerSpec field the config has under the same name, then
        `overrides` for the ones a family names or derives differently (e.g. block_size=config.max_len)."""
        values = {f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)}
        values.update(overrides)
        if "attention_options" in values:
            values["attention_options"] = dict(values["attention_options"])
        return cls(**values)

    def feedforward(self) -> FeedForward:
        inner = self.dropout if self.ff_dropout is None else self.ff_dropout
        return FeedForward(self.d_model, self.d_ff, activation=self.activation, dropout=inner, bias=self.bias)

    def attention_module(self, *, kv_dim: int | None = None, variant: str | None = None) -> MultiHeadAttention:
        return MultiHeadAttention(
            self.d_model, self.n_heads, variant=variant or self.attention, dropout=self.attention_dropout,
            bias=self.bias, kv_dim=kv_dim, block_size=self.block_size,
            variant_options=self.attention_options if variant is None else None,
        )


class _Residual(nn.Module):
    """One sublayer with its residual connection, dropout and norm in the chosen placement."""

    def __init__(self, spec: LayerSpec):
        super().__init__()
        self.norm = nn.LayerNorm(spec.d_model, eps=spec.layer_norm_eps)
        self.dropout = Dropout(spec.dropout)
        self.pre = spec.norm == "pre"

    def forward(self, x: Tensor, fn) -> tuple[Tensor, Tensor | None]:
        out = fn(self.norm(x) if self.pre else x)
        out, extra = out if isinstance(out, tuple) else (out, None)
        x = x + self.dropout(out)
        return (x if self.pre else self.norm(x)), extra


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward. With `causal=True` in forward it is a GPT/decoder-only block."""

    def __init__(self, spec: LayerSpec):
        super().__init__()
        self.self_attn = spec.attention_module()
        self.ff = spec.feedforward()
        self.attn_block = _Residual(spec)
        self.ff_block = _Residual(spec)

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        positions: Tensor | None = None,
        key_positions: Tensor | None = None,
        position: PositionHook | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        x, weights = self.attn_block(x, lambda h: self.self_attn(
            h, mask=mask, causal=causal, positions=positions, key_positions=key_positions,
            position=position, cache=cache, need_weights=need_weights))
        x, _ = self.ff_block(x, self.ff)
        return x, weights


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder memory, then feed-forward."""

    def __init__(self, spec: LayerSpec, *, memory_dim: int | None = None):
        super().__init__()
        self.self_attn = spec.attention_module()
        # Cross-attention keys come from another sequence: variants defined over positions of the
        # same sequence (Synthesizer) cannot do it, so cross-attention falls back to `dot` for them.
        from attnlab.modules.variants import VARIANTS

        cross_variant = spec.attention if VARIANTS.get(spec.attention).supports_cross else "dot"
        self.cross_attn = spec.attention_module(kv_dim=memory_dim, variant=cross_variant)
        self.ff = spec.feedforward()
        self.self_block = _Residual(spec)
        self.cross_block = _Residual(spec)
        self.ff_block = _Residual(spec)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        self_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        causal: bool = True,
        positions: Tensor | None = None,
        key_positions: Tensor | None = None,
        position: PositionHook | None = None,
        cache: tuple[KVCache, KVCache] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        self_cache, cross_cache = cache if cache is not None else (None, None)
        x, self_w = self.self_block(x, lambda h: self.self_attn(
            h, mask=self_mask, causal=causal, positions=positions, key_positions=key_positions,
            position=position, cache=self_cache, need_weights=need_weights))
        x, cross_w = self.cross_block(x, lambda h: self.cross_attn(
            h, memory, mask=memory_mask, cache=cross_cache, need_weights=need_weights))
        x, _ = self.ff_block(x, self.ff)
        return x, self_w, cross_w


def _stack_output(norm: nn.LayerNorm | None, x: Tensor, hidden: list[Tensor]) -> Tensor:
    """A stack's output: its last layer's, through the final norm where there is one. The hidden states (if kept)
    then end with this output, not the last layer's unnormalised one, as HF's GPT-2 reports them."""
    if norm is None:
        return x
    x = norm(x)
    if hidden:
        hidden[-1] = x
    return x


class Encoder(nn.Module):
    """A stack of EncoderLayers with an optional final LayerNorm (needed by pre-norm stacks)."""

    def __init__(self, spec: LayerSpec, n_layers: int, *, final_norm: bool):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(spec) for _ in range(n_layers))
        self.norm = nn.LayerNorm(spec.d_model, eps=spec.layer_norm_eps) if final_norm else None

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        causal: bool = False,
        positions: Tensor | None = None,
        key_positions: Tensor | None = None,
        position: PositionHook | None = None,
        cache: list[KVCache] | None = None,
        need_weights: bool = False,
        output_hidden_states: bool = False,
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Returns (output, per-layer attention weights if asked, hidden states if asked: the input, then each layer's
        output, the last through the final norm where the stack has one)."""
        weights, hidden = [], [x] if output_hidden_states else []
        for i, layer in enumerate(self.layers):
            x, w = layer(x, mask=mask, causal=causal, positions=positions, key_positions=key_positions,
                         position=position, cache=cache[i] if cache is not None else None,
                         need_weights=need_weights)
            if need_weights:
                weights.append(w)
            if output_hidden_states:
                hidden.append(x)
        return _stack_output(self.norm, x, hidden), weights, hidden


class Decoder(nn.Module):
    """A stack of DecoderLayers with an optional final LayerNorm."""

    def __init__(self, spec: LayerSpec, n_layers: int, *, final_norm: bool, memory_dim: int | None = None):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(spec, memory_dim=memory_dim) for _ in range(n_layers))
        self.norm = nn.LayerNorm(spec.d_model, eps=spec.layer_norm_eps) if final_norm else None

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        self_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        positions: Tensor | None = None,
        key_positions: Tensor | None = None,
        position: PositionHook | None = None,
        cache: list[tuple[KVCache, KVCache]] | None = None,
        need_weights: bool = False,
        output_hidden_states: bool = False,
    ) -> tuple[Tensor, list[Tensor], list[Tensor], list[Tensor]]:
        """Returns (output, self-attention weights, cross-attention weights, hidden states)."""
        self_ws, cross_ws, hidden = [], [], [x] if output_hidden_states else []
        for i, layer in enumerate(self.layers):
            x, sw, cw = layer(x, memory, self_mask=self_mask, memory_mask=memory_mask, positions=positions,
                              key_positions=key_positions, position=position,
                              cache=cache[i] if cache is not None else None, need_weights=need_weights)
            if need_weights:
                self_ws.append(sw)
                cross_ws.append(cw)
            if output_hidden_states:
                hidden.append(x)
        return _stack_output(self.norm, x, hidden), self_ws, cross_ws, hidden
