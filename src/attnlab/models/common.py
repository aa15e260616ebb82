"""Pieces every model family shares: token embeddings with a position scheme, the LM loss,
and the sequence-length check."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.errors import AttnlabError, ConfigError
from attnlab.modules.dropout import Dropout
from attnlab.modules.positions import PositionScheme

IGNORE_INDEX = -100


class SequenceTooLong(AttnlabError):
    """An input longer than the model's position scheme or block allows."""


class IdOutOfRange(AttnlabError, IndexError):
    """A token (or segment) id outside the model's table (an IndexError still, for code that caught torch's)."""


def lookup(table: nn.Embedding | Tensor, ids: Tensor, what: str = "input_ids",
           fix: str = "encode the input with the model's own tokenizer") -> Tensor:
    """`table`'s rows at `ids`. An id outside the table is named with the table's range: torch's own error
    ("index out of range in self") named neither. Nothing is checked while the ids are valid; on a GPU a bad id
    stops the device with torch's assert instead, as there is no error to catch without waiting for the device."""
    weight = table.weight if isinstance(table, nn.Embedding) else table
    try:
        return table(ids) if isinstance(table, nn.Embedding) else F.embedding(ids, table)
    except IndexError:
        n = weight.shape[0]
        low, high = int(ids.min()), int(ids.max())
        if 0 <= low and high < n:  # not the ids after all
            raise
        raise IdOutOfRange(f"{what} must lie in 0 to {n - 1} (the model's table of {n}), got "
                           f"{low if low < 0 else high}; {fix}") from None


# Batch entries a model may be given and not read: BERT's sentence-pair batches carry them, and a model that takes
# no segments ignores them (HF's models take the same keys). Any other keyword a model does not take is refused:
# `gpt(ids, position_ids=...)` (BERT's name for GPT's `positions`), `encoder(ids, document_ids=...)` or a
# misspelt `need_weight=True` returned results computed without them, silently.
IGNORED_BATCH_KEYS = frozenset({"token_type_ids", "next_sentence_label"})


def refuse_unknown_keywords(model: nn.Module, keywords: dict) -> None:
    """Raise TypeError, as Python does, for a keyword in `keywords` (a forward's **kwargs) that is not an
    ignored batch key."""
    unknown = [k for k in keywords if k not in IGNORED_BATCH_KEYS]
    if unknown:
        import inspect

        takes = [n for n, p in inspect.signature(model.forward).parameters.items() if p.kind != p.VAR_KEYWORD]
        raise TypeError(f"{type(model).__name__}.forward() got an unexpected keyword argument {unknown[0]!r}; it "
                        f"takes {', '.join(takes)}")


def check_length(length: int, max_len: int | None, what: str = "sequence") -> None:
    if max_len is not None and length > max_len:
        raise SequenceTooLong(
            f"{what} of {length} tokens is longer than the model allows ({max_len}); "
            f"truncate the input or use a model with a larger max_len/block_size"
        )


def check_given_positions(positions: Tensor | None, max_len: int | None, what: str = "positions",
                          shape: tuple[int, int] | None = None) -> None:
    """Positions a caller gives explicitly must be one a token, (B|1, T) for ids of `shape` (B, T) (a 1-D (T,)
    tensor was broadcast over rotary's head axis: every token of head h sat at position h), and lie in the
    model's table (0 to max_len - 1 where it is bounded): a learned table's lookup failed with an IndexError from
    inside the embedding."""
    if positions is None:
        return
    check_integers(positions, what)
    if shape is not None and (positions.dim() != 2 or positions.shape[1] != shape[1]
                              or positions.shape[0] not in (1, shape[0])):
        raise ConfigError(f"{what} has shape {tuple(positions.shape)}; it must be ({shape[0]}, {shape[1]}) or "
                          f"(1, {shape[1]}), one position a token")
    if not positions.numel():
        return
    low, high = int(positions.min()), int(positions.max())
    if low < 0 or (max_len is not None and high >= max_len):
        bound = f"0 to {max_len - 1}" if max_len is not None else "0 and up"
        raise SequenceTooLong(f"{what} must lie in {bound} (the model's positions), got {low if low < 0 else high}; "
                              "give positions within them, or use a model with a larger max_len/block_size")


