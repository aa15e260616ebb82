"""Data-parallel training under `torchrun` (DDP), and the few collectives the trainer needs.

Run the same command under `torchrun --nproc-per-node N -m attnlab train ...`: torchrun sets RANK,
WORLD_SIZE and LOCAL_RANK, `init_distributed` joins the process group (NCCL on GPUs, gloo on CPUs)
and the trainer wraps the model in DistributedDataParallel. Every process computes the same global
batch and keeps its own slice; only rank 0 writes files and shows progress. Without those variables
everything here is a no-op, so single-process code needs no special case.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from attnlab.errors import ConfigError, DataError
from attnlab.training.device import select_device


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {name}={value!r} is not an integer; "
                          "launch distributed runs with torchrun") from None


def env_world() -> World:
    """The world torchrun describes in RANK / WORLD_SIZE / LOCAL_RANK (one process when unset)."""
    return World(_env_int("RANK", 0), _env_int("WORLD_SIZE", 1), _env_int("LOCAL_RANK", 0))


def world() -> World:
    """The current world: the initialised process group if there is one, else a single process."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), _env_int("LOCAL_RANK", 0))
    return World()


def is_main() -> bool:
    """True on rank 0 (and in a single-process run): the process that writes files and logs."""
    return world().is_main


def init_distributed(device: str = "auto") -> tuple[World, torch.device]:
    """Join the process group when launched by torchrun; return the world and this process's device.

    Each process uses GPU number LOCAL_RANK when CUDA is used, else the CPU (gloo backend).

    Raises:
        ConfigError: torch without distributed support, or a device DDP cannot use here (MPS).
    """
    env = env_world()
    if env.size <= 1 and not (dist.is_available() and dist.is_initialized()):
        dev = select_device(device)
        if dev.type == "cuda" and dev.index is not None:
            torch.cuda.set_device(dev)  # torch's calls that name no GPU (streams, memory stats) then use this one
        return World(), dev
    if not dist.is_available():
        raise ConfigError("WORLD_SIZE > 1 but this torch build has no torch.distributed; run one process")
    if device in ("auto", "cuda") and torch.cuda.is_available():
        dev = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    elif device in ("auto", "cpu"):
        dev = torch.device("cpu")
    else:
        dev = select_device(device)
        if dev.type != "cuda":
            raise ConfigError(f"distributed training cannot use device {device!r}; use \"cuda\" or \"cpu\"")
        if dev.index is not None:  # every process would take that one GPU
            raise ConfigError(f"under torchrun each process takes GPU LOCAL_RANK; use device \"cuda\" or \"auto\", "
                              f"not {device!r} (CUDA_VISIBLE_DEVICES picks the GPUs)")
    if not dist.is_initialized():
        try:
            dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
        except ValueError as e:  # WORLD_SIZE set by hand, without the rendezvous torchrun provides (MASTER_ADDR...)
            raise ConfigError(f"WORLD_SIZE={env.size} but the process group cannot start ({str(e).strip()}); "
                              "launch distributed runs with torchrun, or unset WORLD_SIZE") from None
        atexit.register(shutdown)
    return world(), dev


_failed = False


def failed() -> None:
    """Mark this process as stopping on an error: `shutdown` at exit then leaves the process group without waiting
    for the others, which may be blocked in a collective this process will never join (waiting for them hung the
    whole run until gloo's 30-minute timeout); they fail on it at once instead, and torchrun stops the run."""
    global _failed
    _failed = True


def shutdown() -> None:
    """Leave the process group (safe to call when there is none): after a normal end, once the other processes
    are done with it (one that exits while another still works can make gloo abort that one); after `failed`,
    at once."""
    if dist.is_available() and dist.is_initialized():
        if not _failed:
            try:
                barrier()
            except RuntimeError:  # a peer already gone: nothing left to wait for
                pass
        dist.destroy_process_group()


def _comm_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over all processes, in place, and return it (unchanged in a single process)."""
    if world().distributed:
        if tensor.device != _comm_device():
            moved = tensor.to(_comm_device())
            dist.all_reduce(moved, op=dist.ReduceOp.SUM)
            tensor.copy_(moved)
        else:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather_bytes(data: bytes) -> list[bytes]:
    """Every process's `data`, in rank order (used to collect RNG states; no pickling involved)."""
    w = world()
    if not w.distributed:
        return [data]
    dev = _comm_device()
    length = torch.tensor([len(data)], dtype=torch.long, device=dev)
    lengths = [torch.zeros_like(length) for _ in range(w.size)]
    dist.all_gather(lengths, length)
    longest = int(max(n.item() for n in lengths))
    mine = torch.zeros(longest, dtype=torch.uint8, device=dev)
    if data:
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
    chunks = [torch.zeros_like(mine) for _ in range(w.size)]
    dist.all_gather(chunks, mine)
    return [c[: int(n.item())].cpu().numpy().tobytes() for c, n in zip(chunks, lengths)]


def barrier() -> None:
    if world().distributed:
        dist.barrier()


_PEER_GONE = ("closed by peer", "reset by peer", "broken pipe", "remote worker crash")


def peer_gone(e: BaseException) -> bool:
    """Whether `e` is a collective failing because another process of a torchrun run stopped (gloo: "Connection
    closed by peer"; NCCL: torch's DistError)."""
    if os.environ.get("WORLD_SIZE", "") in ("", "1"):
        return False
    text = str(e).lower()
    return isinstance(e, getattr(dist, "DistError", ())) or any(s in text for s in _PEER_GONE)


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` wrapped in DistributedDataParallel (which copies rank 0's weights to every process)."""
    from torch.nn.parallel import DistributedDataParallel

    # Parameters a model leaves out of its loss (`parameters_outside_loss`) get no gradient: DDP is told to look
    # for them (a search of the graph each step), else it waits for their gradients and stops at the next step.
    outside = getattr(model, "parameters_outside_loss", None)
    unused = bool(outside()) if callable(outside) else False
    placed = dict(device_ids=[device.index], output_device=device.index) if device.type == "cuda" else {}
    try:
        return DistributedDataParallel(model, find_unused_parameters=unused, **placed)
    except RuntimeError as e:  # DDP compares the weights' shapes across the processes first
        if "not to match" not in str(e) and "same model" not in str(e):  # a shape; the number of weights
            raise
        raise DataError("the processes of this distributed run built models of different shapes (another "
                        "vocabulary or number of classes: their data files differ); give every process the same "
                        "files") from None


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DDP and `torch.compile` wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model
