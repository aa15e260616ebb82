"""Tokenizers: characters, words, and subwords (BPE, WordPiece) behind one small interface.

Every tokenizer maps text to integer ids and back, knows its special tokens (pad, unk, mask, cls,
sep, bos, eos; any of them may be absent) and saves itself as ONE JSON file, so a checkpoint folder
holds everything needed to read and write text. Nothing is ever pickled.

- `CharTokenizer`: one id per character; built from an explicit character list (the char GPT
  experiments fix the order, e.g. pad = "□" at id 0) or trained on a text. Encoding a corpus is a
  numpy table lookup over code points, so megabytes encode in milliseconds.
- `WordTokenizer`: whitespace (or regex) words, the most frequent ones up to a size.
- `BPETokenizer`, `WordPieceTokenizer`: trained offline with HF `tokenizers`; BPE works on bytes
  (GPT-2 style), so decode(encode(text)) gives back the text exactly.

`train_tokenizer(kind, texts, vocab_size)` picks a class by name; `load_tokenizer(path)` reads any
of them back.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import numbers
import operator
import os
import re
import warnings
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from attnlab.errors import CheckpointError, ConfigError, DataError, UnknownToken, one_line
from attnlab.files import write_text_atomic
from attnlab.registry import Registry

FORMAT_VERSION = 1
TOKENIZER_FILE = "tokenizer.json"
SPECIAL_NAMES = ("pad", "unk", "mask", "cls", "sep", "bos", "eos")
ENCODE_CHUNK = 4096  # texts per call of HF's encode_batch (see _HFTokenizer.encode_batch)


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """The strings of the special tokens; None leaves that special out of the vocabulary.

    Specials come first in a trained vocabulary, in this order, so with the defaults pad has id 0.
    """

    pad: str | None = "<pad>"
    unk: str | None = "<unk>"
    mask: str | None = "<mask>"
    cls: str | None = "<cls>"
    sep: str | None = "<sep>"
    bos: str | None = "<bos>"
    eos: str | None = "<eos>"

    def __post_init__(self) -> None:
        present = [t for _, t in self.items()]
        for name, tok in self.items():
            if not isinstance(tok, str) or not tok:
                raise ConfigError(f"special token {name} must be a non-empty string or None, got {tok!r}")
        if len(set(present)) != len(present):
            raise ConfigError(f"special tokens must be distinct strings, got {self.to_dict()}")

    @classmethod
    def none(cls) -> SpecialTokens:
        return cls(**{name: None for name in SPECIAL_NAMES})

    @classmethod
    def saved(cls, value: Mapping[str, str | None]) -> SpecialTokens:
        """The specials of a saved tokenizer ("specials" in its JSON, which names all seven): a name left out is
        None, as the character tokenizer reads it (the defaults came back: a hand edit that dropped "eos" still
        had one)."""
        return cls.coerce({**dict.fromkeys(SPECIAL_NAMES), **value})

    @classmethod
    def coerce(cls, value: SpecialTokens | Mapping[str, str | None] | None) -> SpecialTokens:
        """None -> the defaults; a mapping overrides some defaults (a value of None drops that one)."""
        if value is None:
            return cls()
        if isinstance(value, SpecialTokens):
            return value
        unknown = sorted(set(value) - set(SPECIAL_NAMES))
        if unknown:
            raise ConfigError(
                f"unknown special token name(s) {', '.join(unknown)}; choose from: {', '.join(SPECIAL_NAMES)}"
            )
        return cls(**dict(value))

    def items(self) -> Iterator[tuple[str, str]]:
        """(name, string) of the specials that are present, in vocabulary order."""
        for name in SPECIAL_NAMES:
            tok = getattr(self, name)
            if tok is not None:
                yield name, tok

    def tokens(self) -> list[str]:
        return [tok for _, tok in self.items()]

    def to_dict(self) -> dict[str, str | None]:
        return {name: getattr(self, name) for name in SPECIAL_NAMES}


class Tokenizer(ABC):
    """The common interface. Subclasses implement the vocabulary lookups, encode/decode and to_dict."""

    kind: ClassVar[str]
    specials: SpecialTokens

    # -- vocabulary -----------------------------------------------------------------------------
    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """The id of `token`, or None if it is not in the vocabulary."""

    @abstractmethod
    def id_to_token(self, token_id: int) -> str:
        """The token string of `token_id`; DataError when it is out of range."""

    def _special_id(self, name: str) -> int | None:
        tok = getattr(self.specials, name)
        return None if tok is None else self.token_to_id(tok)

    @property
    def pad_id(self) -> int | None:
        return self._special_id("pad")

    @property
    def unk_id(self) -> int | None:
        return self._special_id("unk")

    @property
    def mask_id(self) -> int | None:
        return self._special_id("mask")

    @property
    def cls_id(self) -> int | None:
        return self._special_id("cls")

    @property
    def sep_id(self) -> int | None:
        return self._special_id("sep")

    @property
    def bos_id(self) -> int | None:
        return self._special_id("bos")

    @property
    def eos_id(self) -> int | None:
        return self._special_id("eos")

    @property
    def special_ids(self) -> list[int]:
        """Sorted ids of every special token in the vocabulary."""
        ids = (self._special_id(name) for name, _ in self.specials.items())
        return sorted({i for i in ids if i is not None})

    def vocab(self) -> list[str]:
        """All tokens in id order."""
        return [self.id_to_token(i) for i in range(self.vocab_size)]

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < self.vocab_size:
            raise DataError(
                f"token id {token_id} is out of range for a vocabulary of {self.vocab_size} tokens; "
                "use the tokenizer saved with the model"
            )

    # -- encoding -------------------------------------------------------------------------------
    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """The ids of one text; DataError for anything but a str, or for a lone surrogate in it."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in _checked_texts(texts)]

    def encode_array(self, texts: str | Sequence[str], *, continues: bool = False) -> np.ndarray:
        """The ids of a text, or of several texts concatenated, as one int64 array (for corpora). `continues`: the
        text goes on from one encoded before it (a later block of a corpus), so it gets no start-of-text prefix
        (the space a GPT-2 tokenizer saved with add_prefix_space puts before a text) again."""
        if isinstance(texts, str):
            texts = [_checked_text(texts)]  # checked here, so that an error does not call it "text 0"
        return _ids_array(self.encode_batch(list(texts)))

    @abstractmethod
    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """Text of `ids`. Padding is always dropped; other specials only if `skip_special_tokens`.

        `ids` is one sequence of ints (a list, tuple, 1-D array or tensor); a batch (a row of generate's output
        each), a float or an id out of range raises DataError."""

    def _ids_to_keep(self, ids: Iterable[int], skip_special_tokens: bool) -> list[int]:
        ids = _as_ids(ids)
        drop = set(self.special_ids) if skip_special_tokens else {self.pad_id}
        return [i for i in ids if i not in drop]

    # -- persistence ----------------------------------------------------------------------------
    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict with a "type" field, read back by `from_dict`."""

    @classmethod
    @abstractmethod
    def from_dict(cls, data: dict[str, Any]) -> Tokenizer: ...

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the tokenizer as one JSON file; a directory gets `tokenizer.json` inside it."""
        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_dict(), ensure_ascii=False, indent=1)
        return write_text_atomic(path, text)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