def check_integers(values: Tensor, what: str, shape: tuple[int, int] | None = None) -> None:
    """Refuse ids or positions that are not a tensor of int64 or int32 (of `shape`, where given) in one line: float
    positions or segment ids failed in an embedding's dtype error or as indices, document ids of another shape in
    an unpacking or broadcasting error."""
    if not isinstance(values, Tensor) or values.is_floating_point() or values.is_complex() \
            or values.dtype == torch.bool:
        got = str(values.dtype).removeprefix("torch.") if isinstance(values, Tensor) else type(values).__name__
        raise ConfigError(f"{what} must be a tensor of integers; got {got}")
    if values.dtype not in (torch.int64, torch.int32):
        # uint8 indexes as a mask, and relative distances in 8 or 16 bits wrap around: ALiBi and T5 biases were
        # silently wrong (a key one step back read as 255 steps ahead), other schemes failed in torch's words.
        raise ConfigError(f"{what} must be int64 or int32 (as token ids are); got "
                          f"{str(values.dtype).removeprefix('torch.')}; convert them with .long()")
    if shape is not None and tuple(values.shape) != shape:
        raise ConfigError(f"{what} has shape {tuple(values.shape)}; it must be {shape}, input_ids' shape")


def check_attention_mask(mask: Tensor | None, batch: int, new: int, *, cached: int = 0, what: str = "attention_mask",
                         tokens: str = "token") -> None:
    """A (B, S) mask of real tokens must have one entry per key: the `cached` tokens and the `new` ones. A (B, 1)
    mask for a cached model's new token alone was taken for a mask of every key (broadcast: the cache's padding
    became visible, the new token sat at position 0), and other widths failed inside the attention with torch's
    broadcasting error."""
    if mask is None:
        return
    keys = cached + new
    if mask.dim() != 2 or mask.shape[1] != keys or mask.shape[0] not in (1, batch):
        covers = "every key: the cached tokens and the new ones" if cached else f"every {tokens}"
        raise ConfigError(f"{what} has shape {tuple(mask.shape)}; it must be ({batch}, {keys}), 1 for a token "
                          f"and 0 for padding, covering {covers}")


def length_limit(attention: str, position: PositionScheme, block_size: int) -> int | None:
    """The longest sequence a model can take: bounded by a learned position table or by a variant
    whose scores are defined over positions (Synthesizer); None when nothing bounds it."""
    from attnlab.modules.variants import VARIANTS

    if position.max_len is not None or VARIANTS.get(attention).bounded:
        return block_size
    return None


# On a CPU, the rows of a loss with this share of its labels or fewer are picked out before the softmax (picking
# costs about two passes over the logits, the cross-entropy five: it gains below about half).
SELECT_ROWS_BELOW = 0.5


def check_ids(ids: Tensor, what: str = "input_ids") -> None:
    """Refuse token ids that are not a (B, T) tensor of integers, in one line: a 1-D sequence, float ids or a list
    failed deep inside the model in torch's or Python's words (an unpacking error, an embedding's dtype error)."""
    if isinstance(ids, Tensor) and ids.dim() == 2 and ids.dtype in (torch.int64, torch.int32):  # an embedding's
        return
    got = f"a tensor of shape {tuple(ids.shape)} and {str(ids.dtype).removeprefix('torch.')}" \
        if isinstance(ids, Tensor) else type(ids).__name__
    hint = f" (one sequence: {what}[None])" if isinstance(ids, Tensor) and ids.dim() == 1 else ""
    raise ConfigError(f"{what} must be a (B, T) tensor of integer token ids (int64 or int32); got {got}{hint}")


def check_some_tokens(h: Tensor) -> None:
    """A summary of each sequence (a classifier's pooling, BERT's pooler) needs a token to read: sequences of none
    gave NaN scores silently (mean pooling) or an IndexError (first or last token)."""
    if h.shape[1] == 0:
        raise ConfigError("the sequences have no tokens (input_ids of shape (B, 0)), so there is nothing to pool "
                          "into one vector per sequence; give each at least one token")


def check_labels(labels: Tensor, shape: tuple[int, ...], what: str = "labels") -> None:
    """Refuse labels that are not integer ids of `shape` (the logits' without their last axis) in one line: torch
    named a mask's shape, or a dtype, from inside the loss. `what`: the argument's name (BERT's
    next_sentence_label)."""
    if isinstance(labels, Tensor) and labels.shape == shape and not (
            labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool):
        return
    got = f"shape {tuple(labels.shape)} and {str(labels.dtype).removeprefix('torch.')}" \
        if isinstance(labels, Tensor) else type(labels).__name__
    raise ConfigError(f"{what} must be integer ids of the logits' shape without their last axis, {tuple(shape)} "
                      f"(-100 where nothing is scored); got {got}")


