"""AdamW with weight-decay groups, and the learning-rate schedules.

Weight decay rule: a parameter is decayed when it is a matrix (``p.ndim >= 2``: Linear and attention
projection weights, convolution kernels) and is not owned by an ``nn.Embedding`` (token, segment or
learned position tables) and its name does not end in "bias". Biases (of any shape: bilinear attention's key
bias is a matrix), norm gains and other vectors are never decayed. A tied weight that is
both an embedding and an output projection counts as an embedding. A model can exclude more
parameters by defining ``no_weight_decay() -> set[str]`` returning parameter names.

Schedules are a pure function of the step, `lr_at(step, config)`, applied by writing the learning rate
into every parameter group before each optimizer step: there is no scheduler object whose state could
drift from the step counter, so a resumed run gets exactly the same learning rates.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from attnlab.training.trainer import TrainerConfig

SCHEDULES = ("cosine", "noam", "linear", "constant")


def lr_at(step: int, config: TrainerConfig) -> float:
    """Learning rate for optimizer step `step` (0-based) under `config`'s schedule.

    All schedules warm up linearly: step s < warmup_steps gets lr·(s+1)/warmup_steps, so the peak `lr`
    is reached at step warmup_steps-1. Then:

    - "constant": lr.
    - "cosine": half a cosine from lr down to min_lr_ratio·lr, reached at step `decay_steps` (default
      `steps`, one past the last step a run trains) and kept after it.
    - "linear": a straight line from lr down to min_lr_ratio·lr, reached likewise.
    - "noam" (Vaswani et al. 2017): d_model^-0.5 · min(n^-0.5, n · warmup^-1.5) with n = step+1,
      rescaled so its peak (at n = warmup) equals lr: lr · min(sqrt(warmup / n), n / warmup).
      d_model cancels out in the rescaling; min_lr_ratio is not used.
    """
    lr, warmup = config.lr, config.warmup_steps
    total = config.decay_steps if config.decay_steps is not None else config.steps
    n = step + 1
    if config.schedule == "noam":
        return lr * min(math.sqrt(warmup / n), n / warmup)
    if n <= warmup:
        return lr * n / warmup
    if config.schedule == "constant":
        return lr
    floor = config.min_lr_ratio * lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if config.schedule == "cosine":
        return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - floor)
    if config.schedule == "linear":
        return lr + progress * (floor - lr)
    raise ValueError(f"unknown schedule {config.schedule!r}")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups, decayed and not decayed, following the rule in this module's docstring."""
    embedding_params = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    extra = getattr(model, "no_weight_decay", None)
    excluded = set(extra()) if callable(extra) else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():  # shared parameters are listed once
        if not p.requires_grad:
            continue
        # A bias is a bias whatever its shape (bilinear attention's key bias is (heads, key width)).
        if p.ndim >= 2 and id(p) not in embedding_params and name not in excluded and not name.endswith("bias"):
            decay.append(p)
        else:
            no_decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, config: TrainerConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over `model`'s trainable parameters, using torch's fused kernel where the device has one
    (CUDA, CPU, MPS in recent torch), else the multi-tensor (foreach) implementation."""
    groups = param_groups(model, config.weight_decay)
    kwargs = dict(lr=config.lr, betas=tuple(config.betas), eps=config.eps)
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        fused_ok = device.type in _get_fused_kernels_supported_devices()
    except ImportError:
        fused_ok = device.type == "cuda"
    fused_ok = fused_ok and all(p.is_floating_point() for g in groups for p in g["params"])
    if fused_ok:
        try:
            return torch.optim.AdamW(groups, **kwargs, fused=True)
        except (RuntimeError, TypeError, ValueError) as e:
            warnings.warn(f"fused AdamW unavailable ({e}); using the foreach implementation", stacklevel=2)
    return torch.optim.AdamW(groups, **kwargs)  # torch picks foreach on GPUs by itself
