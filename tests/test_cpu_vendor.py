"""What attnlab reads of the CPU from /proc/cpuinfo: its bf16 instructions (precision "auto"), and whether it counts
as AMD's for the switches that pay off only where MKL leaves AVX-512 unused (oneDNN's fp32 matmuls for wide-model
training, weight slicing in batch-1 decoding)."""

import io

import pytest

from attnlab.training import device


def _linux_cpuinfo(monkeypatch, vendor: str = "X", flags: str = "fpu avx2") -> None:
    """This process reads a Linux /proc/cpuinfo of one processor of `vendor` and `flags`."""
    cpuinfo = f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: {flags}\n"
    monkeypatch.setattr(device.sys, "platform", "linux")
    monkeypatch.setattr(device, "open", lambda *a, **k: io.StringIO(cpuinfo), raising=False)


@pytest.mark.parametrize("flags, expected", [("fpu avx2 avx512f", False), ("fpu avx512_bf16 avx2", True),
                                             ("fpu amx_bf16 amx_tile", True)])
def test_cpu_bf16_is_read_from_the_cpu_flags(monkeypatch, flags, expected):
    _linux_cpuinfo(monkeypatch, flags=flags)
    assert device.cpu_has_bf16.__wrapped__() is expected
    monkeypatch.setattr(device.sys, "platform", "darwin")
    assert device.cpu_has_bf16.__wrapped__() is False


@pytest.mark.parametrize("vendor, amd", [("AuthenticAMD", True), ("HygonGenuine", True), ("GenuineIntel", False),
                                         ("CentaurHauls", False)])
def test_amd_and_hygon_cpus_count_as_amd_on_linux(monkeypatch, vendor, amd):
    # Hygon's CPUs are AMD Zen cores under licence, and MKL treats them as it treats AMD's
    _linux_cpuinfo(monkeypatch, vendor=vendor)
    assert device.cpu_is_amd.__wrapped__() is amd


@pytest.mark.parametrize("name, amd", [("AMD64 Family 25 Model 97 Stepping 2, AuthenticAMD", True),
                                       ("Hygon C86 7285 32-core Processor", True),
                                       ("Intel64 Family 6 Model 106 Stepping 6, GenuineIntel", False), ("arm", False)])
def test_amd_and_hygon_cpus_count_as_amd_elsewhere(monkeypatch, name, amd):
    import platform

    monkeypatch.setattr(device.sys, "platform", "win32")
    monkeypatch.setattr(platform, "processor", lambda: name)
    assert device.cpu_is_amd.__wrapped__() is amd
