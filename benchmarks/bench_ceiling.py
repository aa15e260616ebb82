"""How far each of the performance targets (benchmarks/README.md) can go on this machine: for every row, a lower
bound on the time of the workload from what it cannot avoid, and so an upper bound (the ceiling) on its ratio to the
reference, next to the target and to attnlab's figure now, all measured in one run.

  training: the matrix products of one step (each Linear's forward product and its two backward ones, the LM
      head, and the causal half of attention's six products), timed bare in the step's dtype and layouts.
      A step cannot be faster than its products: reference step / products is the ratio a step would reach
      if everything else (norms, GELU, softmax, casts, optimizer, framework calls) cost nothing. fp32 is
      timed on torch's default BLAS (MKL) and, where attnlab verifies it exact, on oneDNN; the faster counts.
  decoding, batch 1: every weight is read once per token, so weight bytes / the read bandwidth of all threads
      (a sum over 256 MB; the last-level cache can serve a part, so this bound is a soft one).
  attention, causal forward + backward: the causal half of the six products at the measured batched-product
      speed of the shape, against torch SDPA.

A target above its row's ceiling cannot be met here without changing the arithmetic (another dtype, fewer
FLOPs); one below it is not ruled out by the hardware. Beside each training row: how long attnlab's step takes
beyond its products (and, at shape A, in how many more operator calls: at that size the framework, not the
arithmetic, is the limit).

    python benchmarks/bench_ceiling.py            # ~1 min on 2 CPU cores; needs the [bench] extra (HF transformers)
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
from bench_attention import SHAPES as ATTENTION_SHAPES
from bench_attention import ours as attention_ours
from bench_attention import sdpa, time_fns
from bench_gpt import SHAPES, VOCAB, Shape, make_data, ours, time_decoding_rows, time_training_rows, train_step_fn
from torch.utils._python_dispatch import TorchDispatchMode
from turns import count, device_or_exit, json_file, require_transformers

from attnlab.training.device import fast_fp32_matmul, resolve_precision, synchronize

TARGETS = {  # the performance targets, as ratios to the reference of the row
    "train B default": 4.5, "train B fp32": 2.5, "train A default": 3.0,
    "decode B fp32": 2.5, "decode B bf16 weights": 4.0, "decode A fp32": 4.0, "attention": 1.5,
}


def best_seconds(fn, repeats: int, device, warmup: int = 2) -> float:
    """The fastest of `repeats` timed calls: a bound is a lower bound on the time, so its best run counts."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def linear_shapes(shape: Shape) -> list[tuple[int, int]]:
    """(in, out) of every weight matrix a GPT of `shape` multiplies by: per layer the fused QKV product, the
    attention output, the MLP's two; then the head (tied to the token embeddings)."""
    d = shape.d_model
    return [(d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)] * shape.n_layers + [(d, VOCAB)]


def step_products(shape: Shape, dtype: torch.dtype, device) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], float]:
    """The (a, b) operands of every `a @ b` of a training step's Linears and head, in the layouts autograd
    uses (forward x·Wᵀ, input gradient dY·W, weight gradient dYᵀ·x), and their FLOPs."""
    g = torch.Generator().manual_seed(0)
    n = shape.batch * shape.block
    pairs, flops = [], 0.0
    for fan_in, fan_out in linear_shapes(shape):
        x, w, dy = (torch.randn(*s, generator=g).to(device, dtype) for s in ((n, fan_in), (fan_out, fan_in),
                                                                            (n, fan_out)))
        pairs += [(x, w.t()), (dy, w), (dy.t(), x)]
        flops += 3 * 2 * n * fan_in * fan_out
    return pairs, flops


def attention_products(b: int, h: int, t: int, dh: int, dtype: torch.dtype, device) -> list[tuple[torch.Tensor, ...]]:
    """The six batched products of attention's forward and backward at full size (the causal bound takes
    half their time): Q·Kᵀ, P·V, dO·Vᵀ, Pᵀ·dO, dS·K, dSᵀ·Q."""
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(b * h, t, dh, generator=g).to(device, dtype) for _ in range(4))
    p = torch.randn(b * h, t, t, generator=g).to(device, dtype)
    return [(q, k.transpose(1, 2)), (p, v), (do, v.transpose(1, 2)), (p.transpose(1, 2), do), (p, k),
            (p.transpose(1, 2), q)]


