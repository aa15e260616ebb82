"""Atomic file writes: a reader (or a crash, or Ctrl-C) sees the old file or the new one, never half of one.

Every file attnlab writes for the user to keep (results, plots, tokenizers, token files, run
descriptions, metrics logs) goes through `atomic_path`: the content is written to a temporary file beside
the target, flushed to disk, and renamed over the target only when writing finished without an error.
Checkpoint folders use the same idea one level up (`attnlab.training.checkpoint`). `folder_lock` keeps a
second run out of a folder one run is writing.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attnlab.errors import PathError

try:  # the OS's file locks (`folder_lock`): POSIX, else Windows, else none
    import fcntl
except ImportError:
    fcntl = None
try:
    import msvcrt
except ImportError:
    msvcrt = None

__all__ = ["atomic_path", "folder_lock", "fsync_path", "make_folder", "ordinary_permissions", "write_text_atomic"]


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



def expand_home(value: Any) -> Any:
    """A path with a leading ~ (~/runs, ~user/runs) as the home folder's path; any other value as it is. For paths
    a shell leaves alone: after `--out=`, in quotes, in a config file or a --set value."""
    return os.path.expanduser(value) if isinstance(value, str) and value.startswith("~") else value

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


def make_folder(path: str | os.PathLike[str], setting: str) -> Path:
    """Create `path` (and its parents) or say in one line why it cannot be, naming the setting to change."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        # A link to a folder that is gone reads as "File exists": say which link (the path or a parent's).
        dangling = next((p for p in (path, *path.parents) if p.is_symlink() and not p.exists()), None)
        why = f"{str(dangling)!r} is a link to {os.readlink(dangling)!r}, which does not exist" \
            if dangling is not None else e.strerror or e
        raise PathError(f"{setting}: cannot create the folder {str(path)!r} ({why}); "
                          "choose another path") from None
    return path


LOCK_FILE = ".attnlab.lock"


@contextmanager
def folder_lock(folder: str | os.PathLike[str], setting: str, *, enabled: bool = True) -> Iterator[Path]:
    """Hold `folder` for one attnlab run for the block: an exclusive lock on its LOCK_FILE, taken through the OS
    (released when the process ends, however it ends). A second run into the same folder is refused in one line
    while this one writes there: two runs had interleaved their checkpoints, run.json and metrics.jsonl.

    A run into a folder just inside another run's (a training run into a knowledge run's phase folder), or over a
    folder just inside which another run writes (a knowledge run over a training run in its phase folder), is
    refused alike: a knowledge run writes and deletes its phase folders.

    Creates the folder (and its parents); what the block created and left holding only the lock file (a run
    refused before it wrote anything) is removed again. Where the OS offers no lock (neither `fcntl` nor
    `msvcrt`), or with `enabled` false (a process other than torchrun's rank 0, which writes nothing), nothing is
    held."""
    folder = Path(folder)
    if not enabled:
        yield folder
        return
    if folder.exists() and not folder.is_dir():
        raise PathError(f"{setting}: {str(folder)!r} is a file, not a folder; choose another path")
    outer = folder.absolute().parent  # one level either way: a knowledge run's phase folders
    if lock_held(outer):
        raise PathError(f"{setting}: {str(folder)!r} is inside {str(outer)!r}, which another attnlab run is writing "
                          "into; wait for it to finish, or give this run another folder")
    missing = [folder, *folder.parents]
    created = missing[:next(i for i, path in enumerate(missing) if path.exists() or path == path.parent)]
    make_folder(folder, setting)
    lock = folder / LOCK_FILE
    try:
        handle = open(lock, "a+b")  # noqa: SIM115 - held open for the block
    except OSError as e:
        raise PathError(f"{setting}: cannot write into the folder {str(folder)!r} ({e.strerror or e}); "
                          "choose another path") from None
    remove = False
    try:
        if not _lock(handle, True):
            # Refused, it removes nothing: the folder it found missing may be the run's that holds the lock.
            raise PathError(f"{setting}: another attnlab run is writing into {str(folder)!r}; wait for it to "
                              "finish, or give this run another folder")
        inner = next((path for path in sorted(folder.iterdir()) if path.is_dir() and lock_held(path)), None)
        if inner is not None:  # checked holding the folder: a run starting inside it now finds this one
            raise PathError(f"{setting}: another attnlab run is writing into {str(inner)!r}, inside "
                              f"{str(folder)!r}; wait for it to finish, or give this run another folder")
        try:
            yield folder
        finally:
            try:  # decided while the lock is held, so that no other run has taken the folder meanwhile
                remove = bool(created) and _holds_only_the_lock(folder)
                if remove:
                    lock.unlink()
            except OSError:  # Windows removes no open file: after closing it, below
                pass
            finally:
                _lock(handle, False)
    finally:
        handle.close()
        if remove:
            try:
                lock.unlink(missing_ok=True)
            except OSError:
                pass
            for path in created:  # the folder, then the parents made for it, while empty
                try:
                    path.rmdir()
                except OSError:
                    break


def lock_held(folder: Path) -> bool:
    """Whether an attnlab run (another process, or this one through another `folder_lock`) holds `folder` now."""
    lock = folder / LOCK_FILE
    try:
        if not lock.is_file():
            return False
        handle = open(lock, "a+b")  # noqa: SIM115 - closed below
    except OSError:  # a folder we may not enter, an unwritable lock: not ours to judge, as a file system without locks
        return False
    with handle:
        if not _lock(handle, True):
            return True
        _lock(handle, False)
        return False


def _holds_only_the_lock(folder: Path) -> bool:
    try:
        return [p.name for p in folder.iterdir()] == [LOCK_FILE]
    except OSError:  # gone, or unreadable: nothing to remove
        return False


def _lock(handle, take: bool) -> bool:
    """Take (without waiting) or release an exclusive lock on the open file `handle`; False only where another
    process holds it. A system or file system without locks (some network mounts) runs unguarded, as before."""
    try:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), (fcntl.LOCK_EX | fcntl.LOCK_NB) if take else fcntl.LOCK_UN)
        elif msvcrt is not None:
            handle.seek(0)
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK if take else msvcrt.LK_UNLCK, 1)
    except OSError as e:
        # flock's refusal, or msvcrt's (a plain OSError with one of these numbers; another, as a file system that
        # cannot lock, runs unguarded as on POSIX)
        held = isinstance(e, BlockingIOError) or (fcntl is None and e.errno in _MSVCRT_HELD)
        return not (take and held)
    return True


_MSVCRT_HELD = (errno.EACCES, getattr(errno, "EDEADLOCK", errno.EDEADLK))
