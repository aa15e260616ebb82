"""Corpora as flat files of token ids, memory-mapped, so text larger than RAM still trains.

`build_token_file(source, tokenizer, "train.bin")` encodes text block by block and appends the ids
to `train.bin` (uint16 when the vocabulary fits, else uint32), with a JSON sidecar
`train.bin.json` (dtype, length, vocabulary size). `TokenFile("train.bin")` maps it back read-only.

`pydoc_corpus()` is the embedded default corpus: Python's own help texts, so a first run needs no
download.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.data.text_files import BLOCK_BYTES, iter_text_blocks, read_text
from attnlab.data.tokenizers import Tokenizer, last_piece_cut, last_word_cut
from attnlab.errors import ConfigError, DataError
from attnlab.files import atomic_path, write_text_atomic

__all__ = ["TokenFile", "build_token_file", "pydoc_corpus", "read_text", "sidecar_path", "token_dtype"]

SIDECAR_FORMAT = "attnlab-token-ids"


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype holding every id: uint16 below 65,536 tokens, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


class NoTokens(DataError):
    """A text that encodes to no token ids: empty, or only characters the tokenizer's normaliser drops (control
    and zero-width characters under WordPiece). Callers that know the text's file name it."""


NO_TOKENS_FIX = ("encodes to no tokens: every character is one the tokenizer drops (control or zero-width "
                 "characters, for WordPiece); give a file of text")


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".json")


class TextStream:
    """Consecutive pieces of one text (e.g. `iter_text_blocks` of a part of a file), for `build_token_file`:
    re-cut where the pieces encode as the whole text does, unlike an iterable of documents, whose items are
    encoded each on its own."""

    def __init__(self, pieces: Iterable[str]):
        self.pieces = pieces


def _recut(pieces: Iterable[str]) -> Iterator[str]:
    """Consecutive pieces of a text as blocks cut before a line end that follows a non-space character
    (`last_piece_cut`), so that each block encodes to its share of the whole text's ids. A line of megabytes
    is cut before a space or tab that follows a non-space character (`last_word_cut`)."""
    carry = ""
    for piece in pieces:
        if not isinstance(piece, str):  # bytes had failed as Python's "can only concatenate str"
            raise ConfigError(f"build_token_file: a TextStream holds strings, got a piece of type "
                              f"{type(piece).__name__}")
        text = carry + piece
        cut = last_piece_cut(text)
        if cut <= 0 and len(text) >= 4 * BLOCK_BYTES:  # no line end to cut at for megabytes (text8): between words
            cut = last_word_cut(text)
            if cut <= 0:  # no whitespace either: cut at the end
                cut = len(text)
        if cut > 0:
            yield text[:cut]
        carry = text[cut:] if cut > 0 else text
    if carry:
        yield carry


def _blocks(source: str | os.PathLike[str] | TextStream | Iterable[str], block_chars: int) -> Iterator[str | list[str]]:
    """The source in blocks of about `block_chars` characters (a Path: about a megabyte, streamed).

    A string, a Path or a `TextStream` gives strings, cut before a line end that follows a non-space character
    (`last_piece_cut`), or where a line is longer than a block, before a space or tab that follows one
    (`last_word_cut`): the blocks encode to the ids of the whole text. Only text without such a space is cut
    between any two characters. An iterable of documents gives lists of its items, kept whole.
    """
    if isinstance(source, os.PathLike):
        yield from _recut(iter_text_blocks(source, BLOCK_BYTES))
        return
    if isinstance(source, TextStream):
        yield from _recut(source.pieces)
        return
    if isinstance(source, str):
        start = 0
        while start < len(source):
            end = min(start + block_chars, len(source))
            if end < len(source):
                cut = last_piece_cut(source, start, end)
                if cut <= start:  # a line longer than the block
                    cut = last_word_cut(source, start, end)
                end = cut if cut > start else end
            yield source[start:end]
            start = end
        return
    group: list[str] = []
    size = 0
    for item in source:
        if not isinstance(item, str):
            raise ConfigError(
                f"build_token_file: expected strings, got an item of type {type(item).__name__}"
            )
        group.append(item)
        size += len(item)
        if size >= block_chars:
            yield group
            group, size = [], 0
    if group:
        yield group


