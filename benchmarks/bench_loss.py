"""The token loss on the CPU: cross-entropy over the labelled rows only (attnlab's `token_loss`) against torch's
cross-entropy over every row, ignored ones included, in one run.

    python benchmarks/bench_loss.py                    # the loss alone, then two training steps
    python benchmarks/bench_loss.py --repeats 20 --json loss.json

Three tables, each timed in turns (one call of every column per round), medians:
- the loss, forward + backward, from logits of a model's dtype: BERT's masked LM (32 × 64 positions, a
  vocabulary of 4,000, 15 % labelled), the knowledge experiment's fine-tuning (32 × 128, 100 characters, a
  quarter labelled) and, above `SELECT_ROWS_BELOW` (so the columns take the same path), translation
  (64 × 30 target positions, 8,000, 71 % labelled, label smoothing 0.1: the share of real target tokens in
  Multi30k's length-sorted batches);
- whole training steps (forward, backward, AdamW) of `configs/bert-mlm.toml` and `configs/translate.toml` (the
  models and random batches of `steps.py`, as in `bench_dropout.py`; the translation batches have no padding:
  every target labelled), with and without the row selection; and (the third) both steps with the LM head over every
  position and over the labelled ones (`mlm_logits = "labelled"`, as `configs/bert-mlm.toml` sets it, so the
  BERT rows of the step table above run the head that way in both columns; `lm_logits = "labelled"`, as
  `configs/translate.toml` sets it, on target rows with padding).
On a GPU `token_loss` takes every row (picking rows would wait for the device): the columns time the same.
Run as a script it keeps freed memory for reuse as the `attnlab` command does (`attnlab.allocator`): without
it each call of the larger cases faults in tens of megabytes of fresh pages, which would dominate both columns.
"""

from __future__ import annotations

import json
from functools import partial

import torch
from steps import arguments, models, print_rows, row, step_dtypes, step_rows, train_step

import attnlab.models.common as common
from attnlab.allocator import keep_freed_memory
from attnlab.models.common import IGNORE_INDEX, token_loss

LOSS_CASES = [  # name, rows, vocabulary, labelled share, label smoothing
    ("bert-mlm", 32 * 64, 4000, 0.15, 0.0),
    ("knowledge", 32 * 128, 100, 0.25, 0.0),
    ("translation", 64 * 30, 8000, 0.71, 0.1),
]
SELECT_FROM = common.SELECT_ROWS_BELOW


def loss_rows(device, dtypes, repeats: int) -> list[dict]:
    rows = []
    g = torch.Generator().manual_seed(0)
    for name, n, vocab, share, smoothing in LOSS_CASES:
        labels = torch.randint(0, vocab, (n,), generator=g)
        labels = torch.where(torch.rand(n, generator=g) < share, labels, IGNORE_INDEX).to(device)
        for dtype in dtypes:
            logits = torch.randn(n, vocab, generator=g).to(device, dtype).requires_grad_()
            fns = {"torch": partial(_loss, logits, labels, smoothing, False),
                   "attnlab": partial(_loss, logits, labels, smoothing, True)}
            rows.append(row({"case": name, "dtype": str(dtype).replace("torch.", "")}, fns, repeats, device))
    common.SELECT_ROWS_BELOW = SELECT_FROM
    return rows


HEAD_FIELDS = {"bert-mlm": "mlm_logits", "translation": "lm_logits"}


def head_rows(device, dtypes, repeats: int) -> list[dict]:
    """Training steps with the LM head over every position ("torch": as HF computes it) and over the labelled
    positions only: BERT's masked LM (`mlm_logits = "labelled"`) and translation (`lm_logits = "labelled"`) on
    target rows of 15 to 30 tokens padded to 30, ~74 % labelled, as in Multi30k's length-sorted batches."""
    rows = []
    for name, (model, batches, opt) in models(device).items():
        if name == "translation":
            batches = [_padded_targets(b) for b in batches]
        for dtype in dtypes:
            fns = {"torch": partial(_head_step, model, batches, opt, dtype, HEAD_FIELDS[name], "all"),
                   "attnlab": partial(_head_step, model, batches, opt, dtype, HEAD_FIELDS[name], "labelled")}
            rows.append(row({"model": name, "dtype": str(dtype).replace("torch.", "")}, fns, repeats, device))
        setattr(model.config, HEAD_FIELDS[name], "all")
    return rows


def _padded_targets(batch: dict, pad_id: int = 0) -> dict:
    g = torch.Generator().manual_seed(1)
    b, t = batch["tgt_ids"].shape
    lengths = torch.randint(t // 2, t + 1, (b,), generator=g).to(batch["tgt_ids"].device)
    padding = torch.arange(t, device=lengths.device)[None, :] >= lengths[:, None]
    return {**batch, "tgt_ids": batch["tgt_ids"].masked_fill(padding, pad_id),
            "labels": batch["labels"].masked_fill(padding, IGNORE_INDEX)}


def _head_step(model, batches, opt, dtype, field: str, value: str, i: int) -> None:
    setattr(model.config, field, value)
    train_step(model, batches, opt, dtype, i)


def _select(on: bool) -> None:
    # Off: no share of labels is at most -1, so every row goes to torch's cross-entropy.
    common.SELECT_ROWS_BELOW = SELECT_FROM if on else -1.0


def _loss(logits, labels, smoothing: float, select: bool, _round: int) -> None:
    _select(select)
    logits.grad = None
    token_loss(logits, labels, label_smoothing=smoothing)[0].backward()


def _step(model, batches, opt, dtype, select: bool, i: int) -> None:
    _select(select)
    train_step(model, batches, opt, dtype, i)


def main(argv: list[str] | None = None) -> dict:
    args = arguments(__doc__, argv)
    device = args.device
    print(f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} thread(s)")
    if device.type != "cpu":
        print(f"on a {device.type} token_loss takes every row: the columns time the same computation")
    dtypes = step_dtypes(device, "loss, head and training-step rows")
    results = {"device": str(device), "loss": loss_rows(device, dtypes, args.repeats)}
    print_rows("token loss, forward + backward (torch: every row; attnlab: the labelled rows)", results["loss"],
               "case")
    if args.steps == "yes":
        results["steps"] = step_rows(device, dtypes, args.repeats, _step, partial(_select, True))
        print_rows("training step (forward, backward, AdamW)", results["steps"], "model")
        results["head"] = head_rows(device, dtypes, args.repeats)
        print_rows("training step, the LM head over every position (torch) or the labelled ones",
                   results["head"], "model")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    keep_freed_memory()  # as the command does; not in main(), which a test runs in its own process
    main()
