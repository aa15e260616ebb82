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

import argparse
import json
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from turns import time_in_turns

import attnlab.modules.dropout as dropout_module
from attnlab.models.registry import build_model
from attnlab.modules.attention import attention
from attnlab.modules.dropout import dropout
from attnlab.training.device import resolve_precision, select_device, synchronize
from attnlab.training.optim import build_optimizer
from attnlab.training.recipe import load_run_config, model_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
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
            rows.append(_row({"shape": list(shape), "dtype": str(dtype).replace("torch.", "")}, fns, repeats, device))
    return rows


def attention_rows(device, repeats: int) -> list[dict]:
    rows = []
    for shape in ATTENTION_SHAPES:
        q, k, v = (torch.randn(*shape, device=device).requires_grad_() for _ in range(3))
        g = torch.randn(*shape, device=device)
        fns = {"torch": partial(_backward, partial(F.scaled_dot_product_attention, q, k, v, dropout_p=0.1), g),
               "attnlab": partial(_backward, lambda q=q, k=k, v=v: attention(q, k, v, dropout=0.1)[0], g)}
        rows.append(_row({"shape": list(shape), "dtype": "float32"}, fns, repeats, device))
    return rows


def models(device) -> dict:
    """(model, batches) of the translation and BERT configs, on random tokens."""
    g = torch.Generator().manual_seed(0)
    run = load_run_config(CONFIGS / "translate.toml")
    vocab = 8000
    seq2seq = model_config(run.model, src_vocab_size=vocab, tgt_vocab_size=vocab, pad_id=0, bos_id=1, eos_id=2,
                           max_len=66)
    bert_run = load_run_config(CONFIGS / "bert-mlm.toml")
    bert = model_config(bert_run.model, vocab_size=4000, max_len=64)

    def translation_batch():
        src = torch.randint(3, vocab, (64, 32), generator=g)
        tgt = torch.randint(3, vocab, (64, 30), generator=g)
        return {"src_ids": src, "src_mask": torch.ones_like(src, dtype=torch.bool), "tgt_ids": tgt, "labels": tgt}

    def bert_batch():
        ids = torch.randint(5, 4000, (32, 64), generator=g)
        labels = torch.where(torch.rand(32, 64, generator=g) < 0.15, ids, -100)
        segments = (torch.arange(64) >= 32).long().expand(32, 64)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": segments,
                "labels": labels, "next_sentence_label": torch.randint(0, 2, (32,), generator=g)}

    out = {}
    for name, config, make, train in (("translation", seq2seq, translation_batch, run.train),
                                      ("bert-mlm", bert, bert_batch, bert_run.train)):
        torch.manual_seed(0)
        model = build_model(config).to(device).train()
        batches = [{k: v.to(device) for k, v in make().items()} for _ in range(8)]
        out[name] = (model, batches, build_optimizer(model, train, device))
    return out


def step_rows(device, dtypes, repeats: int) -> list[dict]:
    rows = []
    for name, (model, batches, opt) in models(device).items():
        for dtype in dtypes:
            fns = {"torch": partial(_step, model, batches, opt, dtype, False),
                   "attnlab": partial(_step, model, batches, opt, dtype, True)}
            try:
                rows.append(_row({"model": name, "dtype": str(dtype).replace("torch.", "")}, fns, repeats, device))
            finally:
                dropout_module.DROPOUT_MIN_ELEMENTS = FAST_FROM
    return rows


def _backward(fn, grad, _round: int) -> None:
    fn().backward(grad)


def _step(model, batches, opt, dtype, fast: bool, i: int) -> None:
    # torch's dropout everywhere: no tensor reaches the size from which attnlab's path runs.
    dropout_module.DROPOUT_MIN_ELEMENTS = FAST_FROM if fast else 1 << 62
    with torch.autocast(batches[0]["labels"].device.type, dtype=dtype, enabled=dtype != torch.float32):
        loss = model(**batches[i % len(batches)]).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _row(row: dict, fns: dict, repeats: int, device) -> dict:
    for fn in fns.values():  # warm-up
        fn(0)
        fn(1)
    ms = {name: 1e3 * sec for name, sec in time_in_turns(fns, repeats, sync=partial(synchronize, device)).items()}
    return {**row, **ms, "speedup": ms["torch"] / ms["attnlab"]}


def _print(title: str, rows: list[dict], key: str) -> None:
    print(f"\n{title}")
    print(f"{key:<22}{'dtype':<10}{'torch ms':>10}{'attnlab ms':>12}{'speedup':>9}")
    for r in rows:
        label = str(tuple(r[key])) if isinstance(r[key], list) else r[key]
        print(f"{label:<22}{r['dtype']:<10}{r['torch']:>10.2f}{r['attnlab']:>12.2f}{r['speedup']:>8.2f}x")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--steps", choices=("yes", "no"), default="yes", help="time the two models' training steps")
    p.add_argument("--json", help="also write the rows to this JSON file")
    p.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then the CPU), cpu, cuda, cuda:N or mps")
    args = p.parse_args(argv)
    device = select_device(args.device)
    print(f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} thread(s); dropout 0.1")
    if device.type != "cpu":
        print(f"on a {device.type} attnlab's dropout is torch's: the columns time the same kernel")
    steps_dtypes = [torch.float32]
    if resolve_precision("auto", device) is not None:
        steps_dtypes.insert(0, torch.bfloat16)
    results = {"device": str(device), "op": op_rows(device, [torch.float32, torch.bfloat16], args.repeats),
               "attention": attention_rows(device, args.repeats)}
    _print("dropout, forward + backward", results["op"], "shape")
    _print("attention with dropout on its weights, forward + backward", results["attention"], "shape")
    if args.steps == "yes":
        results["steps"] = step_rows(device, steps_dtypes, args.repeats)
        _print("training step (forward, backward, AdamW), dropout 0.1", results["steps"], "model")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
