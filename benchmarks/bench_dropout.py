"""Dropout on the CPU: attnlab's `dropout` against torch's `F.dropout`, in one run.

    python benchmarks/bench_dropout.py                 # the op, attention with dropout, two training steps
    python benchmarks/bench_dropout.py --repeats 20 --json dropout.json

Three tables, each timed in turns (one call of every column per round), medians:
- the op, forward + backward, on the activations of the two models below;
- attention with dropout 0.1 on its weights, forward + backward, fp32 (no causal mask, as in an encoder):
  torch's `scaled_dot_product_attention(dropout_p=0.1)` against attnlab's `attention(dropout=0.1)`;
- whole training steps (forward, backward, AdamW) of the models of `configs/translate.toml` (a 3 + 3 layer
  encoder-decoder, 256 wide, vocabulary 8,000, 64 sentence pairs of ~30 tokens) and `configs/bert-mlm.toml`
  (BERT 4 layers, 128 wide, 32 pairs of 64 tokens), dropout 0.1, on random tokens, with attnlab's dropout
  and with torch's in every dropout of the model (the same model, the same batches), in bf16 autocast where
  the CPU has bf16 instructions and in fp32.
On a GPU attnlab's dropout is torch's (the script says so and times the op anyway).
"""

from __future__ import annotations

import json
from functools import partial

import torch
import torch.nn.functional as F
from steps import arguments, print_rows, row, step_dtypes, step_rows, train_step

import attnlab.modules.dropout as dropout_module
from attnlab.modules.attention import attention
from attnlab.modules.dropout import dropout

OP_SHAPES = [(64, 32, 256), (64, 30, 1024), (32, 64, 128), (32, 64, 512)]  # translation, BERT: (B, T, width)
ATTENTION_SHAPES = [(64, 4, 32, 64), (32, 4, 64, 32), (8, 6, 256, 64)]
FAST_FROM = dropout_module.DROPOUT_MIN_ELEMENTS


def op_rows(device, dtypes, repeats: int) -> list[dict]:
    rows = []
    for shape in OP_SHAPES:
        for dtype in dtypes:
            x = torch.randn(*shape, device=device).to(dtype).requires_grad_()
            g = torch.randn(*shape, device=device).to(dtype)
            fns = {"torch": partial(_backward, partial(F.dropout, x, 0.1, True), g),
                   "attnlab": partial(_backward, partial(dropout, x, 0.1), g)}
            rows.append(row({"shape": list(shape), "dtype": str(dtype).replace("torch.", "")}, fns, repeats, device))
    return rows


def attention_rows(device, repeats: int) -> list[dict]:
    rows = []
    for shape in ATTENTION_SHAPES:
        q, k, v = (torch.randn(*shape, device=device).requires_grad_() for _ in range(3))
        g = torch.randn(*shape, device=device)
        fns = {"torch": partial(_backward, partial(F.scaled_dot_product_attention, q, k, v, dropout_p=0.1), g),
               "attnlab": partial(_backward, lambda q=q, k=k, v=v: attention(q, k, v, dropout=0.1)[0], g)}
        rows.append(row({"shape": list(shape), "dtype": "float32"}, fns, repeats, device))
    return rows


def _backward(fn, grad, _round: int) -> None:
    fn().backward(grad)


def _restore() -> None:
    dropout_module.DROPOUT_MIN_ELEMENTS = FAST_FROM


def _step(model, batches, opt, dtype, fast: bool, i: int) -> None:
    # torch's dropout everywhere: no tensor reaches the size from which attnlab's path runs.
    dropout_module.DROPOUT_MIN_ELEMENTS = FAST_FROM if fast else 1 << 62
    train_step(model, batches, opt, dtype, i)


def main(argv: list[str] | None = None) -> dict:
    args = arguments(__doc__, argv)
    device = args.device
    print(f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} thread(s); dropout 0.1")
    if device.type != "cpu":
        print(f"on a {device.type} attnlab's dropout is torch's: the columns time the same kernel")
    results = {"device": str(device), "op": op_rows(device, [torch.float32, torch.bfloat16], args.repeats),
               "attention": attention_rows(device, args.repeats)}
    print_rows("dropout, forward + backward", results["op"], "shape")
    print_rows("attention with dropout on its weights, forward + backward", results["attention"], "shape")
    if args.steps == "yes":
        results["steps"] = step_rows(device, step_dtypes(device), args.repeats, _step, _restore)
        print_rows("training step (forward, backward, AdamW), dropout 0.1", results["steps"], "model")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
