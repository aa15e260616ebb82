"""Where training runs and in which precision.

`select_device` picks CUDA, then Apple's MPS, then the CPU. `resolve_precision` turns the config's
"auto" | "bf16" | "fp32" into an autocast dtype (or None for plain fp32). Master weights and the
optimizer state always stay fp32: bf16 is only used inside `autocast`, for the forward pass.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import warnings
from collections.abc import Iterator

import torch

from attnlab.errors import ConfigError, one_line

DEVICES = ("auto", "cpu", "cuda", "mps")
PRECISIONS = ("auto", "bf16", "fp32")


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def select_device(name: str = "auto") -> torch.device:
    """The device called `name` ("auto", "cpu", "cuda", "cuda:N" or "mps").

    "auto" prefers CUDA, then MPS, then the CPU.

    Raises:
        ConfigError: an unknown name, or a device this machine does not have.
    """
    if isinstance(name, torch.device):  # as torch names it: "cuda:0", "cpu"
        name = str(name)
    if not isinstance(name, str):
        raise ConfigError(f"device: expected a name such as 'cpu', 'cuda' or 'auto', got {name!r}")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    kind, colon, index = name.partition(":")
    if kind not in DEVICES[1:]:
        raise ConfigError(f"device: unknown device {name!r}; choose one of: {', '.join(DEVICES)}, cuda:N")
    # Only CUDA GPUs are taken by number (cpu:1 ran on the CPU, mps:1 named a second Apple GPU no Mac has; train.device
    # takes neither, nor cpu:0), written as torch writes it (cuda:01 passed the setting's check, then failed).
    if colon and (kind != "cuda" or not (index.isascii() and index.isdigit()) or str(int(index)) != index):
        raise ConfigError(f"device: {name!r} is not a device name; use cpu, mps, cuda or cuda:N (N a GPU's number, "
                          "e.g. cuda:0)")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {name!r} is not available (torch sees no CUDA GPU); "
                              "use the device cpu or auto")
        if colon:
            if not int(index) < torch.cuda.device_count():
                raise ConfigError(f"device {name!r} does not exist; this machine has "
                                  f"{torch.cuda.device_count()} CUDA device(s)")
    if kind == "mps" and not _mps_available():
        raise ConfigError(f"device {name!r} is not available (no Apple GPU); "
                          "use the device cpu or auto")
    try:
        return torch.device(name)
    except RuntimeError:  # "cpu:x", "mps:-1"...
        raise ConfigError(f"device: {name!r} is not a device name; use cpu, mps, cuda or cuda:N") from None


def _cpuinfo(field: str) -> str | None:
    """The value of the first `field` line of /proc/cpuinfo (Linux only; None elsewhere, or where it is missing or
    unreadable)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


@functools.lru_cache(maxsize=1)
def cpu_has_bf16() -> bool:
    """Whether this CPU has native bf16 instructions (AVX512-BF16 or AMX-BF16; read on Linux only)."""
    flags = set((_cpuinfo("flags") or "").split())
    return "avx512_bf16" in flags or "amx_bf16" in flags


DEFAULT_LAST_LEVEL_CACHE = 32 << 20  # where the OS does not say: a common L3 size of current desktop/server CPUs


