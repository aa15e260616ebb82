"""The position-wise feed-forward network: Linear(D, Dff) → activation → dropout → Linear(Dff, D)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.registry import Registry

ACTIVATIONS: Registry = Registry("activation")
ACTIVATIONS.add("relu", F.relu)
ACTIVATIONS.add("gelu", F.gelu)
ACTIVATIONS.add("gelu-tanh", lambda x: F.gelu(x, approximate="tanh"))
ACTIVATIONS.add("silu", F.silu)


class FeedForward(nn.Module):
    """FFN(x) = W2·act(W1·x + b1) + b2, applied to every position independently."""

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "relu", dropout: float = 0.0,
                 bias: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff, bias=bias)
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)
        self.act = ACTIVATIONS.get(activation)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(self.act(self.fc1(x))))
