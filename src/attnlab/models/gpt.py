"""GPT: a decoder-only causal language model (Radford et al. 2018, 2019).

Read top to bottom: config, then the model: token embedding + position scheme → n pre-norm blocks
(causal self-attention, MLP) → final LayerNorm → LM head tied to the token embedding.
Legend: B batch, T time (new tokens), S all keys (cache + new), D d_model, V vocabulary.

Any registered attention variant (`dot`, `synthesizer-dense`...) or position scheme (`learned` by
default, `rotary`, `alibi`...) is chosen by name in the config.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.config import Config, check_choice, check_fractions, check_positive
from attnlab.errors import ConfigError
from attnlab.models.common import (
    Embedder,
    check_attention_mask,
    check_given_positions,
    check_ids,
    check_integers,
    check_length,
    default_positions,
    length_limit,
    packed_layout,
    positions_from_mask,
    refuse_unknown_keywords,
    token_loss,
)
from attnlab.models.output import ModelOutput
from attnlab.models.registry import register_family, register_preset
from attnlab.modules.attention import KVCache, key_mask
from attnlab.modules.blocks import NORM_PLACEMENTS, Encoder, LayerSpec
from attnlab.modules.feedforward import ACTIVATIONS
from attnlab.modules.positions import POSITIONS, TABLE_INIT_STD, build_position, check_compatible
from attnlab.modules.variants import VARIANTS, BilinearScores, RandomSynthesizerScores


@dataclass
class GPTConfig(Config):
    """Settings of a GPT. `d_ff` defaults to 4·d_model."""

    vocab_size: int = 65
    block_size: int = 256  # the longest context (learned positions and Synthesizer are bounded by it)
    d_model: int = 384
    n_heads: int = 6
    n_layers: int = 6
    d_ff: int | None = None
    dropout: float = 0.0
    attention_dropout: float = 0.0
    # The exact (erf) GELU of Hendrycks & Gimpel: on CPUs 3x faster than GPT-2's tanh approximation, whose
    # tanh is slow there (`gelu-tanh` remains a choice; the GPT-2 converter selects it).
    activation: str = "gelu"
    norm: str = "pre"
    attention: str = "dot"
    attention_options: dict = field(default_factory=dict)
    position: str = "learned"
    position_options: dict = field(default_factory=dict)
    bias: bool = True
    tie_embeddings: bool = True
    layer_norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "d_model", "n_heads", "n_layers"):
            check_positive(name, getattr(self, name))
        check_fractions(self)
        check_positive("layer_norm_eps", self.layer_norm_eps, allow_zero=True)
        check_positive("init_std", self.init_std, allow_zero=True)
        if self.d_ff is not None:
            check_positive("d_ff", self.d_ff)
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        check_choice("norm", self.norm, NORM_PLACEMENTS)
        check_choice("activation", self.activation, ACTIVATIONS.names())
        check_choice("attention", self.attention, VARIANTS.names())
        check_choice("position", self.position, POSITIONS.names())
        check_compatible(self.attention, self.position, self.attention_options, self.position_options)

    @property
    def ff_width(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    def layer_spec(self) -> LayerSpec:
        return LayerSpec.from_config(self, d_ff=self.ff_width)


class GPT(nn.Module):
    """Decoder-only Transformer LM.

    forward(input_ids (B, T), labels (B, T) = next tokens or -100, attention_mask (B, S) 1 = token)
    -> ModelOutput(logits (B, T, V), loss, n_targets, attentions, hidden_states).
    With a cache from `new_cache()`, only the new tokens are given and S counts cached ones too.
    `document_ids` (B, T) packs several documents into a row (training): each run of equal ids is a
    document that attends to itself only, with positions counted from its start, so it gets the logits
    it would get alone.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        # A copy: the caller's config, changed to build another model, must not change what this one says it is.
        self.config = c = copy.deepcopy(config)
        self.embed = Embedder(c.vocab_size, c.d_model, scale=False, dropout=c.dropout, init_std=c.init_std)
        self.position = build_position(c.position, d_model=c.d_model, n_heads=c.n_heads,
                                       max_len=c.block_size, causal=True, **c.position_options)
        self.blocks = Encoder(c.layer_spec(), c.n_layers, final_norm=c.norm == "pre")
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self._init_weights()
        if c.tie_embeddings:
            self.lm_head.weight = self.embed.token.weight
        self.max_len = length_limit(c.attention, self.position, c.block_size)

    def _init_weights(self) -> None:
        # GPT-2: N(0, 0.02) for linear layers, and the residual output projections scaled by
        # 1/sqrt(2·n_layers) so the residual stream's variance does not grow with depth.
        std = self.config.init_std
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                scale = (2 * self.config.n_layers) ** -0.5 if name.endswith(("out_proj", "fc2")) else 1.0
                nn.init.normal_(module.weight, std=std * scale)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, BilinearScores):  # W_Q·W_K merged: drawn as those two linear layers would be
                module.init_like_dot(std)
        # Position tables (learned, Shaw, T5 bias) and synthesizer-random scores are drawn at N(0, TABLE_INIT_STD)
        # by their modules; HF's initializer_range reaches GPT-2's position table too. Rescaled, not drawn again: at
        # the default std every weight keeps the value it had.
        if std != TABLE_INIT_STD:
            tables = [m.weight for m in self.position.modules() if isinstance(m, nn.Embedding)]
            tables += [m.table for m in self.modules() if isinstance(m, RandomSynthesizerScores)]
            with torch.no_grad():
                for table in tables:
                    table.mul_(std / TABLE_INIT_STD)

    supports_cache = True  # decoding keeps keys and values (a causal model's earlier states never change)

    def new_cache(self, capacity: int = 0) -> list[KVCache]:
        """One KV cache per layer; `capacity` preallocates that many positions."""
        return [KVCache(capacity=capacity) for _ in range(self.config.n_layers)]

    def forward(
        self,
        input_ids: Tensor,
        labels: Tensor | None = None,
        attention_mask: Tensor | None = None,
        *,
        positions: Tensor | None = None,
        document_ids: Tensor | None = None,
        cache: list[KVCache] | None = None,
        need_weights: bool = False,
        output_hidden_states: bool = False,
        **ignored: Tensor,
    ) -> ModelOutput:
        refuse_unknown_keywords(self, ignored)
        check_ids(input_ids)
        b, t = input_ids.shape
        past = cache[0].length if cache else 0
        check_length(past + t, self.max_len, "input")
        check_given_positions(positions, self.max_len, shape=(b, t))
        mask = key_positions = None
        if document_ids is not None:
            if attention_mask is not None or cache is not None:
                raise ConfigError("document_ids (packed documents) cannot be combined with an attention_mask "
                                  "or a cache; give one document per row instead")
            check_integers(document_ids, "document_ids", shape=(b, t))
            document_positions, mask = packed_layout(document_ids)
            positions = document_positions if positions is None else positions
        elif attention_mask is not None:
            check_attention_mask(attention_mask, b, t, cached=past)
            # attention_mask covers every key (cached and new); padded batches (left or right)
            # count positions over real tokens only, so each row sees the positions it would alone.
            # Positions given explicitly win (the keys' then come from them and the cache).
            if positions is None:
                key_positions = positions_from_mask(attention_mask)  # (B, S)
                positions = key_positions[:, -t:]
            mask = key_mask(attention_mask.bool())
        elif positions is None:
            positions = default_positions(t, past, input_ids.device)
        x = self.embed(input_ids, positions, self.position)  # (B, T, D)
        x, weights, hidden = self.blocks(
            x, mask=mask, causal=True, positions=positions, key_positions=key_positions,
            position=self.position, cache=cache, need_weights=need_weights,
            output_hidden_states=output_hidden_states)
        logits = self.lm_head(x)  # (B, T, V)
        out = ModelOutput(logits=logits)
        if labels is not None:
            out.loss, out.n_targets = token_loss(logits, labels)
        if need_weights:
            out.attentions = weights
        if output_hidden_states:
            out.hidden_states = hidden
        return out

    @torch.no_grad()
    def generate(self, prompt: Tensor | list[list[int]], max_new_tokens: int, **options) -> list[list[int]]:
        """Shortcut for `attnlab.inference.generate.generate(self, ...)`."""
        from attnlab.inference.generate import generate

        return generate(self, prompt, max_new_tokens, **options)


register_family("gpt", GPTConfig, GPT)
register_preset("gpt-char-tiny", "gpt", lambda: GPTConfig(
    vocab_size=65, block_size=32, d_model=32, n_heads=4, n_layers=2))
register_preset("gpt-char-small", "gpt", lambda: GPTConfig(
    vocab_size=65, block_size=64, d_model=128, n_heads=4, n_layers=4, dropout=0.0))
register_preset("gpt-char", "gpt", lambda: GPTConfig(
    vocab_size=65, block_size=256, d_model=384, n_heads=6, n_layers=6, dropout=0.2))
register_preset("gpt2-small", "gpt", lambda: GPTConfig(
    vocab_size=50257, block_size=1024, d_model=768, n_heads=12, n_layers=12, dropout=0.1, activation="gelu-tanh"))
