"""Shared fixtures: every test starts from the same seed, and tiny modules can be perturbed away from
their structured initialisation (LayerNorm 1/0, zero biases, near-zero synthesizer tables) so a
parity or invariance test cannot pass because some weight happens to be trivial."""

from __future__ import annotations

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