TOKENIZERS: Registry[type[Tokenizer]] = Registry("tokenizer kind")


def _base_dict(tok: Tokenizer) -> dict[str, Any]:
    return {"type": tok.kind, "version": FORMAT_VERSION, "specials": tok.specials.to_dict()}


# Where a text may be cut and its pieces encoded apart with the ids of the whole text: before a line end ("\n"
# or "\r\n") that follows a non-space character. Every tokenizer here ends a token there. Cutting after the
# line end would not do: byte-level BPE's GPT-2 pattern keeps "\n" with the next line's indentation.
_PIECE_CUT = re.compile(r"(?<=\S)(?=\r?\n)")


def _ids_array(id_lists: Sequence[Sequence[int]]) -> np.ndarray:
    """Lists of ids concatenated as one int64 array."""
    parts = [np.asarray(ids, dtype=np.int64) for ids in id_lists]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def pre_tokenizer_state(hf: Any) -> dict[str, Any]:
    """The settings of an HF tokenizer's pre-tokenizer as its tokenizer.json writes them (`{"type": "none"}`
    without one): the splitting that decides where a text may be cut and encoded in pieces."""
    return json.loads(hf.pre_tokenizer.__getstate__()) if hf.pre_tokenizer is not None else {"type": "none"}


# The longest piece `text_pieces` gives where it can cut between words: HF's Encoding of a text weighs ~100 times
# its ids, so one of a 4 MB line (a one-line corpus like text8) held ~0.9 GB for a moment.
LONGEST_PIECE = 1 << 16


def text_pieces(text: str) -> list[str]:
    """`text` cut at every `_PIECE_CUT` point (about a line each), and a line longer than `LONGEST_PIECE` characters
    also before spaces (`last_word_cut`); the pieces' ids concatenated are the text's."""
    pieces = []
    for piece in _PIECE_CUT.split(text):
        while len(piece) > LONGEST_PIECE and (cut := last_word_cut(piece, 0, LONGEST_PIECE)) > 0:
            pieces.append(piece[:cut])
            piece = piece[cut:]
        pieces.append(piece)
    return pieces


def last_piece_cut(text: str, start: int = 0, end: int | None = None) -> int:
    """The last `_PIECE_CUT` point p with start < p < end (the text cut at p encodes as it does whole), or -1."""
    end = len(text) if end is None else end
    while (p := text.rfind("\n", start, end)) > start:
        q = p - 1 if text[p - 1] == "\r" else p
        if q > start and not text[q - 1].isspace():
            return q
        end = p
    return -1


# Where a text that has no such line end for megabytes (a one-line corpus like text8) is cut instead: before a
# space or tab that follows a non-space character, where every tokenizer here ends a token too. It is only the
# fallback, as fewer word patterns split identically there (see `WordTokenizer`). Other whitespace will not do:
# WordPiece's normalizer deletes "\x0b", "\x0c", "\x1c" to "\x1f" and "\x85", joining the words around them.
def last_word_cut(text: str, start: int = 0, end: int | None = None) -> int:
    """The last point p with start < p < end before a space or tab that follows a non-space character (the text
    cut at p encodes as it does whole), or -1."""
    end = len(text) if end is None else end
    found = {c: text.rfind(c, start + 1, end) for c in " \t"}  # each searched on from where it last stopped
    while (p := max(found.values())) > start:
        if not text[p - 1].isspace():
            return p
        found[text[p]] = text.rfind(text[p], start + 1, p)
    return -1


# Text on which a pattern that can match the empty string almost always does (see `WordTokenizer`).
_EMPTY_MATCH_PROBE = "Ab c1_2.\t,;:!?'\"()-[]{}<>/\\|@#$%^&*+=~`\r\n é中😀"


# A lone surrogate (a byte that was not UTF-8, read with errors="surrogateescape") is no character UTF-8 can hold:
# HF's tokenizers refuse it with a TypeError saying the text is not a str, and a word would silently become unk.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_error(text: str, pos: int, index: int | None = None) -> DataError:
    where = "text" if index is None else f"text {index}"
    return DataError(f"{where} has an invalid character {text[pos]!r} at position {pos} (a lone surrogate); "
                     "read the file as UTF-8 without errors='surrogateescape'")


