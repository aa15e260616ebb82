"""The token loss on the CPU: cross-entropy over the labelled rows only (attnlab's `token_loss`) against torch's
cross-entropy over every row, ignored ones included, in one run.

    python benchmarks/bench_loss.py                    # the loss alone, then two training steps
    python benchmarks/bench_loss.py --repeats 20 --json loss.json

Two tables, each timed in turns (one call of every column per round), medians:
- the loss, forward + backward, from logits of a model's dtype: BERT's masked LM (32 × 64 positions, a
  vocabulary of 4,000, 15 % labelled), the knowledge experiment's fine-tuning (32 × 128, 100 characters, a
  quarter labelled) and, above `SELECT_ROWS_BELOW` (so the columns take the same path), translation
  (64 × 30 target positions, 8,000, 71 % labelled, label smoothing 0.1: the share of real target tokens in
  Multi30k's length-sorted batches);
- whole training steps (forward, backward, AdamW) of `configs/bert-mlm.toml` and `configs/translate.toml` (the
  models and random batches of `steps.py`, as in `bench_dropout.py`; the translation batches have no padding:
  every target labelled), with and without the row selection; and BERT's step with its masked-LM head over
  every position and over the labelled ones (`mlm_logits = "labelled"`, as `configs/bert-mlm.toml` sets it, so
  the BERT rows of the step table above run the head that way in both columns).
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


def head_rows(device, dtypes, repeats: int) -> list[dict]:
    """BERT's training step with the masked-LM head over every position ("torch": as HF computes it) and over
    the labelled positions only (`mlm_logits = "labelled"`)."""
    model, batches, opt = models(device)["bert-mlm"]
    rows = []
    for dtype in dtypes:
        fns = {"torch": partial(_head_step, model, batches, opt, dtype, False),
               "attnlab": partial(_head_step, model, batches, opt, dtype, True)}
        rows.append(row({"model": "bert-mlm", "dtype": str(dtype).replace("torch.", "")}, fns, repeats, device))
    model.config.mlm_logits = "all"
    return rows


def _head_step(model, batches, opt, dtype, labelled: bool, i: int) -> None:
    model.config.mlm_logits = "labelled" if labelled else "all"
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
    dtypes = step_dtypes(device)
    results = {"device": str(device), "loss": loss_rows(device, dtypes, args.repeats)}
    print_rows("token loss, forward + backward (torch: every row; attnlab: the labelled rows)", results["loss"],
               "case")
    if args.steps == "yes":
        results["steps"] = step_rows(device, dtypes, args.repeats, _step, partial(_select, True))
        print_rows("training step (forward, backward, AdamW)", results["steps"], "model")
        results["head"] = head_rows(device, dtypes, args.repeats)
        print_rows("BERT training step, masked-LM head over every position (torch) or the labelled ones",
                   results["head"], "model")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    keep_freed_memory()  # as the command does; not in main(), which a test runs in its own process
    main()
