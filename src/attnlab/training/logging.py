"""What a run reports: a metrics log (JSON lines), a progress bar, and the loss-curve plot.

``metrics.jsonl`` holds one JSON object per line: training records (``step``, ``loss``, ``lr``,
``tokens_per_s``, ``elapsed``, and ``grad_norm``: the global gradient norm of the record's last step before
clipping, absent where grad_clip is 0) and evaluation records (``step``, ``eval_loss``,
``eval_perplexity`` for language models, ``eval_<name>`` for each extra metric, ``elapsed``). A value that is
not a finite number (the perplexity of a loss beyond 700 nats, the loss of an empty evaluation) is written as
null, so that every line is standard JSON (jq and other strict readers refuse NaN and Infinity).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from attnlab.config import finite_number
from attnlab.files import atomic_path, write_text_atomic

T = TypeVar("T")
METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss.png"
RUN_FILE = "run.json"  # the settings of the run (written by `attnlab train`)


class MetricsLog:
    """Appends records to a JSON-lines file, flushed after each line so a crash loses nothing written."""

    def __init__(self, path: str | os.PathLike[str], *, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled

    def start(self, keep_until_step: int | None = None, drop_evals_at: int | None = None) -> None:
        """Begin a run: empty the file, or (when resuming) keep only the records up to a step, without the
        evaluation records of step `drop_evals_at` (an evaluation that was stopped and is done again)."""
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if keep_until_step is not None:
            kept = [r for r in self.read() if r.get("step", 0) <= keep_until_step
                    and not (r.get("step") == drop_evals_at and any(key.startswith("eval_") for key in r))]
        write_text_atomic(self.path, "".join(json_line(r) for r in kept))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json_line(record))

    def read(self) -> list[dict[str, Any]]:
        """The records written so far. A line that is not a record (a torn last line from a crash, bytes that are
        not UTF-8, JSON that is not an object with an integer step) is skipped."""
        if not self.path.is_file():
            return []
        records = []
        with open(self.path, "rb") as f:
            for line in f:
                try:
                    record = json.loads(line.decode("utf-8"))
                except (ValueError, RecursionError):  # not UTF-8 or JSON, a 4,300-digit number, nested too deep
                    continue
                if isinstance(record, dict) and type(record.get("step")) is int:
                    records.append(record)
        return records


def perplexity(loss: float) -> float:
    """exp(loss), infinite where that leaves float64's range (a loss above 700): the same in training's
    evaluations and `attnlab evaluate` (which had capped it at exp(700), a finite number that was no perplexity)."""
    return math.inf if loss > 700 else math.exp(loss)


def json_line(record: dict[str, Any]) -> str:
    """`record` as one line of standard JSON, a value that is not a finite number written as null."""
    finite = {key: None if isinstance(value, float) and not math.isfinite(value) else value
              for key, value in record.items()}
    return json.dumps(finite, allow_nan=False) + "\n"


class Progress:
    """A tqdm bar over optimizer steps showing loss, lr and tokens/s (tqdm adds the ETA); no bar when
    disabled (progress = false, or a process other than rank 0). `write` prints its line above the bar, or
    alone where `echo` is set and there is no bar: progress = false hides the bar, not the evaluations.

    Where stderr is not a terminal (a log file, a pipe) a bar's redrawn frames would fill it with carriage
    returns: it gets a plain line instead, at most every LINE_EVERY_S seconds, with the same figures and the ETA."""

    LINE_EVERY_S = 30.0

    def __init__(self, total: int, initial: int, *, enabled: bool, echo: bool = False):
        self._bar = None
        self._echo = echo
        self._lines = enabled and not _is_terminal(sys.stderr)
        self._total, self._initial, self._n = total, initial, initial
        self._start = self._last_line = time.perf_counter()
        if enabled and not self._lines:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, desc="train")

    def update(self, n: int = 1) -> None:
        self._n += n
        if self._bar is not None:
            self._bar.update(n)

    def show(self, **values: float) -> None:
        formats = {"lr": "{:.3g}", "loss": "{:.4g}"}
        shown = {key: formats.get(key, "{:.0f}").format(value) for key, value in values.items()}
        if self._bar is not None:
            self._bar.set_postfix(shown, refresh=False)
        elif self._lines and (time.perf_counter() - self._last_line >= self.LINE_EVERY_S or self._n >= self._total):
            self._last_line = now = time.perf_counter()
            done = self._n - self._initial
            eta = (now - self._start) / done * (self._total - self._n) if done > 0 else float("nan")
            figures = "  ".join(f"{key}={value}" for key, value in shown.items())
            when = f"ETA {_duration(eta)}" if math.isfinite(eta) and self._n < self._total else ""
            print(f"train: step {self._n}/{self._total}  {figures}  {when}".rstrip(), file=sys.stderr, flush=True)

    def write(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message)
        elif self._echo:
            print(message, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # replaced or closed streams
        return False


def _duration(seconds: float) -> str:
    """h:mm:ss, or m:ss under an hour."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress_bar(iterable: Iterable[T], total: int, desc: str) -> Iterable[T]:
    """`iterable` with a tqdm bar of `total` batches (count, rate, ETA) on stderr while it runs, where stderr is a
    terminal (a pipe or a file gets no bar); the bar is cleared at the end, so what follows prints cleanly."""
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit="batch", dynamic_ncols=True, leave=False, disable=None)


def plot_losses(records: list[dict[str, Any]], path: str | os.PathLike[str]) -> Path | None:
    """Draw the training (and evaluation) loss against the step into a PNG; None when nothing to draw.

    Uses matplotlib's Agg canvas directly (no pyplot), so no global backend state is touched.
    """
    train = [(r["step"], r["loss"]) for r in records if "loss" in r and finite_number(r["loss"])]
    evals = [(r["step"], r["eval_loss"]) for r in records if "eval_loss" in r and finite_number(r["eval_loss"])]
    if not train and not evals:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if train:
        # A lone point (one log record: train.log_every >= train.steps) would be a line of no length, not drawn.
        ax.plot(*zip(*train), label="train", linewidth=1.2, marker="o" if len(train) == 1 else None, markersize=3)
    if evals:
        ax.plot(*zip(*evals), label="eval", marker="o", markersize=3, linewidth=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp)
    return path
