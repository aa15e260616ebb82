"""Which CPUs count as AMD's for the switches that pay off only where MKL leaves AVX-512 unused (oneDNN's fp32
matmuls for wide-model training, weight slicing in batch-1 decoding)."""

import io

import pytest

from attnlab.training import device


@pytest.mark.parametrize("vendor, amd", [("AuthenticAMD", True), ("HygonGenuine", True), ("GenuineIntel", False),
                                         ("CentaurHauls", False)])
def test_amd_and_hygon_cpus_count_as_amd_on_linux(monkeypatch, vendor, amd):
    # Hygon's CPUs are AMD Zen cores under licence, and MKL treats them as it treats AMD's
    cpuinfo = f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: fpu avx2\n"
    monkeypatch.setattr(device.sys, "platform", "linux")
    monkeypatch.setattr(device, "open", lambda *a, **k: io.StringIO(cpuinfo), raising=False)
    assert device.cpu_is_amd.__wrapped__() is amd


@pytest.mark.parametrize("name, amd", [("AMD64 Family 25 Model 97 Stepping 2, AuthenticAMD", True),
                                       ("Hygon C86 7285 32-core Processor", True),
                                       ("Intel64 Family 6 Model 106 Stepping 6, GenuineIntel", False), ("arm", False)])
def test_amd_and_hygon_cpus_count_as_amd_elsewhere(monkeypatch, name, amd):
    import platform

    monkeypatch.setattr(device.sys, "platform", "win32")
    monkeypatch.setattr(platform, "processor", lambda: name)
    assert device.cpu_is_amd.__wrapped__() is amd
