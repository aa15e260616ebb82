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