def _checked_text(text: Any, index: int | None = None) -> str:
    """`text` itself, refused in one line unless it is a str that UTF-8 can hold; `index` is its place in a list of
    texts (None for the one text of `encode`)."""
    if not isinstance(text, str):  # a list would otherwise be encoded as its items glued together, or crash
        if index is None:
            raise DataError(f"encode takes one text (a str), got {type(text).__name__}; "
                            "encode a list of texts with encode_batch")
        raise DataError(f"text {index} is {type(text).__name__}, not a str; give every text as a str")
    if not text.isascii() and (m := _SURROGATE.search(text)):  # isascii is O(1): ASCII text is not scanned
        raise _surrogate_error(text, m.start(), index)
    return text


def _each_checked(texts: str | Iterable[str]) -> Iterator[str]:
    """The texts of `texts` (one str or an iterable of them, read once), each refused as `_checked_text` does."""
    if isinstance(texts, str):
        yield _checked_text(texts)
        return
    for i, text in enumerate(texts):
        yield _checked_text(text, i)


def _checked_texts(texts: Any) -> list[str]:
    """The list of texts `encode_batch` takes: one str is refused, as its characters would become the texts."""
    if isinstance(texts, str):
        raise DataError("encode_batch takes a list of texts, got one str; encode a single text with encode")
    return list(_each_checked(texts))


def _as_ids(ids: Any) -> list[int]:
    """`ids` as Python ints: one sequence of whole numbers (a list or tuple, a 1-D array or tensor). A batch (what
    generate returns) is refused in one line, and so are floats, which int() would cut to other ids."""
    ndim = getattr(ids, "ndim", None)  # numpy arrays and torch tensors
    if ndim == 0:
        raise DataError(f"decode takes a sequence of ids, got a single id ({ids!r}); give it in a list: [id]")
    if ndim is not None and ndim != 1:
        raise DataError(f"decode takes one sequence of ids, not a batch of shape {tuple(ids.shape)}; "
                        "decode each row of generate's output")
    if ndim == 1:
        ids = ids.tolist()
    elif isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise DataError(f"decode takes a sequence of ids, got {type(ids).__name__}; give a list of ints")
    out = []
    for pos, i in enumerate(ids):
        if type(i) is int:
            out.append(i)
            continue
        if isinstance(i, (list, tuple)) or getattr(i, "ndim", 0):
            raise DataError(f"decode takes one sequence of ids, not a batch (item {pos} is a {type(i).__name__}); "
                            "decode each row of generate's output")
        try:
            # A mask passed by mistake: True is no token id (a 0-d bool tensor's operator.index gives 1).
            if isinstance(i, (bool, np.bool_)) or str(getattr(i, "dtype", "")) in ("bool", "torch.bool"):
                raise TypeError
            out.append(operator.index(i))  # numpy integers and 0-d integer tensors, not floats
        except TypeError:
            raise DataError(f"token id {i!r} at position {pos} is not an integer; decode takes integer ids "
                            "(take the argmax or a sample of the logits first)") from None
    return out


def _check_tokens_are_str(tokens: list[Any], what: str) -> None:
    """Refuse a vocabulary entry that is no string (a number in an edited tokenizer.json), which decode would
    crash on."""
    for i, tok in enumerate(tokens):
        if not isinstance(tok, str):
            raise ConfigError(f"{what} vocabulary entry {i} is {tok!r}, not a string; give every token as a string")


