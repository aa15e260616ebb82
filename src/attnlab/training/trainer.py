"""The one training loop every objective uses.

An experiment supplies a model (``model(**batch) -> ModelOutput`` with a mean ``loss`` over targets
whose label is not -100), a batch source (``source.batch(step)`` is the global batch of optimizer
step ``step``, a pure function of the seed and the step) and, optionally, an evaluation source,
per-batch counts to accumulate over it (accuracies) and a metric function of the whole model. The
trainer does the rest, the same way for every objective:

- each process takes its slice of the global batch (rows of one example each, or of several packed
  examples told apart by ``document_ids``) and splits it into micro-batches;
- gradients are accumulated so they equal the gradient of the whole global batch: micro-batch i
  contributes ``loss_i * n_i / N`` where ``n_i`` counts its targets and ``N`` those of the global batch
  (micro-batches with more padding weigh less, exactly as in one large batch);
- gradient clipping, AdamW, the learning-rate schedule;
- periodic evaluation, best checkpoint, early stopping, metrics log, progress bar, loss plot;
- atomic checkpoints and exact resume: a resumed run ends with bit-identical weights, because the
  data position is the step, the learning rate a function of the step, and each step's random draws
  (dropout's masks) come from torch's generator seeded by (seed, process rank, step): nothing random
  carries from one step to the next, so a run stopped anywhere (Ctrl-C under torchrun included, where the
  processes cannot gather their states) goes on exactly.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import math
import random
import re
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from attnlab.config import Config, check_choice, check_positive, finite_number, is_unset
from attnlab.data.sources import BatchSource, evaluation_batches
from attnlab.errors import AttnlabError, CheckpointError, ConfigError, DataError, Terminated, one_line
from attnlab.training import checkpoint as ckpt
from attnlab.training.device import (
    DEVICES,
    PRECISIONS,
    _mps_available,
    autocast,
    fast_fp32_matmul,
    precision_name,
    resolve_precision,
    synchronize,
    wants_onednn_fp32,
)
from attnlab.training.distributed import (
    all_gather_bytes,
    all_reduce_sum,
    barrier,
    init_distributed,
    peer_gone,
    unwrap,
    wrap_ddp,
)
from attnlab.training.logging import (
    METRICS_FILE,
    PLOT_FILE,
    RUN_FILE,
    MetricsLog,
    Progress,
    perplexity,
    plot_losses,
)
from attnlab.training.optim import SCHEDULES, build_optimizer, lr_at, set_lr

IGNORE_INDEX = -100
CHECKPOINT_DIR = "checkpoint"
BEST_DIR = "best"
# Settings whose change between a run and its resumption changes the numbers (worth a warning).
_RESUME_SENSITIVE = ("batch_size", "micro_batch_size", "lr", "min_lr_ratio", "weight_decay", "betas", "eps",
                     "schedule", "warmup_steps", "decay_steps", "grad_clip", "seed", "precision", "compile")


# Metrics whose larger values are better (by name ending), for the default best_mode.
HIGHER_IS_BETTER = ("accuracy", "bleu")


@dataclass
class TrainerConfig(Config):
    """Settings of a training run.

    Attributes:
        steps: optimizer steps in the whole run.
        batch_size: global batch size (examples per optimizer step, over all processes).
        micro_batch_size: examples per forward/backward pass; None = the whole per-process batch.
            batch_size must be divisible by micro_batch_size × the number of processes. A source that packs
            several examples into a row (``document_ids``) gives fewer rows: they are shared in as many passes.
        lr: peak learning rate.
        min_lr_ratio: the cosine and linear schedules decay to min_lr_ratio × lr, reached at step decay_steps
            (default `steps`: one past the last step trained, whose rate is just above it).
        weight_decay: AdamW decoupled weight decay, applied to weight matrices only (see `optim`).
        betas, eps: AdamW's moment decay rates and denominator epsilon.
        schedule: "cosine", "noam", "linear" or "constant", each after a linear warmup (see `lr_at`).
        warmup_steps: steps of linear warmup (required by "noam").
        decay_steps: "cosine"/"linear" reach min_lr_ratio·lr at this step and stay there; None = `steps`.
        grad_clip: clip the global gradient norm to this value; 0 turns clipping off.
        eval_every: evaluate every this many steps (and always at the end); 0 = only at the end.
        eval_batches: evaluate on at most this many batches of batch_size examples (the same ones whatever
            micro_batch_size and the number of processes); 0 = the whole evaluation split.
        save_every: write ``checkpoint/`` every this many steps (and always at the end); 0 = only at the end.
        early_stopping_patience: stop after this many evaluations without improvement; 0 = never.
        best_metric: the evaluation metric that picks ``best/``: "loss", "perplexity", or a name
            returned by the metrics function.
        best_mode: "min" if lower `best_metric` is better, "max" if higher is; by default "max" for
            accuracies and BLEU, "min" for losses and perplexities.
        seed: seed of Python's, numpy's and torch's RNGs (process r uses seed + r).
        precision: "auto" (bf16 where the hardware supports it), "bf16" or "fp32"; weights stay fp32.
        compile: run the model through torch.compile (falls back to eager with a warning).
        device: "auto", "cpu", "cuda", "cuda:N" (one GPU by number; under torchrun each process takes GPU
            LOCAL_RANK, so "cuda" or "auto") or "mps".
        log_every: write a training record to metrics.jsonl every this many steps.
        progress: show a progress bar.
        out_dir: the run folder, used when `Trainer` is not given one (config-file runs).
    """

    steps: int = 1000
    batch_size: int = 32
    micro_batch_size: int | None = None
    lr: float = 3e-4
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    schedule: str = "cosine"
    warmup_steps: int = 0
    decay_steps: int | None = None
    grad_clip: float = 1.0
    eval_every: int = 0
    eval_batches: int = 0
    save_every: int = 0
    early_stopping_patience: int = 0
    best_metric: str = "loss"
    best_mode: str | None = None
    seed: int = 0
    precision: str = "auto"
    compile: bool = False
    device: str = "auto"
    log_every: int = 10
    progress: bool = True
    out_dir: str | None = None

    @property
    def direction(self) -> str:
        """best_mode resolved: "max" for a metric whose larger values are better (accuracy kept under "min" would
        keep the worst evaluation in best/), else "min". Resolved here, not stored: a run.json that recorded the
        resolved mode kept it when given back with another best_metric."""
        return best_direction(self.best_metric, self.best_mode)

    def __post_init__(self):
        for name in ("steps", "batch_size", "lr", "eps", "log_every"):
            check_positive(name, getattr(self, name))
        for name in ("weight_decay", "warmup_steps", "grad_clip", "eval_every", "eval_batches", "save_every",
                     "early_stopping_patience", "seed"):
            check_positive(name, getattr(self, name), allow_zero=True)
        if self.seed >= 2**63:  # torch and numpy take 64-bit seeds (and process r uses seed + r)
            raise ConfigError(f"seed must be below 2**63 = {2**63}, got {self.seed}; choose a smaller seed")
        if self.decay_steps is not None:
            check_positive("decay_steps", self.decay_steps)
        if self.micro_batch_size is not None:
            check_positive("micro_batch_size", self.micro_batch_size)
            if self.batch_size % self.micro_batch_size:
                raise ConfigError(f"batch_size ({self.batch_size}) must be divisible by micro_batch_size "
                                  f"({self.micro_batch_size}); change one of them")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"min_lr_ratio must be between 0 and 1, got {self.min_lr_ratio}")
        self.betas = tuple(self.betas)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"betas must be two numbers in [0, 1), got {list(self.betas)}")
        check_choice("schedule", self.schedule, SCHEDULES)
        if self.schedule == "noam" and self.warmup_steps == 0:
            raise ConfigError("schedule \"noam\" needs warmup_steps > 0 (the paper uses 4000)")
        if self.schedule in ("cosine", "linear") and self.decay_steps is not None \
                and self.decay_steps <= self.warmup_steps:
            raise ConfigError(f"decay_steps ({self.decay_steps}) must be larger than warmup_steps "
                              f"({self.warmup_steps}): the {self.schedule} decay runs between the two")
        if self.out_dir is not None and not str(self.out_dir).strip():  # "" would be the working directory
            raise ConfigError("out_dir is empty; give the run's folder, e.g. runs/my-run")
        if is_unset(self.best_mode):  # --set train.best_mode=none: back to the metric's own (min and max are the
            self.best_mode = None  # only values, so "none" cannot be one)
        if self.best_mode is not None:  # None follows the metric (see `direction`), and stays None in run.json
            check_choice("best_mode", self.best_mode, ("min", "max"))
        check_choice("precision", self.precision, PRECISIONS)
        if not (isinstance(self.device, str) and re.fullmatch(r"cuda:(0|[1-9][0-9]*)", self.device)):  # a GPU's number
            check_choice("device", self.device, (*DEVICES, "cuda:N"))
            if self.device == "cuda:N":  # in the list of choices, but the N stands for a number
                raise ConfigError("device: in cuda:N, N is a GPU's number (cuda:0 is the first); give one")


class TrainingInterrupted(AttnlabError):
    """Training stopped by Ctrl-C after saving a checkpoint; the message says how to resume."""

    exit_code = 130  # the shell's convention for a run stopped by SIGINT


class TrainingDiverged(AttnlabError):
    """The training loss (or the weights) became NaN or infinite; the last checkpoint was not overwritten."""

    same_in_every_process = True  # the loss is summed over the processes, and each holds the same weights


# A Ctrl-C once the last step is done: nothing is left to resume.
_FINISHED = "training finished at step {step} (the last), interrupted before its summary; checkpoint saved in {folder}"
_STOPPED_EARLY = ("training stopped early at step {step} of {steps} (no better evaluation in "
                  "train.early_stopping_patience evaluations), interrupted before its summary; checkpoint saved in "
                  "{folder}")


_RESUME_MISMATCH = ("cannot resume: {}; resume with the model settings the run was trained with (the config it was "
                    "trained from, without model.* --set values that change them), or train into another "
                    "train.out_dir")


def _diverged_fix(cfg: TrainerConfig, precision: str) -> str:
    """What to change after a loss or weights that became NaN or inf, less what the run already does."""
    fixes = ["lower lr", "raise warmup_steps"]
    if not cfg.grad_clip:
        fixes.append("enable grad_clip")
    if precision != "fp32":
        fixes.append('use precision = "fp32"')
    return ", ".join(fixes[:-1]) + " or " + fixes[-1]


def best_direction(metric: str, mode: str | None) -> str:
    """A best_mode as given (None: by the metric's name) as "min" or "max"."""
    return mode if mode is not None else "max" if metric.endswith(HIGHER_IS_BETTER) else "min"


def check_batch_split(cfg: TrainerConfig, processes: int) -> None:
    """Refuse a global batch that the processes (and each one's micro-batches) cannot share equally."""
    if cfg.batch_size % processes:  # every process takes an equal share of the global batch
        raise ConfigError(f"batch_size ({cfg.batch_size}) must be a multiple of the {processes} "
                          f"processes; set train.batch_size to a multiple of {processes}")
    if cfg.micro_batch_size and cfg.batch_size % (cfg.micro_batch_size * processes):
        raise ConfigError(f"batch_size ({cfg.batch_size}) must be divisible by micro_batch_size "
                          f"({cfg.micro_batch_size}) × processes ({processes}); "
                          "change batch_size or micro_batch_size")


@contextlib.contextmanager
def _interrupts_deferred(*, drop: bool = False) -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM received inside the block take effect at its end, with the handlers they
    would have met. Around an optimizer step and the step counter's increment: interrupted between the two, a
    checkpoint held weights already updated by a step it counted as not done (a resume applied it twice), and a
    fused or foreach AdamW can be stopped between its parameter groups.

    With ``drop``, those received are dropped instead: around the save of a run that is already stopping, where
    a second Ctrl-C (an impatient user presses it twice) cut the save short and lost the steps since the last
    checkpoint."""
    signums = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.getsignal(signum) for signum in signums}
    # Signals reach the main thread only; a handler installed outside Python (None) could not be put back.
    if threading.current_thread() is not threading.main_thread() or None in previous.values():
        yield
        return
    held: list[int] = []
    for signum in signums:
        signal.signal(signum, lambda received, frame: held.append(received))
    try:
        try:
            yield
        finally:
            # Both put back with the two signals blocked: one arriving between the two would otherwise raise there
            # and leave the other's holder installed, dropping that signal from then on.
            blocks = hasattr(signal, "pthread_sigmask")
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, signums) if blocks else None
            try:
                for signum in signums:
                    signal.signal(signum, previous[signum])
            finally:
                if blocks:
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    except Exception as e:
        # A torchrun worker waiting in a collective when the same Ctrl-C stopped its peer ("Connection closed by
        # peer"): the signal, which came first, is what the block ends with (the error stays as its context). Any
        # other error stays as it is: one inside the optimizer step (out of memory) may leave the step half applied,
        # which the interrupt's save would have recorded as not taken.
        if held and not drop and peer_gone(e):
            _deliver(held[0], previous[held[0]])
        raise
    for signum in [] if drop else held[:1]:
        _deliver(signum, previous[signum])


def _deliver(signum: int, handler: Any) -> None:
    """Call the handler a held signal would have met."""
    if callable(handler):
        handler(signum, None)  # Python's SIGINT handler raises KeyboardInterrupt; the CLI's SIGTERM one too
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)


def seed_everything(seed: int) -> None:
    """Seed Python's `random`, numpy's global generator and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_step(seed: int, rank: int, step: int) -> None:
    """Seed torch's generators (all devices) for one training step of one process: its dropout masks are then a
    function of (seed, rank, step) alone, whatever ran before (an evaluation, an interruption and a resume)."""
    words = np.random.SeedSequence([seed % 2**63, rank, step]).generate_state(2, dtype=np.uint32)
    value = int(words[0]) << 31 | int(words[1]) >> 1  # 63 bits
    # Not torch.manual_seed: where CUDA is not started (every CPU run) it queues CUDA's seeding for later and
    # records the caller's stack to do so, ~0.3-0.8 ms a step. A GPU in use is started by the time a step runs.
    torch.default_generator.manual_seed(value)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(value)
    if _mps_available():
        torch.mps.manual_seed(value)


def count_targets(batch: dict[str, Any], key: str = "labels") -> int:
    """How many labels of `batch[key]` are not -100 (the targets a model's mean loss averages over)."""
    labels = batch.get(key)
    if not isinstance(labels, Tensor):
        raise DataError(f"a training batch has no {key!r} tensor (keys: {', '.join(batch)}); "
                        "the batch source must provide labels (-100 = ignore)")
    return int((labels != IGNORE_INDEX).sum())


# A model whose loss adds means over different targets (BERT: masked tokens + sentence pairs) reports them in
# `out.extra["loss_terms"]`, {batch key of a term's labels: the term's mean over them}. Accumulated
# micro-batches and evaluation then weight each term by its own counts, so the sum is the large batch's.
LOSS_TERM = "loss_term:"  # the prefix of those terms' (total, count) sums among evaluation counts


def loss_from_sums(sums: Tensor, counted: dict[str, Tensor]) -> tuple[float, dict[str, Tensor]]:
    """The mean loss of `evaluation_sums` (summed over processes): the sum of the loss terms' means where the
    model reported terms, else loss·n / n; and the other counts."""
    terms = {name: pair for name, pair in counted.items() if name.startswith(LOSS_TERM)}
    rest = {name: pair for name, pair in counted.items() if name not in terms}
    if terms:
        return sum(float(total) / max(float(count), 1.0) for total, count in terms.values()), rest
    return (sums[0] / sums[1]).item() if sums[1] > 0 else math.nan, rest


# eval_counts(batch, output) -> {name: (total, count)}: tensors or numbers, summed over the evaluation split.
EvalCounts = Callable[[dict[str, Any], Any], dict[str, tuple[Any, Any]]]


def evaluation_sums(forward: Callable[[dict[str, Any]], Any], batches: Iterable[dict[str, Any]],
                    device: torch.device, counts: EvalCounts | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Sums over `batches` (moved to `device`, each given to `forward`): (loss·n, n, masked-LM loss·n),
    n the targets of a batch and the masked-LM loss the loss where the model reports none, and for each
    metric of `counts` its (total, count). In float64, float32 on MPS (which has no float64)."""
    acc = torch.float32 if device.type == "mps" else torch.float64
    sums = torch.zeros(3, dtype=acc, device=device)
    counted: dict[str, Tensor] = {}
    for batch in batches:
        batch = _to_device(batch, device)
        out = forward(batch)
        if out.loss is None:
            raise DataError("the model returned no loss for an evaluation batch; "
                            "the evaluation source must provide 'labels'")
        n = out.n_targets if out.n_targets is not None else count_targets(batch)
        sums[0] += out.loss.to(acc) * n
        sums[1] += n
        for key, term in out.extra.get("loss_terms", {}).items():
            pair = counted.setdefault(LOSS_TERM + key, torch.zeros(2, dtype=acc, device=device))
            count = count_targets(batch, key)
            pair[0] += term.to(acc) * count
            pair[1] += count
        # Perplexity is of the token loss alone: BERT's loss adds next-sentence prediction.
        sums[2] += out.extra.get("mlm_loss", out.loss).to(acc) * n
        for name, (total, count) in (counts(batch, out) if counts is not None else {}).items():
            pair = counted.setdefault(name, torch.zeros(2, dtype=acc, device=device))
            pair[0] += total
            pair[1] += count
    return sums, counted


def _count_tokens(batch: dict[str, Any]) -> int:
    """The real tokens of a batch, padding left out (tokens/s): a translation batch's source and target tokens."""
    if isinstance(batch.get("src_mask"), Tensor) and isinstance(batch.get("labels"), Tensor):
        return int(batch["src_mask"].sum()) + int((batch["labels"] != IGNORE_INDEX).sum())
    if isinstance(batch.get("attention_mask"), Tensor):
        return int(batch["attention_mask"].sum())
    if isinstance(batch.get("document_ids"), Tensor):  # packed rows: the documents' tokens, not the row-end padding
        return int((batch["document_ids"] >= 0).sum())
    for key in ("input_ids", "labels"):
        if isinstance(batch.get(key), Tensor):
            return batch[key].numel()
    return 0


def _rows(batch: dict[str, Any]) -> int:
    return int(batch["labels"].shape[0]) if isinstance(batch.get("labels"), Tensor) else 0


def _batch_size(batch: dict[str, Any]) -> int:
    """The examples in `batch`: one per row, or, in packed rows, one per run of equal ``document_ids`` in a row
    (-1 marks padding), as the models read them (counting distinct ids refused rows that each number their
    documents from 0)."""
    documents = batch.get("document_ids")
    if isinstance(documents, Tensor):
        if documents.ndim != 2 or not documents.numel():
            return 0
        from attnlab.models.common import document_starts  # here: its attention imports attnlab.training, this package

        return int((document_starts(documents) & (documents >= 0)).sum())
    return _rows(batch)


def slice_batch(batch: dict[str, Any], start: int, stop: int, size: int) -> dict[str, Any]:
    """Rows start:stop of every tensor whose first dimension is the batch size `size` (others unchanged)."""
    return {k: v[start:stop] if isinstance(v, Tensor) and v.ndim >= 1 and v.shape[0] == size else v
            for k, v in batch.items()}


def _to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    non_blocking = device.type == "cuda"
    return {k: v.to(device, non_blocking=non_blocking) if isinstance(v, Tensor) else v
            for k, v in batch.items()}


def _raw_rng() -> tuple:
    cuda = None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = torch.cuda.get_rng_state_all()
    return random.getstate(), np.random.get_state(), torch.get_rng_state(), cuda


def _set_raw_rng(state: tuple) -> None:
    py, npy, cpu, cuda = state
    random.setstate(py)
    np.random.set_state(npy)
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


@contextlib.contextmanager
def _rng_preserved() -> Iterator[None]:
    """Evaluation (and metric functions that sample) must not move the training RNG streams, so a run's
    weights do not depend on how often it evaluates."""
    state = _raw_rng()
    try:
        yield
    finally:
        _set_raw_rng(state)


@dataclass
class _Window:
    """Training statistics since the last log record."""

    loss_sum: Tensor | None = None
    targets: int = 0
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    grad_norm: Tensor | None = None

    def add(self, loss_sum: Tensor, targets: int, tokens: int, seconds: float) -> None:
        self.loss_sum = loss_sum if self.loss_sum is None else self.loss_sum + loss_sum
        self.targets += targets
        self.tokens += tokens
        self.seconds += seconds
        self.steps += 1

    def to_dict(self) -> dict[str, Any] | None:
        if not self.steps:
            return None
        return {"loss_sum": float(self.loss_sum), "targets": int(self.targets), "tokens": self.tokens,
                "seconds": self.seconds, "steps": self.steps,
                "grad_norm": None if self.grad_norm is None else float(self.grad_norm)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], device: torch.device) -> _Window:
        window = cls(loss_sum=torch.tensor(float(data["loss_sum"]), device=device), targets=int(data["targets"]),
                     tokens=int(data["tokens"]), seconds=float(data["seconds"]), steps=int(data["steps"]))
        if data.get("grad_norm") is not None:
            window.grad_norm = torch.tensor(float(data["grad_norm"]))
        return window


@dataclass
class _Totals:
    tokens: int = 0
    train_seconds: float = 0.0
    elapsed_before: float = 0.0  # wall time of earlier sessions of a resumed run
    last_loss: float | None = None
    last_eval: dict[str, float] = field(default_factory=dict)


def _past_steps(step: int, steps: int) -> ConfigError:
    return ConfigError(f"cannot resume: the checkpoint is at step {step}, past train.steps = {steps}; set "
                       f"train.steps above {step} to train on (or to {step}: the run is finished)")


class Trainer:
    """Trains `model` on `train_source` for `config.steps` optimizer steps.

    Args:
        model: an attnlab model: ``model(**batch) -> ModelOutput`` and a ``.config`` of a registered family.
        config: a `TrainerConfig` (or a dict of its settings).
        train_source: a `BatchSource`; ``batch(step)`` gives the global batch of `config.batch_size` rows.
        eval_source: evaluated with ``iter_batches`` every `eval_every` steps and at the end.
        tokenizer: saved into every checkpoint (``tokenizer.save(path)``).
        out_dir: run folder: ``checkpoint/``, ``best/``, ``metrics.jsonl``, ``loss.png`` (default
            `config.out_dir`).
        eval_counts: ``eval_counts(batch, output) -> {name: (total, count)}``, called on every evaluation
            batch in the same pass as the loss; each metric is reported as the sum of its totals over the
            sum of its counts, over the whole evaluation split and all processes (an accuracy in % is
            ``(100 * correct, examples)``). See `EvalCounts`.
        metrics_fn: ``metrics_fn(model) -> dict[str, float]`` of extra evaluation metrics that need more
            than one forward pass per batch (the model is in eval mode under ``torch.no_grad``; it runs on
            every process, and rank 0's values are the run's on every process).
        extra_state: JSON-serialisable dict saved in ``trainer_state.json`` (restored on resume into
            ``trainer.extra_state``). Its ``"labels"``, a classifier's class names in output order, are what
            `evaluate` matches a file's labels to; taken from ``train_source.label_names`` where not given (a
            `ClassificationSource` has them).
        resume: continue from ``out_dir/checkpoint`` (model, optimizer, step, RNG states).

    Raises:
        ConfigError: invalid settings, a model without a registered config, or a batch size that the
            number of processes and micro_batch_size do not divide.
    """

    # What a warning of a setting that needs an evaluation tells a run without one to give (the recipe names its
    # task's data settings instead).
    eval_settings = "Trainer(eval_source=...)"

    def __init__(self, model: nn.Module, config: TrainerConfig | dict[str, Any], train_source: BatchSource, *,
                 out_dir: str | Path | None = None, eval_source: BatchSource | None = None,
                 tokenizer: Any = None,
                 eval_counts: EvalCounts | None = None,
                 metrics_fn: Callable[[nn.Module], dict[str, float]] | None = None,
                 extra_state: dict[str, Any] | None = None, resume: bool = False):
        if not isinstance(config, TrainerConfig):
            config = TrainerConfig.from_dict(config, where="train")
        self.config = cfg = config
        if out_dir is None and cfg.out_dir is None:
            raise ConfigError("no output folder: give Trainer(out_dir=...) or set train.out_dir")
        self.world, self.device = init_distributed(cfg.device)
        check_batch_split(cfg, self.world.size)
        self.dtype = resolve_precision(cfg.precision, self.device, setting="train.precision")
        ckpt._model_config(model)  # fail now, not at the first checkpoint, if the model cannot be saved
        if self.world.is_main and (why := ckpt.not_rebuilt_from_config(model)) is not None:
            warnings.warn(f"the model is a {type(unwrap(model)).__name__}: {why}; load them into a model of its "
                          "class with attnlab.training.load_checkpoint_into(run_folder, model)", stacklevel=2)
        self.model = model.to(self.device)
        self.optimizer = build_optimizer(self.model, cfg, self.device)
        self._ddp = wrap_ddp(self.model, self.device) if self.world.distributed else None
        self._compiled: nn.Module | None = None
        # Packed batches (several examples to a row) are only right for a model that keeps them apart.
        self._reads_documents = "document_ids" in inspect.signature(self.model.forward).parameters
        if cfg.compile:
            try:
                self._compiled = torch.compile(self._ddp or self.model)
            except Exception as e:  # torch.compile can be missing or refuse the platform
                warnings.warn(f"torch.compile is unavailable ({one_line(e)}); training without it",
                              stacklevel=2)
        self.train_source = train_source
        self.eval_source = eval_source
        self.tokenizer = tokenizer
        self.eval_counts = eval_counts
        self.metrics_fn = metrics_fn
        self.extra_state = dict(extra_state or {})
        names = getattr(train_source, "label_names", None)
        if "labels" not in self.extra_state and isinstance(names, (list, tuple)) and names:
            # A classifier trained from Python kept no class names, and `evaluate` then refused its run
            self.extra_state["labels"] = [str(name) for name in names]
        self.resume = resume
        self.out_dir = Path(out_dir if out_dir is not None else cfg.out_dir)
        self.step = 0
        self.best: dict[str, Any] | None = None
        self._best_eval_loss: float | None = None
        self._bad_evals = 0
        self._stale_best = False  # a best/ left by the run this from-scratch run replaces (see _save)
        self._stale_checkpoint = False  # and its checkpoint/
        self._fitted = False  # fit was called: a second call from scratch is refused (see _fit)
        self._in_step = False
        self._eval_due = False  # the step just counted owes an evaluation not yet begun
        self._rng_at_step_start: tuple | None = None
        # Between a step and the end of its evaluation: what best/ and early stopping stood at before it. A run
        # stopped there saves that, marked pending, and its resumption evaluates the step again.
        self._eval_pending: tuple | None = None
        self._said_no_best = False  # the warning that early stopping has no best_metric to follow, given once
        self._window = _Window()  # the training statistics since the last log record (saved with checkpoints)
        self._resume_eval = False  # the checkpoint resumed from was saved inside an evaluation
        self._totals = _Totals()
        self._fit_start: float | None = None
        self.log = MetricsLog(self.out_dir / METRICS_FILE, enabled=self.world.is_main)

    # ------------------------------------------------------------------------------------------------
    # One optimizer step

    def _forward(self, batch: dict[str, Any], *, train: bool) -> Any:
        if "document_ids" in batch and not self._reads_documents:
            raise DataError(f"the batches pack several examples into a row (document_ids), which "
                            f"{type(self.model).__name__} cannot keep apart; use a GPT or a source without packing")
        module = (self._ddp or self.model) if train else self.model
        compiled = self._compiled if (train or self._ddp is None) else None
        with autocast(self.device, self.dtype):
            if compiled is not None:
                try:
                    with _backward_compiled_with_forward():
                        return compiled(**batch)
                except Exception as e:  # compile errors surface at the first call; eager re-raises real ones
                    # torch's BackendCompilerFailed says on its first line only which backend raised
                    cause = getattr(e, "inner_exception", None)
                    why = f"{type(cause).__name__}: {one_line(cause)}" if isinstance(cause, Exception) else one_line(e)
                    warnings.warn(f"torch.compile failed ({why}); continuing without compilation", stacklevel=2)
                    self._compiled = None
            return module(**batch)

    def micro_batches(self, batch: dict[str, Any]) -> list[dict[str, Any]]:
        """This process's share of the global `batch`, split into micro-batches of micro_batch_size rows.

        Packed rows (several examples to a row: fewer rows than batch_size) are shared as evenly as they allow,
        in at most as many micro-batches, so no pass holds more tokens than with one example per row. The
        gradient is the global batch's either way (see `backward`)."""
        n_proc, rank = self.world.size, self.world.rank
        per_rank = self.config.batch_size // n_proc
        rows = _rows(batch)
        if rows < n_proc:
            raise DataError(f"a packed batch of {rows} row(s) cannot be shared among {n_proc} processes; raise "
                            "batch_size or train on fewer processes")
        start, stop = rank * rows // n_proc, (rank + 1) * rows // n_proc
        parts = min(per_rank // (self.config.micro_batch_size or per_rank), stop - start)
        bounds = [start + i * (stop - start) // parts for i in range(parts + 1)]
        return [slice_batch(batch, bounds[i], bounds[i + 1], rows) for i in range(parts)]

    def backward(self, batch: dict[str, Any]) -> tuple[Tensor, int]:
        """Accumulate into ``.grad`` the gradient of the mean loss over all targets of the global `batch`.

        Micro-batch i adds the gradient of ``loss_i * n_i / N`` (times the number of processes, since DDP
        averages gradients over them), where n_i counts its targets and N those of the whole global batch,
        which every process holds, so no communication is needed to know it. A model that reports its loss
        as terms over different targets (`loss_terms`: BERT's masked tokens and sentence pairs) has each
        term weighted so by its own counts.

        Returns:
            this process's sum of ``loss_i * n_i`` (detached) and N.
        """
        n_global = count_targets(batch)
        scale = self.world.size / max(n_global, 1)
        micro = self.micro_batches(batch)
        loss_sum = torch.zeros((), device=self.device)
        totals: dict[str, int] = {}  # each loss term's targets in the global batch
        for i, mb in enumerate(micro):
            n_i = count_targets(mb)
            sync = self._ddp is None or i == len(micro) - 1
            with contextlib.nullcontext() if sync else self._ddp.no_sync():
                out = self._forward(_to_device(mb, self.device), train=True)
                if out.loss is None:
                    raise DataError("the model returned no loss for a training batch; "
                                    "the batch source must provide 'labels'")
                terms = out.extra.get("loss_terms")
                if terms:  # each term weighted by its own share of the global batch's targets
                    objective = sum(term.float() * (count_targets(mb, key) * self.world.size
                                                    / max(totals.setdefault(key, count_targets(batch, key)), 1))
                                    for key, term in terms.items())
                else:
                    objective = out.loss.float() * (n_i * scale)
                objective.backward()
            # Its share of the global batch's loss times N: for loss terms each weighted by its own counts (the
            # plain mean over this micro-batch's n_i targets would weigh a term by another's counts).
            loss_sum += objective.detach() * (n_global / self.world.size) if terms else out.loss.detach().float() * n_i
        return loss_sum, n_global

    def _train_step(self, step: int) -> tuple[Tensor, int, int, Tensor | None]:
        """The gradients of step `step` (clipped); the optimizer step is the caller's, with the step count."""
        batch = self.train_source.batch(step)
        if _batch_size(batch) != self.config.batch_size:
            raise DataError(f"the training source gave a batch of {_batch_size(batch)} examples at step "
                            f"{step} but batch_size is {self.config.batch_size}; make the two equal")
        set_lr(self.optimizer, lr_at(step, self.config))
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, n_targets = self.backward(batch)
        grad_norm = None
        if self.config.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        return loss_sum, n_targets, _count_tokens(batch), grad_norm

    # ------------------------------------------------------------------------------------------------
    # Evaluation

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean loss over the evaluation split (weighted by target counts), perplexity for language
        models (token-level labels), the `eval_counts` metrics from the same forward passes, and the
        metrics function's values. RNG streams are left untouched."""
        metrics: dict[str, float] = {}
        was_training = self.model.training  # given back: a call between fits must not turn dropout on
        with _rng_preserved():
            self.model.eval()
            try:
                if self.eval_source is not None:
                    metrics.update(self._evaluate_source())
                if self.metrics_fn is not None:
                    extra = {key: float(value) for key, value in self.metrics_fn(self.model).items()}
                    if self.world.distributed:
                        # Rank 0's values stand for the run: a metric drawn from each process's own random stream
                        # differed, the processes disagreed on best/ (whose save is collective) and the run hung.
                        extra = json.loads(all_gather_bytes(json.dumps(extra).encode())[0])
                    metrics.update(extra)
            finally:
                self.model.train(was_training)
        return metrics

    def _evaluate_source(self) -> dict[str, float]:
        cfg = self.config
        token_level = False
        batch_size = cfg.micro_batch_size or cfg.batch_size // self.world.size
        # eval_batches counts batches of train.batch_size examples: the same examples whatever the micro-batches
        # and the number of processes (train.batch_size is a multiple of this pass's batch size).
        limit = min(cfg.eval_batches * (cfg.batch_size // batch_size), sys.maxsize)  # islice's largest stop

        def this_process_batches():
            nonlocal token_level
            for i, batch in enumerate(evaluation_batches(self.eval_source, batch_size, limit)):
                token_level = token_level or (isinstance(batch.get("labels"), Tensor) and batch["labels"].ndim >= 2)
                if i % self.world.size == self.world.rank:
                    yield batch

        sums, counted = evaluation_sums(lambda batch: self._forward(batch, train=False), this_process_batches(),
                                        self.device, self.eval_counts)
        acc = sums.dtype
        all_reduce_sum(sums)
        loss, counted = loss_from_sums(sums, self._all_counts(counted, acc))
        metrics = {"loss": loss}
        if token_level:
            token_loss = (sums[2] / sums[1]).item() if sums[1] > 0 else math.nan
            metrics["perplexity"] = perplexity(token_loss)
        for name, (total, count) in counted.items():
            metrics[name] = (total / count).item() if count > 0 else math.nan
        return metrics

    def _all_counts(self, counted: dict[str, Tensor], dtype: torch.dtype) -> dict[str, Tensor]:
        """`counted` summed over the processes (a process may have seen no batch, or none with a metric)."""
        if not self.world.distributed:
            return counted
        names = sorted({name for blob in all_gather_bytes(json.dumps(sorted(counted)).encode())
                        for name in json.loads(blob)})
        stacked = torch.stack([counted.get(name, torch.zeros(2, dtype=dtype, device=self.device))
                               for name in names]) if names else torch.zeros(0, 2, dtype=dtype)
        all_reduce_sum(stacked)
        return dict(zip(names, stacked, strict=True))

    def _record_eval(self, metrics: dict[str, float], elapsed: float) -> bool:
        """Log an evaluation, update best/ and early stopping; True when training should stop."""
        cfg = self.config
        self._totals.last_eval = metrics
        self.log.write({"step": self.step, **{f"eval_{k}": v for k, v in metrics.items()},
                        "elapsed": elapsed})
        if "loss" in metrics and math.isfinite(metrics["loss"]):
            if self._best_eval_loss is None or metrics["loss"] < self._best_eval_loss:
                self._best_eval_loss = metrics["loss"]
        if cfg.best_metric not in metrics:
            if cfg.best_metric == "loss" and self.eval_source is None:
                # only a metrics function, none of whose values is the default best_metric: no best/ to track
                if cfg.early_stopping_patience and not self._said_no_best:
                    self._said_no_best = True
                    warnings.warn(f"train.early_stopping_patience = {cfg.early_stopping_patience} cannot stop this "
                                  "run: only metrics_fn evaluates it, and best_metric = 'loss' is none of its values "
                                  f"({', '.join(metrics)}); set best_metric to one of them (and best_mode), or give "
                                  "an eval_source", stacklevel=2)
                return False
            raise ConfigError(f"best_metric {cfg.best_metric!r} is not an evaluation metric; "
                              f"choose one of: {', '.join(metrics) or 'none (give an eval source)'}")
        value = metrics[cfg.best_metric]
        best = None if self.best is None else self.best["value"]
        better = math.isfinite(value) and (best is None
                                           or (value < best if cfg.direction == "min" else value > best))
        if better:
            self.best = {"metric": cfg.best_metric, "value": value, "step": self.step}
            self._bad_evals = 0
            self._save(self.out_dir / BEST_DIR, with_optimizer=False)
        else:
            self._bad_evals += 1
        return bool(cfg.early_stopping_patience) and self._bad_evals >= cfg.early_stopping_patience

    # ------------------------------------------------------------------------------------------------
    # Checkpoints

    def _trainer_state(self, rng: list[dict[str, Any]], window: dict[str, Any] | None) -> dict[str, Any]:
        from attnlab import __version__

        return {
            "step": self.step,
            "data_position": self.step,  # the next step to train; batches are a function of the step
            "best": self.best,
            "best_eval_loss": self._best_eval_loss,
            "evals_without_improvement": self._bad_evals,
            "eval_pending": self._eval_pending is not None or self._eval_due,
            "log_window": window,
            "rng": rng,
            "world_size": self.world.size,
            "tokens_seen": self._totals.tokens,
            "last_train_loss": self._totals.last_loss,  # a resume that trains no step still reports them
            "last_eval": self._totals.last_eval,
            "train_seconds": self._totals.train_seconds,
            "elapsed": self._elapsed(),
            "trainer_config": self.config.to_dict(),
            "precision_used": self.precision_used,  # what train.precision "auto" resolved to on this machine
            "extra_state": self.extra_state,
            "attnlab_version": __version__,
        }

    def _save(self, folder: Path, *, with_optimizer: bool = True, gather: bool = True) -> Path:
        """Save a checkpoint on rank 0 with every process's RNG state (a collective when `gather`). Weights that
        are not all finite are never saved over a checkpoint (every process holds the same weights, so every
        process raises)."""
        params = [p.detach() for p in self.model.parameters()]
        if params and not bool(torch.stack([torch.isfinite(p).all() for p in params]).all()):
            raise TrainingDiverged(f"the weights became NaN or inf by step {self.step}; "
                                   f"{_diverged_fix(self.config, self.precision_used)} "
                                   f"({folder} was kept as it was)")
        mine = json.dumps(ckpt.capture_rng()).encode()
        states = all_gather_bytes(mine) if gather else [mine]
        window = self._window.to_dict()  # the same steps in every process (None in all of them, or in none)
        if window is not None and (gather or not self.world.distributed):
            # The statistics of every process (each holds its share of the loss): "global" lets a resume with any
            # number of processes go on with them. An interrupted distributed run saves rank 0's share alone.
            window["loss_sum"] = float(all_reduce_sum(self._window.loss_sum.detach().clone()))
            window["global"] = True
        if self.world.is_main:
            ckpt.save_checkpoint(folder, self.model, self.optimizer if with_optimizer else None,
                                 self._trainer_state([json.loads(s) for s in states], window), self.tokenizer)
            # The replaced run goes whole, a Ctrl-C or SIGTERM held until it has: one in the middle (removing a
            # large checkpoint takes a while) was taken for one before this run's first save, which said that run
            # was kept beside this run's best/, or saved checkpoint/ removing that best/ as the other run's.
            with _interrupts_deferred():
                if self._stale_best and folder != self.out_dir / BEST_DIR:
                    # The best/ of the run this one replaces goes once this run has weights of its own to show
                    # (until then the folder still holds that run whole); `--best` never loads the other run's.
                    ckpt.remove_checkpoint(self.out_dir / BEST_DIR)
                if self._stale_checkpoint and folder == self.out_dir / BEST_DIR:
                    # Likewise its checkpoint/ once this run's best/ is written: a crash before this run's first
                    # checkpoint left best/ and checkpoint/ of two runs, and --resume continued the old one.
                    ckpt.remove_checkpoint(self.out_dir / CHECKPOINT_DIR)
                if self._stale_best or self._stale_checkpoint:  # that run is gone now, and the records kept for it
                    for _, aside in self._records():
                        aside.unlink(missing_ok=True)
                self._stale_best = self._stale_checkpoint = False
        # In every process: rank 0's save replaced that run for all of them (a later SIGTERM is no longer one
        # before this run's first save, and a divergence keeps this run's checkpoint).
        self._stale_best = self._stale_checkpoint = False
        return folder

    def _records(self) -> list[tuple[Path, Path]]:
        """(in place, set aside) for each record of the run (metrics.jsonl, run.json). A from-scratch run sets aside
        those of the run it replaces: that run's checkpoints stay until this run saves its own, and a crash before
        that (a SIGKILL, a power cut) left them beside this run's records, which a --resume then continued as the
        old run's history."""
        return [(self.out_dir / name, self.out_dir / f".{name}.replaced") for name in (METRICS_FILE, RUN_FILE)]

    def save(self) -> Path:
        """Write ``out_dir/checkpoint`` now (every process must call this under DDP)."""
        return self._save(self.out_dir / CHECKPOINT_DIR)

    @property
    def finished(self) -> bool:
        """Whether the run (as restored from its checkpoint) has no step left to train and no evaluation to redo,
        or stopped early and stays stopped."""
        cfg = self.config
        stopped = bool(cfg.early_stopping_patience and self._bad_evals >= cfg.early_stopping_patience)
        return stopped or (self.step >= cfg.steps and not self._resume_eval)

    @staticmethod
    def checkpoint_to_resume(out_dir: str | Path) -> Path:
        """The checkpoint folder a run in `out_dir` resumes from: ``checkpoint/``, or the ``.checkpoint.old``
        a crash between the two renames of a save left (see `checkpoint`).

        Raises:
            CheckpointError: there is none.
        """
        folder = Path(out_dir) / CHECKPOINT_DIR
        try:
            return ckpt.find_checkpoint(folder)
        except CheckpointError:
            present = ckpt.checkpoint_in_place(folder)
            if (present / ckpt.CONFIG_FILE).is_file() and not (present / ckpt.MODEL_FILE).is_file():
                # the run is there, its weights lost: starting from scratch, as advised below, would replace it
                raise CheckpointError(f"cannot resume: {present} has no {ckpt.MODEL_FILE} (removed since it was "
                                      "saved); restore the file to resume, or train without --resume to start the "
                                      "run again") from None
            raise CheckpointError(f"cannot resume: no checkpoint in {folder}; "
                                  "train without resuming to start from scratch") from None

    @staticmethod
    def check_resumable(folder: Path, model: nn.Module, steps: int) -> None:
        """The model and step checks of a resume from checkpoint `folder` to `steps`, for a caller that writes into
        the run folder before the trainer resumes (a language model's token files replaced a finished run's data/
        for a resume then refused): the weights are loaded into `model`, and again by the trainer."""
        try:
            state = ckpt.load_checkpoint_into(folder, model)
        except ckpt.ModelMismatch as e:
            raise ckpt.ModelMismatch(_RESUME_MISMATCH.format(e.problem)) from None
        step = state.get("step")
        if type(step) is int and step > steps:  # a malformed step is the trainer's to refuse, in its words
            raise _past_steps(step, steps)

    def _restore(self) -> None:
        folder = self.checkpoint_to_resume(self.out_dir)
        try:
            state = ckpt.load_checkpoint_into(folder, self.model, self.optimizer)
        except ckpt.ModelMismatch as e:
            raise ckpt.ModelMismatch(_RESUME_MISMATCH.format(e.problem)) from None
        if not (folder / ckpt.STATE_FILE).is_file():
            raise CheckpointError(f"cannot resume: {folder} has no {ckpt.STATE_FILE}")
        if "step" not in state:
            raise CheckpointError(f"cannot resume: {folder / ckpt.STATE_FILE} has no step; the checkpoint is "
                                  "incomplete, use another one")
        if isinstance(state["step"], bool) or not isinstance(state["step"], int):  # 3.5, "3", 1e999, true
            raise CheckpointError(f"{folder / ckpt.STATE_FILE} is malformed (step {state['step']!r} is not a whole "
                                  "number); use another checkpoint")
        try:
            self.step = state["step"]
            self.best = state.get("best")
            self._best_eval_loss = state.get("best_eval_loss")
            self._bad_evals = int(state.get("evals_without_improvement", 0))
            self._resume_eval = bool(state.get("eval_pending", False))
            window = state.get("log_window")
            self.extra_state = dict(state.get("extra_state") or {})
            self._totals.tokens = int(state.get("tokens_seen", 0))
            last_loss = state.get("last_train_loss")
            self._totals.last_loss = float(last_loss) if isinstance(last_loss, (int, float)) else None
            last_eval = state.get("last_eval")
            self._totals.last_eval = {k: float(v) for k, v in last_eval.items() if isinstance(v, (int, float))} \
                if isinstance(last_eval, dict) else {}
            self._totals.train_seconds = float(state.get("train_seconds", 0.0))
            self._totals.elapsed_before = float(state.get("elapsed", 0.0))
            rng = list(state.get("rng") or [])
            saved_config = dict(state.get("trainer_config") or {})
            saved_world = int(state.get("world_size", 1))
        except (KeyError, TypeError, ValueError, OverflowError) as e:  # OverflowError: int(1e999)
            raise CheckpointError(f"{folder / ckpt.STATE_FILE} is malformed ({one_line(e)}); "
                                  "use another checkpoint") from None
        if self.step < 0:
            raise CheckpointError(f"{folder / ckpt.STATE_FILE} is malformed (step {self.step} is negative); "
                                  "use another checkpoint")
        best = self.best
        if not (best is None or (isinstance(best, dict) and isinstance(best.get("metric"), str)
                                 and finite_number(best.get("value")) and type(best.get("step")) is int)) \
                or not (self._best_eval_loss is None or finite_number(self._best_eval_loss)):
            # read at the first evaluation, after steps were trained: a traceback then
            raise CheckpointError(f"{folder / ckpt.STATE_FILE} is malformed (best: {best!r:.80}, best_eval_loss: "
                                  f"{self._best_eval_loss!r:.40}); use another checkpoint")
        if self.step > self.config.steps:  # nothing to train, and run.json would describe a shorter run
            raise _past_steps(self.step, self.config.steps)
        changed = [k for k in _RESUME_SENSITIVE if k in saved_config
                   and _as_json(saved_config[k]) != _as_json(getattr(self.config, k))]
        if ("decay_steps" in changed and saved_config.get("decay_steps") is None
                and self.config.decay_steps == saved_config.get("steps")):
            changed.remove("decay_steps")  # the old schedule written out, as the longer-run warning advises
        used = state.get("precision_used")  # "auto" resolves by the machine: bf16 where trained, fp32 here
        if "precision" not in changed and used in ("bf16", "fp16", "fp32") and used != self.precision_used:
            changed.append(f"precision: train.precision = {self.config.precision!r} gives {self.precision_used} here, "
                           f"the run trained in {used}")
        # Model settings a checkpoint loads under (dropout, the longest sequence...) change the numbers too.
        saved_model, model_now = ckpt.read_config(folder), ckpt._model_config(self.model)
        changed += [f"model.{k}" for k in ckpt.LOADABLE_CHANGES if k in saved_model and k in model_now
                    and json.dumps(saved_model[k], sort_keys=True) != json.dumps(model_now[k], sort_keys=True)]
        if changed and self.world.is_main:
            warnings.warn(f"resuming with changed settings ({', '.join(changed)}): the run will not "
                          "reproduce an uninterrupted one", stacklevel=3)
        # best first: a new best_metric starts tracking again, so a run that had stopped early trains on (and its
        # schedule's move is then worth saying)
        self._check_resumed_best(saved_config)
        self._check_resumed_schedule(saved_config)
        # The log window of every process's steps since the last record, not one process's share of it (older
        # checkpoints: a one-process run's); rank 0 holds its loss, so that the log's all-reduce adds it once.
        whole = isinstance(window, dict) and window.get("global") is True
        if window and (whole or saved_world == self.world.size == 1):
            try:
                self._window = _Window.from_dict(window, self.device)
            except (KeyError, TypeError, ValueError, OverflowError) as e:  # OverflowError: float(10**400)
                raise CheckpointError(f"{folder / ckpt.STATE_FILE} is malformed (log_window: {one_line(e)}); "
                                      "use another checkpoint") from None
            if not self.world.is_main:
                self._window.loss_sum = torch.zeros_like(self._window.loss_sum)
        elif window and self.world.is_main:  # said, not left for a reader to take for the whole window's loss
            first = self.step - int(window.get("steps", 0)) + 1 if isinstance(window, dict) else self.step
            warnings.warn(f"the next training record covers only the steps after {self.step}: the loss of steps "
                          f"{first} to {self.step} was interrupted with each process holding its own share, which "
                          "the checkpoint does not keep (the weights resume exactly)", stacklevel=3)
        # Each step seeds torch itself (seed_step); the saved states give Python's and numpy's generators, which
        # a user's code may draw from, where the checkpoint has this process's (an interrupted distributed run
        # saves rank 0's alone).
        if len(rng) == self.world.size:
            ckpt.restore_rng(rng[self.world.rank])
        else:
            seed_everything(self.config.seed + self.world.rank + self.step)
        if saved_world != self.world.size and self.world.is_main:
            warnings.warn(f"resuming a {saved_world}-process run with {self.world.size} process(es)",
                          stacklevel=3)
        if self.step:  # the rate of the last step taken: what a log record written before the next step shows
            set_lr(self.optimizer, lr_at(self.step - 1, self.config))

    def _check_resumed_schedule(self, saved_config: dict[str, Any]) -> None:
        """A cosine or linear decay ends at train.steps unless train.decay_steps is set: a resume with more steps
        stretches it, and the learning rate jumps back up where the run left off. Said, with the way to keep it."""
        cfg, old_steps = self.config, saved_config.get("steps")
        if (cfg.schedule not in ("cosine", "linear") or cfg.decay_steps is not None or saved_config.get("decay_steps")
                is not None or not isinstance(old_steps, int) or old_steps == cfg.steps or not self.world.is_main):
            return
        stopped = bool(cfg.early_stopping_patience and self._bad_evals >= cfg.early_stopping_patience)
        if stopped or self.step >= cfg.steps:  # no step left to train: no rate to move
            return
        old = copy.copy(cfg)
        old.steps = old_steps
        before = lr_at(self.step - 1, old) if self.step else None
        jump = "" if before is None else \
            f" (the learning rate goes {before:.3g} → {lr_at(self.step, cfg):.3g} at step {self.step})"
        warnings.warn(f"train.steps {old_steps} → {cfg.steps} moves the end of the {cfg.schedule} decay, which ends at "
                      f"train.steps{jump}; to keep the run's schedule and train on at its floor, resume with --set "
                      f"train.decay_steps={old_steps}", stacklevel=4)

    def _check_resumed_best(self, saved_config: dict[str, Any]) -> None:
        """best/ and early stopping compare evaluations by one metric in one direction: resumed with another
        best_metric or best_mode, the saved best value means nothing to them, so tracking starts again."""
        cfg = self.config
        metric = self.best.get("metric") if isinstance(self.best, dict) else saved_config.get("best_metric")
        saved_metric = saved_config.get("best_metric")
        if not isinstance(saved_metric, str):  # absent, or malformed (null, a number): as the run's own
            saved_metric = metric if isinstance(metric, str) else cfg.best_metric
        mode = best_direction(saved_metric, saved_config.get("best_mode")) if "best_mode" in saved_config \
            else cfg.direction
        if (metric is None or metric == cfg.best_metric) and mode == cfg.direction:
            return
        if self.world.is_main:
            warnings.warn(f"resuming with best_metric {metric!r} ({mode}) → {cfg.best_metric!r} ({cfg.direction}): "
                          "best/ and early stopping start again from the next evaluation", stacklevel=4)
        self.best, self._bad_evals = None, 0

    def _interrupted(self, *, terminated: bool = False) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self._in_step and self._rng_at_step_start is not None:
            _set_raw_rng(self._rng_at_step_start)  # the unfinished step will be redone from its start
        if self._eval_pending is not None:  # stopped inside an evaluation: saved as before it, to be redone
            self._undo_pending_eval()
        folder = self.out_dir / CHECKPOINT_DIR
        if (self._stale_checkpoint or self._stale_best) and (self.step == 0 or terminated and self.world.distributed):
            # This run's first save would replace the run in the folder: not for nothing (stopped before its first
            # step, where a user stopping a run that "replaces" one meant to keep it), nor for a crash: torchrun
            # stops every process with SIGTERM when one of them fails, where a one-process run's crash keeps it.
            # (Ctrl-C after a step, which reaches every process, saves as in one process.) The records of the run
            # kept go back in place of this one's, and its loss curve is drawn again.
            if self.world.is_main:
                for path, aside in self._records():
                    if aside.is_file():
                        aside.replace(path)
                    else:  # the run kept had no such record (trained in Python, converted): this run's goes
                        path.unlink(missing_ok=True)
                self._plot()
            raise TrainingInterrupted(
                f"training interrupted at step {self.step} of {self.config.steps}, before this run's first save: "
                f"nothing of it was saved, and the run it was replacing in {self.out_dir} is kept; run the command "
                "again to start over, or with --resume to continue that run") from None
        # Other processes may have been stopped anywhere, so no collective: rank 0 saves alone.
        self._save(folder, gather=False)
        if self.world.is_main:
            self._plot()
        if self._eval_pending is None and not self._in_step and self.finished:  # only the summary was left
            raise TrainingInterrupted(self._finished_message(folder)) from None
        raise TrainingInterrupted(
            f"training interrupted at step {self.step} of {self.config.steps}; checkpoint saved in {folder}; "
            "to continue, run the same command with --resume"
        ) from None

    def _finished_message(self, folder: Path) -> str:
        """What an interrupt says once no step is left: the run reached train.steps, or stopped early (a resume has
        nothing to train)."""
        if self.step < self.config.steps:
            return _STOPPED_EARLY.format(step=self.step, steps=self.config.steps, folder=folder)
        return _FINISHED.format(step=self.step, folder=folder)

    # ------------------------------------------------------------------------------------------------
    # The loop

    @property
    def precision_used(self) -> str:
        """The arithmetic the steps run in, "bf16", "fp16" or "fp32": what train.precision ("auto" by default)
        resolved to on this machine, recorded in the summary and every checkpoint."""
        return precision_name(self.dtype)

    def _elapsed(self) -> float:
        since = time.perf_counter() - self._fit_start if self._fit_start is not None else 0.0
        return self._totals.elapsed_before + since

    def _plot(self) -> None:
        try:
            plot_losses(self.log.read(), self.out_dir / PLOT_FILE)
        except Exception as e:  # a plot must never cost the user a finished run
            warnings.warn(f"could not draw {PLOT_FILE} ({one_line(e)})", stacklevel=2)

    def _warn_inert_settings(self, has_eval: bool) -> None:
        """Say so where a setting cannot do what it is for in this run."""
        cfg = self.config
        if cfg.early_stopping_patience and (not has_eval or not cfg.eval_every or cfg.eval_every >= cfg.steps):
            why = "there is no evaluation (nothing held out)" if not has_eval else \
                "train.eval_every = 0 evaluates only at the end" if not cfg.eval_every else \
                f"train.eval_every = {cfg.eval_every} evaluates only at the end of {cfg.steps} steps"
            warnings.warn(f"train.early_stopping_patience = {cfg.early_stopping_patience} cannot stop this run: "
                          f"{why}", stacklevel=4)
        inert = [f"train.{name} = {getattr(cfg, name)}" for name in ("eval_every", "eval_batches")
                 if getattr(cfg, name) != getattr(TrainerConfig, name)]
        if not has_eval and inert:  # (a config's eval_every, with its evaluation file dropped)
            warnings.warn(f"{' and '.join(inert)} {'does' if len(inert) == 1 else 'do'} nothing: there is no "
                          f"evaluation (nothing held out); give {self.eval_settings}, or drop "
                          f"{'it' if len(inert) == 1 else 'them'}", stacklevel=4)
        if not has_eval and cfg.best_metric != TrainerConfig.best_metric:
            warnings.warn(f"train.best_metric = {cfg.best_metric!r} cannot pick best/: there is no evaluation (nothing "
                          f"held out); give {self.eval_settings}, or drop it", stacklevel=4)
        for name, role in (("decay_steps", "it ends the cosine and linear decays"),
                           ("min_lr_ratio", "it is the floor of the cosine and linear decays")):
            value = getattr(cfg, name)
            if value != getattr(TrainerConfig, name) and cfg.schedule not in ("cosine", "linear"):
                warnings.warn(f"train.{name} = {value} does nothing under schedule = \"{cfg.schedule}\" ({role}); "
                              "drop it or pick one of those", stacklevel=4)
        if cfg.warmup_steps > cfg.steps:  # the peak comes at step warmup_steps - 1
            warnings.warn(f"train.warmup_steps ({cfg.warmup_steps}) is larger than train.steps ({cfg.steps}): the "
                          f"learning rate never reaches train.lr (at most {lr_at(cfg.steps - 1, cfg):.3g}); lower "
                          "warmup_steps", stacklevel=4)

    def _evaluate_step(self, progress: Progress) -> bool:
        """Evaluate after step `self.step` and record it (metrics.jsonl, best/, early stopping); True when
        training should stop. Until recorded, a Ctrl-C saves the state from before it (see `_interrupted`)."""
        self._eval_pending = (copy.deepcopy(self.best), self._best_eval_loss, self._bad_evals,
                              self._totals.last_eval)
        self._eval_due = False  # owed no more: pending from here until recorded, then done
        try:
            metrics = self.evaluate()
            stopped_early = self._record_eval(metrics, self._elapsed())
        except Exception as e:
            # An evaluation that fails (a metrics function's error, a misspelt best_metric) keeps the steps
            # trained: saved as before it, to be redone on resume, as a Ctrl-C inside it is (it lost the whole run
            # where the only evaluation came after the last step).
            self._save_before_failed_eval(e)
            raise
        self._eval_pending = None
        shown = ", ".join(f"eval {k} {v:.4g}" for k, v in metrics.items())
        progress.write(f"step {self.step}: {shown}")
        return stopped_early

    def _undo_pending_eval(self) -> None:
        """Back to the records from before the evaluation under way (`_eval_pending`), which is then redone on
        resume: best/, the best loss, the patience count, the last evaluation."""
        self.best, self._best_eval_loss, self._bad_evals, self._totals.last_eval = self._eval_pending

    def _save_before_failed_eval(self, error: Exception) -> None:
        """Save the checkpoint as before the evaluation that raised `error` (rank 0 alone: the other processes
        may not have failed), and say so in the error's notes."""
        self._undo_pending_eval()
        folder = self.out_dir / CHECKPOINT_DIR
        try:
            self._save(folder, gather=False)
        except Exception:  # the error being raised says what went wrong; a save that fails too must not hide it
            return
        if self.world.is_main and hasattr(error, "add_note"):  # Python 3.11+
            error.add_note(f"the {self.step} steps trained are saved in {folder}, with this evaluation to redo: "
                           "fix it and resume")

    def _saves_at(self, stopped_early: bool) -> bool:
        """Whether the checkpoint is written after step `self.step`: the last, an early stop, every save_every."""
        cfg = self.config
        return self.step == cfg.steps or stopped_early or bool(cfg.save_every and self.step % cfg.save_every == 0)

    def _window_loss(self, window: _Window) -> float:
        """The mean training loss of the window's steps over every process; TrainingDiverged if not finite."""
        loss_sum = window.loss_sum.detach().clone()
        all_reduce_sum(loss_sum)
        loss = loss_sum.item() / max(window.targets, 1)
        if not math.isfinite(loss):
            # Checked at every step on one CPU process, so the step is exact; elsewhere at log, evaluation and
            # save steps only (a GPU would otherwise wait for every step), so somewhere since the last check.
            first = self.step - window.steps + 1
            when = f"at step {self.step}" if window.steps == 1 or self._checks_each_step else \
                f"between steps {first} and {self.step}"
            # A run from scratch that diverges before its first save has no checkpoint: the folder's is another run's.
            kept = "the last checkpoint was kept" if not self._stale_checkpoint and ckpt.checkpoint_present(
                self.out_dir / CHECKPOINT_DIR) else "this run saved no checkpoint"
            raise TrainingDiverged(f"the training loss became {loss} {when}; "
                                   f"{_diverged_fix(self.config, self.precision_used)} ({kept})")
        return loss

    @property
    def _checks_each_step(self) -> bool:
        return self.device.type == "cpu" and not self.world.distributed

    def _log_window(self, progress: Progress) -> _Window:
        """Log the steps since the last record (`self._window`) and start a new window, which is returned."""
        self._log_train(self._window, progress)
        self._window = _Window()
        return self._window

    def _log_train(self, window: _Window, progress: Progress) -> None:
        loss = self._window_loss(window)
        lr = self.optimizer.param_groups[0]["lr"]
        tokens_per_s = window.tokens / window.seconds if window.seconds > 0 else 0.0
        record = {"step": self.step, "loss": loss, "lr": lr, "tokens_per_s": tokens_per_s,
                  "elapsed": self._elapsed()}
        if window.grad_norm is not None:
            record["grad_norm"] = float(window.grad_norm)
        self.log.write(record)
        progress.show(loss=loss, lr=lr, tok_s=tokens_per_s)
        self._totals.last_loss = loss

    def fit(self, resume: bool | None = None, on_start: Callable[[], None] | None = None) -> dict[str, Any]:
        """Train to `config.steps` (or early stopping) and return a summary. `on_start` is called once the
        run is set up (a resumed checkpoint loaded and checked), before the metrics log is opened: the
        place to write files that must not change when a resume fails.

        Returns:
            ``steps``, ``start_step``, ``final_train_loss``, ``final_eval`` (dict), ``final_eval_loss``,
            ``best_eval_loss``, ``best`` (metric, value, step), ``stopped_early`` (before ``config.steps``),
            ``redid_eval`` (a resumed run first redid the evaluation its checkpoint was saved inside),
            ``wall_time_s`` and ``tokens_per_s`` (of this call: a resumed run's steps from ``start_step``),
            ``checkpoint`` (path).

        Raises:
            TrainingInterrupted: Ctrl-C; a checkpoint was saved first.
            TrainingDiverged: the training loss became NaN or infinite.
            CheckpointError: resume without a usable checkpoint.
            ConfigError: a second call without resume on the same Trainer.
        """
        # fp32 runs of wide models on an AMD CPU with AVX-512 take oneDNN's AVX-512 matmuls where that is verified
        # exact (see device.py).
        with fast_fp32_matmul(self.device, enabled=self.dtype is None and wants_onednn_fp32(self.model)):
            return self._fit(resume, on_start)

    def _fit(self, resume: bool | None, on_start: Callable[[], None] | None) -> dict[str, Any]:
        cfg = self.config
        resume = self.resume if resume is None else resume
        if self._fitted and not resume:
            # From scratch, with the step and weights this call left: the run's own records were set aside as a
            # replaced run's, and its log restarted (a notebook's second fit() after an interrupt, or by mistake).
            raise ConfigError(f"this Trainer has trained already (to step {self.step} of {cfg.steps}); call "
                              f"fit(resume=True) to go on from its checkpoint in {self.out_dir}, or build a new "
                              "Trainer to train from scratch")
        if self.eval_source is not None and self.eval_counts is None and self.metrics_fn is None \
                and cfg.best_metric not in ("loss", "perplexity"):
            # Found before training, not at the first evaluation (with eval_every = 0: after the last step)
            raise ConfigError(f"best_metric {cfg.best_metric!r} is not a metric this run evaluates (an eval source "
                              "without eval_counts or metrics_fn gives loss and, for token predictions, "
                              "perplexity); choose one of those, or give the eval_counts or metrics_fn that "
                              "computes it")
        self._fitted = True
        seed_everything(cfg.seed + self.world.rank)
        if resume:
            self._restore()
        self._stale_best = not resume and ckpt.checkpoint_present(self.out_dir / BEST_DIR)
        self._stale_checkpoint = not resume and ckpt.checkpoint_present(self.out_dir / CHECKPOINT_DIR)
        if self.world.is_main:
            for path, aside in self._records():
                if resume:  # of checkpoints that a run replacing them left when it died before saving its own
                    if aside.is_file():
                        aside.replace(path)
                elif self._stale_best or self._stale_checkpoint:  # kept if set aside before: they belong to the
                    if path.is_file() and not aside.exists():  # checkpoints there, the files in place to a run
                        path.replace(aside)  # that died
                else:  # no run to belong to
                    aside.unlink(missing_ok=True)
        if on_start is not None and self.world.is_main:
            on_start()
        if self.world.is_main and not resume:  # a resumed run was told at its start
            self._warn_inert_settings(has_eval=self.eval_source is not None or self.metrics_fn is not None)
        self.log.start(keep_until_step=self.step if resume else None,
                       drop_evals_at=self.step if resume and self._resume_eval else None)
        if self.world.is_main and not resume:  # the log it drew is gone: a run failing before its first record
            (self.out_dir / PLOT_FILE).unlink(missing_ok=True)  # left another run's curve beside its run.json
        start_step = self.step
        tokens_before, seconds_before = self._totals.tokens, self._totals.train_seconds  # a resumed run's so far
        self._fit_start = time.perf_counter()
        self.model.train()
        progress = Progress(cfg.steps, self.step, enabled=cfg.progress and self.world.is_main, echo=self.world.is_main)
        window = self._window  # restored with a checkpoint: the steps since its last log record
        # A resumed run that had stopped early stays stopped (unless given a larger patience).
        stopped_early = bool(resume and cfg.early_stopping_patience and self._bad_evals >= cfg.early_stopping_patience)
        saved_at = None
        has_eval = self.eval_source is not None or self.metrics_fn is not None
        redid_eval = False
        try:
            if self._resume_eval and has_eval and not stopped_early:  # stopped inside this step's evaluation
                stopped_early = self._evaluate_step(progress)
                redid_eval, self._resume_eval = True, False  # done: `finished` no longer waits for it
                if stopped_early and window.steps:  # logged before the save, as in the loop
                    window = self._log_window(progress)
                if self._saves_at(stopped_early):
                    self.save()
                    saved_at = self.step
            while self.step < cfg.steps and not stopped_early:
                self._rng_at_step_start = _raw_rng()
                seed_step(cfg.seed, self.world.rank, self.step)
                self._in_step = True
                t = time.perf_counter()
                loss_sum, n_targets, n_tokens, grad_norm = self._train_step(self.step)
                # The update, its count and its records together, or none of them: a Ctrl-C in here takes effect
                # at the end of the block, and an evaluation the step owes is then saved as pending.
                with _interrupts_deferred():
                    self.optimizer.step()
                    self.step += 1
                    self._in_step = False
                    last = self.step == cfg.steps
                    logs = self.step % cfg.log_every == 0 or last
                    evaluates = has_eval and (last or bool(cfg.eval_every and self.step % cfg.eval_every == 0))
                    if logs or evaluates:
                        # A GPU runs steps behind the host: the window's time (tokens/s) must hold its steps'
                        # work, not leave it to the log's or the evaluation's wait. Not every step: the next batch
                        # is prepared while the device works.
                        synchronize(self.device)
                    seconds = time.perf_counter() - t
                    self._totals.tokens += n_tokens
                    self._totals.train_seconds += seconds
                    window.add(loss_sum, n_targets, n_tokens, seconds)
                    window.grad_norm = grad_norm
                    progress.update()
                    if logs:  # checks the loss too
                        window = self._log_window(progress)
                    elif self._checks_each_step or evaluates or self._saves_at(False):  # before a checkpoint has it
                        self._window_loss(window)
                    self._eval_due = evaluates
                if evaluates:
                    stopped_early = self._evaluate_step(progress)
                    if stopped_early and window.steps:  # logged before the save, which keeps the window
                        window = self._log_window(progress)
                if self._saves_at(stopped_early):
                    self.save()
                    saved_at = self.step
        except KeyboardInterrupt as e:
            with _interrupts_deferred(drop=True):  # the run stops anyway; another Ctrl-C must not cut its save
                progress.close()
                self._interrupted(terminated=isinstance(e, Terminated))
        except TrainingDiverged:
            progress.close()
            if self.world.is_main:
                self._plot()  # the curve up to the last log record: where it went wrong
            raise
        finally:
            progress.close()
        # The run is done: a Ctrl-C now takes effect once the last checkpoint and the plot are written. It cut the
        # final save (the steps since the last checkpoint lost) or the plot (none left), and the run was reported
        # as interrupted with no word of what it had finished.
        try:
            with _interrupts_deferred():
                if window.steps:  # stopped early between two log records
                    self._log_train(window, progress)
                if saved_at != self.step and self.step > start_step:
                    self.save()
                if self.world.is_main:
                    self._plot()
        except KeyboardInterrupt:
            raise TrainingInterrupted(self._finished_message(self.out_dir / CHECKPOINT_DIR)) from None
        # Every process leaves together, once the main one has written the checkpoint and the plot: a process
        # that exits while another still works can make gloo abort that one ("Connection closed by peer").
        barrier()
        wall = time.perf_counter() - self._fit_start
        # This call's steps, as wall_time_s is (a resumed run's rate over the whole run read as this one's).
        tokens, seconds = self._totals.tokens - tokens_before, self._totals.train_seconds - seconds_before
        return {
            "steps": self.step,
            "start_step": start_step,
            "final_train_loss": self._totals.last_loss,
            "final_eval": dict(self._totals.last_eval),
            "final_eval_loss": self._totals.last_eval.get("loss"),
            "best_eval_loss": self._best_eval_loss,
            "best": self.best,
            # Patience running out at the last step stopped nothing (a resume with more steps still stays stopped).
            "stopped_early": stopped_early and self.step < cfg.steps,
            "redid_eval": redid_eval,
            "wall_time_s": wall,
            "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
            "precision": self.precision_used,
            "checkpoint": str(self.out_dir / CHECKPOINT_DIR),
        }


@contextlib.contextmanager
def _backward_compiled_with_forward():
    """A context in which torch.compile builds a graph's backward with its forward: by default AOTAutograd lowers
    the backward at the first `backward()`, outside the trainer's fallback, where a failure to compile it (a
    kernel inductor cannot build) stopped the run instead of falling back to eager. The switch is set and put
    back directly (torch's `config.patch` costs ~100 µs a call, this ~6); nothing in a torch without it."""
    try:
        from torch._functorch import config
    except ImportError:
        config = None
    if config is None or not hasattr(config, "force_non_lazy_backward_lowering"):
        yield
        return
    before = config.force_non_lazy_backward_lowering
    config.force_non_lazy_backward_lowering = True
    try:
        yield
    finally:
        config.force_non_lazy_backward_lowering = before


def _as_json(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
