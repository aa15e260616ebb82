"""Batch sources: the global batch of every training step as a pure function of (seed, step).

The trainer asks `source.batch(step)` for the whole batch of step `step`, splits it along dim 0 into
micro-batches and ranks, and resumes a run by asking for the same step again. So no source keeps
iterator state: randomness comes from `numpy.random.default_rng([seed, step])`, epoch orders from a
permutation seeded by (seed, epoch), and a step maps to (epoch, position in epoch).

Batch dicts hold torch tensors (B = batch, T = time, S = source time):
- `input_ids` (B, T) long; `labels` (B, T) long, the target of each position, -100 where no loss
  (next-token labels are already shifted by the source);
- `attention_mask` (B, T) long, 1 = token, 0 = padding (right padding), in padded batches;
- classification: `labels` (B,) long;  BERT: `token_type_ids` (B, T), `next_sentence_label` (B,);
- seq2seq: `src_ids`, `src_mask` (B, S), `tgt_ids` (B, T) starting with bos, `labels` (B, T) ending
  with eos and -100 on padding.

Every source also has `iter_batches(batch_size)`, which walks its data once (evaluation): in order, or,
for translation, classification and BERT's sentence pairs built with `bucket_by_length`, sorted by length
(`evaluation_batches` takes the first batches of any source without biasing that choice toward short examples).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from attnlab.data.corpus import TokenFile
from attnlab.data.text_files import ClassificationData, read_classification_file, read_lines
from attnlab.data.tokenizers import Tokenizer
from attnlab.errors import ConfigError, DataError

__all__ = [
    "BatchSource",
    "BertSource",
    "CausalLMSource",
    "ClassificationSource",
    "MLMSource",
    "MaskSpec",
    "NSPPairs",
    "ParallelTextSource",
    "evaluation_batches",
    "mask_tokens",
    "pad_batch",
    "read_classification_file",
    "step_rng",
]

IGNORE_INDEX = -100
# Extra seed words keep the random streams of different uses apart.
_EPOCH_SALT = 0x5EED_0001
_EVAL_SALT = 0x5EED_0002
_POOL_SALT = 0x5EED_0003
Batch = dict[str, torch.Tensor]


@runtime_checkable
class BatchSource(Protocol):
    """What the trainer reads training and evaluation data from: `batch(step)`, a pure function of
    (seed, step), the epoch length, and `iter_batches(batch_size)`, the whole split once, in order."""

    steps_per_epoch: int | None  # None for infinite random-window sources

    def batch(self, step: int) -> Batch: ...

    def iter_batches(self, batch_size: int) -> Iterator[Batch]: ...


def step_rng(seed: int, step: int, *salt: int) -> np.random.Generator:
    """The random generator of one (seed, step): the same in any process and any call order."""
    if step < 0:
        raise ValueError(f"step must be non-negative, got {step}")
    return np.random.default_rng([seed, step, *salt])


def torch_generator(rng: np.random.Generator) -> torch.Generator:
    """A CPU torch generator seeded from `rng` (used for masking)."""
    return torch.Generator().manual_seed(int(rng.integers(1 << 62)))


def _check_common(batch_size: int, seed: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")


def _as_token_array(tokens: TokenFile | np.ndarray | torch.Tensor | Sequence[int]) -> np.ndarray:
    if isinstance(tokens, TokenFile):
        return tokens.ids
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.detach().cpu().numpy()
    arr = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens, dtype=np.int64)
    if arr.ndim != 1:
        raise ConfigError(f"token ids must be a 1-D array, got shape {tuple(arr.shape)}")
    return arr


def _long(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))


# ------------------------------------------------------------------------------------------------
# Padding
# ------------------------------------------------------------------------------------------------
# What a cut warning advises: training can raise the setting; a trained model's length is fixed (`cut_advice`).
_CUT_ADVICE: ContextVar[str] = ContextVar("cut_advice", default="raise {setting} to keep them whole")


@contextmanager
def cut_advice(text: str) -> Iterator[None]:
    """Within the block, warnings of cut sequences end with `text` (formatted with {setting})."""
    token = _CUT_ADVICE.set(text)
    try:
        yield
    finally:
        _CUT_ADVICE.reset(token)


def _warn_cut(lengths: Sequence[int], room: int, what: str, setting: str, extra: int = 0, also: str = "") -> None:
    """Warn, with counts, when sequences are cut to `room` tokens (`extra`: the special tokens the setting
    also counts; `also`: what else is cut, said after the counts): a cut the user does not know of changes what
    is learned or scored."""
    cut = [n for n in lengths if n > room]
    if cut:
        specials = " with specials" if extra else ""  # a source sentence has none
        warnings.warn(f"{len(cut)} of {len(lengths)} {what} are longer than {setting} allows ({room + extra} "
                      f"tokens{specials}) and were cut (the longest has {max(cut) + extra}){also}; "
                      + _CUT_ADVICE.get().format(setting=setting), stacklevel=3)


def _pad(sequences: Sequence[Sequence[int]], value: int, length: int) -> np.ndarray:
    out = np.full((len(sequences), length), value, dtype=np.int64)
    for i, seq in enumerate(sequences):
        n = min(len(seq), length)
        out[i, :n] = seq[:n]
    return out


def pad_batch(
    sequences: Sequence[Sequence[int]],
    pad_id: int,
    *,
    max_length: int | None = None,
    labels: Sequence[Sequence[int]] | None = None,
    label_pad_id: int = IGNORE_INDEX,
    min_length: int = 0,
) -> Batch:
    """Right-pad `sequences` to the longest (at most `max_length`, longer ones are cut), and to at least
    `min_length` (a batch of empty sequences then still has a column, all padding).

    Returns `input_ids` and `attention_mask` (B, T), and `labels` (B, T) padded with -100 when
    `labels` (one sequence per input) is given.
    """
    lengths = [len(s) if max_length is None else min(len(s), max_length) for s in sequences]
    length = max(max(lengths, default=0), min_length)
    ids = _pad(sequences, pad_id, length)
    mask = (np.arange(length)[None, :] < np.asarray(lengths, dtype=np.int64)[:, None]).astype(np.int64)
    out = {"input_ids": _long(ids), "attention_mask": _long(mask)}
    if labels is not None:
        if len(labels) != len(sequences):
            raise ValueError(f"pad_batch: {len(labels)} label sequences for {len(sequences)} inputs")
        out["labels"] = _long(_pad(labels, label_pad_id, length))
    return out


# ------------------------------------------------------------------------------------------------
# Epoch orders for finite data sets
# ------------------------------------------------------------------------------------------------
class _EpochOrder:
    """Maps a step to the example indices of its batch: shuffled per epoch, fixed batch size.

    `steps_per_epoch` is n // batch_size (the few left over land in other batches in other epochs);
    a data set smaller than one batch is repeated to fill it. With `lengths`, examples of similar
    length are batched together (sorted within pools of 50 batches) and the batches shuffled.
    """

    POOL_BATCHES = 50

    def __init__(self, n: int, batch_size: int, seed: int, lengths: np.ndarray | None = None):
        self.n, self.batch_size, self.seed, self.lengths = n, batch_size, seed, lengths
        self.steps_per_epoch = max(1, n // batch_size)
        self._memo: tuple[int, np.ndarray] | None = None  # the last epoch's order (a cache, not state)

    def order(self, epoch: int) -> np.ndarray:
        """(steps_per_epoch, batch_size) example indices of `epoch`."""
        if self._memo is not None and self._memo[0] == epoch:
            return self._memo[1]
        rng = np.random.default_rng([self.seed, epoch, _EPOCH_SALT])
        perm = rng.permutation(self.n)
        if self.n < self.batch_size:
            perm = np.resize(perm, self.batch_size)
        perm = perm[: self.steps_per_epoch * self.batch_size]
        if self.lengths is not None:
            pool = self.batch_size * self.POOL_BATCHES
            perm = np.concatenate(
                [
                    p[np.argsort(self.lengths[p], kind="stable")]
                    for p in np.split(perm, range(pool, len(perm), pool))
                ]
            )
            batches = perm.reshape(self.steps_per_epoch, self.batch_size)
            batches = batches[rng.permutation(self.steps_per_epoch)]
        else:
            batches = perm.reshape(self.steps_per_epoch, self.batch_size)
        self._memo = (epoch, batches)
        return batches

    def indices(self, step: int) -> np.ndarray:
        if step < 0:
            raise ValueError(f"step must be non-negative, got {step}")
        epoch, i = divmod(step, self.steps_per_epoch)
        return self.order(epoch)[i]


def _evaluation_order(n_examples: int, size: int, max_batches: int | None,
                      keys: Callable[[int], tuple[np.ndarray, ...]] | None = None) -> list[np.ndarray]:
    """The example indices of each evaluation batch of `size`: the first `max_batches` batches' worth of the
    examples in file order (all without it), sorted (stably) by `keys(n)`, the sort keys of the first n examples
    with the primary key first, where given; the last batch may be smaller."""
    n = n_examples if not max_batches else min(n_examples, max_batches * size)
    order = np.arange(n)
    if keys is not None:  # np.lexsort sorts by its last key first
        order = np.lexsort(tuple(reversed(keys(n))))
    return [order[start:start + size] for start in range(0, n, size)]


class _ExampleSource:
    """Shared by sources over a finite list of examples: `batch(step)` via `_EpochOrder`; evaluation in file
    order, or sorted by `_eval_keys` (primary key first) when the source batches by length."""

    batch_size: int
    _order: _EpochOrder
    _eval_keys: tuple[np.ndarray, ...] | None = None

    def __len__(self) -> int:
        return self._order.n

    @property
    def steps_per_epoch(self) -> int:
        return self._order.steps_per_epoch

    def indices(self, step: int) -> np.ndarray:
        """The example indices of step `step`'s batch."""
        return self._order.indices(step)

    def batch(self, step: int) -> Batch:
        return self.collate(self._order.indices(step))

    def eval_indices(self, batch_size: int | None = None, max_batches: int | None = None) -> list[np.ndarray]:
        """The example indices of each evaluation batch: the first `max_batches` batches' worth of examples in
        file order (all without it), sorted by length when the source batches by length, so that a batch
        pads little; the last batch may be smaller."""
        keys = self._eval_keys
        return _evaluation_order(len(self), batch_size or self.batch_size, max_batches,
                                 None if keys is None else lambda n: tuple(key[:n] for key in keys))

    def iter_batches(self, batch_size: int | None = None, max_batches: int | None = None) -> Iterator[Batch]:
        """Every example once (or the first `max_batches` batches' worth), batched by `eval_indices`."""
        for indices in self.eval_indices(batch_size, max_batches):
            yield self.collate(indices)

    def collate(self, indices: np.ndarray) -> Batch:
        raise NotImplementedError


