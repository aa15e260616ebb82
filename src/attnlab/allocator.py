"""The C allocator's settings for the `attnlab` command's own process (no torch import: `attnlab --help` stays
fast).

A training step allocates and frees the same large buffers (activations, their gradients, attention scores)
every step. With glibc's defaults, blocks above a threshold that starts at 128 KiB get fresh pages from the
kernel (mmap) and freed memory at the top of the heap goes back to it, so each step's buffers come back as
new pages that the kernel faults in and zeroes one by one, expensive on a virtual machine. Keeping freed
memory for reuse made a bf16 training step faster on 2 cores of an AMD Zen 4 (the same script in separate
processes, alternating): shape A (4 layers, 128 wide) 24.5-25.8 -> 22.4-23.9 ms, shape B (6 layers, 384 wide)
540-553 -> 466-477 ms. The price: the process holds on to the memory of its peak until it exits, which a
training run reaches every step anyway.

The command line applies this at start (`attnlab.__main__`), with a bound on oneDNN's cache of compiled products
(`bound_onednn_cache`, below); the library does not, as both are process-wide.
`ATTNLAB_MALLOC=system` keeps glibc's defaults, and so does any allocator setting of the user's own
(any `MALLOC_*` variable, `GLIBC_TUNABLES`, or jemalloc/tcmalloc through `LD_PRELOAD`).
"""

from __future__ import annotations

import ctypes
import os
import sys

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_SETTINGS = (
    (_M_TRIM_THRESHOLD, 1 << 30),  # keep up to 1 GiB of free memory at the heap's top
    (_M_TOP_PAD, 64 << 20),  # and grow it 64 MiB at a time
)
# Blocks up to this size come from the heap (where glibc refuses 1 GiB, as older versions cap the threshold
# at 32 MiB, that).
_MMAP_THRESHOLDS = (1 << 30, 32 << 20)


def _user_settings(environ: dict[str, str]) -> list[str]:
    """The allocator settings of the user's own in `environ`: glibc's MALLOC_* variables (the thresholds,
    MALLOC_ARENA_MAX that containers set to save memory, MALLOC_PERTURB_, MALLOC_CHECK_...) and GLIBC_TUNABLES."""
    return [name for name in environ if name.startswith("MALLOC_") or name == "GLIBC_TUNABLES"]


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to keep freed memory for reuse (see the module's note); True if it applied. A no-op
    off Linux, with another C library or allocator, with `ATTNLAB_MALLOC=system`, or where the user set
    glibc's allocator variables."""
    if not sys.platform.startswith("linux") or os.environ.get("ATTNLAB_MALLOC", "").lower() == "system":
        return False
    if _user_settings(dict(os.environ)) or "malloc" in os.environ.get("LD_PRELOAD", ""):
        return False
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols
        libc.gnu_get_libc_version  # noqa: B018 - glibc only (musl's mallopt does nothing)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # The threshold first: setting any of these fixes it, at 128 KiB if it was not set.
    if not any(mallopt(_M_MMAP_THRESHOLD, size) == 1 for size in _MMAP_THRESHOLDS):
        return False
    return all([mallopt(param, value) == 1 for param, value in _SETTINGS])


# oneDNN (torch's bf16 matrix products on a CPU) keeps a compiled primitive, with memory of its own, for each
# shape it has seen, up to 1,024 of them by default. A training step of fixed shapes (a GPT on fixed windows)
# needs a few dozen; batches of varying lengths (translation, batched by length) make new ones for many steps:
# 400 bf16 steps of the translation config's model on batches of 4-39 by 4-39 tokens grew to 2,200 MiB resident
# (717 with one shape throughout; 3,225 with freed memory kept, as the command runs). With at most 64 or 256
# primitives 1,574 and 1,904; with at most 128 and freed memory kept 2,114 against 3,225; the same speed within
# noise (Zen 4, 2026-11-25).
ONEDNN_CACHE_PRIMITIVES = 128
_ONEDNN_CACHE_SETTINGS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY")


def bound_onednn_cache() -> bool:
    """Keep at most ONEDNN_CACHE_PRIMITIVES of oneDNN's compiled primitives (see the note above); True if it
    applied. Effective before the process's first oneDNN product; a setting of the user's own stands."""
    if any(name in os.environ for name in _ONEDNN_CACHE_SETTINGS):
        return False
    os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(ONEDNN_CACHE_PRIMITIVES)
    return True
