"""The `attnlab` command keeps freed memory for reuse (glibc's malloc settings); the library leaves the
process alone. Each check runs in a fresh process: the settings are process-wide."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

from attnlab import allocator


def _glibc_with_mallinfo2() -> bool:
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018
        libc.mallinfo2  # noqa: B018 - glibc 2.33 and later
        return sys.platform.startswith("linux")
    except (OSError, AttributeError):
        return False


needs_glibc = pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="needs Linux with glibc >= 2.33")

# Allocates 16 MiB through malloc (a bytearray) and prints how much of it came as fresh mmap pages.
_PROBE = textwrap.dedent("""
    import ctypes, sys
    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Info
    if sys.argv[1] == "keep":
        from attnlab.allocator import keep_freed_memory
        print(keep_freed_memory())
    elif sys.argv[1] == "command":
        import attnlab.cli
        attnlab.cli.main = lambda: None  # the command's entry, without running a command
        from attnlab.__main__ import run
        run()
    before = libc.mallinfo2().hblkhd
    block = bytearray(16 << 20)
    print((libc.mallinfo2().hblkhd - before) >> 20)
""")


def _probe(mode: str, **env: str) -> list[str]:
    mine = allocator._user_settings(dict(os.environ))
    clean = {k: v for k, v in os.environ.items() if k not in mine and k != "ATTNLAB_MALLOC"}
    done = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=120,
                          env={**clean, **env}, check=True)
    return done.stdout.split()


@needs_glibc
def test_by_default_large_blocks_are_fresh_pages():
    assert _probe("default") == ["16"]  # glibc's default: a 16 MiB block is mmapped, and unmapped when freed


@needs_glibc
def test_kept_memory_serves_large_blocks_from_the_heap():
    assert _probe("keep") == ["True", "0"]


@needs_glibc
def test_the_command_applies_it_at_start():
    assert _probe("command") == ["0"]


@needs_glibc
@pytest.mark.parametrize("env", [{"ATTNLAB_MALLOC": "system"}, {"MALLOC_TRIM_THRESHOLD_": "131072"},
                                 {"MALLOC_ARENA_MAX": "2"}, {"MALLOC_PERTURB_": "1"},  # were not seen (readme5)
                                 {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
                                 {"LD_PRELOAD": "libjemalloc.so.2"}])
def test_the_users_choice_stands(env):
    out = _probe("keep", **env)  # (no jemalloc here: the loader warns and goes on; the variable is what counts)
    assert out[0] == "False" and out[-1] == "16"


def test_off_linux_nothing_happens(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert allocator.keep_freed_memory() is False


def test_the_onednn_cache_bound_is_set_unless_the_user_set_one(monkeypatch):
    for name in allocator._ONEDNN_CACHE_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    assert allocator.bound_onednn_cache() is True
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(allocator.ONEDNN_CACHE_PRIMITIVES)
    for name, value in (("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "2048"), ("DNNL_PRIMITIVE_CACHE_CAPACITY", "0")):
        for other in allocator._ONEDNN_CACHE_SETTINGS:
            monkeypatch.delenv(other, raising=False)
        monkeypatch.setenv(name, value)
        assert allocator.bound_onednn_cache() is False
        assert os.environ[name] == value and all(os.environ.get(o) is None for o in allocator._ONEDNN_CACHE_SETTINGS
                                                 if o != name)


def test_the_command_bounds_the_onednn_cache_at_start():
    probe = ("import attnlab.cli, os; attnlab.cli.main = lambda: None; "
             "from attnlab.__main__ import run; run(); print(os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'))")
    clean = {k: v for k, v in os.environ.items() if k not in allocator._ONEDNN_CACHE_SETTINGS}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=clean,
                          check=True)
    assert done.stdout.split() == [str(allocator.ONEDNN_CACHE_PRIMITIVES)]