def evaluation_batches(source: BatchSource, batch_size: int, max_batches: int | None = None) -> Iterator[Batch]:
    """The evaluation batches of `source`, at most `max_batches` of them (all with None or 0). A source that
    sorts its evaluation by length sorts only the examples those batches hold, the same ones as in file
    order, so a limit does not pick the shortest examples."""
    if isinstance(source, (_ExampleSource, BertSource)):
        return source.iter_batches(batch_size, max_batches or None)
    batches = source.iter_batches(batch_size)
    return itertools.islice(batches, max_batches) if max_batches else batches


# ------------------------------------------------------------------------------------------------
# Causal language modelling
# ------------------------------------------------------------------------------------------------
class _TokenWindows:
    """Windows of a token stream (a `TokenFile` memmap or an array), gathered without Python loops."""

    steps_per_epoch: int | None = None
    extra_tokens = 0  # how many tokens past the window a batch reads (1 for next-token labels)

    def __init__(
        self,
        tokens: TokenFile | np.ndarray | torch.Tensor | Sequence[int],
        block_size: int,
        batch_size: int,
        seed: int = 0,
    ):
        _check_common(batch_size, seed)
        self.tokens = _as_token_array(tokens)
        if block_size < 1:
            raise ConfigError(f"block_size must be positive, got {block_size}")
        need = block_size + self.extra_tokens
        if len(self.tokens) < need:
            raise DataError(
                f"the corpus has {len(self.tokens)} tokens, fewer than the {need} one example needs; "
                "use a smaller block_size or a bigger corpus"
            )
        self.block_size, self.batch_size, self.seed = block_size, batch_size, seed

    def _random_starts(self, rng: np.random.Generator) -> np.ndarray:
        last = len(self.tokens) - self.block_size - self.extra_tokens  # the last valid start
        return rng.integers(0, last + 1, size=self.batch_size)

    def _windows(self, starts: np.ndarray, width: int) -> np.ndarray:
        # One fancy-index gather of a (B, width) index matrix: no Python loop over tokens.
        return np.asarray(self.tokens[starts[:, None] + np.arange(width)], dtype=np.int64)


