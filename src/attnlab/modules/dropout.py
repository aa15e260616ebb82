"""Dropout (Srivastava et al. 2014) with a faster path on the CPU.

On a CPU torch draws dropout's mask with one call of its Mersenne Twister per element, on one thread: ~6 ns
an element on a Zen 4 core, so in training a Transformer with dropout 0.1 on 2 cores (the translation config:
256 wide, 3 + 3 layers, batches of 64 sentences) dropout took ~22 % of the step. `dropout` here draws 64
random bits per call of the generator and cuts them into four 16-bit numbers, one per element, each compared
with the drop probability rounded to a multiple of 1/65536 (0.1 becomes 0.1000061); the kept values are
scaled by 1 / (1 - that probability), so every output's expected value is its input exactly, as with
torch's. The same generator and seed make the same masks; only the stream differs from `F.dropout`'s.

Elsewhere torch's own dropout runs: on GPUs (whose generator is fast), under `torch.compile`, for small
tensors (below DROPOUT_MIN_ELEMENTS, where the extra calls cost more than they save), and where rounding would
move the probability by more than 0.1 % of itself (most p below 0.0076, and p = 1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

DROPOUT_MIN_ELEMENTS = 4096
_LEVELS = 1 << 16  # a 16-bit number per element


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """x with each element zeroed with probability p and the rest scaled by 1 / (1 - p), in training;
    x itself otherwise. See the module's notes for the CPU path."""
    if not training or p == 0:
        return x
    drop = round(p * _LEVELS)
    if (x.device.type != "cpu" or x.numel() < DROPOUT_MIN_ELEMENTS or torch.compiler.is_compiling()
            or drop >= _LEVELS or abs(drop - p * _LEVELS) > 1e-3 * p * _LEVELS):
        return F.dropout(x, p, training=True)
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_(-(1 << 63), None)
    keep = _keep(words.view(torch.int16)[:n].view(x.shape), drop)
    return torch.mul(x, keep).mul_(_LEVELS / (_LEVELS - drop))


def _keep(lanes: Tensor, drop: int) -> Tensor:
    """The mask of uniform int16 `lanes` (over [-32768, 32767]) that keeps each with probability
    (65536 - drop) / 65536: where it is at least -32768 + drop. Compared in place, the mask is 0/1 in int16,
    2 bytes an element (autograd keeps it for the backward, where torch's dropout keeps one of x's dtype)."""
    return lanes.ge_(drop - _LEVELS // 2)


class Dropout(nn.Dropout):
    """`nn.Dropout` (same settings, no weights) whose training pass on the CPU takes `dropout`'s faster path."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