# ------------------------------------------------------------------------------------------------
# Characters
# ------------------------------------------------------------------------------------------------
@TOKENIZERS.register("char")
class CharTokenizer(Tokenizer):
    """One id per character, in the order of `chars`.

    `chars` lists the vocabulary in id order. Each special given by keyword (pad="□", mask="⁇"...)
    must be an entry of `chars`; specials may be multi-character strings like "<pad>" (such entries
    are never produced from text, only decoded), every other entry is exactly one character.

    Example: `CharTokenizer(["□", "⁇", *sorted(set(text))], pad="□", mask="⁇")` has pad id 0 and
    mask id 1, and no unk: encoding a character outside the list raises DataError.
    """

    kind = "char"

    def __init__(
        self,
        chars: Sequence[str],
        *,
        pad: str | None = None,
        unk: str | None = None,
        mask: str | None = None,
        cls: str | None = None,
        sep: str | None = None,
        bos: str | None = None,
        eos: str | None = None,
    ):
        self.specials = SpecialTokens(pad=pad, unk=unk, mask=mask, cls=cls, sep=sep, bos=bos, eos=eos)
        self._tokens = list(chars)
        _check_tokens_are_str(self._tokens, "character")
        self._ids = {tok: i for i, tok in enumerate(self._tokens)}
        if len(self._ids) != len(self._tokens):
            dup = next(t for t, n in Counter(self._tokens).items() if n > 1)
            raise ConfigError(f"character vocabulary lists {dup!r} twice; give each character once")
        special_strings = set(self.specials.tokens())
        for name, tok in self.specials.items():
            if tok not in self._ids:
                raise ConfigError(
                    f"special token {name}={tok!r} is not in the character list; add it to chars"
                )
        for tok in self._tokens:
            if tok not in special_strings and len(tok) != 1:
                raise ConfigError(
                    f"character vocabulary entry {tok!r} is not a single character; "
                    "only specials may be longer"
                )
        # Lookup table: code point -> id (-1 for characters outside the vocabulary).
        singles = [(ord(t), i) for i, t in enumerate(self._tokens) if len(t) == 1]
        size = max((cp for cp, _ in singles), default=0) + 1
        self._table = np.full(size, -1, dtype=np.int32)
        for cp, i in singles:
            self._table[cp] = i
        self._token_array = np.array(self._tokens, dtype=object)

    @classmethod
    def train(
        cls,
        texts: str | Iterable[str],
        vocab_size: int | None = None,
        *,
        specials: SpecialTokens | Mapping[str, str | None] | None = None,
    ) -> CharTokenizer:
        """Specials first, then the characters of `texts` in sorted order.

        With `vocab_size`, only the most frequent characters that fit are kept (others become unk).
        """
        specials = SpecialTokens.coerce(specials)
        counts: Counter[str] = Counter()
        for text in _each_checked(texts):
            counts.update(text)
        for tok in specials.tokens():
            counts.pop(tok, None)
        chars = sorted(counts)
        if vocab_size is not None:
            room = vocab_size - len(specials.tokens())
            if room < 1:
                raise ConfigError(
                    f"char vocab_size {vocab_size} leaves no room beside "
                    f"{len(specials.tokens())} special tokens; "
                    "raise vocab_size (data.vocab_size in a run config)"
                )
            if len(chars) > room:
                chars = sorted(sorted(counts, key=lambda c: (-counts[c], c))[:room])
        return cls([*specials.tokens(), *chars], **dict(specials.items()))

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._ids.get(token)

    def id_to_token(self, token_id: int) -> str:
        self._check_id(token_id)
        return self._tokens[token_id]

    def vocab(self) -> list[str]:
        return list(self._tokens)

    def encode_array(self, texts: str | Sequence[str], *, continues: bool = False) -> np.ndarray:
        return self._lookup(texts if isinstance(texts, str) else "".join(_checked_texts(texts)))

    def _lookup(self, text: str) -> np.ndarray:
        """The ids of `text` as an int64 array."""
        # UTF-32 gives one 4-byte code point per character: the whole text becomes an array at once.
        try:
            points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        except UnicodeEncodeError as e:
            raise DataError(
                f"text has an invalid character {text[e.start]!r} at position {e.start} (a lone surrogate); "
                "read the file as UTF-8 without errors='surrogateescape'"
            ) from None
        if len(points) and int(points.max()) >= len(self._table):  # characters beyond the table
            inside = points < len(self._table)
            ids = np.full(len(points), -1, dtype=np.int32)
            ids[inside] = self._table[points[inside]]
        else:
            ids = self._table[points]
        unknown = ids < 0
        if unknown.any():
            unk = self.unk_id
            if unk is None:
                pos = int(np.argmax(unknown))
                ch = text[pos]
                raise UnknownToken(
                    f"character {ch!r} (U+{ord(ch):04X}) at position {pos} is not in the tokenizer's "
                    "vocabulary and there is no unk token; "
                    "train the tokenizer on text containing it or add an unk", ch, pos
                )
            ids[unknown] = unk
        return ids.astype(np.int64)

    def encode(self, text: str) -> list[int]:
        return self._lookup(_checked_text(text)).tolist()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # One lookup over all texts joined, then split: fast for many short texts.
        texts = _checked_texts(texts)
        if not texts:
            return []
        try:
            ids = self._lookup("".join(texts))
        except DataError:
            return [self.encode(t) for t in texts]  # re-raises with the position inside the text
        ends = np.cumsum([len(t) for t in texts])[:-1]
        return [part.tolist() for part in np.split(ids, ends)]

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        keep = self._ids_to_keep(ids, skip_special_tokens)
        if not keep:
            return ""
        try:
            arr = np.asarray(keep, dtype=np.int64)
        except OverflowError:  # an id beyond 64 bits: named as out of range, like any other
            self._check_id(next(i for i in keep if not 0 <= i < self.vocab_size))
            raise
        bad = (arr < 0) | (arr >= self.vocab_size)
        if bad.any():
            self._check_id(int(arr[bad][0]))
        return "".join(self._token_array[arr].tolist())

    def to_dict(self) -> dict[str, Any]:
        return {**_base_dict(self), "tokens": list(self._tokens)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CharTokenizer:
        specials = {k: v for k, v in data["specials"].items() if v is not None}
        return cls(data["tokens"], **specials)


# ------------------------------------------------------------------------------------------------
# Words
# ------------------------------------------------------------------------------------------------
@TOKENIZERS.register("word")
class WordTokenizer(Tokenizer):
    """Words split on whitespace, or the matches of a regex `pattern`; decode joins them with spaces.

    `vocab` lists the tokens in id order and must contain every present special. Token files encode a text
    a block of lines at a time (about a megabyte), cut before a line end that follows a non-space character;
    a line of megabytes (a one-line corpus like text8) is cut before a space or tab that follows a non-space
    character. The default pattern splits the pieces as one `encode` of the whole text does, and so does a
    `pattern` whose matches never hold a non-space character followed by whitespace and look at nothing
    outside themselves (`\\w+`, `\\w+|[^\\w\\s]+`, `\\s+\\w+`); others may split differently there (`\\w+\\s`
    takes the newline or space with the word before it, `\\w+(?=\\s)` looks past the cut). A `pattern` must not
    match the empty string (`\\w*`, `\\b`): an empty match is no word.
    """

    kind = "word"

    def __init__(
        self,
        vocab: Sequence[str],
        *,
        specials: SpecialTokens | Mapping[str, str | None] | None = None,
        pattern: str | None = None,
        lowercase: bool = False,
    ):
        self.specials = SpecialTokens.coerce(specials)
        self._tokens = list(vocab)
        _check_tokens_are_str(self._tokens, "word")
        self._ids = {tok: i for i, tok in enumerate(self._tokens)}
        if len(self._ids) != len(self._tokens):
            raise ConfigError("word vocabulary has duplicate entries; give each word once")
        for name, tok in self.specials.items():
            if tok not in self._ids:
                raise ConfigError(f"special token {name}={tok!r} is not in the word vocabulary; add it")
        if not isinstance(lowercase, bool):
            raise ConfigError(f"word tokenizer lowercase must be true or false, got {lowercase!r}; "
                              "write true or false without quotes")
        self.pattern = pattern
        self.lowercase = lowercase
        try:
            self._regex = re.compile(pattern) if pattern is not None else None
        except re.error as e:
            raise ConfigError(f"word tokenizer pattern {pattern!r} is not a valid regex: {e}") from None
        # An empty match would be a word '' between every two: refused here on texts that show the usual
        # culprits (`\w*`, `\s*`, `\b`), and by `split` on any text that shows another.
        if self._regex is not None and any(m.group(0) == "" for m in self._regex.finditer(_EMPTY_MATCH_PROBE)):
            raise self._empty_match_error()

    def _empty_match_error(self) -> ConfigError:
        return ConfigError(f"word tokenizer pattern {self.pattern!r} matches the empty string; make every match "
                           "take at least one character (e.g. \\w+, not \\w* or \\b)")

    def split(self, text: str) -> list[str]:
        """The words of `text`, before the vocabulary lookup."""
        text = _checked_text(text)
        if self.lowercase:
            text = text.lower()
        if self._regex is None:
            return text.split()
        words = [m.group(0) for m in self._regex.finditer(text)]
        if "" in words:
            raise self._empty_match_error()
        return words

    @classmethod
    def train(
        cls,
        texts: str | Iterable[str],
        vocab_size: int | None = None,
        *,
        min_frequency: int = 1,
        pattern: str | None = None,
        lowercase: bool = False,
        specials: SpecialTokens | Mapping[str, str | None] | None = None,
    ) -> WordTokenizer:
        """Specials, then words by decreasing frequency (ties alphabetical) seen at least `min_frequency`
        times, up to `vocab_size` tokens in all."""
        specials = SpecialTokens.coerce(specials)
        splitter = cls([*specials.tokens()], specials=specials, pattern=pattern, lowercase=lowercase)
        counts: Counter[str] = Counter()
        for text in _each_checked(texts):
            counts.update(splitter.split(text))
        for tok in specials.tokens():
            counts.pop(tok, None)
        words = sorted((w for w, n in counts.items() if n >= min_frequency), key=lambda w: (-counts[w], w))
        if vocab_size is not None:
            room = vocab_size - len(specials.tokens())
            if room < 1:
                raise ConfigError(
                    f"word vocab_size {vocab_size} leaves no room beside "
                    f"{len(specials.tokens())} special tokens; "
                    "raise vocab_size (data.vocab_size in a run config)"
                )
            words = words[:room]
        return cls([*specials.tokens(), *words], specials=specials, pattern=pattern, lowercase=lowercase)

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._ids.get(token)

    def id_to_token(self, token_id: int) -> str:
        self._check_id(token_id)
        return self._tokens[token_id]

    def vocab(self) -> list[str]:
        return list(self._tokens)

    def encode(self, text: str) -> list[int]:
        words = self.split(text)
        unk = self.unk_id
        if unk is not None:
            get = self._ids.get
            return [get(w, unk) for w in words]
        try:
            return [self._ids[w] for w in words]
        except KeyError as e:
            raise UnknownToken(
                f"word {e.args[0]!r} is not in the tokenizer's vocabulary and there is no unk token; "
                "retrain the tokenizer with an unk token", str(e.args[0])
            ) from None

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        keep = self._ids_to_keep(ids, skip_special_tokens)
        return " ".join(self.id_to_token(i) for i in keep)

    def to_dict(self) -> dict[str, Any]:
        return {
            **_base_dict(self),
            "pattern": self.pattern,
            "lowercase": self.lowercase,
            "tokens": list(self._tokens),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WordTokenizer:
        return cls(
            data["tokens"],
            specials=SpecialTokens.saved(data["specials"]),
            pattern=data.get("pattern"),
            lowercase=data.get("lowercase", False),
        )


# ------------------------------------------------------------------------------------------------
# Subwords, via HF tokenizers
# ------------------------------------------------------------------------------------------------
class _HFTokenizer(Tokenizer):
    """A trained HF `tokenizers.Tokenizer` with our specials; no post-processor, so encode adds nothing."""

    def __init__(self, hf: Any, specials: SpecialTokens | Mapping[str, str | None] | None = None):
        from tokenizers import decoders

        self._hf = self._deterministic(hf)
        self.specials = SpecialTokens.coerce(specials)
        # The byte-level decoder reads every token, added ones too, as GPT-2's byte symbols: "«mask»" would come
        # back as "�mask�". An added token (a special) matched raw text, so decode puts its string back as it is
        # and sends only the runs of byte-level tokens between them through the decoder. WordPiece's decoder maps
        # no characters, so its specials come back as written already, and decoding the runs between them apart
        # would lose the spaces it puts around them ("fox ⁇ dog"): there this is None.
        added = self._hf.get_added_tokens_decoder()
        self._verbatim = ({i: tok.content for i, tok in added.items()}
                          if isinstance(self._hf.decoder, decoders.ByteLevel) else None)
        # Added tokens HF marks special (a converted tokenizer's additional special tokens) are specials too: HF's
        # decode leaves them out of text, and so do generate and decode(skip_special_tokens=True).
        self._added_specials = {i for i, tok in added.items() if tok.special}
        self._continuing = self._without_prefix(self._hf)
        for name, tok in self.specials.items():
            if hf.token_to_id(tok) is None:
                raise ConfigError(f"special token {name}={tok!r} is not in the {self.kind} vocabulary")

    @property
    def hf(self) -> Any:
        """The underlying `tokenizers.Tokenizer`."""
        return self._hf

    @property
    def special_ids(self) -> list[int]:
        """Sorted ids of every special token: ours, and the added tokens HF's tokenizer marks special."""
        return sorted(set(super().special_ids) | self._added_specials)

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._hf.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        self._check_id(token_id)
        return self._hf.id_to_token(token_id)

    def encode(self, text: str) -> list[int]:
        return self._hf.encode(_checked_text(text), add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # In chunks: HF's Encoding of a text (offsets, token strings, masks) weighs ~100 times its ids, so one call
        # over a whole parallel or classification file held gigabytes for a moment (and the process kept them).
        return self._encode_chunks(self._hf, _checked_texts(texts))

    @staticmethod
    def _encode_chunks(hf: Any, texts: list[str]) -> list[list[int]]:
        return [e.ids for start in range(0, len(texts), ENCODE_CHUNK)
                for e in hf.encode_batch(texts[start:start + ENCODE_CHUNK], add_special_tokens=False)]

    def encode_array(self, texts: str | Sequence[str], *, continues: bool = False) -> np.ndarray:
        if not isinstance(texts, str):
            return super().encode_array(texts)
        # Checked whole first, so that an error names the position in the text given; then encoded in parallel, in
        # pieces whose ids are the whole text's: only the first gets a prefix the tokenizer puts before a text.
        pieces = text_pieces(_checked_text(texts))
        if self._continuing is None:
            return super().encode_array(pieces)
        head, rest = ([], pieces) if continues else (pieces[:1], pieces[1:])
        return _ids_array(self._encode_chunks(self._hf, head) + self._encode_chunks(self._continuing, rest))

    @staticmethod
    def _without_prefix(hf: Any) -> Any:
        """A copy of `hf` that puts nothing before a text's start, for the pieces of a text after its first; None
        where `hf` puts nothing there. A byte-level pre-tokenizer with add_prefix_space (a GPT-2 tokenizer saved
        with add_prefix_space=True) puts a space there."""
        from tokenizers import Tokenizer as HFTokenizer

        def off(node: dict) -> dict:
            if node.get("type") == "ByteLevel" and node.get("add_prefix_space"):
                return {**node, "add_prefix_space": False}
            if node.get("type") == "Sequence":
                return {**node, "pretokenizers": [off(child) for child in node.get("pretokenizers", [])]}
            return node

        given = pre_tokenizer_state(hf)
        if (pre := off(given)) == given:
            return None
        data = json.loads(hf.to_str())
        data["pre_tokenizer"] = pre
        return HFTokenizer.from_str(json.dumps(data))

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        keep = self._ids_to_keep(ids, skip_special_tokens)
        for i in keep:
            self._check_id(i)
        added = self._verbatim
        if not added:
            return self._hf.decode(keep, skip_special_tokens=False)
        parts, start = [], 0
        for end, i in enumerate(keep):
            if i in added:  # see __init__
                parts += [self._hf.decode(keep[start:end], skip_special_tokens=False), added[i]]
                start = end + 1
        return "".join([*parts, self._hf.decode(keep[start:], skip_special_tokens=False)])

    def to_dict(self) -> dict[str, Any]:
        return {**_base_dict(self), "hf_tokenizer": self._hf.to_str()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> _HFTokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        try:
            hf = HFTokenizer.from_str(data["hf_tokenizer"])
        except Exception as e:  # HF raises a bare Exception for malformed JSON
            raise DataError(
                f"the embedded {cls.kind} tokenizer is corrupt ({e}); save the tokenizer again"
            ) from None
        unk = getattr(hf.model, "unk_token", None)
        if unk is not None and hf.token_to_id(unk) is None:  # HF fails on the first unknown word instead
            raise DataError(
                f"the embedded {cls.kind} tokenizer's unknown token {unk!r} is not in its vocabulary; "
                "save the tokenizer again"
            )
        size, ids = hf.get_vocab_size(with_added_tokens=True), set(hf.get_vocab(with_added_tokens=True).values())
        if ids != set(range(size)):  # a gap or a shared id: encode would give ids beyond the embedding
            missing = min(set(range(size)) - ids)
            raise DataError(
                f"the embedded {cls.kind} tokenizer's {size} tokens do not have the ids 0 to {size - 1} "
                f"(none has id {missing}, the largest is {max(ids)}); save the tokenizer again"
            )
        return cls(hf, SpecialTokens.saved(data["specials"]))

    @staticmethod
    def _deterministic(hf: Any) -> Any:
        """`hf` encoding every id of a text and no more, the same ids at every call: HF applies its own truncation
        and padding settings in encode (an HF tokenizer.json, as all-MiniLM-L6-v2's, pads and cuts to 128), and BPE
        dropout skips merges at random. A tokenizer with such settings is copied without them (the caller's own
        object is left as it is); read from a file or wrapped, it encodes alike."""
        if hf.truncation is None and hf.padding is None and not getattr(hf.model, "dropout", None):
            return hf
        from tokenizers import Tokenizer as HFTokenizer

        hf = HFTokenizer.from_str(hf.to_str())
        hf.no_truncation()
        hf.no_padding()
        if getattr(hf.model, "dropout", None):
            hf.model.dropout = None
        return hf

    @staticmethod
    def _train_hf(hf: Any, trainer: Any, texts: str | Iterable[str]) -> None:
        hf.train_from_iterator(_each_checked(texts), trainer=trainer)


# A subword vocabulary's size is the user's choice: unset, the messages said "got None; raise it".
_NEEDS_SIZE = ("a {kind} tokenizer learns as many tokens as vocab_size asks (data.vocab_size in a run config), which "
               "is not set; set it, at least {least} (e.g. --set data.vocab_size=8000)")


@TOKENIZERS.register("bpe")
class BPETokenizer(_HFTokenizer):
    """Byte-level BPE (GPT-2 style): every text encodes without unk, and decode gives it back exactly.

    The special tokens' strings ("<mask>", "<eos>"...) in a text encode as those specials, so a prompt can
    name them; decode drops padding, so a literal "<pad>" does not come back."""

    kind = "bpe"

    @classmethod
    def train(
        cls,
        texts: str | Iterable[str],
        vocab_size: int = 8000,
        *,
        min_frequency: int = 2,
        specials: SpecialTokens | Mapping[str, str | None] | None = None,
    ) -> BPETokenizer:
        """Learn merges on `texts` until `vocab_size` tokens (256 byte symbols + specials + merges)."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        specials = SpecialTokens.coerce(specials)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        smallest = len(alphabet) + len(specials.tokens())
        if vocab_size is None:
            raise ConfigError(_NEEDS_SIZE.format(kind="bpe", least=smallest))
        if vocab_size < smallest:
            raise ConfigError(
                f"bpe vocab_size (data.vocab_size in a run config) must be at least {smallest} "
                f"(256 byte symbols + {len(specials.tokens())} specials), "
                f"got {vocab_size}; raise it or use the char tokenizer"
            )
        hf = HFTokenizer(models.BPE(unk_token=specials.unk))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=specials.tokens(),
            initial_alphabet=alphabet,
            show_progress=False,
        )
        cls._train_hf(hf, trainer, texts)
        return cls(hf, specials)


@TOKENIZERS.register("wordpiece")
class WordPieceTokenizer(_HFTokenizer):
    """BERT's WordPiece: split on whitespace and punctuation, "##" marks a word's continuation pieces.

    Decoding joins a word's "##" pieces and puts one space between words and punctuation marks, except
    before ".", ",", "!" and "?": "Hello, world!" comes back as written, but "It's (a) test." as
    "It ' s ( a ) test." and "3.14" as "3. 14" (whitespace runs become one space). A word of more than 100
    characters encodes as one unk token (HF's `max_input_chars_per_word`).
    """

    kind = "wordpiece"

    @classmethod
    def train(
        cls,
        texts: str | Iterable[str],
        vocab_size: int = 8000,
        *,
        min_frequency: int = 2,
        lowercase: bool = False,
        specials: SpecialTokens | Mapping[str, str | None] | None = None,
    ) -> WordPieceTokenizer:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

        specials = SpecialTokens.coerce(specials)
        if specials.unk is None:
            raise ConfigError(
                "wordpiece needs an unk special token for words it cannot split; set specials.unk"
            )
        if vocab_size is None:
            raise ConfigError(_NEEDS_SIZE.format(kind="wordpiece", least=len(specials.tokens()) + 1))
        if vocab_size <= len(specials.tokens()):
            raise ConfigError(f"wordpiece vocab_size must exceed the {len(specials.tokens())} special tokens, got "
                              f"{vocab_size}; raise vocab_size (data.vocab_size in a run config)")
        def pipeline(model):
            hf = HFTokenizer(model)
            hf.normalizer = normalizers.BertNormalizer(
                clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=lowercase
            )
            hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            hf.decoder = decoders.WordPiece(prefix="##", cleanup=True)
            return hf

        hf = pipeline(models.WordPiece(unk_token=specials.unk, continuing_subword_prefix="##"))
        texts = [texts] if isinstance(texts, str) else texts
        if iter(texts) is texts:  # a one-shot iterator: kept, as the alphabet pass reads the texts first (a
            texts = list(texts)  # re-readable corpus is read twice, not held in memory)

        def words(text: str) -> list[str]:
            return [word for word, _ in hf.pre_tokenizer.pre_tokenize_str(hf.normalizer.normalize_str(text))]

        # HF's trainer numbers the "##" forms of characters in hash-map order, and equal merge counts are
        # broken by those numbers, so the same text could give another vocabulary in another process
        # (huggingface/tokenizers#1794). Giving every character and its "##" form a number up front, in
        # sorted order, makes training deterministic; the "##" forms are then ordinary vocabulary entries.
        # The characters of the words: those of the normalised text that the pre-tokenizer keeps (it drops spaces and
        # keeps the rest, whatever surrounds them), so each distinct character is asked once, not each of the text
        # (a pass over every word in Python took ~60 % of the training time).
        seen: set[str] = set()
        for text in _each_checked(texts):
            seen.update(hf.normalizer.normalize_str(text))
        alphabet = sorted(c for c in seen if [word for word, _ in hf.pre_tokenizer.pre_tokenize_str(c)] == [c])
        # Only characters that can follow another one inside a word get a "##" form: BERT's normalizer and
        # pre-tokenizer make every CJK character and punctuation mark a word of its own, so "##中" or "##,"
        # could never be encoded, and on CJK text those dead forms would take the whole vocab_size.
        joining = [c for c in alphabet if len(words("a" + c)) == 1]
        fixed = specials.tokens() + ["##" + c for c in joining]
        least = len(fixed) + len(alphabet)  # every character alone, the "##" forms that can occur, the specials
        if vocab_size < least:
            warnings.warn(f"wordpiece vocab_size {vocab_size} is below the {least} tokens the text's {len(alphabet)} "
                          f"characters need (each alone, {len(joining)} of them also as a '##' piece, with "
                          f"{len(specials.tokens())} specials); the vocabulary has {least} tokens; raise vocab_size "
                          "(data.vocab_size) to learn longer pieces", stacklevel=2)
        trainer = trainers.WordPieceTrainer(
            vocab_size=max(vocab_size, least),
            min_frequency=min_frequency,
            special_tokens=fixed,
            initial_alphabet=alphabet,
            continuing_subword_prefix="##",
            show_progress=False,
        )
        cls._train_hf(hf, trainer, texts)
        vocab = hf.get_vocab()  # the trained pieces, specials and "##" forms included, with their ids
        hf = pipeline(models.WordPiece(vocab, unk_token=specials.unk, continuing_subword_prefix="##"))
        hf.add_special_tokens(specials.tokens())
        return cls(hf, specials)


# ------------------------------------------------------------------------------------------------
# Factory and loading
# ------------------------------------------------------------------------------------------------
def train_tokenizer(
    kind: str, texts: str | Iterable[str], vocab_size: int | None = None, **options: Any
) -> Tokenizer:
    """Train a tokenizer of `kind` ("char", "word", "bpe", "wordpiece") on `texts`.

    Args:
        kind: tokenizer family; an unknown kind raises ConfigError listing the allowed ones.
        texts: one string or an iterable of strings (lines, documents), read once.
        vocab_size: total size including specials; None keeps every char/word (required for bpe/wordpiece).
        options: passed to the class's `train` (specials, min_frequency, pattern, lowercase...).
    """
    cls = TOKENIZERS.get(kind)
    train = cls.train  # type: ignore[attr-defined]
    allowed = [p for p in inspect.signature(train).parameters if p not in ("texts", "vocab_size")]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(
            f"{kind} tokenizer has no option(s) {', '.join(unknown)}; its options are: {', '.join(allowed)}"
        )
    # Whole numbers of at least 1, or one line: a float or a string failed inside HF's trainer or ours (a TypeError,
    # an OverflowError for -1), and a min_frequency of 0 or below was taken as 1.
    for name, value in (("vocab_size", vocab_size), ("min_frequency", options.get("min_frequency", 1))):
        if (value is not None or name == "min_frequency") and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
            raise ConfigError(f"{kind} tokenizer: {name} must be a whole number of at least 1, got {value!r}")
    if "min_frequency" in options:
        options["min_frequency"] = int(options["min_frequency"])
    return train(texts, None if vocab_size is None else int(vocab_size), **options)


def tokenizer_from_dict(data: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from `Tokenizer.to_dict()`."""
    kind = data.get("type") if isinstance(data, dict) else None
    if kind is None and isinstance(data, dict) and {"model", "added_tokens"} <= set(data):
        raise DataError("this is a Hugging Face tokenizers file, not attnlab's (whose JSON names its \"type\"); "
                        "save an attnlab tokenizer in its place (Tokenizer.save)")
    if not isinstance(kind, str) or kind not in TOKENIZERS:  # a list or object is no name (and unhashable)
        raise DataError(f"unknown tokenizer type {kind!r}; expected one of: {', '.join(TOKENIZERS.names())}")
    version = data.get("version", FORMAT_VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        raise DataError(f"tokenizer format version {version!r} is not a whole number; write "
                        f'"version": {FORMAT_VERSION} (a number, without quotes) or save the tokenizer again')
    if version < 1:
        raise DataError(f"tokenizer format version {version} does not exist (they start at 1); write "
                        f'"version": {FORMAT_VERSION} or save the tokenizer again')
    if version > FORMAT_VERSION:
        raise DataError(
            f"tokenizer format version {version!r} is newer than this attnlab reads; upgrade attnlab"
        )
    try:
        return TOKENIZERS.get(kind).from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, ConfigError):
            raise DataError(f"tokenizer file is inconsistent: {e}") from None
        raise DataError(
            f"tokenizer data is missing or has a bad field ({e!r}); save the tokenizer again"
        ) from None


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """Read a tokenizer saved by `Tokenizer.save`: a JSON file, a folder holding tokenizer.json, or a run folder
    (`attnlab train` saves it in the run's checkpoint/)."""
    path = Path(path)
    if path.is_dir():
        folder = path
        path = path / TOKENIZER_FILE
        if not path.is_file():  # a run folder: its checkpoint's (or the .old copy a crashed save left, or best/)
            from attnlab.training.checkpoint import checkpoint_in_place, find_checkpoint

            inside = checkpoint_in_place(folder / "checkpoint") / TOKENIZER_FILE
            if not inside.is_file():
                try:
                    inside = find_checkpoint(folder) / TOKENIZER_FILE  # the folder generate would load
                except CheckpointError:
                    pass
            path = inside if inside.is_file() else path
        if not path.is_file():
            raise CheckpointError(  # a checkpoint without one: weights converted or saved on their own
                f"folder '{folder}' has no {TOKENIZER_FILE}, which the text is read with; give a run or checkpoint "
                f"folder that has one, or save its tokenizer there (Tokenizer.save)"
            )
    if not path.is_file():
        raise DataError(f"tokenizer file '{path}' does not exist; check the path")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    # ValueError: not UTF-8, not JSON, or a number of more than 4,300 digits; RecursionError: nested too deep
    except (ValueError, RecursionError) as e:
        raise DataError(
            f"tokenizer file '{path}' is not valid JSON ({one_line(e)}); save the tokenizer again"
        ) from None
    try:
        return tokenizer_from_dict(data)
    except DataError as e:
        raise DataError(f"tokenizer file '{path}': {e}") from None
