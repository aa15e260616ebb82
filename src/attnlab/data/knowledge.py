"""Data for the "knowledge access" experiment: a character GPT pretrained with span corruption on
biographies, then fine-tuned to answer "Where was X born?" (CS224n 2021, assignment 5).

Three pieces, each usable alone:

- `KnowledgeVocab`: a character vocabulary with a pad mark (id 0) and a mask mark (id 1).
- `SpanCorruptionSource`: pretraining batches. Each document is truncated, a span is cut out of it and
  moved to the end behind a second mask mark, so the model learns to fill in blanks:
  ``prefix ⁇ suffix ⁇ content □□□``.
- `QASource`: fine-tuning batches from ``question<TAB>answer`` lines, laid out as
  ``question ⁇ answer ⁇ □□□`` with a loss on the answer and the closing mask mark only.

Both sources follow the trainer's BatchSource contract: `batch(step)` returns the global batch for a
training step as a pure function of (seed, step), with keys ``input_ids`` (B, T) and ``labels`` (B, T),
labels already aligned with the inputs (``labels[:, t]`` is the target at position t, -100 = no loss).
Epoch e visits the examples in a shuffle seeded by (seed, e); the last batch of an epoch is topped up with
examples from the start of the same shuffle so every batch has exactly `batch_size` rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from attnlab.data.text_files import split_lines
from attnlab.errors import ConfigError, DataError

if TYPE_CHECKING:
    from attnlab.data.tokenizers import CharTokenizer

PAD = "\u25a1"  # □  pads a line out to the block size; never a target
MASK = "\u2047"  # ⁇  marks a blank (span corruption) and separates question from answer
IGNORE = -100  # label for positions that carry no loss (the cross-entropy ignore_index)

# Tags mixed into the seeds so the shuffle, training samples and evaluation samples use unrelated streams.
_SHUFFLE, _SAMPLE, _EVAL = 1, 2, 3


# --------------------------------------------------------------------------------------------------------
# Vocabulary


def build_char_vocab(*texts: str) -> list[str]:
    """The character list ``[PAD, MASK] + sorted(characters of all texts)``: pad id 0, mask id 1.

    Pass every text the model will read (the pretraining corpus *and* the fine-tuning questions), so that
    characters only the questions use (such as "?") get an id too.
    """
    chars: set[str] = set()
    for text in texts:
        chars.update(text)
    chars.discard(PAD)
    chars.discard(MASK)
    return [PAD, MASK, *sorted(chars)]


class KnowledgeVocab:
    """Character ↔ id mapping with ``pad_id == 0`` and ``mask_id == 1``.

    Args:
        chars: the id → character list, as made by `build_char_vocab`.

    Raises:
        DataError: `chars` does not start with PAD, MASK or repeats a character.
    """

    def __init__(self, chars: Sequence[str]):
        chars = list(chars)
        if chars[:2] != [PAD, MASK]:
            raise DataError(
                f"a knowledge vocabulary must start with {PAD!r} (pad) and {MASK!r} (mask); "
                "make it with build_char_vocab"
            )
        # A non-string (e.g. a number in a hand-edited tokenizer JSON) fails the same check, not with a TypeError.
        if any(not isinstance(c, str) or len(c) != 1 for c in chars) or len(set(chars)) != len(chars):
            raise DataError(
                "a knowledge vocabulary must list distinct single characters; make it with build_char_vocab"
            )
        self.itos: list[str] = chars
        self.stoi: dict[str, int] = {c: i for i, c in enumerate(chars)}
        # Sorted code points → ids, for encoding a long text in one vectorised lookup.
        codes = np.array([ord(c) for c in chars], dtype=np.uint32)
        order = np.argsort(codes)
        self._codes = codes[order]
        self._ids = order.astype(np.int64)

    pad_id = 0
    mask_id = 1

    @classmethod
    def from_texts(cls, *texts: str) -> KnowledgeVocab:
        """The vocabulary of every character in `texts` (see `build_char_vocab`)."""
        return cls(build_char_vocab(*texts))

    def __len__(self) -> int:
        return len(self.itos)

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of `text`.

        Raises:
            DataError: a character is not in the vocabulary.
        """
        try:
            return [self.stoi[c] for c in text]
        except KeyError as e:
            raise DataError(_unknown_char_message(e.args[0])) from None

    def encode_array(self, text: str) -> np.ndarray:
        """`encode` for long texts: the ids as an int64 array, computed without a Python loop."""
        # surrogatepass: a lone surrogate (text read with errors="surrogateescape") is a character as encode takes it
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        pos = np.searchsorted(self._codes, codes).clip(max=len(self._codes) - 1)
        bad = np.flatnonzero(self._codes[pos] != codes)
        if bad.size:
            raise DataError(_unknown_char_message(chr(codes[bad[0]])))
        return self._ids[pos]

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        """The text of a sequence of ids (a list, array or 1-D tensor)."""
        if isinstance(ids, (torch.Tensor, np.ndarray)):
            ids = ids.tolist()
        return "".join(self.itos[i] for i in ids)

    def to_json(self) -> str:
        return json.dumps({"kind": "char", "pad": PAD, "mask": MASK, "chars": self.itos}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> KnowledgeVocab:
        """The vocabulary saved by `to_json`.

        Raises:
            DataError: the text is not a saved character vocabulary.
        """
        try:
            data = json.loads(text)
            chars = data["chars"]
            ok = data.get("kind") == "char" and isinstance(chars, list)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            ok = False
        if not ok:
            raise DataError(
                "tokenizer JSON is not a saved character vocabulary; save it with KnowledgeVocab.to_json"
            )
        return cls(chars)

    def to_tokenizer(self) -> CharTokenizer:
        """The same vocabulary as the project's `CharTokenizer` (pad □, mask ⁇), for checkpoints:
        it saves as a standard ``tokenizer.json`` that `load_tokenizer` reads."""
        from attnlab.data.tokenizers import CharTokenizer

        return CharTokenizer(self.itos, pad=PAD, mask=MASK)

    @classmethod
    def from_tokenizer(cls, tokenizer: CharTokenizer) -> KnowledgeVocab:
        """The vocabulary of a `CharTokenizer` made by `to_tokenizer` (e.g. loaded from a checkpoint)."""
        return cls([tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KnowledgeVocab) and self.itos == other.itos

    def __repr__(self) -> str:
        return f"KnowledgeVocab({len(self)} characters)"


def _unknown_char_message(ch: str) -> str:
    return (
        f"character {ch!r} (U+{ord(ch):04X}) is not in the vocabulary; build the vocabulary over every "
        "text the model reads (corpus and fine-tuning files)"
    )


# --------------------------------------------------------------------------------------------------------
# Reading files


def _read_text(path: str | PathLike[str], what: str) -> str:
    """The UTF-8 text of a file, or a DataError saying what is wrong with it."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"{path}: file not found; check the path to the {what}")
    if not p.is_file():
        raise DataError(f"{path}: is not a file; give the path to the {what}")
    data = p.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataError(f"{path} line {line}: not valid UTF-8; save the file as UTF-8") from None
    if b"\x00" in data:  # UTF-16 without a byte-order mark (or binary): valid UTF-8 that no text holds
        from attnlab.data.text_files import _nul_error

        raise _nul_error(p, text)
    if not text.strip():
        raise DataError(f"{path}: file is empty; it should hold the {what}")
    return text


def read_corpus(path: str | PathLike[str]) -> list[str]:
    """The documents of a pretraining corpus: one per line, blank lines skipped.

    Raises:
        DataError: the file is missing, empty or not UTF-8, or a line holds the pad or mask character.
    """
    text = _read_text(path, "pretraining corpus (one document per line)")
    lines = split_lines(text, path)  # CR-only line ends refused: the corpus read as one document
    for number, line in enumerate(lines, start=1):
        _check_no_specials(line, f"{path} line {number}")
    return [line for line in lines if line.strip()]


def _check_no_specials(text: str, where: str) -> None:
    """The pad and mask characters structure every example; in the data they would be read as structure."""
    for char, role in ((MASK, "the mask and answer separator"), (PAD, "the padding")):
        if char in text:
            raise DataError(f"{where} holds {char!r} (U+{ord(char):04X}), the character this experiment uses as "
                            f"{role}; remove or replace it")


def read_qa_file(
    path: str | PathLike[str], require_answers: bool = True, block_size: int | None = None
) -> list[tuple[str, str | None]]:
    """The (question, answer) pairs of a file of ``question<TAB>answer`` lines.

    Blank lines are skipped; whitespace around each field is removed. `read_qa_lines` also gives each
    pair's line number.

    Args:
        path: the file.
        require_answers: if False (for prediction), a line may hold only a question, or a question and an
            empty answer; its answer is then None.
        block_size: if given, also check that every line fits the model's block (see `QASource`); when
            answers are not required, only the question (and room for an answer) is checked.

    Raises:
        DataError: missing, empty or non-UTF-8 file; a line without a tab, with more than one tab, with an
            empty question or (when answers are required) an empty answer; a line longer than the block;
            the pad or mask character in a question, or in an answer when answers are required (an answer
            that prediction does not use may hold them).
    """
    return [(question, answer) for _, question, answer in read_qa_lines(path, require_answers, block_size)]


def read_qa_lines(
    path: str | PathLike[str], require_answers: bool = True, block_size: int | None = None
) -> list[tuple[int, str, str | None]]:
    """Like `read_qa_file`, with each pair's line number in the file (from 1) first, so that output about
    the questions can name the lines they came from (blank lines are skipped)."""
    text = _read_text(path, "'question<TAB>answer' lines" if require_answers else
                      "questions, one a line (an answer after a tab is optional)")
    pairs: list[tuple[int, str, str | None]] = []
    for number, line in enumerate(split_lines(text, path), start=1):  # CR-only line ends refused, as above
        if not line.strip():
            continue
        where = f"{path} line {number}"
        fields = line.split("\t")
        if len(fields) > 2:
            raise DataError(f"{where}: expected 'question<TAB>answer', found {len(fields) - 1} tabs")
        # Without required answers an answer is read past, not used: only the question must be free of them.
        _check_no_specials(line if require_answers else fields[0], where)
        if len(fields) == 1 and require_answers:
            raise DataError(f"{where}: expected 'question<TAB>answer', found no tab")
        question = fields[0].strip()
        answer = fields[1].strip() if len(fields) == 2 else ""
        if not question:
            raise DataError(f"{where}: the question (before the tab) is empty")
        if not answer:
            if require_answers:
                raise DataError(f"{where}: the answer (after the tab) is empty")
            answer = None
        if block_size is not None:
            # Without required answers (prediction) the answer is ignored: only the question must fit.
            _check_fits(question, answer if require_answers else None, block_size, where)
        pairs.append((number, question, answer))
    return pairs


# --------------------------------------------------------------------------------------------------------
# Span corruption (pretraining)


def _check_block_size(block_size: int) -> None:
    # int(7/8 * block) >= 4 needs block >= 5; and then L + 2 <= block + 1 always holds.
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 5:
        raise ConfigError(
            f"block_size must be an integer of at least 5 for span corruption, got {block_size!r}"
        )


def _span_plan(n_chars: int, block_size: int, rng: np.random.Generator) -> tuple[int, int, int]:
    """(kept length L, span start, span length) for a document of `n_chars` characters (see
    `corrupt_document` for the rules)."""
    length = int(rng.integers(4, int(block_size * 7 / 8), endpoint=True))
    length = min(length, n_chars)
    if length >= 4:
        # Span length uniform in [1, hi] has mean (1 + hi) / 2. Take hi = L/2 - 1: for odd L that is not
        # an integer, so round it down or up with equal chance; either way the mean is exactly L/4.
        hi = length // 2 - 1
        if length % 2:
            hi += int(rng.integers(0, 2))
    else:
        hi = 1
    span = int(rng.integers(1, hi, endpoint=True))
    start = int(rng.integers(0, length - span, endpoint=True))
    return length, start, span


def corrupt_document(doc: str, block_size: int, rng: np.random.Generator) -> str:
    """One span-corruption example: ``prefix ⁇ suffix ⁇ content`` padded with □ to block_size+1 chars.

    The rules (CS224n 2021 a5):

    1. Keep the first L characters, L uniform in [4, int(block_size * 7/8)] (inclusive). A document
       shorter than L is kept whole (so L = len(doc) then, possibly below 4).
    2. Cut a span ("content") out of the kept text. Its length is uniform in [1, L/2 - 1], where for odd
       L the bound L/2 - 1 is rounded down or up at random, which makes the mean exactly L/4 for L >= 4
       (documents shorter than 4 characters get a span of 1). Its start is uniform over the positions
       that keep it inside the kept text, so prefix and suffix may be empty.
    3. Return ``prefix + MASK + suffix + MASK + content`` followed by PAD up to block_size + 1 characters.
       The model reads x = s[:-1] and predicts y = s[1:].

    Args:
        doc: the document, non-empty.
        block_size: the model's context length, at least 5.
        rng: the source of randomness; the result is a pure function of (doc, block_size, rng state).
    """
    _check_block_size(block_size)
    if not doc:
        raise DataError("cannot corrupt an empty document; remove blank lines from the corpus")
    length, start, span = _span_plan(len(doc), block_size, rng)
    kept = doc[:length]
    prefix, content, suffix = kept[:start], kept[start : start + span], kept[start + span :]
    out = prefix + MASK + suffix + MASK + content
    return out + PAD * (block_size + 1 - len(out))


def _sample_rng(seed: int, tag: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed, tag, *keys])


def _epoch_indices(n: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Example indices of the global batch for `step`: epoch e = step // steps_per_epoch walks a shuffle
    seeded by (seed, e); the last batch of an epoch wraps around to the start of that shuffle."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    steps_per_epoch = math.ceil(n / batch_size)
    epoch, position = divmod(int(step), steps_per_epoch)
    order = _sample_rng(seed, _SHUFFLE, epoch).permutation(n)
    return order[np.arange(position * batch_size, (position + 1) * batch_size) % n]


def _check_loader_args(batch_size: int, seed: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")


def _to_batch(rows: np.ndarray, labels: np.ndarray, trim: bool = False) -> dict[str, torch.Tensor]:
    width = labels.shape[1]
    if trim:
        # Drop the trailing columns where no row has a target: they are padding, and a causal model's
        # earlier positions never see later ones, so the loss and its gradient are unchanged.
        has_target = (labels != IGNORE).any(axis=0)
        width = int(np.flatnonzero(has_target)[-1]) + 1 if has_target.any() else 1
    return {
        "input_ids": torch.from_numpy(np.ascontiguousarray(rows[:, :width])),
        "labels": torch.from_numpy(np.ascontiguousarray(labels[:, :width])),
    }


def _packed_batch(rows: np.ndarray, labels: np.ndarray, pad_id: int) -> dict[str, torch.Tensor]:
    """The batch's examples packed into as few rows of the block's width as they fit in (first fit, longest
    first), each example cut after its last target.

    ``document_ids`` gives each token its example's index in the batch (-1 on the padding that ends a row).
    A causal model that reads it (`attnlab.models.gpt.GPT`) lets each example see only itself, with
    positions from 0, so the loss and gradient equal those of one example per row; no pad column is computed.
    """
    width = labels.shape[1]
    has_target = labels != IGNORE
    # Columns up to the last target (at least one, so an example without targets still counts as one).
    lengths = np.maximum(np.where(has_target.any(axis=1), width - np.argmax(has_target[:, ::-1], axis=1), 0), 1)
    filled: list[int] = []
    contents: list[list[int]] = []
    for i in np.argsort(-lengths, kind="stable"):
        row = next((r for r, used in enumerate(filled) if used + lengths[i] <= width), len(filled))
        if row == len(filled):
            filled.append(0)
            contents.append([])
        filled[row] += int(lengths[i])
        contents[row].append(int(i))
    shape = (len(filled), max(filled))
    ids = np.full(shape, pad_id, dtype=np.int64)
    targets = np.full(shape, IGNORE, dtype=np.int64)
    documents = np.full(shape, -1, dtype=np.int64)
    for r, examples in enumerate(contents):
        start = 0
        for i in examples:
            end = start + lengths[i]
            ids[r, start:end] = rows[i, : lengths[i]]
            targets[r, start:end] = labels[i, : lengths[i]]
            documents[r, start:end] = i
            start = end
    return {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(targets),
            "document_ids": torch.from_numpy(documents)}


class _Layout:
    """A source's batch layout: one example per row (`trim`: without the pad columns after the last target) or
    several per row (`pack`)."""

    trim: bool = False
    pack: bool = False
    vocab: KnowledgeVocab

    def _layout(self, rows: np.ndarray, labels: np.ndarray) -> dict[str, torch.Tensor]:
        return _packed_batch(rows, labels, self.vocab.pad_id) if self.pack else _to_batch(rows, labels, self.trim)


class SpanCorruptionSource(_Layout):
    """Span-corruption pretraining batches over a list of documents (one per corpus line).

    Sample ``i`` of step ``s`` is `corrupt_document` of its document with the generator seeded by
    (seed, s, i), so any batch can be rebuilt in any process and any order. Evaluation (`iter_batches`)
    uses a generator seeded by (seed, document index) instead, the same on every call.

    Args:
        documents: the documents, each non-empty.
        vocab: a vocabulary holding every character of the documents.
        block_size: model context length T (x and labels are (B, T)).
        batch_size: global batch size B.
        seed: seed of the epoch shuffles and of the corruption.
        trim: cut each batch after its last target column (fewer pad columns to compute; same loss
            for a causal model). Batches are then (B, T') with T' <= T.
        pack: pack the examples of each batch into as few rows as they fit in, with ``document_ids``
            (see `_packed_batch`): the same loss and gradient for a GPT, about a third fewer positions to
            compute here, as documents are cut to random lengths. Batches are then (R, T') with R <= B.

    Raises:
        DataError: no documents, an empty document, or a character missing from `vocab`.
        ConfigError: block_size below 5, batch_size below 1 or a negative seed.
    """

    def __init__(
        self, documents: Sequence[str], vocab: KnowledgeVocab, block_size: int, batch_size: int, seed: int = 0,
        trim: bool = False, pack: bool = False,
    ):
        _check_block_size(block_size)
        self.trim, self.pack = trim, pack
        _check_loader_args(batch_size, seed)
        if not documents:
            raise DataError("the pretraining corpus has no documents; give a file with one document per line")
        for i, doc in enumerate(documents):
            if not doc:
                raise DataError(f"corpus document {i + 1} is empty; remove blank lines from the corpus")
            _check_no_marks(doc, f"corpus document {i + 1}")
        self.documents = list(documents)
        self.vocab = vocab
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self.steps_per_epoch: int | None = math.ceil(len(self.documents) / batch_size)
        # Encode the whole corpus once; each document is then a slice of one id array.
        try:
            self._ids = vocab.encode_array("".join(self.documents))
        except DataError as e:
            raise DataError(f"pretraining corpus: {e}") from None
        lengths = np.array([len(d) for d in self.documents], dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(lengths)])

    def __len__(self) -> int:
        return len(self.documents)

    def _row(self, doc_index: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """The encoded block_size+1 ids of one corrupted document, and its unpadded length."""
        ids = self._ids[self._offsets[doc_index] : self._offsets[doc_index + 1]]
        length, start, span = _span_plan(len(ids), self.block_size, rng)
        row = np.full(self.block_size + 1, self.vocab.pad_id, dtype=np.int64)
        pieces = [
            ids[:start],
            [self.vocab.mask_id],
            ids[start + span : length],
            [self.vocab.mask_id],
            ids[start : start + span],
        ]
        body = np.concatenate(pieces)
        row[: len(body)] = body
        return row, len(body)

    def _batch_of(
        self, doc_indices: Sequence[int], rngs: Iterable[np.random.Generator]
    ) -> dict[str, torch.Tensor]:
        rows = np.empty((len(doc_indices), self.block_size + 1), dtype=np.int64)
        labels = np.empty((len(doc_indices), self.block_size), dtype=np.int64)
        for r, (d, rng) in enumerate(zip(doc_indices, rngs)):
            rows[r], n = self._row(int(d), rng)
            labels[r] = rows[r, 1:]
            labels[r, n - 1 :] = IGNORE  # targets y[t] = s[t+1] that fall in the padding
        return self._layout(rows, labels)

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        """The global batch for training step `step`: ``input_ids`` and ``labels``, both (B, T) long."""
        docs = _epoch_indices(len(self.documents), self.batch_size, self.seed, step)
        return self._batch_of(docs, (_sample_rng(self.seed, _SAMPLE, step, i) for i in range(len(docs))))

    def iter_batches(self, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Every document once, in corpus order, corrupted the same way on every call; the last batch may
        be smaller."""
        _check_loader_args(batch_size, self.seed)
        for lo in range(0, len(self.documents), batch_size):
            docs = range(lo, min(lo + batch_size, len(self.documents)))
            yield self._batch_of(docs, (_sample_rng(self.seed, _EVAL, d) for d in docs))


# --------------------------------------------------------------------------------------------------------
# Question answering (fine-tuning)


def qa_prompt(question: str) -> str:
    """The text the model is given at prediction time: the question and the mask mark."""
    return question + MASK


def parse_answer(completion: str) -> str:
    """The answer in a model completion of `qa_prompt`: the text after the first mask mark, up to the
    next mask mark (or pad, or the end)."""
    _, _, after = completion.partition(MASK)
    return after.split(MASK, 1)[0].split(PAD, 1)[0].strip()


def _check_no_marks(text: str, where: str) -> None:
    """The pad and mask characters are the layout's own: in a text they would read as padding or a mask mark."""
    for mark, name in ((PAD, "pad"), (MASK, "mask")):
        if mark in text:
            raise DataError(f"{where}: holds {mark!r}, the {name} character of the layout; remove it from the text")


def _check_fits(question: str, answer: str | None, block_size: int, where: str,
                fix: str = "shorten the line or raise block_size") -> None:
    """A DataError unless the pair fits the block (`fix` ends the message: data that is generated, not written by
    the user, cannot be shortened)."""
    if answer is None:  # to be answered: `question ⁇` and room for one character of answer in the block
        if len(question) + 2 > block_size:
            raise DataError(f"{where}: the question takes {len(question) + 1} characters with its {MASK} mark, "
                            f"leaving no room for an answer in block_size = {block_size}; {fix}")
        return
    needed = len(question) + len(answer) + 2
    if needed > block_size + 1:
        raise DataError(
            f"{where}: question and answer take {needed} characters with the two {MASK} marks, more than "
            f"block_size + 1 = {block_size + 1}; {fix}"
        )


class QASource(_Layout):
    """Fine-tuning batches of ``question ⁇ answer ⁇`` lines, padded with □ to block_size + 1 characters.

    With s that string, x = s[:-1] and y = s[1:]. The loss covers exactly the characters of
    ``answer + MASK``: the targets y[t] for len(question) <= t <= len(question) + len(answer). Targets
    inside the question, the first mask mark (which the prompt always supplies) and the padding get -100.

    Args:
        pairs: (question, answer) pairs, every answer given.
        vocab: the pretraining vocabulary; it must hold every character of the pairs.
        block_size: model context length T.
        batch_size: global batch size B.
        seed: seed of the epoch shuffles.
        name: how error messages refer to the pairs (e.g. the file name).
        trim: cut each batch after its last target column (see `SpanCorruptionSource`).
        pack: pack each batch's examples into as few rows as they fit in (see `SpanCorruptionSource`).

    Raises:
        DataError: no pairs, a missing answer, a pair longer than the block, or an unknown character.
        ConfigError: bad block_size, batch_size or seed.
    """

    def __init__(
        self,
        pairs: Sequence[tuple[str, str | None]],
        vocab: KnowledgeVocab,
        block_size: int,
        batch_size: int,
        seed: int = 0,
        name: str = "fine-tuning data",
        trim: bool = False,
        pack: bool = False,
    ):
        self.trim, self.pack = trim, pack
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 2:
            raise ConfigError(f"block_size must be an integer of at least 2, got {block_size!r}")
        _check_loader_args(batch_size, seed)
        if not pairs:
            raise DataError(f"{name}: no question-answer pairs; give 'question<TAB>answer' lines")
        self.pairs = list(pairs)
        self.vocab = vocab
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self.steps_per_epoch: int | None = math.ceil(len(self.pairs) / batch_size)
        n = len(self.pairs)
        self._rows = np.full((n, block_size + 1), vocab.pad_id, dtype=np.int64)
        self._labels = np.full((n, block_size), IGNORE, dtype=np.int64)
        for i, (question, answer) in enumerate(self.pairs):
            where = f"{name} pair {i + 1}"
            if not answer:
                raise DataError(f"{where}: no answer; fine-tuning needs 'question<TAB>answer' lines")
            _check_fits(question, answer, block_size, where)
            _check_no_marks(question + answer, where)
            try:
                ids = vocab.encode(question + MASK + answer + MASK)
            except DataError as e:
                raise DataError(f"{where}: {e}") from None
            self._rows[i, : len(ids)] = ids
            q = len(question)
            self._labels[i, q : len(ids) - 1] = ids[q + 1 :]

    def __len__(self) -> int:
        return len(self.pairs)

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        """The global batch for training step `step`: ``input_ids`` and ``labels``, both (B, T) long."""
        idx = _epoch_indices(len(self.pairs), self.batch_size, self.seed, step)
        return self._layout(self._rows[idx], self._labels[idx])

    def iter_batches(self, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Every pair once, in order; the last batch may be smaller."""
        _check_loader_args(batch_size, self.seed)
        for lo in range(0, len(self.pairs), batch_size):
            hi = min(lo + batch_size, len(self.pairs))
            yield self._layout(self._rows[lo:hi], self._labels[lo:hi])


# --------------------------------------------------------------------------------------------------------
# Evaluation


def exact_match(predictions: Sequence[str], answers: Sequence[str]) -> float:
    """Percentage of predictions equal to their answer (ignoring surrounding whitespace)."""
    if len(predictions) != len(answers):
        raise ValueError(f"{len(predictions)} predictions for {len(answers)} answers")
    if not answers:
        raise ValueError("no answers to score")
    hits = sum(p.strip() == a.strip() for p, a in zip(predictions, answers))
    return 100.0 * hits / len(answers)


def london_baseline(answers: Sequence[str]) -> float:
    """Percentage accuracy of always answering "London" (the assignment's trivial baseline)."""
    return exact_match(["London"] * len(answers), answers)