@functools.lru_cache(maxsize=4)
def cpu_last_level_cache_bytes(sysfs: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """The size of the CPU's last-level cache as the OS reports it (Linux sysfs; elsewhere a 32 MiB guess)."""
    import glob
    import re

    best = (0, 0)  # (level, bytes)
    for folder in glob.glob(f"{sysfs}/index*"):
        try:
            with open(f"{folder}/level") as f:
                level = int(f.read())
            with open(f"{folder}/size") as f:
                match = re.fullmatch(r"(\d+)([KMG]?)", f.read().strip())
        except (OSError, ValueError):
            continue
        if match:
            size = int(match[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[match[2]]
            best = max(best, (level, size))
    return best[1] or DEFAULT_LAST_LEVEL_CACHE


def _cuda_bf16(device: torch.device) -> bool:
    """Whether the GPU `device` computes in bf16 natively: compute capability 8.0 (Ampere) or later, or ROCm.

    `torch.cuda.is_bf16_supported()` alone says yes on older GPUs too (it counts emulation, slower than fp32
    there) and asks about the current GPU, which is not `device` for "cuda:1"."""
    if not _cuda_bf16_runs():
        return False
    if torch.version.hip:
        return True
    try:
        return torch.cuda.get_device_capability(device if device.index is not None else None)[0] >= 8
    except Exception:  # old drivers can raise here; then we simply stay in fp32
        return False


def _cuda_bf16_runs() -> bool:
    """Whether torch can run bf16 on this GPU at all (natively or emulated)."""
    try:
        return bool(torch.cuda.is_bf16_supported())
    except Exception:  # old drivers can raise here; then we simply stay in fp32
        return False


class SlowPrecisionWarning(UserWarning):
    """bf16 asked for where it is emulated, on a CPU or GPU (a caller that resolves the precision for many runs
    warns once)."""


def precision_name(dtype: torch.dtype | None) -> str:
    """"bf16", "fp16" or "fp32": the arithmetic of an autocast dtype from `resolve_precision` (None: plain fp32)."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def resolve_precision(precision: str, device: torch.device | str, *,
                      setting: str = "precision") -> torch.dtype | None:
    """The autocast dtype for `precision` on `device`; None means plain fp32 (no autocast).

    "auto" gives bf16 on CUDA GPUs that compute it natively (Ampere and later) and on CPUs with bf16
    instructions, fp32 otherwise (including MPS). "bf16" is honoured wherever torch can run it (on a CPU
    without bf16 instructions or a GPU older than Ampere it is emulated, correct but slow).

    Raises:
        ConfigError: an unknown precision, or "bf16" on a CUDA GPU without bf16 support or on an MPS device whose
            torch or macOS cannot autocast to it.
    """
    device = torch.device(device)
    if precision not in PRECISIONS:
        raise ConfigError(f"{setting}: unknown value {precision!r}; choose one of: {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return None
    if device.type == "cuda":
        supported = _cuda_bf16(device)
    elif device.type == "cpu":
        supported = cpu_has_bf16()
    else:
        supported = False
    if precision == "auto":
        return torch.bfloat16 if supported else None
    said, instead = _said(setting, "bf16"), _said(setting, "auto", "fp32")
    if device.type == "cuda" and not supported:
        if not _cuda_bf16_runs():
            raise ConfigError(f"{said} but this GPU does not support bf16; use {_said(setting, 'fp32')}")
        warnings.warn(f"{said} on a GPU older than Ampere (compute capability below 8.0): bf16 is "
                      f"emulated and slower than fp32; use {instead}", SlowPrecisionWarning,
                      stacklevel=2)
    if device.type == "mps":
        problem = _mps_bf16_problem()
        if problem:
            raise ConfigError(f"{said} cannot run on this MPS device with this torch ({problem}); use {instead}")
    if device.type == "cpu" and not supported:
        # Without AVX512-BF16 or AMX, torch computes bf16 matmuls in a generic loop: correct, but on an
        # AVX2 CPU 50-100x slower than fp32 (1.3 vs 120 GFLOP/s measured on an AMD Zen 3).
        warnings.warn(f"{said} on a CPU without bf16 instructions: matmuls are emulated and "
                      f"far slower than fp32; use {instead}", SlowPrecisionWarning, stacklevel=2)
    return torch.bfloat16


def _said(setting: str, *values: str) -> str:
    """`setting` given `values` (alternatives) as the user writes them: a command-line flag (--precision auto or fp32)
    or a config setting (train.precision = "auto" or "fp32")."""
    if setting.startswith("--"):
        return f"{setting} {' or '.join(values)}"
    return f"{setting} = " + " or ".join(f'"{value}"' for value in values)


def _mps_bf16_problem() -> str | None:
    """Why bf16 autocast cannot run on MPS here, or None: torch before 2.5 has no MPS autocast (an error at the first
    forward), 2.5 only fp16, and later ones bf16 only from macOS 14; there torch disables autocast with a warning,
    and the run would train in fp32 while recorded as bf16."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.autocast(device_type="mps", dtype=torch.bfloat16)
    except (RuntimeError, ValueError, AssertionError) as e:
        return one_line(e)
    disabled = [w for w in caught if "disabling autocast" in str(w.message).lower()]
    return one_line(disabled[0].message) if disabled else None


@contextlib.contextmanager
def autocast(device: torch.device | str, dtype: torch.dtype | None) -> Iterator[None]:
    """Mixed-precision autocast on `device` for `dtype`; does nothing when `dtype` is None (fp32)."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=torch.device(device).type, dtype=dtype):
        yield


def synchronize(device: torch.device | str) -> None:
    """Wait until `device` has done the work queued on it. A GPU runs behind the host: a clock read without this
    times the launching of the work, not the work. The CPU has nothing queued."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


# ------------------------------------------------------------------------------------------------
# fp32 matmuls on oneDNN
# ------------------------------------------------------------------------------------------------


def _onednn_matmul_backend():
    """torch's oneDNN matmul settings with their `fp32_precision` switch, or None in a torch without it
    (older than ~2.7, which pyproject allows)."""
    backend = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)
    return backend if hasattr(backend, "fp32_precision") else None


def onednn_fp32_matmul_on() -> bool:
    """Whether fp32 matmuls take oneDNN's exact AVX-512 path right now (inside `fast_fp32_matmul`, or a
    user's own setting of the same switch on a CPU where `onednn_fp32_is_exact`)."""
    backend = _onednn_matmul_backend()
    return backend is not None and backend.fp32_precision == "bf16" and onednn_fp32_is_exact()


@functools.cache
def onednn_fp32_is_exact() -> bool:
    """Whether routing fp32 matmuls to oneDNN keeps fp32 accuracy on this CPU, checked against float64.

    torch sends fp32 matmuls to oneDNN only when `torch.backends.mkldnn.matmul.fp32_precision` allows a
    reduced precision. On CPUs with AMX oneDNN then really computes in bf16 (relative error ~1e-3); on
    AVX-512 CPUs without AMX it computes in fp32 (error ~1e-7) on a path 2-3x faster than MKL's on AMD
    CPUs. Only the second case passes this check.
    """
    backend = _onednn_matmul_backend()
    if backend is None or not torch.backends.mkldnn.is_available():
        return False
    old, enabled = backend.fp32_precision, torch._C._get_mkldnn_enabled()
    try:
        # oneDNN itself switched on for the probe: asked first inside `onednn_off`, the product would take MKL
        # and pass, and the cached answer would stand where oneDNN computes in bf16 (AMX).
        torch._C._set_mkldnn_enabled(True)
        backend.fp32_precision = "bf16"
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(512, 384, generator=g), torch.randn(384, 768, generator=g)
        exact = a.double() @ b.double()
        error = ((a @ b).double() - exact).abs().max() / exact.abs().max()
        return bool(error < 1e-5)
    except (RuntimeError, ValueError, TypeError):
        return False
    finally:
        backend.fp32_precision = old
        torch._C._set_mkldnn_enabled(enabled)


# Below this model width MKL's fp32 matmuls were as fast or faster in bench_gpt.py (shape A, 128 wide:
# 22k vs 17k tokens/s; 192-256 wide: within noise); at 384 wide oneDNN's were 1.4x faster.
ONEDNN_FP32_MIN_WIDTH = 384


def cpu_runs_avx512() -> bool:
    """Whether torch's CPU kernels run at the AVX-512 level here (`torch.backends.cpu.get_cpu_capability`)."""
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return capability is not None and capability().startswith("AVX512")


AMD_VENDOR_IDS = ("AuthenticAMD", "HygonGenuine")  # Hygon's CPUs are licensed AMD Zen cores


@functools.lru_cache(maxsize=1)
def cpu_is_amd() -> bool:
    """Whether this CPU is an AMD one, or a Hygon one (AMD's Zen cores, which MKL treats as it treats AMD's):
    /proc/cpuinfo's vendor_id on Linux; elsewhere the processor's name."""
    if sys.platform.startswith("linux"):
        return _cpuinfo("vendor_id") in AMD_VENDOR_IDS
    import platform

    return any(name in platform.processor() for name in ("AMD", "Hygon"))


def wants_onednn_fp32(model: torch.nn.Module) -> bool:
    """Whether oneDNN's fp32 matmuls pay off for training `model` here: a model wide enough (see
    ONEDNN_FP32_MIN_WIDTH) on an AMD CPU with AVX-512. What they win is oneDNN's AVX-512 kernels where MKL avoids
    AVX-512 (AMD CPUs). On an AVX2-only Zen 3 the products ran at MKL's speed and an fp32 step at 384 wide took
    1,682 / 1,514 / 1,620 ms with the switch against 1,624 / 1,523 / 1,465 without (three runs in turns, 2026-11-28),
    attention then leaving torch's flash kernel for a path ~7 % slower there; on an Intel Ice Lake, where MKL runs
    AVX-512 itself, a step at shape B took 845 ms with the switch against 757 without (medians of six in turns,
    2026-12-07)."""
    config = getattr(model, "config", None)
    return int(getattr(config, "d_model", 0) or 0) >= ONEDNN_FP32_MIN_WIDTH and cpu_runs_avx512() and cpu_is_amd()


class _HeldSetting:
    """A process-wide setting held at one value while any block holding it runs, in any thread, and given back as
    the first of them found it when the last one leaves. Saving and restoring in each block lost the setting
    where blocks of two threads overlapped and left in the other order: the last to leave wrote back the value
    it had found inside the other's block (oneDNN stayed off for the process, 16x slower bf16 products)."""

    __slots__ = ("_get", "_set", "_value", "_lock", "_holders", "_found")

    def __init__(self, get, set_, value):
        self._get, self._set, self._value = get, set_, value
        self._lock, self._holders, self._found = threading.Lock(), 0, None

    def hold(self) -> None:
        with self._lock:
            if not self._holders:
                self._found = self._get()
            self._holders += 1
            self._set(self._value)

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if not self._holders:
                self._set(self._found)


_ONEDNN_OFF = _HeldSetting(torch._C._get_mkldnn_enabled, torch._C._set_mkldnn_enabled, False)


@functools.cache
def _fp32_on_onednn() -> _HeldSetting:
    """fp32 matmuls on oneDNN, held (made on first use: torch's switch, where this torch has it)."""
    backend = _onednn_matmul_backend()
    return _HeldSetting(lambda: backend.fp32_precision, lambda value: setattr(backend, "fp32_precision", value),
                        "bf16")


@contextlib.contextmanager
def fast_fp32_matmul(device: torch.device | str, enabled: bool = True) -> Iterator[bool]:
    """Within the block, fp32 matmuls on the CPU take oneDNN's AVX-512 path where `onednn_fp32_is_exact`;
    yields whether it did. Used for fp32 training of wide models (`wants_onednn_fp32`): for narrow
    models and for batch-1 decoding (matrix-vector products) MKL stays faster."""
    if not enabled or torch.device(device).type != "cpu" or not onednn_fp32_is_exact():
        yield False
        return
    switch = _fp32_on_onednn()
    switch.hold()  # held, not saved and restored: another thread's run may be inside the same block
    try:
        yield True
    finally:
        switch.release()


class onednn_off:  # noqa: N801 - used like a function: `with onednn_off(...):`
    """Within the block (where `on`), CPU ops skip oneDNN for torch's own kernels; the switch is restored on
    the way out, an error included, by the last of overlapping blocks of several threads to leave. It is
    process-wide: an op another thread runs meanwhile skips oneDNN too, with the same result up to rounding. A
    class rather than a generator: it sits on decoding's per-token path, where it costs ~1 µs a use against
    ~1.5 for `contextlib.contextmanager`."""

    __slots__ = ("on",)

    def __init__(self, on: bool = True):
        self.on = on

    def __enter__(self) -> None:
        if self.on:
            _ONEDNN_OFF.hold()

    def __exit__(self, *exc: object) -> None:
        if self.on:
            _ONEDNN_OFF.release()
