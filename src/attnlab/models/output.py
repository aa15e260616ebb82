"""The structured output every model returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class ModelOutput:
    """What a forward pass returns.

    Attributes:
        logits: main prediction scores, e.g. (B, T, V) for a language model or (B, C) for a classifier.
        loss: mean loss over the targets that are not ignored (label -100), when labels were given.
        n_targets: how many targets `loss` averages over (a 0-dim long tensor); the trainer uses it to
            weight micro-batches so accumulated gradients equal the large-batch gradient.
        attentions: per layer, attention weights (B, H, T_q, T_k), only when asked for.
        hidden_states: the embeddings (B, T, D), then each layer's output, only when asked for; in a stack with a
            final norm (pre-norm) the last is taken after it, the states the head reads (as HF's GPT-2).
        extra: other named outputs (e.g. BERT's next-sentence logits, cross-attention weights).
    """

    logits: Tensor
    loss: Tensor | None = None
    n_targets: Tensor | None = None
    attentions: list[Tensor] | None = None
    hidden_states: list[Tensor] | None = None
    extra: dict[str, Tensor] = field(default_factory=dict)
