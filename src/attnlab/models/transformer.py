"""The encoder-decoder Transformer of "Attention is all you need" (Vaswani et al. 2017).

Read top to bottom: config, then the model (embeddings → encoder → decoder → output projection).
Legend: B batch, S source length, T target length, D d_model, V vocabulary.

The paper's choices are the defaults: post-norm, sinusoidal positions, embeddings scaled by
sqrt(D), one vocabulary shared by source and target with the embedding matrix also used as the
pre-softmax projection ("we share the same weight matrix between the two embedding layers and the
pre-softmax linear transformation").
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.config import Config, check_choice, check_fractions, check_positive
from attnlab.errors import ConfigError
from attnlab.models.common import (
    LOGITS_AT,
    Embedder,
    check_attention_mask,
    check_ids,
    check_length,
    default_positions,
    labelled_rows,
    length_limit,
    positions_from_mask,
    refuse_unknown_keywords,
    token_loss,
)
from attnlab.models.output import ModelOutput
from attnlab.models.registry import register_family, register_preset
from attnlab.modules.attention import KVCache, key_mask
from attnlab.modules.blocks import NORM_PLACEMENTS, Decoder, Encoder, LayerSpec
from attnlab.modules.feedforward import ACTIVATIONS
from attnlab.modules.positions import POSITIONS, build_position, check_compatible
from attnlab.modules.variants import VARIANTS


@dataclass
class TransformerConfig(Config):
    """Settings of the encoder-decoder Transformer (defaults: the paper's base model's architecture; the loss
    is plain cross-entropy unless `label_smoothing` is set: the paper trained with 0.1, as
    configs/translate.toml does)."""

    src_vocab_size: int = 37000
    tgt_vocab_size: int = 37000
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation: str = "relu"
    norm: str = "post"
    final_norm: bool | None = None  # None: only for pre-norm (a post-norm stack already ends in a norm)
    attention: str = "dot"
    attention_options: dict = field(default_factory=dict)
    position: str = "sinusoidal"
    position_options: dict = field(default_factory=dict)
    max_len: int = 1024
    share_embeddings: bool = True  # source and target embeddings are one matrix (needs one vocabulary)
    tie_output: bool = True  # the output projection reuses the target embedding matrix
    output_bias: bool = False
    scale_embeddings: bool = True  # multiply embeddings by sqrt(d_model)
    bias: bool = True
    layer_norm_eps: float = 1e-5
    label_smoothing: float = 0.0
    lm_logits: str = "all"  # "labelled": in training, given labels, the LM head scores labelled positions only
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self):
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            check_positive(name, getattr(self, name))
        check_fractions(self)
        check_positive("layer_norm_eps", self.layer_norm_eps, allow_zero=True)
        check_positive("n_encoder_layers", self.n_encoder_layers, allow_zero=True)
        check_positive("n_decoder_layers", self.n_decoder_layers)
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        check_choice("norm", self.norm, NORM_PLACEMENTS)
        check_choice("lm_logits", self.lm_logits, LOGITS_AT)
        check_choice("activation", self.activation, ACTIVATIONS.names())
        check_choice("attention", self.attention, VARIANTS.names())
        check_choice("position", self.position, POSITIONS.names())
        check_compatible(self.attention, self.position, self.attention_options, self.position_options)
        for name, limit, side in (("pad_id", min(self.src_vocab_size, self.tgt_vocab_size), "both vocabularies"),
                                  ("bos_id", self.tgt_vocab_size, "the target vocabulary"),
                                  ("eos_id", self.tgt_vocab_size, "the target vocabulary")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
                raise ConfigError(f"{name} ({value}) must be a token id of {side} (0 to {limit - 1}); set it to "
                                  "the tokenizer's id")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ConfigError("share_embeddings needs src_vocab_size == tgt_vocab_size; "
                              "set share_embeddings = false for separate vocabularies")

    @property
    def has_final_norm(self) -> bool:
        return self.norm == "pre" if self.final_norm is None else self.final_norm

    def layer_spec(self) -> LayerSpec:
        return LayerSpec.from_config(self, block_size=self.max_len)


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder Transformer with its LM head.

    forward(src_ids (B, S), tgt_ids (B, T), src_mask (B, S) 1 = token, labels (B, T)) -> ModelOutput
    with logits (B, T, V). `encode` and `decode` are exposed for generation with a KV cache.

    `lm_logits = "labelled"`: in training, given labels, the LM head runs at the labelled target positions
    only and `logits` holds their rows, (n, V) in row-major order: the same loss and gradients without the
    head's product and the cross-entropy over the padding of the target rows (29 % of the positions in
    length-sorted Multi30k batches; the head is the largest product of a small translation model).
    Evaluation (eval mode) and inference always score every position.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        # A copy: the caller's config, changed to build another model, must not change what this one says it is.
        self.config = c = copy.deepcopy(config)
        spec = c.layer_spec()
        self.src_embed = Embedder(c.src_vocab_size, c.d_model, scale=c.scale_embeddings, dropout=c.dropout,
                                  what="src_ids")
        self.tgt_embed = Embedder(c.tgt_vocab_size, c.d_model, scale=c.scale_embeddings, dropout=c.dropout,
                                  what="tgt_ids")
        if c.share_embeddings:
            self.tgt_embed.token = self.src_embed.token
        # Two schemes: the encoder's bias schemes are bidirectional, the decoder's causal.
        self.src_position = build_position(c.position, d_model=c.d_model, n_heads=c.n_heads,
                                           max_len=c.max_len, causal=False, **c.position_options)
        self.tgt_position = build_position(c.position, d_model=c.d_model, n_heads=c.n_heads,
                                           max_len=c.max_len, causal=True, **c.position_options)
        self.encoder = Encoder(spec, c.n_encoder_layers, final_norm=c.has_final_norm)
        self.decoder = Decoder(spec, c.n_decoder_layers, final_norm=c.has_final_norm)
        self.lm_head = nn.Linear(c.d_model, c.tgt_vocab_size, bias=c.output_bias)
        if c.tie_output:
            self.lm_head.weight = self.tgt_embed.token.weight
        # The longest source and target (None: unbounded): learned positions or Synthesizer bound them.
        self.max_len = length_limit(c.attention, self.src_position, c.max_len)

    # -- the two halves -----------------------------------------------------------------------------

    def encode(self, src_ids: Tensor, src_mask: Tensor | None = None, *, need_weights: bool = False,
               output_hidden_states: bool = False) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """(B, S) ids -> memory (B, S, D), encoder attention weights, hidden states."""
        check_ids(src_ids, "src_ids")
        check_length(src_ids.shape[1], self.max_len, "source sequence")
        check_attention_mask(src_mask, *src_ids.shape, what="src_mask", tokens="source token")
        # With a mask, positions count real tokens, so a left-padded source reads as it does alone.
        positions = positions_from_mask(src_mask) if src_mask is not None else \
            default_positions(src_ids.shape[1], 0, src_ids.device)
        x = self.src_embed(src_ids, positions, self.src_position)
        mask = key_mask(src_mask.bool()) if src_mask is not None else None
        return self.encoder(x, mask=mask, positions=positions, position=self.src_position,
                            need_weights=need_weights, output_hidden_states=output_hidden_states)

    def decode_states(self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor | None = None, *,
                      cache: list[tuple[KVCache, KVCache]] | None = None, need_weights: bool = False,
                      output_hidden_states: bool = False):
        """`decode` up to the LM head: the decoder's output states (B, T, D) in place of the logits."""
        check_ids(tgt_ids, "tgt_ids")
        if tgt_ids.shape[0] != memory.shape[0]:  # broadcast over the sources, or a raw broadcasting error
            raise ConfigError(f"tgt_ids has {tgt_ids.shape[0]} rows but there are {memory.shape[0]} sources; give one "
                              "target row per source")
        past = cache[0][0].length if cache else 0
        check_length(past + tgt_ids.shape[1], self.max_len, "target sequence")
        positions = default_positions(tgt_ids.shape[1], past, tgt_ids.device)
        y = self.tgt_embed(tgt_ids, positions, self.tgt_position)
        check_attention_mask(src_mask, *memory.shape[:2], what="src_mask", tokens="source token")
        memory_mask = key_mask(src_mask.bool()) if src_mask is not None else None
        y, self_w, cross_w, hidden = self.decoder(
            y, memory, memory_mask=memory_mask, positions=positions, position=self.tgt_position,
            cache=cache, need_weights=need_weights, output_hidden_states=output_hidden_states)
        return y, self_w, cross_w, hidden

    def decode(self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor | None = None, *,
               cache: list[tuple[KVCache, KVCache]] | None = None, need_weights: bool = False,
               output_hidden_states: bool = False):
        """(B, T) target ids and memory -> (logits (B, T, V), self weights, cross weights, hidden)."""
        y, self_w, cross_w, hidden = self.decode_states(tgt_ids, memory, src_mask, cache=cache,
                                                         need_weights=need_weights,
                                                         output_hidden_states=output_hidden_states)
        return self.lm_head(y), self_w, cross_w, hidden

    def new_cache(self) -> list[tuple[KVCache, KVCache]]:
        return [(KVCache(), KVCache(static=True)) for _ in range(self.config.n_decoder_layers)]

    # -- training forward ---------------------------------------------------------------------------

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, src_mask: Tensor | None = None,
                labels: Tensor | None = None, *, need_weights: bool = False,
                output_hidden_states: bool = False, **ignored: Tensor) -> ModelOutput:
        refuse_unknown_keywords(self, ignored)
        memory, enc_w, enc_h = self.encode(src_ids, src_mask, need_weights=need_weights,
                                           output_hidden_states=output_hidden_states)
        y, self_w, cross_w, dec_h = self.decode_states(tgt_ids, memory, src_mask, need_weights=need_weights,
                                                       output_hidden_states=output_hidden_states)
        if labels is not None and self.training and self.config.lm_logits == "labelled":
            y, labels = labelled_rows(y, labels)  # (n, D), (n,): the head's rows that the loss reads
        out = ModelOutput(logits=self.lm_head(y))
        if labels is not None:
            # Label smoothing regularises training; evaluation scores the true cross-entropy, whose exp is the
            # perplexity (smoothed, it was twice the true figure on Multi30k).
            smoothing = self.config.label_smoothing if self.training else 0.0
            out.loss, out.n_targets = token_loss(out.logits, labels, label_smoothing=smoothing)
        if need_weights:
            out.attentions = self_w
            out.extra.update(cross_attentions=torch.stack(cross_w) if cross_w else None,
                             encoder_attentions=torch.stack(enc_w) if enc_w else None)
            out.extra = {k: v for k, v in out.extra.items() if v is not None}
        if output_hidden_states:
            out.hidden_states = dec_h
            out.extra["encoder_hidden_states"] = torch.stack(enc_h)
        return out


register_family("seq2seq", TransformerConfig, Seq2SeqTransformer)
register_preset("transformer-base", "seq2seq", TransformerConfig)
register_preset("transformer-big", "seq2seq", lambda: TransformerConfig(
    d_model=1024, n_heads=16, d_ff=4096, dropout=0.3))
register_preset("seq2seq-tiny", "seq2seq", lambda: TransformerConfig(
    src_vocab_size=64, tgt_vocab_size=64, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2,
    n_decoder_layers=2, dropout=0.0, max_len=64))