def token_loss(logits: Tensor, labels: Tensor, *, label_smoothing: float = 0.0,
               what: str = "labels") -> tuple[Tensor, Tensor]:
    """Mean cross-entropy over labels != -100, and the number of such labels.

    A batch with no target gives a loss of 0 (not NaN) that still depends on the logits, so every
    process of a distributed run takes part in the backward pass.

    On a CPU, where torch's cross-entropy makes several passes over every row, ignored or not, the rows with a
    label are picked out first when they are at most SELECT_ROWS_BELOW of all: BERT's masked LM scores 15 %
    of its positions (configs/bert-mlm.toml: the loss, forward and backward, 2.5× faster in fp32 and 3.5–4.3× in
    bf16, a training step 1.03–1.13×; `benchmarks/bench_loss.py`), the knowledge experiment's fine-tuning its
    answers. The same loss (summed in another order) and gradient. Not on GPUs, where picking rows waits for
    the device, nor under torch.compile.
    """
    check_labels(labels, logits.shape[:-1], what)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1) if labels.dtype == torch.int64 else labels.reshape(-1).long()  # int32, uint8
    has_label = flat_labels != IGNORE_INDEX
    n = has_label.sum()
    if (flat_logits.device.type == "cpu" and not torch.compiler.is_compiling()
            and int(n) <= SELECT_ROWS_BELOW * len(flat_labels)):
        rows = has_label.nonzero().squeeze(1)
        flat_logits, flat_labels = flat_logits.index_select(0, rows), flat_labels.index_select(0, rows)
    if flat_logits.dtype not in (torch.float32, torch.float64):  # half precision: sum in fp32; float64 stays
        flat_logits = flat_logits.float()
    try:
        total = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="sum",
                                label_smoothing=label_smoothing)
    except IndexError:  # torch's "Target 99 is out of bounds"
        scored = flat_labels[flat_labels != IGNORE_INDEX]
        high = int(scored.max())
        bad = high if high >= flat_logits.shape[-1] else int(scored.min())
        raise IdOutOfRange(f"{what} must lie in 0 to {flat_logits.shape[-1] - 1} (or be -100, not scored), got "
                           f"{bad}") from None
    return total / n.clamp(min=1), n


LOGITS_AT = ("all", "labelled")  # where a training forward given labels runs an LM head (BERT, seq2seq)


def labelled_rows(hidden: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """(B, T, D) states and (B, T) labels -> the (n, D) states and (n,) labels of the labelled positions,
    in row-major order: the only rows an LM head must score for the loss (`LOGITS_AT`'s "labelled")."""
    check_labels(labels, hidden.shape[:-1])  # as (B, T): the picked rows would name a shape the caller never gave
    picked = labels != IGNORE_INDEX
    return hidden[picked], labels[picked]


def default_positions(length: int, offset: int, device: torch.device) -> Tensor:
    return torch.arange(offset, offset + length, device=device)[None, :]  # (1, T)


def positions_from_mask(attention_mask: Tensor) -> Tensor:
    """(B, T) 1/0 mask of real tokens (left or right padding) -> (B, T) positions counting real tokens only."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def document_starts(document_ids: Tensor) -> Tensor:
    """(B, T) bool: True where a packed document begins, a token whose id differs from its left neighbour's (each
    row's first token begins one)."""
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    return starts


def packed_layout(document_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Several documents packed into each row: (B, T) ids, each run of equal neighbouring ids one document.

    Returns the positions counted from each document's first token (B, T) and the (B, 1, T, T) boolean
    mask that lets a token see the tokens of its own document only (a causal model adds causality). A
    document then gets exactly the outputs it would get alone in a row of its own.
    """
    b, t = document_ids.shape
    index = torch.arange(t, device=document_ids.device).expand(b, t)
    starts = document_starts(document_ids)
    first = torch.where(starts, index, 0).cummax(dim=1).values  # the index of each token's document start
    run = starts.cumsum(dim=1)  # which document of its row a token belongs to
    return index - first, run[:, None, :, None] == run[:, None, None, :]


class Embedder(nn.Module):
    """Token embedding (optionally scaled by sqrt(D), as in the paper), plus an additive position
    scheme, plus dropout."""

    def __init__(self, vocab_size: int, d_model: int, *, scale: bool, dropout: float,
                 init_std: float | None = None, what: str = "input_ids"):
        super().__init__()
        self.what = what  # the ids' name in a caller's error
        self.token = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.token.weight, std=init_std if init_std is not None else d_model ** -0.5)
        self.scale = math.sqrt(d_model) if scale else 1.0
        self.dropout = Dropout(dropout)

    def forward(self, ids: Tensor, positions: Tensor, position: PositionScheme) -> Tensor:
        x = lookup(self.token, ids, self.what)
        if self.scale != 1.0:
            x = x * self.scale
        return self.dropout(position.embed(x, positions))
