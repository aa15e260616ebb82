"""Reading text data files with errors a user can act on.

Every problem with a file (missing, a directory, empty, not UTF-8, a malformed line) raises
`DataError` with one line naming the file, the place (line number or byte offset) and the fix.

- `read_text(path)`, `read_lines(path)`: whole files (one sentence per line for parallel text).
- `iter_text_blocks(path)`: a big file in ~1 MB blocks cut at line ends, for streaming.
- `read_classification_file(path, ...)`: (text, label) examples from TSV, CSV or JSONL.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import decimal
import io
import json
import os
import re
import struct
import sys
import unicodedata
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from attnlab.errors import ConfigError, DataError, one_line

BLOCK_BYTES = 1 << 20

# Header names recognised without being told (GLUE and common data sets), most specific first.
TEXT_COLUMN_NAMES = ("sentence", "text", "review", "content", "document", "sentence1")
LABEL_COLUMN_NAMES = ("label", "labels", "class", "category", "target", "sentiment",
                      "is_duplicate", "quality")  # the last two: GLUE's own QQP and MRPC files
# The two texts of sentence-pair tasks, as headers name them (GLUE's RTE/WNLI/MRPC, QNLI, QQP and MNLI/SNLI as
# Hugging Face datasets exports them; GLUE's own QQP and MRPC files). attnlab's classifiers read one text, so a
# file with both is refused unless the text column is named: read alone, the first would train silently on
# half of every example.
PAIR_COLUMNS = (("sentence1", "sentence2"), ("question", "sentence"), ("question1", "question2"),
                ("premise", "hypothesis"), ("#1 string", "#2 string"))
FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl"}
# The longest CSV field read: no limit but the most a C long (csv's limit) holds, 2**31 - 1 where it is 32 bits.
CSV_FIELD_LIMIT = 2 ** (8 * struct.calcsize("l") - 1) - 1


def check_file(path: str | os.PathLike[str], what: str = "data file", *, pipes: bool = False) -> Path:
    """The path as a Path, or DataError if it is missing, a directory, or empty; with `pipes`, a pipe or a
    device (`<(...)`, /dev/stdin) passes, for a reader that reads the file once (its emptiness is found on
    reading it)."""
    if not str(path).strip():  # Path("") is the working folder: "'.' is a directory" named no mistake
        raise DataError(f"{what}: the path is empty; give a file's path")
    path = Path(path)
    if not path.exists():
        raise DataError(f"{what} '{path}' does not exist; check the path")
    if path.is_dir():
        raise DataError(f"{what} '{path}' is a directory; pass a file inside it")
    if pipes and not path.is_file():
        return path
    if not path.is_file():  # a pipe (<(...), /dev/stdin) or a device: its size 0 had been called empty
        raise DataError(f"{what} '{path}' is not a regular file (a pipe or a device), which attnlab does not read "
                        "(most data is read more than once); save it to a file and give that")
    if path.stat().st_size == 0:
        raise DataError(f"{what} '{path}' is empty; give a file with data in it")
    return path


# The magic numbers of the compressed and archive formats a data file is most often mistaken for, with the
# command that unpacks each.
COMPRESSED = ((b"\x1f\x8b", "gzip", "gunzip -k"), (b"BZh", "bzip2", "bunzip2 -k"),
              (b"\xfd7zXZ\x00", "xz", "unxz -k"), (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
              (b"PK\x03\x04", "zip", "unzip"))


def _decode_error(path: Path, err: UnicodeDecodeError, base_offset: int = 0, base_line: int = 0,
                  head: bytes | None = None) -> DataError:
    """`head`: the file's first bytes where the caller holds them (a pipe cannot be read twice)."""
    if head is None:
        with open(path, "rb") as f:
            head = f.read(6)
    for magic, name, unpack in COMPRESSED:
        if head.startswith(magic):
            return DataError(f"data file '{path}' is {name}-compressed, not text; unpack it first "
                             f"({unpack} '{path}') and give the unpacked file")
    if head[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        return DataError(f"data file '{path}' is not UTF-8 but UTF-16 (it starts with a UTF-16 byte-order mark); "
                         f"re-encode it as UTF-8 (e.g. iconv -f utf-16 -t utf-8 '{path}' > new.txt)")
    data = err.object
    if data[:BLOCK_BYTES].count(0) * 100 > min(len(data), BLOCK_BYTES):  # over 1 % NUL bytes
        return DataError(f"data file '{path}' looks like a binary file, not text (it is not UTF-8 and holds NUL "
                         "bytes); give a text file")
    offset = base_offset + err.start
    line = base_line + data[: err.start].count(b"\n") + 1
    bad = data[err.start : err.start + 1].hex()
    return DataError(
        f"data file '{path}' is not UTF-8: byte 0x{bad} at line {line} (byte offset {offset}) "
        "cannot be decoded; "
        "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
    )


def _nul_error(path: Path, text: str, base_line: int = 0) -> DataError:
    """NUL is valid UTF-8 but no text holds it: a file of them is UTF-16 without a byte-order mark (every
    ASCII character followed or preceded by a zero byte) or binary data, which would otherwise be read as
    text (a vocabulary of '\x00' and letters, or a TSV "without tabs")."""
    line = base_line + text.count("\n", 0, text.index("\x00")) + 1
    return DataError(f"data file '{path}' holds NUL characters (the first at line {line}): it looks like UTF-16 "
                     f"without a byte-order mark, or binary data; re-encode it as UTF-8 (e.g. iconv -f utf-16le "
                     f"-t utf-8 '{path}' > new.txt) or give a text file")


def _newlines_before(path: Path, offset: int) -> int:
    """The line ends in the file's first `offset` bytes (read a block at a time)."""
    count = 0
    with open(path, "rb") as f:
        while offset > 0:
            data = f.read(min(BLOCK_BYTES, offset))
            if not data:
                break
            count += data.count(b"\n")
            offset -= len(data)
    return count


STDIN_NAME = "<standard input>"  # how messages name it


def file_name(path: str | os.PathLike[str], *, pipes: bool = False) -> str:
    """How messages name the file at `path`: STDIN_NAME for "-" where `pipes` reads it as standard input."""
    return STDIN_NAME if pipes and str(path) == "-" else str(path)


def read_text(path: str | os.PathLike[str], *, pipes: bool = False) -> str:
    """The whole file as a string (UTF-8, a leading byte-order mark dropped). With `pipes`, a pipe or a device
    is read too (see `check_file`), and "-" reads standard input."""
    if pipes and str(path) == "-":
        path, data = Path(STDIN_NAME), sys.stdin.buffer.read()
    else:
        path = check_file(path, pipes=pipes)
        data = path.read_bytes()
    if not data:  # a pipe that gave nothing (a regular file's size was checked)
        raise DataError(f"data file '{path}' is empty; give a file with data in it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _decode_error(path, e, head=data[:6]) from None
    if b"\x00" in data:  # on the bytes: ~40x faster than on text beyond Latin-1
        raise _nul_error(path, text)
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise DataError(f"data file '{path}' has only whitespace; give a file with data in it")
    return text


def split_lines(text: str, path: str | os.PathLike[str] | None = None) -> list[str]:
    r"""Lines split on "\n" only (not on the other characters `str.splitlines` treats as breaks, which
    would misalign parallel files), without a final empty line and without "\r". With the `path` the text was
    read from, DataError where its lines end in a lone "\r" (classic Mac OS), which would read as one line."""
    if path is not None and "\r" in text:  # the common file has no "\r": one scan
        _check_line_ends(Path(path), text)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _check_line_ends(path: Path, text: str) -> None:
    """DataError where lone CRs (not followed by LF) outnumber the LFs: a file whose lines end in CR only, whose
    lines, sentences or rows would run together; a CR in a line of a file of LF or CRLF line ends passes."""
    lone = text.count("\r") - text.count("\r\n")
    if lone > text.count("\n"):
        raise DataError(f"data file '{path}' uses CR-only line ends (classic Mac OS), so its lines would read as "
                        f"one; convert them to LF (e.g. tr '\\r' '\\n' < '{path}' > new.txt, or mac2unix)")


def read_lines(path: str | os.PathLike[str], *, pipes: bool = False) -> list[str]:
    """The lines of a file (see `split_lines`); `pipes` as for `read_text`."""
    return split_lines(read_text(path, pipes=pipes), file_name(path, pipes=pipes))


def split_documents(text: str, path: str | os.PathLike[str] | None = None) -> list[list[str]]:
    """BERT's pre-training text layout: documents separated by blank lines, one sentence (or segment) per
    line. Returns each document's non-blank lines, stripped; documents without any are dropped. A line of
    invisible format characters (a zero-width space, a byte order mark) or control characters (U+0001) only is
    blank: WordPiece's normaliser (BERT's) drops them, which left a sentence of no tokens. With the `path` the
    text was read from, lines ending in a lone "\r" are refused (see `split_lines`): they made one document of
    one sentence."""
    documents: list[list[str]] = [[]]
    for line in split_lines(text, path):
        line = line.strip()
        if line and all(c.isspace() or unicodedata.category(c) in ("Cf", "Cc") for c in line):
            line = ""
        if line:
            documents[-1].append(line)
        elif documents[-1]:
            documents.append([])
    return [doc for doc in documents if doc]


def held_out_documents(documents: Sequence[Sequence[str]], fraction: float, *,
                       min_documents: int = 1) -> tuple[list[list[str]], list[list[str]]]:
    """(train, held_out): the last `fraction` of a BERT pre-training corpus kept for evaluation.

    Whole documents when that holds out at least two; otherwise (a corpus of one or a few long documents,
    such as one sentence per line with no blank lines), or where the last whole documents are too short to
    give sentence pairs, the last `fraction` of the sentences, the document where they start cut in two.
    Each part must keep a sentence pair (a document of two sentences) and `min_documents` documents (2 where
    random next sentences are drawn from other documents); where the sentence cut cannot give both that,
    nothing is held out (held_out is empty).
    """

    def usable(part: list[list[str]]) -> bool:
        return len(part) >= min_documents and any(len(doc) >= 2 for doc in part)

    docs = [list(doc) for doc in documents]
    n_docs = int(len(docs) * fraction)
    if n_docs >= 2 and usable(docs[:-n_docs]) and usable(docs[-n_docs:]):
        return docs[:-n_docs], docs[-n_docs:]
    total = sum(len(doc) for doc in docs)
    n_sentences = int(total * fraction)
    if n_sentences < 2:
        return docs, []
    cut, seen = total - n_sentences, 0  # sentences before `cut` train, the rest are held out
    train, held = [], []
    for doc in docs:
        k = min(max(cut - seen, 0), len(doc))  # this document's sentences before the cut
        if k:
            train.append(doc[:k])
        if k < len(doc):
            held.append(doc[k:])
        seen += len(doc)
    return (train, held) if usable(train) and usable(held) else (docs, [])


def iter_text_blocks(path: str | os.PathLike[str], block_bytes: int = BLOCK_BYTES, *, start: int = 0,
                     stop: int | None = None) -> Iterator[str]:
    """The file's text in blocks of about `block_bytes`, each ending at a line end (except the last, and
    except where a line is longer than four blocks: it is then cut between characters).

    Concatenating the blocks gives `read_text(path)`; memory stays at one block. `start` and `stop` (byte
    offsets at character boundaries, e.g. from `line_split_offset`) read a part of the file.
    """
    path = check_file(path)
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = start  # bytes read before the current block
    newlines = 0  # line ends decoded before the current block (counted from `start`)
    carry = ""
    first = start == 0
    with open(path, "rb") as f:
        f.seek(start)
        while True:
            want = block_bytes if stop is None else max(0, min(block_bytes, stop - offset))
            data = f.read(want) if want else b""
            final = not data
            pending = len(decoder.getstate()[0])  # bytes of a character cut by the previous block
            try:
                text = decoder.decode(data, final=final)
            except UnicodeDecodeError as e:  # lines are counted from the file's start, not from `start`
                line = _newlines_before(path, start) + newlines
                raise _decode_error(path, e, base_offset=offset - pending, base_line=line) from None
            if b"\x00" in data:  # a NUL byte is never part of a multi-byte character: the text holds it too
                raise _nul_error(path, text, base_line=_newlines_before(path, start) + newlines)
            offset += len(data)
            newlines += text.count("\n")
            if first and text:
                text = text.removeprefix("\ufeff")
                first = False
            text = carry + text
            if final:
                if text:
                    yield text
                return
            cut = text.rfind("\n") + 1
            if cut == 0:
                if len(text) < 4 * block_bytes:
                    carry = text
                    continue
                cut = len(text)  # a very long line: cut it rather than hold it all
            carry = text[cut:]
            yield text[:cut]


def check_text(path: str | os.PathLike[str]) -> Path:
    """`check_file`, and the file must hold more than whitespace (as `read_text` checks), read a block at a
    time until one does."""
    path = check_file(path)
    if not any(block.strip() for block in iter_text_blocks(path)):
        raise DataError(f"data file '{path}' has only whitespace; give a file with data in it")
    return path


def line_split_offset(path: str | os.PathLike[str], fraction: float) -> int:
    """A byte offset near `fraction` of the file's size where a line starts (the first line end at or after
    it), or, in a line longer than a block, the nearest character boundary: the place to cut a file into a
    training and a held-out part without reading it whole. Where the file's last line spans the target (no
    line starts after it, or only lines of blanks: a final line end is no line to hold out), the start of that
    line if that holds out at most twice the share asked for and lies within a block before the target; else a
    character boundary."""
    path = check_file(path)
    size = path.stat().st_size
    target = min(size, max(0, int(size * fraction)))
    with open(path, "rb") as f:
        f.seek(target)
        ahead = f.read(BLOCK_BYTES)
    newline = ahead.find(b"\n")
    at_end = target + len(ahead) >= size
    if newline >= 0 and not (at_end and not ahead[newline + 1:].strip()):
        return target + newline + 1
    # No line starts after the target but a last one of blanks (a file's final line end among them): that one
    # would hold out nothing, where the file without it holds out its last line.
    if at_end and target > 0:  # the last line runs from before the target to the end
        # Its start, if that holds out at most twice the share asked for (a long last paragraph would
        # otherwise take most of the file); else a character boundary, as in any long line.
        back = max(0, target - BLOCK_BYTES, size - 2 * (size - target))
        with open(path, "rb") as f:
            f.seek(back)
            behind = f.read(target - back)
        newline = behind.rfind(b"\n")
        if newline >= 0:
            return back + newline + 1
    cut = 0
    while cut < len(ahead) and ahead[cut] & 0xC0 == 0x80:  # not inside a multi-byte UTF-8 character
        cut += 1
    return target + cut


# ------------------------------------------------------------------------------------------------
# Classification files
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class ClassificationData:
    """Examples from one file: `texts[i]` has label string `labels[i]` (None when the file has no labels),
    read from line `line_numbers[i]`."""

    texts: list[str]
    labels: list[str] | None
    line_numbers: list[int]
    path: str = ""

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def label_names(self) -> list[str]:
        """The distinct labels sorted (numerically when they are all integers)."""
        return sort_labels(set(self.labels or ()))

    def label_ids(self, label_names: Sequence[str] | None = None) -> list[int]:
        """Each example's index in `label_names` (default: this file's own sorted labels)."""
        if self.labels is None:
            raise DataError(f"data file '{self.path}' has no label column; pass label_column")
        names = list(label_names) if label_names is not None else self.label_names
        index = {name: i for i, name in enumerate(names)}
        out = []
        for label, line in zip(self.labels, self.line_numbers):
            if label not in index:
                raise DataError(
                    f"data file '{self.path}' line {line}: label {label!r} is not one of the known labels "
                    f"{names}{same_number_hint(label, names)}; fix the label or train with this label included"
                )
            out.append(index[label])
        return out


def sort_labels(labels: set[str] | Sequence[str]) -> list[str]:
    labels = set(labels)
    if all(_is_int(x) for x in labels):
        return sorted(labels, key=lambda x: (int(x), x))  # "1" and "01": ties in a fixed order
    return sorted(labels)


def _is_int(s: str) -> bool:
    try:
        int(s)
    except ValueError:
        return False
    return True


def _label_string(value: object, path: Path, line: int) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        shown = json.dumps(value, ensure_ascii=False, default=float)  # as JSON spells it: true, null, [0.5, 1]
        raise DataError(
            f"data file '{path}' line {line}: label {shown} is not a string or integer; fix the line"
        )
    if isinstance(value, (float, decimal.Decimal)):  # a JSON number with a point or exponent (1.0, 1e2), NaN
        number = decimal.Decimal(value)
        if not number.is_finite() or number != number.to_integral_value():
            shown = number if isinstance(value, decimal.Decimal) else json.dumps(value)  # NaN, as JSON spells it
            raise DataError(f"data file '{path}' line {line}: label {shown} is not an integer; fix the line")
        if number.adjusted() >= _MAX_DIGITS:  # 1e5000: as an integer of 5,000 digits is refused (not computed)
            raise DataError(f"data file '{path}' line {line}: label {value} is a number of more than "
                            f"{_MAX_DIGITS:,} digits; fix the line")
        value = int(number)
    text = str(value).strip()
    if not text:
        raise DataError(f"data file '{path}' line {line}: the label is empty; fix the line or drop it")
    return text


def detect_format(path: Path, format: str | None) -> str:
    if format is not None:
        if format not in ("tsv", "csv", "jsonl"):
            raise ConfigError(f"unknown data format {format!r}; choose one of: tsv, csv, jsonl")
        return format
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise DataError(
            f"cannot tell the format of '{path}' from its extension; "
            "name it .tsv, .csv or .jsonl"
        )
    return FORMATS[suffix]


def read_classification_file(
    path: str | os.PathLike[str],
    text_column: str | int | None = None,
    label_column: str | int | None = None,
    *,
    format: str | None = None,
    header: bool | None = None,
    require_labels: bool = True,
    training: bool = True,
) -> ClassificationData:
    """Read (text, label) examples from a TSV, CSV or JSONL file.

    Args:
        path: the file; its extension (.tsv/.csv/.jsonl) gives the format unless `format` is set.
        text_column, label_column: column names (files with a header row, JSONL keys) or 0-based
            indices (headerless files). None picks a known name ("sentence", "text"... / "label"...)
            from the header, or columns 0 and 1 when there is no header.
        header: whether the first TSV/CSV row names the columns; None detects it (a column name was
            given, or the first row holds known names such as SST-2's `sentence<TAB>label`).
        require_labels: when False a file without a label column (e.g. GLUE test sets) is accepted.
        training: whether the file trains a classifier, whose rows labelled -1 are warned of (see
            `_warn_unlabelled_rows`); a file scored by a trained one is not (its -1 is a class the model knows,
            or refused as unknown).

    Raises:
        DataError: missing, empty or non-UTF-8 file, a malformed line (with its line number), a
            missing column, an empty label, or no text that is not empty.
    """
    path = check_file(path)  # first: a folder or a pipe is named as such, not blamed on its extension
    fmt = detect_format(path, format)
    # read_text drops the file's byte-order mark; files saved with one and joined by `cat` hold more, each at the
    # start of a line, where it would stick to a label ("\ufeff1", a class of its own) or break a JSON line.
    text = read_text(path).replace("\n\ufeff", "\n").replace("\r\ufeff", "\r")
    if fmt == "jsonl":
        data = _read_jsonl(path, text, text_column, label_column, require_labels)
    else:
        data = _read_table(path, text, fmt, text_column, label_column, header, require_labels)
    if not any(t.strip() for t in data.texts):  # a classifier would learn the labels' frequencies only
        raise DataError(f"data file '{path}': every text is empty ({len(data.texts)} lines); check that "
                        "data.text_column (evaluate: --text-column) names the column of the texts")
    empty = [line for t, line in zip(data.texts, data.line_numbers) if not t.strip()]
    if empty:  # kept (a row's place and its label count), but a classifier sees no token of them
        warnings.warn(f"data file '{path}': {len(empty)} row(s) have an empty text (the first at line {empty[0]}); "
                      "they are read as examples of no words, labelled as written; fill or drop them",
                      stacklevel=2)
    _warn_same_number(data)
    if training:
        _warn_unlabelled_rows(data)
    return data


def _number(label: str) -> decimal.Decimal | None:
    """The number a label spells exactly (a float took 10000000000000000 and 10000000000000001 for one), or None."""
    try:
        value = decimal.Decimal(label)
    except decimal.InvalidOperation:
        return None
    return value if value.is_finite() else None


def same_number_hint(label: str, known: Sequence[str]) -> str:
    """For a label refused as unknown: "; ..." naming the known label that spells the same number ("1.0" where the
    training file had "1", as a JSON file reads 1.0), or "" when none does."""
    value = _number(label)
    twin = next((name for name in known if value is not None and _number(name) == value), None)
    return "" if twin is None else (f" ({label!r} spells the number of class {twin!r}, but labels are read as "
                                    "text: a JSON Lines number by its value, 1.0 as '1', a TSV or CSV cell as "
                                    "written; write the classes as whole numbers (1), or as the same text, in both "
                                    "files)")


def _warn_unlabelled_rows(data: ClassificationData) -> None:
    """Warn of a few rows labelled -1 among classes 0, 1, ...: how HF datasets write a row without a gold label
    (SNLI's pairs without one, 0.1–2 % of its splits), which would train as a class of its own. A -1 of 5 % of the
    rows or more is taken for a class (sentiment as -1, 0, 1), as are labels -1 and 1 (a binary task)."""
    labels = set(data.labels or ())
    others = labels - {"-1"}
    if "-1" not in labels or "0" not in others or not all(name.isdigit() for name in others):
        return
    rows = [line for label, line in zip(data.labels or (), data.line_numbers) if label == "-1"]
    if len(rows) * 20 >= len(data):
        return
    warnings.warn(f"data file '{data.path}': {len(rows)} row(s) are labelled -1 (the first at line {rows[0]}), "
                  "beside classes numbered from 0; -1 is how Hugging Face datasets mark a row without a label, and "
                  "here it is a class of its own; drop those rows unless -1 is meant as a class", stacklevel=3)


def _warn_same_number(data: ClassificationData) -> None:
    """Warn of two labels that spell one number ("1" and "1.0", "01"): each is a class of its own, as text labels are
    (a JSON number's spelling is not kept: 1.0 reads as "1")."""
    seen: dict[decimal.Decimal, str] = {}
    for name in sorted(set(data.labels or ())):
        value = _number(name)
        if value is None:
            continue
        if value in seen:
            warnings.warn(f"data file '{data.path}': the labels {seen[value]!r} and {name!r} are one number but two "
                          "classes, as labels are read as text; write each class one way", stacklevel=3)
            return
        seen[value] = name


# How to name the text and the label column: training's setting, and the flag of `evaluate` (which reads the same
# files with the same messages).
_SETTING = {"text": "set data.text_column (evaluate: --text-column)",
            "label": "set data.label_column (evaluate: --label-column)"}
# What a JSON value that is not a string is, in JSON's words.
_JSON_TYPES = {dict: "an object", list: "an array", int: "a number", float: "a number", decimal.Decimal: "a number",
               bool: "true or false", type(None): "null"}


_MAX_DIGITS = 4300  # Python's limit on the digits of an integer read from text (sys.get_int_max_str_digits)


def _json_number(text: str) -> decimal.Decimal | float:
    """A JSON number with a point or an exponent, exactly (a float read 9007199254740993.0 as ...992); one whose
    exponent is beyond Decimal's is the float it always was (inf, or 0.0)."""
    try:
        return decimal.Decimal(text)
    except decimal.InvalidOperation:
        return float(text)


def _check_no_surrogate(text: str, path: Path, line: int) -> None:
    """Refuse a JSON text holding half of a UTF-16 pair (a \\ud83d escape, as a string cut inside an emoji leaves),
    which is no character: UTF-8 files cannot hold one, JSON's escapes can."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(f"data file '{path}' line {line}: the text holds {text[e.start]!r} at character "
                        f"{e.start + 1}, half of a UTF-16 surrogate pair (a string cut inside a character), which is "
                        "no character; fix the line") from None


def _read_jsonl(path, text, text_column, label_column, require_labels) -> ClassificationData:
    texts: list[str] = []
    labels: list[str] = []
    lines: list[int] = []
    text_key, label_key = text_column, label_column
    array = "; a JSON array is not JSON Lines: write one object per line (e.g. jq -c '.[]' FILE > new.jsonl)"
    for number, line in enumerate(split_lines(text, path), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line, parse_float=_json_number)
        except RecursionError:
            raise DataError(f"data file '{path}' line {number}: JSON nested too deeply to read; fix the line") from None
        except json.JSONDecodeError as e:
            hint = array if not texts and line.lstrip().startswith("[") else "; fix the line"
            raise DataError(f"data file '{path}' line {number}: not valid JSON ({e.msg}){hint}") from None
        except ValueError as e:  # valid JSON that Python will not read: an integer of more than 4,300 digits
            raise DataError(f"data file '{path}' line {number}: {one_line(e)}; fix the line") from None
        if not isinstance(obj, dict):
            hint = array if isinstance(obj, list) else "; write one JSON object per line"
            raise DataError(
                f"data file '{path}' line {number}: expected a JSON object, got {type(obj).__name__}{hint}"
            )
        text_key, label_key = _json_key(text_key, obj, path, number), _json_key(label_key, obj, path, number)
        first = not texts  # where a field is missing from the first object, the fix is the setting, not the line
        if text_key is None:
            _refuse_pairs(path, obj, "field")
            text_key = next((k for k in TEXT_COLUMN_NAMES if k in obj), None)
            if text_key is None:
                raise DataError(f"data file '{path}' line {number}: no text field among the fields {sorted(obj)}; "
                                f"{_missing_fix('text')}")
        if label_key is None and (require_labels or any(k in obj for k in LABEL_COLUMN_NAMES)):
            label_key = next((k for k in LABEL_COLUMN_NAMES if k in obj), None)
            if label_key is None:
                raise DataError(f"data file '{path}' line {number}: no label field among the fields {sorted(obj)}; "
                                f"{_missing_fix('label')}")
            if texts:  # the lines before this one had no label (possible only when labels are optional)
                raise DataError(f"data file '{path}' line {lines[0]}: no field {label_key!r}, which line {number} "
                                "has; give every line a label or none")
        if text_key == label_key:
            raise _same_columns(path, repr(text_key))
        for key, what in ((text_key, "text"), (label_key, "label")):
            if first and key is not None and key not in obj:  # the setting names a field the file lacks
                raise DataError(f"data file '{path}' line {number}: no {what} field {key!r} among the fields "
                                f"{sorted(obj)}; {_missing_fix(what)}")
        if text_key not in obj:
            raise DataError(f"data file '{path}' line {number}: no string field {text_key!r}; fix the line")
        if not isinstance(obj[text_key], str):
            kind = _JSON_TYPES.get(type(obj[text_key]), type(obj[text_key]).__name__)
            fix = (f"if another of the fields {sorted(obj)} holds the texts, {_SETTING['text']} to it, else fix the "
                   "line") if first else "fix the line"
            raise DataError(f"data file '{path}' line {number}: no string field {text_key!r}: it holds {kind}, not "
                            f"a string; {fix}")
        _check_no_surrogate(obj[text_key], path, number)
        texts.append(obj[text_key].strip())  # as a TSV or CSV cell is: one example reads alike in every format
        lines.append(number)
        if label_key is not None:
            if label_key not in obj:
                raise DataError(f"data file '{path}' line {number}: no field {label_key!r}; fix the line")
            labels.append(_label_string(obj[label_key], path, number))
    if not texts:
        raise DataError(f"data file '{path}' has no examples; give a file with data in it")
    return ClassificationData(texts, labels if label_key is not None else None, lines, str(path))


def _missing_fix(what: str, header: bool = False) -> str:
    """The fix where a file's header (`header`) or first JSON object has no text or label column that is named or
    known: name one of those it has; for labels, a file without any (a test split) may be meant."""
    if what == "text":
        return f"{_SETTING['text']} to one of them"
    example, which = ("as GLUE's test.tsv", "the column of the labels") if header else ("a test split", "one of them")
    return f"if the file has no labels ({example}), give a labelled file, else {_SETTING['label']} to {which}"


def _json_key(key: str | int | None, obj: dict, path: Path, number: int) -> str | None:
    """A column given by number names a JSONL field only as that number's text ("0"): fields have names."""
    if not isinstance(key, int):
        return key
    if str(key) in obj:
        return str(key)
    raise DataError(f"data file '{path}' line {number}: JSON Lines fields have names, not numbers, and there is no "
                    f"field {str(key)!r}; give the column by name, one of {sorted(obj)}")


# A cell as Python's csv module or pandas writes one holding a quote: in quotes, its own quotes doubled.
_CSV_QUOTED = re.compile(r'"(?:[^"]|"")*""(?:[^"]|"")*"', re.DOTALL)
_TSV_UNQUOTED = "a .tsv file is read without quoting (GLUE's texts hold bare quotes)"
_TSV_FIX = "save it unquoted (pandas: quoting=csv.QUOTE_NONE) or as a .csv file"


def _split_alike(text: str, sep: str, rows: int = 5) -> bool:
    """Whether the first non-blank `rows` lines of `text` split by `sep` into one number of at least two cells
    each (a comma inside a sentence of a one-column TSV does not)."""
    lines = [line for line in text.splitlines() if line.strip()][:rows]
    cells = csv.reader(lines) if sep == "," else (line.split(sep) for line in lines)
    try:
        widths = {len(row) for row in cells}
    except csv.Error:
        return False
    return len(widths) == 1 and min(widths) >= 2


def _table_rows(path: Path, text: str, fmt: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of each non-blank row."""
    if fmt == "tsv":
        # GLUE TSVs hold unbalanced quotes, so no quoting: split on tabs.
        for number, line in enumerate(split_lines(text, path), start=1):
            if line.strip():
                yield number, line.split("\t")
        return
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    rows = []
    start = 1
    # csv refuses a field over 131,072 characters (a long document, which TSV and JSONL read) unless its
    # process-wide limit is raised: raised for this read only, the rows kept rather than yielded so that the
    # limit is back before the caller goes on (or stops reading).
    limit = csv.field_size_limit(CSV_FIELD_LIMIT)
    try:
        for row in reader:
            if any(cell.strip() for cell in row):
                rows.append((start, row))
            start = reader.line_num + 1
    except csv.Error as e:  # named where the bad row starts: an unclosed quote runs on to the end of the file
        runs_on = f"; the row runs on to line {reader.line_num}: a quote left open?" if reader.line_num > start else ""
        raise DataError(f"data file '{path}' line {start}: malformed CSV ({e}{runs_on}); fix the line") from None
    finally:
        csv.field_size_limit(limit)
    yield from rows


def _same_columns(path: Path, column: str, label_given: bool = True) -> DataError:
    """Text and label read from one column: the fix is the text column's setting, unless the label column was only
    the default column of a file without a header (`label_given` False), taken by the text column named."""
    fix = f"{_SETTING['text']} to the column of the texts" if label_given else \
        f"{_SETTING['label']} to the column of the labels"
    return DataError(f"data file '{path}': the text and the label column are the same ({column}), so the labels "
                     f"would be read as the text; {fix}")


def _header_cell(cell: str) -> str:
    """A cell as a column name: stripped, and without a leading byte-order mark, which str.strip keeps (a header
    of a file saved with one and joined to another by `cat`, where `read_text` drops only the file's first)."""
    return cell.strip().removeprefix("\ufeff").strip()


def _is_header(cells: list[str]) -> bool:
    names = {_header_cell(c).lower() for c in cells}
    return bool(names & set(TEXT_COLUMN_NAMES)) or bool(names & set(LABEL_COLUMN_NAMES)) or \
        any(first in names and second in names for first, second in PAIR_COLUMNS)


def _column_index(path: Path, column: str | int, names: list[str] | None, what: str) -> int:
    if isinstance(column, int):
        return column
    if names is None:
        raise DataError(
            f"data file '{path}' has no header row, so {what} column {column!r} cannot be found; "
            f"set data.{what}_column (evaluate: --{what}-column) to a 0-based column number instead"
        )
    if column in names:
        return names.index(column)
    # As the columns found without a name are: "label" reads a header's "Label" (where only one column is so named).
    alike = [i for i, name in enumerate(names) if name.lower() == _header_cell(column).lower()]
    if len(alike) == 1:
        return alike[0]
    if alike:
        raise DataError(f"data file '{path}': columns {alike[0]} ({names[alike[0]]!r}) and {alike[1]} "
                        f"({names[alike[1]]!r}) of the header both read as {column!r}, so the {what} column is "
                        f"ambiguous; give it by 0-based number: {_SETTING[what]}")
    if not _is_header(names):  # perhaps a headerless file read with named columns
        raise _no_header(path, f"no {what} column {column!r}", names)
    # for labels, a test split without any looks just like this
    raise DataError(f"data file '{path}': no {what} column {column!r} in the header {names}; "
                    f"{_missing_fix(what, header=True)}")


def _no_header(path: Path, problem: str, names: list[str]) -> DataError:
    return DataError(
        f"data file '{path}': {problem}, and its first row {names} does not look like a header; if the file has "
        "none, give the columns by 0-based number (evaluate: --text-column 0 --label-column 1; train: "
        "data.text_column and data.label_column), else name one of those columns"
    )


def _refuse_pairs(path: Path, names, what: str) -> None:
    """DataError where `names` (a header's, or a JSON object's keys) hold both texts of a sentence pair, named
    as the file spells them (a named column is matched as written)."""
    spelled = {_header_cell(str(n)).lower(): _header_cell(str(n)) for n in names}
    for first, second in PAIR_COLUMNS:
        if first in spelled and second in spelled:
            raise DataError(f"data file '{path}' has two text {what}s, {spelled[first]!r} and {spelled[second]!r} "
                            "(a sentence-pair task): attnlab's classifiers read one text; set data.text_column "
                            "(evaluate: --text-column) to the one to read")


def _read_table(path, text, fmt, text_column, label_column, header, require_labels) -> ClassificationData:
    sep = "tab-separated" if fmt == "tsv" else "comma-separated"
    rows = _table_rows(path, text, fmt)
    first = next(rows, None)
    if first is None:
        raise DataError(f"data file '{path}' has no rows; give a file with data in it")
    _, first_cells = first
    if header is None:
        header = isinstance(text_column, str) or isinstance(label_column, str) or _is_header(first_cells)
    names = [_header_cell(c) for c in first_cells] if header else None
    lowered = [n.lower() for n in names] if names else None
    if not header and text_column is None and label_column is None and len(first_cells) > 2:
        # Columns 0 and 1 had been read: the source codes of a GLUE CoLA file (source, label, mark, sentence).
        raise DataError(f"data file '{path}' has {len(first_cells)} {sep} columns and no header row, so which "
                        "holds the text and which the label is not known; give them by 0-based number (evaluate: "
                        "--text-column and --label-column; train: data.text_column and data.label_column), or add "
                        "a header row")

    def pick(column, known, what, default):
        if column is not None:
            return _column_index(path, column, names, what)
        if lowered is None:
            return default
        found = next((lowered.index(k) for k in known if k in lowered), None)
        if found is None and (what == "text" or require_labels):
            named = [_header_cell(c).lower() for c in (text_column, label_column) if isinstance(c, str)]
            if not _is_header(first_cells) and not set(named) & set(lowered):
                # read as a header because the other column was given by name, which it does not hold either
                raise _no_header(path, f"the {what} column cannot be found by name", names)
            raise DataError(
                f"data file '{path}': cannot find the {what} column in the header {names}; {_SETTING[what]}"
            )
        return found

    if text_column is None and lowered is not None:
        _refuse_pairs(path, names, "column")
    # Of two columns without a header, the one named by number leaves the other to the other role.
    pair = len(first_cells) == 2 and lowered is None
    text_idx = pick(text_column, TEXT_COLUMN_NAMES, "text",
                    1 - label_column if pair and text_column is None and label_column in (0, 1) else 0)
    label_default = 1 if require_labels or len(first_cells) > 1 else None
    if pair and text_idx in (0, 1):
        label_default = 1 - text_idx
    label_idx = pick(label_column, LABEL_COLUMN_NAMES, "label", label_default)
    if text_idx == label_idx:
        raise _same_columns(path, f"{names[text_idx]!r}" if names and 0 <= text_idx < len(names) else str(text_idx),
                            label_given=label_column is not None or lowered is not None)
    width = len(first_cells)
    for idx, what in ((text_idx, "text"), (label_idx, "label")):
        if idx is not None and not 0 <= idx < width:
            other = {"tsv": ("\t", "tab-separated", ".tsv"), "csv": (",", "comma-separated", ".csv")}[
                "csv" if fmt == "tsv" else "tsv"]
            if width == 1 and _split_alike(text, other[0]):  # the extension names the other separator
                raise DataError(f"data file '{path}' line {first[0]} has one {sep} column but looks {other[1]} "
                                f"(the separator is chosen by the file's extension); name the file {other[2]}")
            raise DataError(
                f"data file '{path}' line {first[0]}: {what} column {idx} does not exist, "
                f"the row has {width} "
                f"{sep} columns; {_SETTING[what]}"
            )
        if idx is not None and lowered is not None and lowered.count(lowered[idx]) > 1:  # named twice
            twice = [i for i, n in enumerate(lowered) if n == lowered[idx]]
            raise DataError(f"data file '{path}': the header names columns {twice[0]} and {twice[1]} "
                            f"{names[idx]!r}, so the {what} column is ambiguous; rename one, or give the column "
                            f"by 0-based number ({_SETTING[what]})")

    texts: list[str] = []
    labels: list[str] = []
    lines: list[int] = []
    body = rows if header else _chain_first(first, rows)
    repeated: list[int] = []  # the header again, as where files were joined with `cat`
    quoted_cell: int | None = None  # the first text cell that a CSV writer quoted ("a ""b"" c")
    for number, cells in body:
        if _names_columns(cells, lowered, text_idx, label_idx):
            repeated.append(number)
            continue
        if len(cells) != width:
            # a cell that opens a CSV quote and does not close it: a quoted tab or line break split the row
            quoted = fmt == "tsv" and any(c.lstrip().startswith('"') and c.count('"') % 2 for c in cells)
            raise DataError(
                f"data file '{path}' line {number}: expected {width} {sep} columns, found {len(cells)}; "
                + (f"{_TSV_UNQUOTED}, so a quoted tab or line break splits a row: fix the line, or {_TSV_FIX}"
                   if quoted else "fix the line")
            )
        if fmt == "tsv" and quoted_cell is None and _CSV_QUOTED.fullmatch(cells[text_idx].strip()):
            quoted_cell = number
        texts.append(cells[text_idx].strip())
        lines.append(number)
        if label_idx is not None:
            labels.append(_label_string(cells[label_idx], path, number))
    if quoted_cell is not None:
        warnings.warn(f"data file '{path}' line {quoted_cell}: the text looks quoted as a CSV writer quotes it "
                      f"(\"...\" with its quotes doubled), but {_TSV_UNQUOTED}: the quotes are read as part of the "
                      f"text; {_TSV_FIX}", stacklevel=3)
    if repeated:
        what = "repeat the header" if header else "name the columns, as a header does"
        warnings.warn(f"data file '{path}': {len(repeated)} row(s) {what} (the first at line {repeated[0]}, as where "
                      "files were joined); they are skipped", stacklevel=3)
    if not texts:
        raise DataError(f"data file '{path}' has a header but no examples; give a file with data in it")
    why = _header_like_first_label(labels) if not header else None
    if why:
        # A header of names attnlab does not know (QQP's id, question1, question2, is_duplicate) read with
        # numbered columns would become an example whose label is a class of its own.
        warnings.warn(f"data file '{path}' line {lines[0]}: the label {labels[0]!r} {why}, so the row may name the "
                      f"columns; it is read as an example. If it is a header, "
                      f"give the columns by name (data.text_column and data.label_column; evaluate: --text-column "
                      f"and --label-column), which reads the first row as the header", stacklevel=3)
    return ClassificationData(texts, labels if label_idx is not None else None, lines, str(path))


def _header_like_first_label(labels: list[str]) -> str | None:
    """Why the first row's label looks like a column name (None where it does not): the only label that is not a
    number, or, in a file of 10 rows or more whose other classes each have several, a class of its one row."""
    if len(labels) <= 2:
        return None
    if not _is_int(labels[0]) and all(_is_int(x) for x in labels[1:]):
        return "is the only one that is not a number"
    counts = Counter(labels)
    if len(labels) >= 10 and counts[labels[0]] == 1 and min(n for x, n in counts.items() if x != labels[0]) > 1:
        return "is on no other row, while every other class has several"
    return None


def _names_columns(cells: list[str], lowered: list[str] | None, text_idx: int, label_idx: int | None) -> bool:
    """Whether a row is a header rather than an example: the file's header again (in any case), or in a file
    without one, a text and a label cell that are both column names (`sentence<TAB>label`: a file with a header
    appended to one without, by `cat`). Read as an example, it made a class of its own."""
    if lowered is not None:
        return len(cells) == len(lowered) and [_header_cell(c).lower() for c in cells] == lowered
    return label_idx is not None and len(cells) > max(text_idx, label_idx) and \
        _header_cell(cells[text_idx]).lower() in TEXT_COLUMN_NAMES and \
        _header_cell(cells[label_idx]).lower() in LABEL_COLUMN_NAMES


def _chain_first(first, rest):
    yield first
    yield from rest