def build_token_file(
    source: str | os.PathLike[str] | TextStream | Iterable[str],
    tokenizer: Tokenizer,
    out_path: str | os.PathLike[str],
    *,
    dtype: str | np.dtype | None = None,
    add_eos: bool = False,
    block_chars: int = BLOCK_BYTES,
) -> TokenFile:
    """Encode `source` and write its ids to `out_path` (flat binary) plus `out_path + ".json"`.

    Streams: at most one block of text and its ids are in memory at a time.

    Args:
        source: a string (cut into ~1 MB blocks at line ends, or between words), a path (`pathlib.Path`,
            streamed from disk), a `TextStream` (consecutive pieces of one text: both give the ids of the whole
            text), or an iterable of strings (lines, documents), each encoded on its own with the ids
            concatenated; keep the newline in lines if the tokenizer should see it.
        tokenizer: any `Tokenizer`.
        out_path: the binary file; the folder is created.
        dtype: "uint16" or "uint32"; None picks the smallest that holds the vocabulary.
        add_eos: append the tokenizer's eos id after each item of an iterable source (documents).
        block_chars: characters encoded per block.

    Returns:
        the written file opened as a `TokenFile`.
    """
    out_path = Path(out_path)
    dt = token_dtype(tokenizer.vocab_size) if dtype is None else np.dtype(dtype)
    if dt not in (np.dtype(np.uint16), np.dtype(np.uint32)):
        raise ConfigError(f"token file dtype must be uint16 or uint32, got {dt}")
    if tokenizer.vocab_size > np.iinfo(dt).max + 1:
        raise ConfigError(f"a vocabulary of {tokenizer.vocab_size} tokens does not fit {dt}; use uint32")
    eos = tokenizer.eos_id if add_eos else None
    if add_eos and eos is None:
        raise ConfigError("add_eos needs a tokenizer with an eos token; train it with specials.eos set")
    if add_eos and isinstance(source, (str, os.PathLike, TextStream)):  # it had been left out without a word
        raise ConfigError("add_eos puts an eos after each document of an iterable of documents; a string, a file or "
                          "a TextStream is one text: give its documents as an iterable of strings, or leave add_eos "
                          "out")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    length = 0
    with atomic_path(out_path) as tmp:  # per process: under torchrun every process writes the same files
        with open(tmp, "wb") as f:
            began = False  # whether a block of the text was encoded (the blocks after it continue the text)
            for group in _blocks(source, block_chars):
                if eos is None or isinstance(group, str):  # a text's block: eos marks documents, not blocks
                    ids = tokenizer.encode_array(group, continues=began)  # a list of documents ignores it
                    began = True
                else:
                    parts = [
                        np.append(np.asarray(x, dtype=np.int64), eos) for x in tokenizer.encode_batch(group)
                    ]
                    ids = np.concatenate(parts)
                f.write(ids.astype(dt).tobytes())
                length += len(ids)
        if length == 0:
            raise NoTokens(f"no tokens to write to '{out_path}': the text is empty; give a non-empty corpus")
    meta = {
        "format": SIDECAR_FORMAT,
        "version": 1,
        "dtype": dt.name,
        "length": length,
        "vocab_size": tokenizer.vocab_size,
        "tokenizer": tokenizer.kind,
    }
    write_text_atomic(sidecar_path(out_path), json.dumps(meta, indent=1) + "\n")
    return TokenFile(out_path)


class TokenFile:
    """A token-id file written by `build_token_file`, memory-mapped read-only.

    Supports `len`, integer and slice indexing (returning numpy values/arrays backed by the map) and
    fancy indexing with an index array (the batch sources gather windows this way).
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        meta_path = sidecar_path(self.path)
        if not self.path.is_file():
            raise DataError(f"token file '{self.path}' does not exist; build it with build_token_file")
        if not meta_path.is_file():
            raise DataError(f"token file '{self.path}' has no sidecar '{meta_path.name}'; rebuild it")
        try:
            meta: dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8"))
            self.dtype = np.dtype(meta["dtype"])
            self.length = int(meta["length"])
            self.vocab_size = int(meta["vocab_size"])
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise DataError(
                f"token file sidecar '{meta_path}' is corrupt ({e!r}); rebuild the token file"
            ) from None
        if self.dtype not in (np.dtype(np.uint16), np.dtype(np.uint32)):  # what build_token_file writes
            raise DataError(f"token file sidecar '{meta_path}' is corrupt (dtype {meta['dtype']!r}, where token "
                            "files hold uint16 or uint32 ids); rebuild the token file")
        self.meta = meta
        expected = self.length * self.dtype.itemsize
        actual = self.path.stat().st_size
        if actual != expected or self.length == 0:
            raise DataError(
                f"token file '{self.path}' has {actual} bytes but its sidecar says "
                f"{self.length} {self.dtype} ids "
                f"({expected} bytes); rebuild the token file"
            )
        self.ids = np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.length,))

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: Any) -> Any:
        return self.ids[index]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.asarray(self.ids, dtype=dtype)

    def __repr__(self) -> str:
        return (
            f"TokenFile('{self.path}', length={self.length}, dtype={self.dtype.name}, "
            f"vocab_size={self.vocab_size})"
        )


def pydoc_corpus() -> str:
    """Every help text of the standard library's `pydoc_data.topics`, sorted by topic, blank-line separated.

    About 460 KB of English technical prose, present wherever Python is, so it needs no download.
    """
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key].strip() for key in sorted(topics)) + "\n"


def corpus_text(path: str | os.PathLike[str] | None = None) -> str:
    """The text of `path`, or the embedded pydoc corpus when `path` is None."""
    return pydoc_corpus() if path is None else read_text(path)
