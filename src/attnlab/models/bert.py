"""BERT (Devlin et al. 2019): a bidirectional post-norm Transformer encoder pretrained with a masked
language model and next-sentence prediction, then fine-tuned with a classifier on [CLS].

Read top to bottom: config, embeddings (token + position + segment, then LayerNorm and dropout), the
pooler and the heads, then the model. Legend: B batch, T length, D d_model (HF `hidden_size`),
V vocabulary, C classes.

The layers are the core `EncoderLayer`s (post-norm, GELU, LayerNorm eps 1e-12); with the converter in
`attnlab.convert.bert` a Hugging Face BERT checkpoint loads into this model and gives the same outputs.
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
    check_attention_mask,
    check_given_positions,
    check_ids,
    check_integers,
    check_length,
    check_some_tokens,
    default_positions,
    labelled_rows,
    length_limit,
    lookup,
    positions_from_mask,
    refuse_unknown_keywords,
    token_loss,
)
from attnlab.models.encoder import first_pool
from attnlab.models.output import ModelOutput
from attnlab.models.registry import register_family, register_preset
from attnlab.modules.attention import key_mask
from attnlab.modules.blocks import Encoder, LayerSpec
from attnlab.modules.dropout import Dropout
from attnlab.modules.feedforward import ACTIVATIONS
from attnlab.modules.positions import POSITIONS, PositionScheme, build_position, check_compatible
from attnlab.modules.variants import VARIANTS, BilinearScores

HEADS = ("pretraining", "classification", "none")


# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


@dataclass
class BertConfig(Config):
    """Settings of BERT (defaults: bert-base-uncased). HF `BertConfig` names are in the comments.

    `heads` picks the outputs:
    - "pretraining": masked-LM logits (B, T, V) and, with `nsp`, next-sentence logits (B, 2) in
      `extra["nsp_logits"]` (`nsp = false` is the "no NSP" ablation, and the layout of HF
      `BertForMaskedLM` checkpoints);
    - "classification": (B, C) logits from the pooled [CLS] state;
    - "none": the encoder's last hidden state (B, T, D) as logits (HF `BertModel`).
    `pooler` (Linear + tanh on [CLS]) defaults to present when a head reads it and for "none".
    `causal = true` makes the left-to-right ablation (where [CLS] sees only itself, so it needs
    `nsp = false`, and no classification head). Positions count real tokens; the converter in
    `attnlab.convert.bert` maps HF names.
    `mlm_logits = "labelled"`: in training, given labels, the masked-LM head runs at the labelled positions
    only and `logits` holds their rows, (n, V) in the row-major order of the positions: the same loss and
    gradients for the head's work at those positions only, 15 % of them in BERT (NVIDIA's BERT pretraining
    does the same); evaluation (eval mode) and inference always score every position.
    """

    vocab_size: int = 30522
    d_model: int = 768  # hidden_size
    n_layers: int = 12  # num_hidden_layers
    n_heads: int = 12  # num_attention_heads
    d_ff: int = 3072  # intermediate_size
    max_len: int = 512  # max_position_embeddings
    type_vocab_size: int = 2  # 0: no segment embeddings
    activation: str = "gelu"  # hidden_act ("gelu" is the exact erf form)
    layer_norm_eps: float = 1e-12
    dropout: float = 0.1  # hidden_dropout_prob
    attention_dropout: float = 0.1  # attention_probs_dropout_prob
    classifier_dropout: float | None = None  # None: dropout
    initializer_range: float = 0.02
    pad_id: int | None = 0  # pad_token_id (its embedding row gets no gradient from the lookup)
    tie_output: bool = True  # tie_word_embeddings: the MLM decoder is the token embedding matrix
    heads: str = "pretraining"
    nsp: bool = True
    n_classes: int = 2
    pooler: bool | None = None
    causal: bool = False
    attention: str = "dot"
    attention_options: dict = field(default_factory=dict)
    position: str = "learned"
    position_options: dict = field(default_factory=dict)
    mlm_logits: str = "all"

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "max_len"):
            check_positive(name, getattr(self, name))
        check_fractions(self)
        check_positive("layer_norm_eps", self.layer_norm_eps, allow_zero=True)
        check_positive("initializer_range", self.initializer_range, allow_zero=True)
        check_positive("n_layers", self.n_layers, allow_zero=True)
        check_positive("type_vocab_size", self.type_vocab_size, allow_zero=True)
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.pad_id is not None and not 0 <= self.pad_id < self.vocab_size:
            raise ConfigError(f"pad_id ({self.pad_id}) must be a token id below vocab_size "
                              f"({self.vocab_size})")
        check_choice("heads", self.heads, HEADS)
        check_choice("mlm_logits", self.mlm_logits, LOGITS_AT)
        check_choice("activation", self.activation, ACTIVATIONS.names())
        check_choice("attention", self.attention, VARIANTS.names())
        check_choice("position", self.position, POSITIONS.names())
        check_compatible(self.attention, self.position, self.attention_options, self.position_options)
        if self.heads == "classification" and self.n_classes < 2:
            raise ConfigError(f"n_classes must be at least 2 for a classification head, got {self.n_classes}")
        if self.causal and self.head_reads_pooler:
            # Under the causal mask [CLS], the first token, attends to itself only: its pooled state, and so
            # the head's output, would be the same for every input.
            head = "the next-sentence head" if self.heads == "pretraining" else "the classification head"
            fix = "set causal = false, or nsp = false" if self.heads == "pretraining" else "set causal = false"
            raise ConfigError(f"causal = true: [CLS] sees only itself, so {head} would read the same pooled "
                              f"state for every input; {fix}")
        if self.pooler is False and self.head_reads_pooler:
            raise ConfigError(f"heads = {self.heads!r}" + (" with nsp" if self.heads == "pretraining" else "")
                              + " reads the pooled [CLS] state; set pooler = true (or leave it unset)")

    @property
    def head_reads_pooler(self) -> bool:
        return self.heads == "classification" or (self.heads == "pretraining" and self.nsp)

    @property
    def has_pooler(self) -> bool:
        """`pooler` resolved: None (the default, kept as None so `replace(heads=...)` re-decides) means
        present when a head reads it and for "none" (as HF BertModel)."""
        if self.pooler is None:
            return self.head_reads_pooler or self.heads == "none"
        return self.pooler

    def layer_spec(self) -> LayerSpec:
        return LayerSpec.from_config(self, ff_dropout=0.0, norm="post", block_size=self.max_len)


# --------------------------------------------------------------------------------------------------
# Embeddings, pooler, heads
# --------------------------------------------------------------------------------------------------


class BertEmbeddings(nn.Module):
    """token(ids) + position + segment(token_type_ids), then LayerNorm and dropout."""

    def __init__(self, config: BertConfig, position: PositionScheme):
        super().__init__()
        c = config
        self.token = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.position = position
        self.segment = nn.Embedding(c.type_vocab_size, c.d_model) if c.type_vocab_size else None
        self.norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.dropout = Dropout(c.dropout)

    def forward(self, ids: Tensor, positions: Tensor, token_type_ids: Tensor | None) -> Tensor:
        x = lookup(self.token, ids)  # (B, T, D)
        if self.segment is not None and token_type_ids is not None:
            x = x + lookup(self.segment, token_type_ids, "token_type_ids",
                           "give each token its segment's number (0 for the first, 1 for the second)")
        elif self.segment is not None:
            x = x + self.segment.weight[0]
        x = self.position.embed(x, positions)
        return self.dropout(self.norm(x))


class Pooler(nn.Module):
    """tanh(W·h_[CLS] + b): the sentence summary the NSP and classification heads read. [CLS] is the first
    real token: position 0 under right padding (HF's rule), after the padding of a left-padded row."""

    def __init__(self, d_model: int):
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, h: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        check_some_tokens(h)
        return torch.tanh(self.dense(first_pool(h, attention_mask)))  # (B, D)


class MaskedLMHead(nn.Module):
    """transform = LayerNorm(act(Linear(h))); logits = transform·Eᵀ + b, E the token embeddings."""

    def __init__(self, config: BertConfig):
        super().__init__()
        c = config
        self.dense = nn.Linear(c.d_model, c.d_model)
        self.act = ACTIVATIONS.get(c.activation)
        self.norm = nn.LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.decoder = nn.Linear(c.d_model, c.vocab_size)  # weight tied by the model when tie_output

    def forward(self, h: Tensor) -> Tensor:
        return self.decoder(self.norm(self.act(self.dense(h))))  # (B, T, V)


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------


class BertModel(nn.Module):
    """BERT with the heads chosen by `config.heads`.

    forward(input_ids (B, T), attention_mask (B, T) 1 = token, token_type_ids (B, T) segments,
    labels, next_sentence_label (B,)) -> ModelOutput.

    Loss for "pretraining" (as HF `BertForPreTraining`): loss = mean MLM loss over labels != -100
    + mean NSP loss over the batch's next_sentence_label (either term only when its labels are given),
    both also in `extra` (`mlm_loss`, `nsp_loss`). `n_targets` is the number of MLM targets (the
    number of NSP labels when only those are given). With both, `extra["loss_terms"]` holds the two
    means by the batch key of their labels, so that the trainer weights the MLM term by masked tokens
    and the NSP term by sentence pairs: accumulated micro-batches give the large batch's gradient.
    For "classification", labels are (B,) class ids and n_targets counts them.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        # A copy: the caller's config, changed to build another model, must not change what this one says it is.
        self.config = c = copy.deepcopy(config)
        position = build_position(c.position, d_model=c.d_model, n_heads=c.n_heads, max_len=c.max_len,
                                  causal=c.causal, **c.position_options)
        self.embeddings = BertEmbeddings(c, position)
        # BERT has no dropout inside the feed-forward (layer_spec sets ff_dropout = 0).
        self.encoder = Encoder(c.layer_spec(), c.n_layers, final_norm=False)
        self.pooler = Pooler(c.d_model) if c.has_pooler else None
        self.mlm = MaskedLMHead(c) if c.heads == "pretraining" else None
        self.nsp = nn.Linear(c.d_model, 2) if c.heads == "pretraining" and c.nsp else None
        if c.heads == "classification":
            self.classifier_dropout = Dropout(c.dropout if c.classifier_dropout is None
                                              else c.classifier_dropout)
            self.classifier = nn.Linear(c.d_model, c.n_classes)
        self.apply(self._init_weights)
        if self.mlm is not None and c.tie_output:
            self.mlm.decoder.weight = self.embeddings.token.weight
        # The longest sequence (None: unbounded): learned positions (BERT's) or Synthesizer bound it.
        self.max_len = length_limit(c.attention, self.embeddings.position, c.max_len)

    def _init_weights(self, module: nn.Module) -> None:
        """BERT's init: N(0, initializer_range) weights, zero biases (and pad row), unit LayerNorms."""
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, BilinearScores):  # W_Q·W_K merged: drawn as those two linear layers would be
            module.init_like_dot(std)

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None,
               token_type_ids: Tensor | None = None, position_ids: Tensor | None = None, *,
               need_weights: bool = False,
               output_hidden_states: bool = False) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """(B, T) ids -> (last hidden state (B, T, D), per-layer attention weights, hidden states).

        Positions count real tokens (right padding gives HF's 0..T-1 on every real token); pass
        `position_ids` (B|1, T) to override.
        """
        check_ids(input_ids)
        b, t = input_ids.shape
        check_length(t, self.max_len)
        check_given_positions(position_ids, self.max_len, "position_ids", shape=(b, t))
        check_attention_mask(attention_mask, b, t)
        if token_type_ids is not None:
            check_integers(token_type_ids, "token_type_ids")
            if token_type_ids.dim() != 2 or token_type_ids.shape[1] != t or token_type_ids.shape[0] not in (1, b):
                raise ConfigError(f"token_type_ids has shape {tuple(token_type_ids.shape)}; it must be ({b}, {t}), "
                                  "the segment id of each token of input_ids")
        if position_ids is None:
            position_ids = positions_from_mask(attention_mask) if attention_mask is not None \
                else default_positions(t, 0, input_ids.device)
        x = self.embeddings(input_ids, position_ids, token_type_ids)
        mask = key_mask(attention_mask.bool()) if attention_mask is not None else None
        return self.encoder(x, mask=mask, causal=self.config.causal, positions=position_ids,
                            position=self.embeddings.position, need_weights=need_weights,
                            output_hidden_states=output_hidden_states)

    @property
    def _reads_pooler(self) -> bool:
        """Whether the output reads the pooler: not the pre-training heads without NSP (a pooler kept beside them,
        as a converted HF BERT keeps one, to fine-tune a classifier from later)."""
        return self.config.heads == "none" or self.config.head_reads_pooler

    def parameters_outside_loss(self) -> list[str]:
        """The names of parameters no loss of this model reaches (a pooler the heads do not read): they get no
        gradient, which DDP must be told of (it stopped at the second step)."""
        if self.pooler is None or self._reads_pooler:
            return []
        return [name for name, _ in self.pooler.named_parameters(prefix="pooler")]

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, labels: Tensor | None = None,
                next_sentence_label: Tensor | None = None, position_ids: Tensor | None = None, *,
                need_weights: bool = False, output_hidden_states: bool = False,
                **ignored: Tensor) -> ModelOutput:
        refuse_unknown_keywords(self, ignored)
        h, weights, hidden = self.encode(input_ids, attention_mask, token_type_ids, position_ids,
                                         need_weights=need_weights, output_hidden_states=output_hidden_states)
        heads = self.config.heads
        pooled = self.pooler(h, attention_mask) if self.pooler is not None and self._reads_pooler else None
        if heads == "pretraining":
            out = self._pretraining(h, pooled, labels, next_sentence_label)
        elif heads == "classification":
            out = ModelOutput(logits=self.classifier(self.classifier_dropout(pooled)))  # (B, C)
            if labels is not None:
                out.loss, out.n_targets = token_loss(out.logits, labels)
        else:
            if labels is not None:  # no head to score them: a loss of None would pass for "nothing to learn"
                raise ConfigError("labels were given to a BertModel without heads (heads='none'), which has no loss; "
                                  "build it with heads='pretraining' or 'classification' to train it")
            out = ModelOutput(logits=h)
            if pooled is not None:
                out.extra["pooled_output"] = pooled
        if need_weights:
            out.attentions = weights
        if output_hidden_states:
            out.hidden_states = hidden
        return out

    def _pretraining(self, h: Tensor, pooled: Tensor | None, labels: Tensor | None,
                     next_sentence_label: Tensor | None) -> ModelOutput:
        if labels is not None and self.training and self.config.mlm_logits == "labelled":
            h, labels = labelled_rows(h, labels)  # (n, D), (n,): the head's rows that the loss reads
        out = ModelOutput(logits=self.mlm(h))  # (B, T, V), or (n, V)
        losses = []
        if labels is not None:
            mlm_loss, out.n_targets = token_loss(out.logits, labels)
            out.extra["mlm_loss"] = mlm_loss.detach()
            losses.append(mlm_loss)
        if self.nsp is not None:
            out.extra["nsp_logits"] = nsp_logits = self.nsp(pooled)  # (B, 2)
            if next_sentence_label is not None:
                nsp_loss, n_nsp = token_loss(nsp_logits, next_sentence_label, what="next_sentence_label")
                out.extra["nsp_loss"] = nsp_loss.detach()
                losses.append(nsp_loss)
                if out.n_targets is None:
                    out.n_targets = n_nsp
        if losses:
            out.loss = sum(losses[1:], losses[0])
        if len(losses) == 2:
            out.extra["loss_terms"] = {"labels": losses[0], "next_sentence_label": losses[1]}
        return out


# --------------------------------------------------------------------------------------------------
# Family and presets
# --------------------------------------------------------------------------------------------------

register_family("bert", BertConfig, BertModel)
# bert-base-uncased: 110,106,428 parameters with the pretraining heads, 109,482,240 as HF BertModel.
register_preset("bert-base", "bert", BertConfig)
register_preset("bert-tiny", "bert", lambda: BertConfig(
    vocab_size=99, d_model=32, n_layers=2, n_heads=4, d_ff=37, max_len=64, dropout=0.0,
    attention_dropout=0.0))
