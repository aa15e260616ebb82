"""An encoder-only Transformer with a swappable head: the model of PyTorch's `nn.Transformer` word
language-model tutorial (`TransformerModel`), and the same body under a classification head.

Read top to bottom: config, heads (LM, pooling + classifier), then the model (embeddings × sqrt(D)
→ position scheme → stack of encoder layers → head). Legend: B batch, T length, D d_model,
V vocabulary, C classes.

The tutorial's choices are the defaults: embeddings scaled by sqrt(D), sinusoidal positions, post-norm
layers with ReLU and no final norm, attention dropout equal to the residual dropout, and an LM head
`Linear(D, V)` with a bias under a causal mask.

Pretrain-then-finetune: `model.with_head("classification", n_classes=2)` returns a new model holding a
copy of this encoder's weights and a freshly initialised head.
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
    check_ids,
    check_length,
    check_some_tokens,
    default_positions,
    length_limit,
    positions_from_mask,
    refuse_unknown_keywords,
    token_loss,
)
from attnlab.models.output import ModelOutput
from attnlab.models.registry import register_family, register_preset
from attnlab.modules.attention import KVCache, key_mask
from attnlab.modules.blocks import NORM_PLACEMENTS, Encoder, LayerSpec
from attnlab.modules.dropout import Dropout
from attnlab.modules.feedforward import ACTIVATIONS
from attnlab.modules.positions import POSITIONS, build_position, check_compatible
from attnlab.modules.variants import VARIANTS
from attnlab.registry import Registry

HEADS = ("lm", "classification")


# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


@dataclass
class EncoderConfig(Config):
    """Settings of the encoder model (defaults: the tutorial's model with a 100-word vocabulary).

    `head` picks the output: "lm" gives per-token logits (B, T, V) and "classification" gives
    (B, C) logits over a pooled representation (`pooling`: "mean" over real tokens, "first" or "last"
    real token). `causal` defaults to the head's natural choice: True for "lm" (the tutorial's
    square subsequent mask), False for "classification"; an "lm" head with `causal = false` is a
    masked (bidirectional) LM, whose labels must then mark the masked positions.
    """

    vocab_size: int = 100
    d_model: int = 200
    n_heads: int = 2
    d_ff: int = 200
    n_layers: int = 4
    dropout: float = 0.2
    attention_dropout: float | None = None  # None: the same as dropout (as nn.TransformerEncoderLayer)
    activation: str = "relu"
    norm: str = "post"
    final_norm: bool | None = None  # None: only for pre-norm (a post-norm stack already ends in a norm)
    attention: str = "dot"
    attention_options: dict = field(default_factory=dict)
    position: str = "sinusoidal"
    position_options: dict = field(default_factory=dict)
    max_len: int = 512
    head: str = "lm"
    n_classes: int = 2
    pooling: str = "mean"
    causal: bool | None = None  # None: True for the "lm" head, False for "classification"
    scale_embeddings: bool = True  # multiply embeddings by sqrt(d_model)
    bias: bool = True
    layer_norm_eps: float = 1e-5
    label_smoothing: float = 0.0
    pad_id: int | None = None  # when set, a batch without attention_mask treats this id as padding

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            check_positive(name, getattr(self, name))
        check_fractions(self)
        check_positive("layer_norm_eps", self.layer_norm_eps, allow_zero=True)
        check_positive("n_layers", self.n_layers, allow_zero=True)
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        check_choice("head", self.head, HEADS)
        check_choice("pooling", self.pooling, POOLINGS.names())
        check_choice("norm", self.norm, NORM_PLACEMENTS)
        check_choice("activation", self.activation, ACTIVATIONS.names())
        check_choice("attention", self.attention, VARIANTS.names())
        check_choice("position", self.position, POSITIONS.names())
        check_compatible(self.attention, self.position, self.attention_options, self.position_options)
        if self.head == "classification" and self.n_classes < 2:
            raise ConfigError(f"n_classes must be at least 2 for a classification head, got {self.n_classes}")
        if self.head == "classification" and self.is_causal and self.pooling == "first":
            raise ConfigError('pooling = "first" under a causal mask reads a token that sees only itself: the '
                              'same summary for every input; use pooling = "last" or "mean", or causal = false')

    # The "None: automatic" settings stay None in the config (so `replace(head=...)` and the JSON keep
    # meaning "automatic") and are resolved here.
    @property
    def is_causal(self) -> bool:
        return self.head == "lm" if self.causal is None else self.causal

    @property
    def has_final_norm(self) -> bool:
        return self.norm == "pre" if self.final_norm is None else self.final_norm

    def layer_spec(self) -> LayerSpec:
        attention_dropout = self.dropout if self.attention_dropout is None else self.attention_dropout
        return LayerSpec.from_config(self, attention_dropout=attention_dropout, block_size=self.max_len)


# --------------------------------------------------------------------------------------------------
# Heads
# --------------------------------------------------------------------------------------------------
# Pooling functions: (B, T, D) states and the (B, T) keep-mask of real tokens (None: all real) -> (B, D).

POOLINGS: Registry = Registry("pooling")


@POOLINGS.register("mean")
def mean_pool(h: Tensor, keep: Tensor | None) -> Tensor:
    """Average over the real tokens."""
    if keep is None:
        return h.mean(dim=1)
    w = keep.to(h.dtype)[..., None]  # (B, T, 1)
    return (h * w).sum(dim=1) / w.sum(dim=1).clamp(min=1.0)


@POOLINGS.register("first")
def first_pool(h: Tensor, keep: Tensor | None) -> Tensor:
    """The first real token (position 0 under right padding; a [CLS]-style summary)."""
    if keep is None:
        return h[:, 0]
    idx = keep.long().argmax(dim=1)  # first True
    return h[torch.arange(h.shape[0], device=h.device), idx]


@POOLINGS.register("last")
def last_pool(h: Tensor, keep: Tensor | None) -> Tensor:
    """The last real token: under a causal mask the only one that has seen the whole sequence."""
    if keep is None:
        return h[:, -1]
    idx = h.shape[1] - 1 - keep.flip(1).long().argmax(dim=1)  # last True
    return h[torch.arange(h.shape[0], device=h.device), idx]


class LMHead(nn.Module):
    """Per-token vocabulary scores: Linear(D, V) with a bias (the tutorial's `self.linear`)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.proj = nn.Linear(config.d_model, config.vocab_size)

    def forward(self, h: Tensor, keep: Tensor | None) -> Tensor:
        return self.proj(h)  # (B, T, V)


class ClassificationHead(nn.Module):
    """Pool the sequence to one vector, then dropout and Linear(D, C)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.pool = POOLINGS.get(config.pooling)
        self.dropout = Dropout(config.dropout)
        self.proj = nn.Linear(config.d_model, config.n_classes)

    def forward(self, h: Tensor, keep: Tensor | None) -> Tensor:
        check_some_tokens(h)
        return self.proj(self.dropout(self.pool(h, keep)))  # (B, C)


HEAD_MODULES: dict[str, type[nn.Module]] = {"lm": LMHead, "classification": ClassificationHead}


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------


class EncoderModel(nn.Module):
    """Embeddings → encoder stack → head.

    forward(input_ids (B, T), attention_mask (B, T) 1 = token, labels) -> ModelOutput with logits
    (B, T, V) for the "lm" head (labels (B, T), already shifted by the data) or (B, C) for the
    "classification" head (labels (B,)). Padding is masked out of attention (as keys) and of pooling;
    positions count real tokens only, so left and right padding give the same outputs on real tokens.
    A causal LM decodes with a cache from `new_cache()` as GPT does: only the new tokens are given, and
    attention_mask (if any) covers the cached keys too; with a cache, padding comes from attention_mask alone
    (config.pad_id is not read: the cached keys' ids are gone), so give it where tokens may equal pad_id.
    """

    def __init__(self, config: EncoderConfig):
        super().__init__()
        # A copy: the caller's config, changed to build another model, must not change what this one says it is.
        self.config = c = copy.deepcopy(config)
        self.embed = Embedder(c.vocab_size, c.d_model, scale=c.scale_embeddings, dropout=c.dropout)
        self.position = build_position(c.position, d_model=c.d_model, n_heads=c.n_heads, max_len=c.max_len,
                                       causal=c.is_causal, **c.position_options)
        self.encoder = Encoder(c.layer_spec(), c.n_layers, final_norm=c.has_final_norm)
        self.head = HEAD_MODULES[c.head](c)
        # The tutorial's init_weights: uniform(-0.1, 0.1) embedding and output weights, zero output bias.
        nn.init.uniform_(self.embed.token.weight, -0.1, 0.1)
        self._init_head()
        # The longest sequence (None: unbounded); generation slides a window of this size past it.
        self.max_len = length_limit(c.attention, self.position, c.max_len)

    def _init_head(self) -> None:
        nn.init.uniform_(self.head.proj.weight, -0.1, 0.1)
        nn.init.zeros_(self.head.proj.bias)

    @property
    def supports_cache(self) -> bool:
        """Whether decoding may keep keys and values: only under the causal LM head (a bidirectional model's
        earlier states change with every token added after them), and with a layer to keep them (the cache's
        length places new tokens: an empty list of caches would put every token at position 0)."""
        return self.config.head == "lm" and self.config.is_causal and self.config.n_layers > 0

    def _no_cache_error(self) -> ConfigError:
        if self.config.n_layers == 0:
            return ConfigError("a model without layers has no keys or values to cache; decode it without a cache")
        return ConfigError("a KV cache needs the causal LM head (head = \"lm\", causal not false); decode "
                           "this model without a cache")

    def new_cache(self, capacity: int = 0) -> list[KVCache]:
        """One KV cache per layer; `capacity` preallocates that many positions."""
        if not self.supports_cache:
            raise self._no_cache_error()
        return [KVCache(capacity=capacity) for _ in range(self.config.n_layers)]

    def _keep(self, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor | None:
        """(B, T) bool, True on real tokens; None when every token is real."""
        if attention_mask is not None:
            return attention_mask.bool()
        if self.config.pad_id is not None:
            return input_ids != self.config.pad_id
        return None

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None, *, cache: list[KVCache] | None = None,
               need_weights: bool = False, output_hidden_states: bool = False
               ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """(B, T) ids -> (final states (B, T, D), per-layer attention weights, hidden states)."""
        check_ids(input_ids)
        b, t = input_ids.shape
        if cache is not None and not self.supports_cache:
            raise self._no_cache_error()
        past = cache[0].length if cache else 0
        check_length(past + t, self.max_len)
        check_attention_mask(attention_mask, b, t, cached=past)
        # With a cache, padding comes from attention_mask over every key (config.pad_id sees only new tokens).
        keep = self._keep(input_ids, attention_mask) if cache is None else (
            None if attention_mask is None else attention_mask.bool())
        if keep is None:
            positions, key_positions, mask = default_positions(t, past, input_ids.device), None, None
        else:  # (B, S) keep -> positions over real tokens (the new tokens' are the last t), (B, 1, 1, S) key mask
            key_positions, mask = positions_from_mask(keep), key_mask(keep)
            positions = key_positions[:, -t:]
        x = self.embed(input_ids, positions, self.position)  # (B, T, D)
        return self.encoder(x, mask=mask, causal=self.config.is_causal, positions=positions,
                            key_positions=key_positions, position=self.position, cache=cache,
                            need_weights=need_weights, output_hidden_states=output_hidden_states)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None,
                *, cache: list[KVCache] | None = None, need_weights: bool = False,
                output_hidden_states: bool = False, **ignored: Tensor) -> ModelOutput:
        refuse_unknown_keywords(self, ignored)
        h, weights, hidden = self.encode(input_ids, attention_mask, cache=cache, need_weights=need_weights,
                                         output_hidden_states=output_hidden_states)
        keep = None if cache is not None else self._keep(input_ids, attention_mask)  # the LM head reads no keep
        out = ModelOutput(logits=self.head(h, keep))
        if labels is not None:
            smoothing = self.config.label_smoothing if self.training else 0.0  # evaluation: the true loss
            out.loss, out.n_targets = token_loss(out.logits, labels, label_smoothing=smoothing)
        if need_weights:
            out.attentions = weights
        if output_hidden_states:
            out.hidden_states = hidden
        return out

    def with_head(self, head: str, *, n_classes: int | None = None, pooling: str | None = None,
                  causal: bool | None = None) -> EncoderModel:
        """A new model with a copy of this one's embeddings, positions and encoder, and a fresh `head`.

        Args:
            head: "lm" or "classification".
            n_classes: classes of a classification head (default: the config's).
            pooling: pooling of a classification head (default: the config's).
            causal: the attention mask of the new model. Default: keep this model's, since the encoder
                was trained with it (a causally pretrained encoder gives different features without it).

        Returns:
            An EncoderModel on this model's device and dtype, in this model's train/eval mode.
        """
        changes: dict = {"head": head, "causal": self.config.is_causal if causal is None else causal}
        if self.config.position == "t5-bias" and bool(changes["causal"]) != self.config.is_causal:
            # T5's buckets are laid out for one mask: under another, the table's rows are read for other distances
            raise ConfigError(f"causal = {changes['causal']!r}, but this model's T5 bias buckets were learned under "
                              f"causal = {self.config.is_causal}, which another mask reads for other distances; keep "
                              "its mask (causal=None)")
        for name, value in (("n_classes", n_classes), ("pooling", pooling)):
            if value is not None:
                changes[name] = value
        p = next(self.parameters())
        # In this model's dtype before the weights are copied in: a float64 body must not pass through float32.
        new = EncoderModel(self.config.replace(**changes)).to(device=p.device, dtype=p.dtype)
        body = {k: v for k, v in self.state_dict().items() if not k.startswith("head.")}
        missing, unexpected = new.load_state_dict(body, strict=False)
        if unexpected or any(not k.startswith("head.") for k in missing):  # pragma: no cover - invariant
            raise RuntimeError(f"with_head: body mismatch (missing {missing}, unexpected {unexpected})")
        return new.train(self.training)


# --------------------------------------------------------------------------------------------------
# Family and presets
# --------------------------------------------------------------------------------------------------


def _tutorial(**changes) -> EncoderConfig:
    """The tutorial's widths: d_model 200, d_ff 200, 2 heads, dropout 0.2; here 4 layers and 100 words (the course
    notes' symbols: the tutorial itself stacks 2 layers over WikiText-2's vocabulary)."""
    return EncoderConfig(vocab_size=100, d_model=200, n_heads=2, d_ff=200, n_layers=4, dropout=0.2,
                         **changes)


register_family("encoder", EncoderConfig, EncoderModel)
register_preset("tutorial-lm", "encoder", lambda: _tutorial(head="lm"))  # 1,008,100 parameters
register_preset("tutorial-cls", "encoder", lambda: _tutorial(head="classification", n_classes=2))  # 988,402
register_preset("encoder-tiny", "encoder", lambda: EncoderConfig(
    vocab_size=64, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0, max_len=64))
