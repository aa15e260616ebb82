"""`generate --input` reads its file once, so a pipe (`<(...)`, /dev/stdin) and "-" (standard input) work: they had
been refused with a reason that did not hold for it ("most data is read more than once"). The checks a file gets
(empty, not UTF-8) still hold for what a pipe gives."""

from __future__ import annotations

import io
import os
import sys

import pytest
from test_translation_blank_lines import _run

from attnlab.errors import DataError


def _pipe(data: bytes) -> str:
    """A path that reads `data` from a pipe once (the /dev/fd/N a shell's `<(...)` gives)."""
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    return f"/dev/fd/{read}"


SOURCES = b"the cat\n   \na dog ran\n"


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="needs /dev/fd")
def test_a_pipe_translates_as_the_same_file_does(tmp_path):
    from attnlab.inference.runs import translate_file

    run, _ = _run()
    file = tmp_path / "src.txt"
    file.write_bytes(SOURCES)
    expected = translate_file(run, file, max_len=8)
    path = _pipe(SOURCES)
    try:
        assert translate_file(run, path, max_len=8) == expected
    finally:
        os.close(int(path.rsplit("/", 1)[1]))


def test_a_dash_reads_standard_input(tmp_path, monkeypatch):
    from attnlab.inference.runs import translate_file

    run, _ = _run()
    file = tmp_path / "src.txt"
    file.write_bytes(SOURCES)
    expected = translate_file(run, file, max_len=8)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(SOURCES)))
    assert translate_file(run, "-", max_len=8) == expected


def test_standard_input_gets_a_files_checks(monkeypatch):
    from attnlab.inference.runs import translate_file

    run, _ = _run()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    with pytest.raises(DataError, match=r"^data file '<standard input>' is empty; give a file with data in it$"):
        translate_file(run, "-", max_len=8)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("the cat\n".encode("utf-16"))))
    with pytest.raises(DataError, match=r"^data file '<standard input>' is not UTF-8 but UTF-16"):
        translate_file(run, "-", max_len=8)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"the cat\nsat \xff\n")))
    with pytest.raises(DataError, match=r"^data file '<standard input>' is not UTF-8: byte 0xff at line 2 "):
        translate_file(run, "-", max_len=8)


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="needs /dev/fd")
def test_an_empty_pipe_is_named_empty():
    from attnlab.inference.runs import translate_file

    run, _ = _run()
    path = _pipe(b"")
    try:
        with pytest.raises(DataError, match=rf"^data file '{path}' is empty; give a file with data in it$"):
            translate_file(run, path, max_len=8)
    finally:
        os.close(int(path.rsplit("/", 1)[1]))


def test_files_read_more_than_once_still_refuse_pipes(tmp_path):
    """Training and evaluation data is read more than once: a pipe there is still refused, naming why."""
    from attnlab.data.text_files import read_text

    fifo = tmp_path / "text.fifo"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="is not a regular file .* read more than once"):
        read_text(fifo)


def test_standard_input_is_named_alike_in_every_message(monkeypatch):
    from attnlab.inference.runs import translate_file

    run, _ = _run()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"the cat\rsat\rhere\r")))
    with pytest.raises(DataError, match=r"^data file '<standard input>' uses CR-only line ends"):
        translate_file(run, "-", max_len=8)