class CausalLMSource(_TokenWindows):
    """Random windows of a token stream for next-token prediction.

    `batch(step)` draws `batch_size` windows of `block_size + 1` ids: `input_ids` are the first
    `block_size`, `labels` the last `block_size` (the next token of each input position).
    """

    extra_tokens = 1

    def batch(self, step: int) -> Batch:
        starts = self._random_starts(step_rng(self.seed, step))
        win = self._windows(starts, self.block_size + 1)  # (B, T+1)
        return {"input_ids": _long(win[:, :-1]), "labels": _long(win[:, 1:])}

    @property
    def eval_windows(self) -> int:
        """How many windows `iter_batches` walks: every token but the first a target once."""
        return math.ceil((len(self.tokens) - 1) / self.block_size)

    def iter_batches(self, batch_size: int | None = None) -> Iterator[Batch]:
        """Consecutive non-overlapping windows: every token but the first is a target exactly once.

        The last window is padded (input 0, label -100); right padding cannot change the earlier
        positions of a causal model, so no attention mask is needed.
        """
        size = batch_size or self.batch_size
        n, T = len(self.tokens), self.block_size
        n_windows = self.eval_windows
        for first in range(0, n_windows, size):
            starts = np.arange(first, min(first + size, n_windows)) * T
            idx = starts[:, None] + np.arange(T + 1)  # (B, T+1)
            valid = idx < n
            win = np.asarray(self.tokens[np.minimum(idx, n - 1)], dtype=np.int64)
            inputs = np.where(valid[:, :-1], win[:, :-1], 0)
            labels = np.where(valid[:, 1:], win[:, 1:], IGNORE_INDEX)
            yield {"input_ids": _long(inputs), "labels": _long(labels)}


# ------------------------------------------------------------------------------------------------
# Masked language modelling (BERT)
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MaskSpec:
    """BERT masking: pick `mask_prob` of the non-special tokens; of those, `replace_prob` become the
    mask token, `random_prob` a random non-special token, the rest stay as they are."""

    mask_id: int
    vocab_size: int
    special_ids: tuple[int, ...] = ()
    mask_prob: float = 0.15
    replace_prob: float = 0.8
    random_prob: float = 0.1

    def __post_init__(self) -> None:
        for name in ("mask_prob", "replace_prob", "random_prob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"masking {name} must be between 0 and 1, got {value}")
        if self.replace_prob + self.random_prob > 1.0 + 1e-9:
            raise ConfigError(
                "masking replace_prob + random_prob must be at most 1, "
                f"got {self.replace_prob + self.random_prob}"
            )
        specials = tuple(sorted({*map(int, self.special_ids), int(self.mask_id)}))
        object.__setattr__(self, "special_ids", specials)
        if not 0 <= self.mask_id < self.vocab_size:
            raise ConfigError(f"mask_id {self.mask_id} is outside the vocabulary of {self.vocab_size}")
        if len(specials) >= self.vocab_size:
            raise ConfigError("the vocabulary has only special tokens; nothing to mask or draw at random")

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, **options: float) -> MaskSpec:
        if tokenizer.mask_id is None:
            raise ConfigError(
                "masked LM needs a tokenizer with a mask token; train it with specials.mask set"
            )
        return cls(tokenizer.mask_id, tokenizer.vocab_size, tuple(tokenizer.special_ids), **options)

    def random_candidates(self) -> torch.Tensor:
        ids = torch.arange(self.vocab_size)
        return ids[~torch.isin(ids, torch.tensor(self.special_ids, dtype=torch.long))]


