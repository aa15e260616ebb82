"""Rows for the tests of benchmarks/turns.py's processes: plain functions, so a spawned process can import them."""

from __future__ import annotations

import os
from pathlib import Path


def logging_row(label: str, log: str) -> tuple:
    """A row that appends '<label><round> <pid>' to `log` at every call."""
    def call(i: int) -> None:
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"{label}{i} {os.getpid()}\n")
    Path(log).touch()
    return call, lambda: None


def failing_row() -> tuple:
    raise ValueError("no such model")


def threads_row(log: str) -> tuple:
    """A row that writes the number of threads torch computes on in its process to `log`."""
    import torch

    Path(log).write_text(str(torch.get_num_threads()), encoding="utf-8")
    return (lambda i: None), lambda: None
