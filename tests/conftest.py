"""Shared fixtures: every test starts from the same seed, and tiny modules can be perturbed away from
their structured initialisation (LayerNorm 1/0, zero biases, near-zero synthesizer tables) so a
parity or invariance test cannot pass because some weight happens to be trivial."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def perturb():
    """`perturb(module, std=0.3)`: add N(0, std) noise to every parameter (frozen ones included)."""

    @torch.no_grad()
    def apply(module: nn.Module, std: float = 0.3) -> nn.Module:
        for p in module.parameters():
            p.add_(torch.randn_like(p) * std)
        return module.eval()

    return apply


# The real public data sets beside the repository (../shared/data, or $ATTNLAB_SHARED_DATA): never committed, so the
# tests that read them skip where they are absent.
SHARED_DATA = Path(os.environ.get("ATTNLAB_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")


@pytest.fixture
def shared_data():
    """`shared_data("sst2", "dev.tsv")`: the path of that file in the shared data folder; skips the test when it
    is missing."""

    def find(*parts: str) -> Path:
        path = SHARED_DATA.joinpath(*parts)
        if not path.exists():
            pytest.skip(f"{path} is missing (the shared data sets are not committed)")
        return path

    return find
