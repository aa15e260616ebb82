"""The position-wise feed-forward network: Linear(D, Dff) → activation → dropout → Linear(Dff, D)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.modules.dropout import Dropout
from attnlab.registry import Registry
from attnlab.training.device import onednn_off

NATIVE_GELU_MAX = 8192  # elements: below this torch's own GELU kernel beat oneDNN's on the Zen 3 (above, slower)


def gelu(x: Tensor) -> Tensor:
    """The exact GELU, x·Φ(x), by the faster kernel for the input's size.

    On the CPU torch hands an fp32 exact GELU to oneDNN, which costs ~10 µs a call however small the input
    (12 µs for 16 values on a Zen 3 EPYC, against 1.5 µs for torch's own kernel of the same function): a
    fifth of the non-matmul time of a decoding step at batch 1. Small fp32 CPU inputs therefore take
    torch's kernel; large ones (training) keep oneDNN, which is faster there (`onednn_off`, process-wide for
    the call)."""
    if (x.numel() > NATIVE_GELU_MAX or x.device.type != "cpu" or x.dtype != torch.float32
            or torch.compiler.is_compiling()):
        return F.gelu(x)
    with onednn_off():
        return F.gelu(x)


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU's tanh approximation (GPT-2's), a named function so that a model using it pickles."""
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: Registry = Registry("activation")
ACTIVATIONS.add("relu", F.relu)
ACTIVATIONS.add("gelu", gelu)
ACTIVATIONS.add("gelu-tanh", gelu_tanh)
ACTIVATIONS.add("silu", F.silu)


class FeedForward(nn.Module):
    """FFN(x) = W2·act(W1·x + b1) + b2, applied to every position independently."""

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "relu", dropout: float = 0.0,
                 bias: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias)
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)
        self.act = ACTIVATIONS.get(activation)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(self.act(self.fc1(x))))
