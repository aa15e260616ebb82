"""What the A/B scripts `bench_dropout.py` and `bench_loss.py` share: the two models whose training steps they
time (`configs/translate.toml` and `configs/bert-mlm.toml` on random tokens), the step, the command line, and
rows of two columns timed in turns ("torch": the peer, "attnlab": ours)."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import torch
from turns import count, device_or_exit, json_file, time_in_turns

from attnlab.models.registry import build_model
from attnlab.training.device import resolve_precision, synchronize
from attnlab.training.optim import build_optimizer
from attnlab.training.recipe import load_run_config, model_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def arguments(doc: str, argv: list[str] | None) -> argparse.Namespace:
    """The command line both scripts take: --repeats, --steps, --json and --device."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=count, default=10)
    p.add_argument("--steps", choices=("yes", "no"), default="yes", help="time the two models' training steps")
    p.add_argument("--json", type=json_file, help="also write the rows to this JSON file")
    p.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then the CPU), cpu, cuda, cuda:N or mps")
    args = p.parse_args(argv)
    args.device = device_or_exit(p, args.device)
    return args


def step_dtypes(device: torch.device, rows: str = "training-step rows") -> list[torch.dtype]:
    """fp32, and before it bf16 where the default training precision is bf16 autocast (said where it is not, naming
    the caller's `rows` those dtypes time: the bf16 rows were left out without a word)."""
    if resolve_precision("auto", device) is None:
        print(f"bf16 is not native on this {device.type}: the bf16 {rows} are left out")
        return [torch.float32]
    return [torch.bfloat16, torch.float32]


def models(device) -> dict:
    """{name: (model, batches, optimizer)} of the translation and BERT configs, on random tokens."""
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


def step_rows(device, dtypes, repeats: int, step, restore) -> list[dict]:
    """A row per model and dtype: `step(model, batches, opt, dtype, ours, i)` with ours False ("torch") and True
    ("attnlab"), timed in turns; `restore()` undoes whatever switch `step` sets, after each row."""
    rows = []
    for name, (model, batches, opt) in models(device).items():
        for dtype in dtypes:
            fns = {"torch": partial(step, model, batches, opt, dtype, False),
                   "attnlab": partial(step, model, batches, opt, dtype, True)}
            try:
                rows.append(row({"model": name, "dtype": str(dtype).replace("torch.", "")}, fns, repeats, device))
            finally:
                restore()
    return rows


def train_step(model, batches, opt, dtype, i: int) -> None:
    """One training step (forward, backward, AdamW) on batch i (mod their number), in bf16 autocast or fp32."""
    with torch.autocast(batches[0]["labels"].device.type, dtype=dtype, enabled=dtype != torch.float32):
        loss = model(**batches[i % len(batches)]).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def row(labels: dict, fns: dict, repeats: int, device) -> dict:
    """`labels` with each function's median milliseconds (two warm-up calls each first) and torch / attnlab."""
    for fn in fns.values():
        fn(0)
        fn(1)
    ms = {name: 1e3 * sec for name, sec in time_in_turns(fns, repeats, sync=partial(synchronize, device)).items()}
    return {**labels, **ms, "speedup": ms["torch"] / ms["attnlab"]}


def print_rows(title: str, rows: list[dict], key: str) -> None:
    print(f"\n{title}")
    print(f"{key:<22}{'dtype':<10}{'torch ms':>10}{'attnlab ms':>12}{'speedup':>9}")
    for r in rows:
        label = str(tuple(r[key])) if isinstance(r[key], list) else r[key]
        print(f"{label:<22}{r['dtype']:<10}{r['torch']:>10.2f}{r['attnlab']:>12.2f}{r['speedup']:>8.2f}x")
