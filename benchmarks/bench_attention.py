"""Causal attention, forward + backward: attnlab's `attention()` (its dispatcher) against torch's
`scaled_dot_product_attention` and a plain softmax(QKᵀ)V, in one run, at the shapes of the performance targets
(benchmarks/README.md).

    python benchmarks/bench_attention.py              # every shape and dtype, medians of 10 timings
    python benchmarks/bench_attention.py --repeats 20 --json attention.json
    python benchmarks/bench_attention.py --device cuda  # a GPU (the default, auto, takes one where there is one)

Rows: (batch, heads, T, head width) × dtype; columns: milliseconds per forward+backward for each
implementation, and attnlab's ratio against SDPA and against the fastest peer. Two plain peers: "plain", the
textbook form (mask built each call, softmax in fp32), and "lean", the same product with the causal bias kept
and added in one `baddbmm`, the softmax in the inputs' dtype. The bf16 rows
run only where bf16 is native, a CPU with bf16 instructions or a GPU from Ampere on (`--bf16 yes` forces them;
elsewhere torch emulates bf16 slowly).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from functools import partial

import torch
import torch.nn.functional as F
from turns import count, device_or_exit, json_file, time_in_turns

from attnlab.modules.attention import attention
from attnlab.training.device import resolve_precision, synchronize

SHAPES = [
    (32, 4, 112, 32),  # the knowledge experiment's quick scale (block 128, trimmed batches)
    (8, 6, 256, 64),  # shape B of the GPT benchmark
    (1, 6, 2048, 64),  # a long sequence
]


def plain(q, k, v):
    """softmax(QKᵀ/√d)V as a textbook writes it: the mask built each call, the softmax in fp32 (as autocast does)."""
    t = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v


@functools.lru_cache(maxsize=8)
def _causal_bias(t: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((t, t), float("-inf"), device=device, dtype=dtype).triu(1)


def lean(q, k, v):
    """The same product without its avoidable costs: the causal bias made once per shape and added where the
    scale is applied (one `baddbmm`), the softmax in the inputs' dtype. A leaner peer for attnlab's explicit
    paths, which do the same."""
    b, h, t, d = q.shape
    bias = _causal_bias(t, q.device, q.dtype).expand(b * h, t, t)
    scores = torch.baddbmm(bias, q.reshape(b * h, t, d), k.reshape(b * h, t, d).transpose(1, 2),
                           alpha=1.0 / math.sqrt(d))
    return (torch.softmax(scores, dim=-1) @ v.reshape(b * h, t, d)).view(b, h, t, d)


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def ours(q, k, v):
    return attention(q, k, v, causal=True)[0]


def time_fns(fns: dict, shape, dtype, repeats: int, device: torch.device | str = "cpu") -> dict[str, float]:
    """Median seconds per forward+backward of each function, timed in turns (one call of each per round)
    so that a slower or faster spell of a shared machine touches every column alike."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=g).to(device, dtype).requires_grad_() for _ in range(3))
    grad = torch.randn(*shape, generator=g).to(device, dtype)
    for fn in fns.values():
        for _ in range(2):
            fn(q, k, v).backward(grad)
    return time_in_turns({name: lambda _, fn=fn: fn(q, k, v).backward(grad) for name, fn in fns.items()}, repeats,
                         sync=partial(synchronize, device))


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=count, default=10)
    p.add_argument("--json", type=json_file, help="also write the rows to this JSON file")
    p.add_argument("--bf16", choices=("auto", "yes", "no"), default="auto",
                   help="run the bf16 rows: auto = only where bf16 is native (CPU bf16 instructions, Ampere+ GPU)")
    p.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then the CPU), cpu, cuda, cuda:N or mps")
    args = p.parse_args(argv)
    device = device_or_exit(p, args.device)
    dtypes = [torch.float32]
    if args.bf16 == "yes" or (args.bf16 == "auto" and resolve_precision("auto", device) is not None):
        dtypes.append(torch.bfloat16)
    elif args.bf16 == "no":
        print("--bf16 no: bf16 rows left out")
    else:
        print(f"bf16 is not native on this {device.type}: bf16 rows left out (--bf16 yes runs them, emulated and "
              "slow)")
    rows = []
    print(f"torch {torch.__version__}, device {device}, {torch.get_num_threads()} thread(s); ms per causal "
          "forward+backward")
    print(f"{'shape (B,H,T,Dh)':<22}{'dtype':<7}{'SDPA':>9}{'plain':>9}{'lean':>9}{'attnlab':>9}{'vs SDPA':>9}"
          f"{'vs best':>9}")
    for shape in SHAPES:
        for dtype in dtypes:
            fns = {"sdpa": sdpa, "plain": plain, "lean": lean, "attnlab": ours}
            ms = {name: 1e3 * sec for name, sec in time_fns(fns, shape, dtype, args.repeats, device).items()}
            best = min(ms["sdpa"], ms["plain"], ms["lean"])  # the fastest peer
            row = {"shape": list(shape), "dtype": str(dtype).replace("torch.", ""), "device": str(device), **ms,
                   "vs_sdpa": ms["sdpa"] / ms["attnlab"], "vs_best": best / ms["attnlab"]}
            rows.append(row)
            print(f"{str(shape):<22}{row['dtype']:<7}{ms['sdpa']:>9.2f}{ms['plain']:>9.2f}{ms['lean']:>9.2f}"
                  f"{ms['attnlab']:>9.2f}{row['vs_sdpa']:>8.2f}x{row['vs_best']:>8.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