def products_seconds(pairs, repeats: int, device, onednn: bool = False) -> float | None:
    """Seconds for all the products in turn (the best run); with `onednn`, fp32 products on oneDNN, or None where
    attnlab would not use it (not exact on this CPU, or not a CPU)."""
    def run():
        for a, b in pairs:
            torch.matmul(a, b)
    with fast_fp32_matmul(device, enabled=onednn) as used:
        if onednn and not used:
            return None
        return best_seconds(run, repeats, device)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def read_bandwidth(device, repeats: int) -> float:
    """Bytes per second of a sum over 256 MB, on all threads."""
    x = torch.ones(64 * 2**20, device=device)
    return x.numel() * 4 / best_seconds(lambda: x.sum(), repeats, device)


class _CountOps(TorchDispatchMode):
    """Counts the ATen operators that run (after autograd and composite operators' decomposition)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def aten_calls_per_step(shape: Shape, dtype: torch.dtype | None, device) -> int:
    step = train_step_fn(ours(shape).train(), "ours", dtype, device=device)
    batch = make_data(shape, 1)[0]
    step(batch)
    with _CountOps() as ops:
        step(batch)
    return ops.count


def weight_bytes(shape: Shape, element_size: int) -> int:
    """Bytes of the weight matrices a decoded token reads (biases and norms are a rounding error)."""
    return element_size * sum(fan_in * fan_out for fan_in, fan_out in linear_shapes(shape))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=count, default=5,
                   help="timed calls per measurement (workloads: the median; bare products and reads: the best)")
    p.add_argument("--shapes", default="A,B", help="comma-separated: A, B (issue 5's shapes, the only ones with "
                   "targets and bounds here)")
    p.add_argument("--no-attention", action="store_true", help="skip the attention rows")
    p.add_argument("--decode-tokens", type=count, default=200)
    p.add_argument("--json", type=json_file, help="also write the results to this JSON file")
    p.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then the CPU), cpu, cuda, cuda:N or mps")
    args = p.parse_args(argv)
    device = device_or_exit(p, args.device)
    shapes = args.shapes.split(",")
    if not set(shapes) <= {"A", "B"}:  # bench_gpt's other shapes have no target and no bound written here
        p.error("--shapes: choose among A, B")
    require_transformers("bench_ceiling")  # the reference of every training and decoding row (options first)
    default = resolve_precision("auto", device)  # attnlab's default training dtype there (None: fp32)
    r = args.repeats
    out: dict = {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads(),
                 "cpu": cpu_name(), "default_dtype": str(default), "rows": {}}

    # The references and attnlab now, first (before the bare measurements' large buffers come and go).
    timed = {}
    for name in shapes:
        shape = SHAPES[name]
        specs = {"ours default": ("ours", default), "ours fp32": ("ours", None), "HF fp32": ("hf", None)}
        timed[name] = (time_training_rows(specs, shape, 2, r, device),
                       time_decoding_rows(shape, args.decode_tokens, max(1, r // 2), device))

    # Bare rates.
    rates = {}
    for name in shapes:
        shape = SHAPES[name]
        pairs32, flops = step_products(shape, torch.float32, device)
        mkl = products_seconds(pairs32, r, device)
        onednn = products_seconds(pairs32, r, device, onednn=True)
        rates[name] = {"flops": flops, "fp32_mkl_s": mkl, "fp32_onednn_s": onednn,
                       "fp32_s": mkl if onednn is None else min(mkl, onednn)}
        if default is not None:
            rates[name]["low_s"] = products_seconds(step_products(shape, default, device)[0], r, device)
        heads = (shape.batch, shape.n_heads, shape.block, shape.d_model // shape.n_heads)
        for key, dtype in (("fp32", torch.float32), ("low", default)):
            if dtype is not None:
                rates[name][f"attn_{key}_s"] = 0.5 * products_seconds(attention_products(*heads, dtype, device), r,
                                                                      device) * shape.n_layers
    bandwidth = read_bandwidth(device, r)
    out["bare"] = {"rates": rates, "read_bytes_per_s": bandwidth}
    gf = {name: rates[name]["flops"] / 1e9 for name in rates}
    low_name = str(default).replace("torch.", "") if default is not None else "float32"
    print(f"{out['cpu']}; torch {torch.__version__}, device {device}, {torch.get_num_threads()} thread(s), default "
          f"training dtype {low_name}")
    for name in shapes:
        x = rates[name]
        onednn = f"{gf[name] / x['fp32_onednn_s']:,.0f}" if x["fp32_onednn_s"] is not None else "not used"
        low = f", {low_name} {gf[name] / x['low_s']:,.0f}" if "low_s" in x else ""
        attention = f"fp32 {x['attn_fp32_s'] * 1e3:,.2f}" + (f", {low_name} {x['attn_low_s'] * 1e3:,.2f}"
                                                              if "attn_low_s" in x else "")
        # The bounds add the two: printed apart, each row's bound can be redone from what is shown.
        print(f"  products of a shape-{name} step ({gf[name]:.1f} GFLOP), GFLOP/s: fp32 MKL "
              f"{gf[name] / x['fp32_mkl_s']:,.0f}, fp32 oneDNN {onednn}{low}; plus attention's causal half, ms: "
              f"{attention}")
    print(f"  read bandwidth {bandwidth / 1e9:.1f} GB/s")


    rows = out["rows"]
    for name in shapes:
        shape = SHAPES[name]
        train, dec = timed[name]
        ref = train["HF fp32"]["step_s"]
        x = rates[name]
        bound = x.get("low_s", x["fp32_s"]) + x.get("attn_low_s", x["attn_fp32_s"])  # fp32 where that is the default
        rows[f"train {name} default"] = {"now": ref / train["ours default"]["step_s"], "ceiling": ref / bound,
                                        "bound_s": bound, "reference_s": ref, "ours_s": train["ours default"]["step_s"]}
        if name == "B":
            bound = x["fp32_s"] + x["attn_fp32_s"]
            rows["train B fp32"] = {"now": ref / train["ours fp32"]["step_s"], "ceiling": ref / bound,
                                    "bound_s": bound, "reference_s": ref, "ours_s": train["ours fp32"]["step_s"]}
        hf_token = 1 / dec["HF fp32"]["tokens_per_s"]
        for label, size in (("fp32", 4), ("bf16 weights", 2)):
            if name == "A" and label != "fp32":
                continue
            bound = weight_bytes(shape, size) / bandwidth
            rows[f"decode {name} {label}"] = {"now": dec[f"ours {label}"]["vs_HF"], "ceiling": hf_token / bound,
                                              "bound_s": bound, "reference_s": hf_token}
    calls = aten_calls_per_step(SHAPES["A"], default, device) if "A" in shapes else 0
    if calls:
        rows["train A default"]["aten_calls"] = calls
    for shape in [] if args.no_attention else ATTENTION_SHAPES:
        for dtype in (torch.float32, default):
            if dtype is None:
                continue
            ms = time_fns({"sdpa": sdpa, "attnlab": attention_ours}, shape, dtype, r, device)
            bound = 0.5 * products_seconds(attention_products(*shape, dtype, device), r, device)
            tag = str(dtype).replace("torch.", "")
            rows[f"attention {tag} T={shape[2]}"] = {"now": ms["sdpa"] / ms["attnlab"], "ceiling": ms["sdpa"] / bound,
                                                    "bound_s": bound, "reference_s": ms["sdpa"]}

    def rest(label: str) -> str:  # what attnlab's step spends beyond the bound
        row = rows.get(label)
        if row is None:
            return ""
        step, beyond = row["ours_s"] * 1e3, (row["ours_s"] - row["bound_s"]) * 1e3
        return f"; attnlab's step {step:.1f} ms, {beyond:.1f} beyond them"

    notes = {
        # The bound is a step's products and attention's causal half (both printed above).
        "train B default": f"{low_name} products and attention of a step{rest('train B default')}",
        "train B fp32": f"fp32 products (faster of MKL and oneDNN) and attention of a step{rest('train B fp32')}",
        "train A default": f"{low_name} products and attention of a step{rest('train A default')}; {calls:,} "
                           "operator calls a step",
        "decode B fp32": f"{weight_bytes(SHAPES['B'], 4) / 1e6:.1f} MB read per token",
        "decode B bf16 weights": f"{weight_bytes(SHAPES['B'], 2) / 1e6:.1f} MB read per token",
        "decode A fp32": f"{weight_bytes(SHAPES['A'], 4) / 1e6:.1f} MB read per token",
    }
    print(f"\n{'row':<30}{'target':>8}{'now':>8}{'ceiling':>9}  {'bound':>10} vs {'reference':<10}  what bounds it")
    for label, row in rows.items():
        target = TARGETS.get(label, TARGETS["attention"] if label.startswith("attention") else float("nan"))
        row["target"] = target
        note = notes.get(label, "causal half of the six products vs torch SDPA")
        print(f"{label:<30}{target:>7.1f}x{row['now']:>7.2f}x{row['ceiling']:>8.2f}x  "
              f"{row['bound_s'] * 1e3:>8.2f}ms vs {row['reference_s'] * 1e3:>8.2f}ms  {note}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
