"""Atomic file writes: a reader (or a crash, or Ctrl-C) sees the old file or the new one, never half of one.

Every file attnlab writes for the user to keep (results, plots, tokenizers, token files, run
descriptions, metrics logs) goes through `atomic_path`: the content is written to a temporary file beside
the target, flushed to disk, and renamed over the target only when writing finished without an error.
Checkpoint folders use the same idea one level up (`attnlab.training.checkpoint`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_path", "fsync_path", "ordinary_permissions", "write_text_atomic"]


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a file or a folder's entries to disk; a no-op where the platform cannot (Windows folders)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some platforms cannot fsync a read-only descriptor or a folder
        pass
    finally:
        os.close(fd)


def check_readable(path: str | os.PathLike[str]) -> None:
    """Open and close `path`, so that a file the user may not read raises PermissionError naming it: safetensors
    reports such a file as "No such file or directory", and the user looks for a missing file instead."""
    open(path, "rb").close()


def ordinary_permissions(path: str | os.PathLike[str]) -> None:
    """Give a file the permissions a plain ``open(path, "w")`` would have (0o666 less the umask).

    safetensors creates its files readable by their owner only; a run folder shared with a group should
    not hold a readable config beside unreadable weights.
    """
    if os.name != "posix":
        return
    umask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path beside `path` to write to; it replaces `path` when the block ends without error and
    is removed when it raises (KeyboardInterrupt included).

    The temporary name keeps the target's suffix (``plot.png`` → ``plot.png.<pid>.tmp.png``), so writers
    that pick a format from the name (matplotlib) write the right one, and carries the process id, so
    processes writing the same file side by side (torchrun) never share one.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        fsync_path(tmp)
        try:
            os.replace(tmp, path)
        except OSError as e:  # e.g. a folder in the target's place: name the target, not the temporary file
            raise type(e)(e.errno, e.strerror, str(path)) from None
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write UTF-8 text (``\\n`` line ends on every platform) through `atomic_path`."""
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    return path