def mask_tokens(
    input_ids: torch.Tensor,
    spec: MaskSpec,
    generator: torch.Generator,
    *,
    attention_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's 80/10/10 masking, a pure function of its inputs and the generator's state.

    Special tokens (and padding outside `attention_mask`) are never picked. Each row with any
    eligible token gets at least one pick, so a batch never has an empty loss (Google's BERT data likewise
    predicts max(1, round(0.15·n)) tokens of a sequence of n): a short row is masked at more than `mask_prob`
    on average, 0.15 + 0.85^n / n (0.24 for n = 5).

    Returns:
        (masked input_ids, labels): labels hold the original id where a token was picked, else -100.
    """
    ids = input_ids.long().cpu()
    eligible = ~torch.isin(ids, torch.tensor(spec.special_ids, dtype=torch.long))
    if attention_mask is not None:
        eligible &= attention_mask.cpu().bool()
    picked = (torch.rand(ids.shape, generator=generator) < spec.mask_prob) & eligible
    # Rows with nothing picked get their eligible token of highest random score.
    score = torch.rand(ids.shape, generator=generator).masked_fill(~eligible, -1.0)
    fallback = torch.zeros_like(picked).scatter_(-1, score.argmax(-1, keepdim=True), True) & eligible
    picked |= fallback & ~picked.any(-1, keepdim=True)
    action = torch.rand(ids.shape, generator=generator)
    to_mask = picked & (action < spec.replace_prob)
    to_random = picked & (action >= spec.replace_prob) & (action < spec.replace_prob + spec.random_prob)
    candidates = spec.random_candidates()
    random_ids = candidates[torch.randint(len(candidates), ids.shape, generator=generator)]
    out = torch.where(to_mask, torch.full_like(ids, spec.mask_id), torch.where(to_random, random_ids, ids))
    labels = torch.where(picked, ids, torch.full_like(ids, IGNORE_INDEX))
    return out.to(input_ids.device), labels.to(input_ids.device)


def _mask_each_row(input_ids: torch.Tensor, spec: MaskSpec, seed: int, rows: Sequence[int],
                  lengths: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`mask_tokens` for evaluation: row r (the `rows[r]`-th example of the evaluation set) masked over its first
    `lengths[r]` tokens (all of them without `lengths`) by a generator of its own, so a row's masks do not depend
    on the batch it is in. Returns (masked input_ids, labels); positions past a row's length keep their ids and
    are ignored by the loss."""
    ids, labels = input_ids.clone(), torch.full_like(input_ids, IGNORE_INDEX)
    for r, row in enumerate(rows):
        n = input_ids.shape[1] if lengths is None else lengths[r]
        generator = torch_generator(step_rng(seed, int(row) + 1, _EVAL_SALT))
        ids[r:r + 1, :n], labels[r:r + 1, :n] = mask_tokens(input_ids[r:r + 1, :n], spec, generator)
    return ids, labels


class MLMSource(_TokenWindows):
    """Random windows of `block_size` tokens of a stream, masked BERT-style (no sentence pairs)."""

    def __init__(
        self,
        tokens: TokenFile | np.ndarray | torch.Tensor | Sequence[int],
        block_size: int,
        batch_size: int,
        masking: MaskSpec,
        seed: int = 0,
    ):
        super().__init__(tokens, block_size, batch_size, seed)
        self.masking = masking

    def _masked(self, ids: np.ndarray, rng: np.random.Generator) -> Batch:
        masked, labels = mask_tokens(_long(ids), self.masking, torch_generator(rng))
        return {"input_ids": masked, "labels": labels}

    def batch(self, step: int) -> Batch:
        rng = step_rng(self.seed, step)
        return self._masked(self._windows(self._random_starts(rng), self.block_size), rng)

    def iter_batches(self, batch_size: int | None = None) -> Iterator[Batch]:
        """Consecutive full windows (a shorter tail is left out), each masked by its own fixed generator, so
        the masks (and the scores) do not depend on the batch size."""
        size = batch_size or self.batch_size
        n_windows = len(self.tokens) // self.block_size
        for first in range(0, n_windows, size):
            starts = np.arange(first, min(first + size, n_windows)) * self.block_size
            ids, labels = _mask_each_row(_long(self._windows(starts, self.block_size)), self.masking, self.seed,
                                         range(first, first + len(starts)))
            yield {"input_ids": ids, "labels": labels}


class NSPPairs:
    """Sentence pairs for next-sentence prediction, from documents given as lists of sentences.

    A pair is a sentence A with a following sentence in its document, and B either that next
    sentence (is_next = 1) or, with probability `random_next_prob`, a random sentence of another
    document (is_next = 0). `encode_pair` gives `[CLS] A [SEP] B [SEP]` with token types 0 / 1,
    cut to `max_length` by shortening the longer sentence first (as BERT does).

    Args:
        documents: each a list of sentences, as strings (encoded here) or lists of ids.
        tokenizer: provides cls, sep and pad ids (and encodes string sentences).
    """

    def __init__(
        self,
        documents: Sequence[Sequence[str | Sequence[int]]],
        tokenizer: Tokenizer,
        *,
        max_length: int = 128,
        random_next_prob: float = 0.5,
    ):
        if tokenizer.cls_id is None or tokenizer.sep_id is None:
            raise ConfigError(
                "sentence pairs need a tokenizer with cls and sep tokens; set specials.cls and .sep"
            )
        if max_length < 5:
            raise ConfigError(f"sentence pair max_length must be at least 5, got {max_length}")
        if not 0.0 <= random_next_prob <= 1.0:
            raise ConfigError(f"random_next_prob must be between 0 and 1, got {random_next_prob}")
        self.cls_id, self.sep_id = tokenizer.cls_id, tokenizer.sep_id
        self.pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
        self.max_length, self.random_next_prob = max_length, random_next_prob
        documents = [list(doc) for doc in documents]
        flat = [s for doc in documents for s in doc]
        strings = [i for i, s in enumerate(flat) if isinstance(s, str)]
        if strings:
            encoded = tokenizer.encode_batch([flat[i] for i in strings])
            for i, ids in zip(strings, encoded):
                flat[i] = ids
        # A sentence of no tokens (a line of characters the normaliser drops, as WordPiece's drops U+FFFD) gave
        # pairs "[CLS] [SEP] B [SEP]" without a masked token: it is left out, and a document left empty with it.
        docs: list[list[list[int]]] = []
        start = 0
        for doc in documents:
            kept = [list(map(int, s)) for s in flat[start:start + len(doc)] if len(s) > 0]
            start += len(doc)
            if kept:
                docs.append(kept)
        self.sentences: list[list[int]] = [s for doc in docs for s in doc]
        # A pair holds [CLS] A [SEP] B [SEP] with at least one token of the other sentence: longer sentences are
        # always cut (a paragraph on one line, as in WikiText, loses most of its tokens).
        # (Pairs of two shorter sentences are cut too where they pass it together: said, not counted, as pairs are
        # drawn at each step.)
        _warn_cut([len(s) for s in self.sentences], max_length - 4, "sentences", "data.max_length", 4,
                  also=", as are pairs of shorter sentences that pass it together")
        lengths = np.array([len(doc) for doc in docs], dtype=np.int64)
        self.doc_starts = np.concatenate([[0], np.cumsum(lengths)])
        self.doc_lengths = lengths
        self.doc_of = np.repeat(np.arange(len(docs)), lengths)
        # An anchor is a sentence with a next sentence in the same document.
        doc_ends = self.doc_starts[self.doc_of + 1]
        self.anchors = np.flatnonzero(np.arange(len(self.sentences)) + 1 < doc_ends).astype(np.int64)
        if len(self.anchors) == 0:
            raise DataError(
                "no document has two sentences, so there are no sentence pairs; give longer documents"
            )
        if random_next_prob > 0 and len(docs) < 2:
            raise DataError("random next sentences need at least two documents; give more documents (one sentence "
                            "per line, a blank line between documents)")

    def __len__(self) -> int:
        return len(self.anchors)

    def _pairs(self, anchors: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        n = len(anchors)
        is_next = rng.random(n) >= self.random_next_prob
        doc = self.doc_of[anchors]
        other = rng.integers(0, max(len(self.doc_lengths) - 1, 1), size=n)
        other = other + (other >= doc)  # any document but the anchor's
        other = np.minimum(other, len(self.doc_lengths) - 1)
        offset = np.floor(rng.random(n) * self.doc_lengths[other]).astype(np.int64)
        b = np.where(is_next, anchors + 1, self.doc_starts[other] + offset)
        return b, is_next.astype(np.int64)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """n random pairs: (index of A, index of B, is_next) into `sentences`."""
        a = self.anchors[rng.integers(0, len(self.anchors), size=n)]
        b, is_next = self._pairs(a, rng)
        return a, b, is_next

    def in_order(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every anchor once, in order, with B drawn by `rng`."""
        b, is_next = self._pairs(self.anchors, rng)
        return self.anchors, b, is_next

    def encode_pair(self, a: Sequence[int], b: Sequence[int]) -> tuple[list[int], list[int]]:
        """`[CLS] A [SEP] B [SEP]` and its token types, at most `max_length` long."""
        budget = self.max_length - 3
        la, lb = len(a), len(b)
        if la + lb > budget:
            # Same result as repeatedly dropping the last token of the longer sentence.
            if min(la, lb) <= budget // 2:
                la, lb = (budget - lb, lb) if la > lb else (la, budget - la)
            else:
                la, lb = (budget + 1) // 2, budget // 2
        ids = [self.cls_id, *a[:la], self.sep_id, *b[:lb], self.sep_id]
        types = [0] * (la + 2) + [1] * (lb + 1)
        return ids, types


class BertSource:
    """BERT pre-training batches: sentence pairs (`NSPPairs`) with 80/10/10 masking.

    Each batch has `input_ids`, `attention_mask`, `token_type_ids`, `labels` (masked LM, -100 where
    nothing was masked) and `next_sentence_label` (0 = B follows A, 1 = B is random, as in BERT and HF).

    With `bucket_by_length`, the pairs of POOL_BATCHES consecutive steps are drawn together, sorted by length
    and cut into that many batches, handed out in a random order: the same pairs as ever in distribution, few
    pad positions in a batch. Evaluation (`iter_batches`) then batches the pairs sorted by length too, each
    masked as in file order.
    """

    steps_per_epoch: int | None = None
    POOL_BATCHES = _EpochOrder.POOL_BATCHES

    def __init__(self, pairs: NSPPairs, batch_size: int, masking: MaskSpec, seed: int = 0,
                 bucket_by_length: bool = False):
        _check_common(batch_size, seed)
        self.pairs, self.batch_size, self.masking, self.seed = pairs, batch_size, masking, seed
        self.bucket_by_length = bucket_by_length
        self._sentence_lengths = np.array([len(x) for x in pairs.sentences], dtype=np.int64)
        specials = set(masking.special_ids)
        if not any(token not in specials for sentence in pairs.sentences for token in sentence):
            # Every pair's masked LM loss would be over no token (its loss and perplexity read 0 and 1).
            raise DataError("no token of the text can be masked: every one is a special token (the unknown token "
                            "stands for text the tokenizer's vocabulary does not hold); give text that vocabulary "
                            "covers, or train the tokenizer on it")
        self._memo: tuple[int, tuple[np.ndarray, ...]] | None = None  # the last pool (a cache, not state)

    def _lengths(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The length of each pair's `[CLS] A [SEP] B [SEP]`, as `encode_pair` cuts it."""
        return np.minimum(self._sentence_lengths[a] + self._sentence_lengths[b] + 3, self.pairs.max_length)

    def _pool(self, pool: int) -> tuple[np.ndarray, ...]:
        """(a, b, is_next), each (POOL_BATCHES, batch_size): the batches of steps pool·P … pool·P + P - 1."""
        if self._memo is not None and self._memo[0] == pool:
            return self._memo[1]
        rng = step_rng(self.seed, pool, _POOL_SALT)
        a, b, is_next = self.pairs.sample(rng, self.POOL_BATCHES * self.batch_size)
        order = np.argsort(self._lengths(a, b), kind="stable")
        rows = rng.permutation(self.POOL_BATCHES)
        batches = tuple(x[order].reshape(self.POOL_BATCHES, self.batch_size)[rows] for x in (a, b, is_next))
        self._memo = (pool, batches)
        return batches

    def _collate(self, a: np.ndarray, b: np.ndarray, is_next: np.ndarray, rng: np.random.Generator | None,
                 *, rows: Sequence[int] = ()) -> Batch:
        """Encode, pad and mask pairs: the whole batch by `rng` (training), or, with `rng` None, each pair by its
        own generator, numbered by `rows` (evaluation: the masks do not depend on the batch)."""
        sents = self.pairs.sentences
        encoded = [self.pairs.encode_pair(sents[i], sents[j]) for i, j in zip(a.tolist(), b.tolist())]
        out = pad_batch([ids for ids, _ in encoded], self.pairs.pad_id)
        length = out["input_ids"].shape[1]
        out["token_type_ids"] = _long(_pad([types for _, types in encoded], 0, length))
        if rng is not None:
            out["input_ids"], out["labels"] = mask_tokens(
                out["input_ids"], self.masking, torch_generator(rng), attention_mask=out["attention_mask"]
            )
        else:
            out["input_ids"], out["labels"] = _mask_each_row(out["input_ids"], self.masking, self.seed, rows,
                                                            [len(ids) for ids, _ in encoded])
        out["next_sentence_label"] = _long(1 - is_next)  # BERT's convention: 0 = B follows A
        return out

    def batch(self, step: int) -> Batch:
        rng = step_rng(self.seed, step)
        if not self.bucket_by_length:
            return self._collate(*self.pairs.sample(rng, self.batch_size), rng)
        if step < 0:
            raise ValueError(f"step must be non-negative, got {step}")
        pool, row = divmod(step, self.POOL_BATCHES)
        return self._collate(*(x[row] for x in self._pool(pool)), rng)

    def iter_batches(self, batch_size: int | None = None, max_batches: int | None = None) -> Iterator[Batch]:
        """Every anchor sentence once (or the first `max_batches` batches' worth), with fixed random partners and
        masking: the same pairs and masks whatever the batch size, in order or, with `bucket_by_length`, sorted
        by length."""
        a, b, is_next = self.pairs.in_order(step_rng(self.seed, 0, _EVAL_SALT))
        keys = (lambda n: (self._lengths(a[:n], b[:n]),)) if self.bucket_by_length else None
        for part in _evaluation_order(len(a), batch_size or self.batch_size, max_batches, keys):
            yield self._collate(a[part], b[part], is_next[part], None, rows=part.tolist())


# ------------------------------------------------------------------------------------------------
# Classification
# ------------------------------------------------------------------------------------------------
def classification_ends(tokenizer: Tokenizer, *, sep: bool = True) -> tuple[list[int], list[int]]:
    """The ids a classifier's text goes between: `[CLS] text [SEP]`, the layout of BERT's pre-training (every
    segment ends in [SEP]) and of HF's tokenizers for one text, as far as the tokenizer has those tokens.
    `sep=False`: `[CLS] text`, the layout of runs trained before 2026-12-06."""
    prefix = [tokenizer.cls_id] if tokenizer.cls_id is not None else []
    suffix = [tokenizer.sep_id] if sep and prefix and tokenizer.sep_id is not None else []
    return prefix, suffix


class ClassificationSource(_ExampleSource):
    """Padded batches of (text, label) examples, shuffled per epoch.

    Args:
        data: examples from `read_classification_file` (or use `from_file`).
        tokenizer: encodes the texts (once, at construction).
        batch_size: global batch size.
        max_length: longest sequence, `prefix_ids` and `suffix_ids` included (None: no limit).
        label_names: the label list shared by all splits (pass the training set's `label_names` to
            the dev set so ids agree); default: this data's sorted labels.
        prefix_ids, suffix_ids: ids put around every text, e.g. `[tok.cls_id]` and `[tok.sep_id]`.
        bucket_by_length: batch texts of similar length together (less padding), in training and in
            evaluation (`iter_batches`, sorted by length).
    """

    def __init__(
        self,
        data: ClassificationData,
        tokenizer: Tokenizer,
        batch_size: int,
        *,
        max_length: int | None = 128,
        seed: int = 0,
        label_names: Sequence[str] | None = None,
        prefix_ids: Sequence[int] = (),
        suffix_ids: Sequence[int] = (),
        bucket_by_length: bool = False,
    ):
        _check_common(batch_size, seed)
        if any(i is None for i in (*prefix_ids, *suffix_ids)):
            raise ConfigError("prefix_ids/suffix_ids contain None: the tokenizer lacks that special token")
        self.batch_size, self.seed = batch_size, seed
        self.data = data
        self.pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
        body = None if max_length is None else max_length - len(prefix_ids) - len(suffix_ids)
        if body is not None and body < 1:
            # Also reached by `evaluate`, which cuts to the run's own length, so the message names both fixes.
            ends = len(prefix_ids) + len(suffix_ids)
            raise ConfigError(
                f"data.max_length {max_length} leaves no room for text beside the {ends} special token"
                f"{'s' if ends != 1 else ''} put around each text; raise data.max_length to at least {ends + 1} "
                "(evaluate cuts texts to the run's own length: retrain the run with at least that)"
            )
        encoded = tokenizer.encode_batch(data.texts)
        if body is not None:
            _warn_cut([len(ids) for ids in encoded], body, "texts", "data.max_length", max_length - body)
        self.examples = [
            [*prefix_ids, *(ids if body is None else ids[:body]), *suffix_ids]
            for ids in encoded
        ]
        if data.labels is not None:
            self.label_names = list(label_names) if label_names is not None else data.label_names
            self.label_ids: np.ndarray | None = np.asarray(data.label_ids(self.label_names), dtype=np.int64)
        else:
            self.label_names = list(label_names or ())
            self.label_ids = None
        lengths = np.array([len(ids) for ids in self.examples], dtype=np.int64)
        self._order = _EpochOrder(len(self.examples), batch_size, seed, lengths if bucket_by_length else None)
        self._eval_keys = (lengths,) if bucket_by_length else None

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        tokenizer: Tokenizer,
        batch_size: int,
        *,
        text_column: str | int | None = None,
        label_column: str | int | None = None,
        format: str | None = None,
        **options: Any,
    ) -> ClassificationSource:
        # Given the class names of a trained model, it is scored against them (see read_classification_file)
        data = read_classification_file(path, text_column, label_column, format=format,
                                        training="label_names" not in options)
        return cls(data, tokenizer, batch_size, **options)

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def collate(self, indices: np.ndarray) -> Batch:
        # A column even when every text of the batch is empty (and no [CLS] prefix): the heads read a position.
        out = pad_batch([self.examples[i] for i in indices.tolist()], self.pad_id, min_length=1)
        if self.label_ids is not None:
            out["labels"] = _long(self.label_ids[indices])
        return out


# ------------------------------------------------------------------------------------------------
# Parallel text (translation)
# ------------------------------------------------------------------------------------------------
def check_aligned(src_lines: Sequence[str], tgt_lines: Sequence[str], src_path: Any, tgt_path: Any) -> None:
    """Refuse parallel text whose two sides (the lines of `src_path` and `tgt_path`, files or lists) differ in
    length, in one line naming the files."""
    if len(src_lines) != len(tgt_lines):
        raise DataError(
            f"parallel files differ in length: '{_name(src_path)}' has {len(src_lines)} lines and "
            f"'{_name(tgt_path)}' has {len(tgt_lines)}; "
            "each line must translate the same line of the other"
        )


class ParallelTextSource(_ExampleSource):
    """Sentence pairs from two aligned files (line i of one translates line i of the other).

    Batches: `src_ids`, `src_mask` (B, S); `tgt_ids` = bos + target (decoder input) and `labels` =
    target + eos (for a target cut at max_tgt_length, its next token in place of eos), -100 on padding (B, T).

    Args:
        src_path, tgt_path: the files, or lists of lines.
        max_src_length, max_tgt_length: cut longer sentences (the target length counts bos/eos).
        bucket_by_length: batch sentences of similar source length together (less padding); evaluation
            (`iter_batches`) sorts them by source, then target length.
    """

    def __init__(
        self,
        src_path: str | os.PathLike[str] | Sequence[str],
        tgt_path: str | os.PathLike[str] | Sequence[str],
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        batch_size: int,
        *,
        max_src_length: int | None = None,
        max_tgt_length: int | None = None,
        seed: int = 0,
        bucket_by_length: bool = False,
    ):
        _check_common(batch_size, seed)
        if tgt_tokenizer.bos_id is None or tgt_tokenizer.eos_id is None:
            raise ConfigError(
                "the target tokenizer needs bos and eos tokens; train it with specials.bos and .eos"
            )
        if max_tgt_length is not None and max_tgt_length < 2:
            raise ConfigError(
                f"max_tgt_length must be at least 2 (bos/eos + one token), got {max_tgt_length}"
            )
        src_lines = _lines(src_path)
        tgt_lines = _lines(tgt_path)
        check_aligned(src_lines, tgt_lines, src_path, tgt_path)
        if not src_lines:
            raise DataError("parallel text has no sentence pairs; give non-empty files")
        self.batch_size, self.seed = batch_size, seed
        self.bos_id, self.eos_id = tgt_tokenizer.bos_id, tgt_tokenizer.eos_id
        self.src_pad_id = src_tokenizer.pad_id if src_tokenizer.pad_id is not None else 0
        self.tgt_pad_id = tgt_tokenizer.pad_id if tgt_tokenizer.pad_id is not None else 0
        one_sided = [i for i, (a, b) in enumerate(zip(src_lines, tgt_lines)) if bool(a.strip()) != bool(b.strip())]
        if one_sided:
            warnings.warn(f"{len(one_sided)} of {len(src_lines)} sentence pairs have one side empty (the first at "
                          f"line {one_sided[0] + 1} of '{_name(src_path)}' and '{_name(tgt_path)}'): they pair a "
                          "sentence with nothing (trained or scored alike); check that the files are aligned",
                          stacklevel=2)
        blank = [i for i, (a, b) in enumerate(zip(src_lines, tgt_lines)) if not (a.strip() or b.strip())]
        if blank:
            warnings.warn(f"{len(blank)} of {len(src_lines)} sentence pairs are blank on both sides (the first at "
                          f"line {blank[0] + 1} of '{_name(src_path)}' and '{_name(tgt_path)}'): they pair nothing "
                          "with nothing (trained or scored alike); remove the blank lines from both files",
                          stacklevel=2)
        body = None if max_tgt_length is None else max_tgt_length - 1
        # A line of whitespace only is blank, as the warnings above and `generate --input` take it (no tokens): a
        # tokenizer that keeps spaces (BPE) made tokens of it, so `evaluate` translated it into words where
        # `generate` printed nothing, and scored other translations than it prints.
        src_ids, tgt_ids = (tokenizer.encode_batch([line if line.strip() else "" for line in lines])
                            for tokenizer, lines in ((src_tokenizer, src_lines), (tgt_tokenizer, tgt_lines)))
        if max_src_length is not None:
            _warn_cut([len(ids) for ids in src_ids], max_src_length, "source sentences", "data.max_length")
        if body is not None:
            _warn_cut([len(ids) for ids in tgt_ids], body, "target sentences", "data.max_length", 1)
        self.src = [ids[:max_src_length] for ids in src_ids]
        self.tgt = [ids[:body] for ids in tgt_ids]
        # The label after a target's last kept token: eos where the sentence ends there, its next token where
        # it was cut (an eos there would teach the model to stop where sentences are merely long).
        self.tgt_next = [ids[body] if body is not None and len(ids) > body else self.eos_id for ids in tgt_ids]
        lengths = np.array([len(s) for s in self.src], dtype=np.int64)
        self._order = _EpochOrder(len(self.src), batch_size, seed, lengths if bucket_by_length else None)
        # Evaluation sorts by target length too: its loss reads whole targets (teacher forcing).
        self._eval_keys = (lengths, np.array([len(t) for t in self.tgt], dtype=np.int64)) if bucket_by_length else None

    def collate(self, indices: np.ndarray) -> Batch:
        idx = indices.tolist()
        # At least one source column: a batch of blank source lines (sorted together by length) is all padding,
        # which the encoder reads as nothing to attend to, instead of a tensor without columns.
        src = pad_batch([self.src[i] for i in idx], self.src_pad_id, min_length=1)
        tgt_in = [[self.bos_id, *self.tgt[i]] for i in idx]
        tgt_out = [[*self.tgt[i], self.tgt_next[i]] for i in idx]
        tgt = pad_batch(tgt_in, self.tgt_pad_id, labels=tgt_out)
        return {
            "src_ids": src["input_ids"],
            "src_mask": src["attention_mask"],
            "tgt_ids": tgt["input_ids"],
            "labels": tgt["labels"],
        }


def _lines(source: str | os.PathLike[str] | Sequence[str]) -> list[str]:
    if isinstance(source, (str, os.PathLike)):
        return read_lines(source)
    return list(source)


def _name(source: object) -> str:
    return str(source) if isinstance(source, (str, os.PathLike)) else "<list>"
