"""Training and decoding speed of attnlab's GPT against HF transformers' GPT2LMHeadModel, in one run.

Same shapes, same data, one run; the rows of a table are timed in turns (one step of each per round), each row in a
process of its own (so that no row's memory traffic depends on another's; --one-process times them all in this
one), and the medians printed with same-run ratios.

    python benchmarks/bench_gpt.py                # both shapes, training + decoding (+ bf16 accuracy)
    python benchmarks/bench_gpt.py --shapes A --repeats 3 --json out.json
    python benchmarks/bench_gpt.py --device cuda   # a GPU (the default, auto, takes one where there is one)

Shapes (vocabulary 65):
    A: 4 layers, 4 heads, 128 wide, block 64, batch 12
    B: 6 layers, 6 heads, 384 wide, block 256, batch 8
Rows:
    train  ours default : attnlab's default settings (bf16 autocast where the hardware has bf16; exact GELU)
    train  ours fp32    : attnlab forced to fp32
    train  HF fp32      : GPT2LMHeadModel in fp32 as users run it: not compiled, with transformers' default
                          attention (SDPA; --hf-attention eager for its explicit path) and fused AdamW (the
                          default of HF's Trainer) (the reference, ratio 1.00)
    train  HF fp32 exact GELU : the same with activation_function="gelu" (torch's exact GELU, the function of
                          attnlab's GPT) in place of GPT-2's "gelu_new" (its tanh approximation, several
                          operations): what of attnlab's lead is the activation function
    train  HF bf16      : GPT2LMHeadModel under bf16 autocast
    decode              : batch-1 greedy generation of 200 tokens with KV cache: attnlab with fp32 and with
                          bf16 weights, HF `generate` with fp32 weights (the reference)
    accuracy            : loss on held-out text after the same steps on the same text, default (bf16) vs
                          fp32 training, both evaluated in fp32 (the standard library's pydoc texts as 65
                          symbols: the 64 most common characters and one for the rest; the last tenth held out)
    peak MiB            : peak resident memory of three training steps above the process's resident memory
                          once the model and data exist (each row in a fresh process, Linux /proc); on a GPU
                          the peak of torch's allocations on it above those once the model and data exist

On a CPU without bf16 instructions torch emulates bf16 matrix products, 50-100x slower than fp32 with AVX2
only and 3-5x with AVX-512 (an Intel Ice Lake), so the bf16 training rows (HF bf16, accuracy) are left out
there unless `--bf16 yes` asks for them; "ours default" is then fp32, as `precision = "auto"` gives on that
CPU. Decoding with bf16 weights stays: torch's bf16 matrix-vector kernel does not need those instructions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from functools import partial

import torch
from turns import count, count0, device_or_exit, json_file, require_transformers, time_in_turns, time_in_turns_apart

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.training.device import (
    cpu_has_bf16,
    fast_fp32_matmul,
    resolve_precision,
    synchronize,
    wants_onednn_fp32,
)


@dataclass(frozen=True)
class Shape:
    name: str
    n_layers: int
    n_heads: int
    d_model: int
    block: int
    batch: int


SHAPES = {
    "A": Shape("A", 4, 4, 128, 64, 12),
    "B": Shape("B", 6, 6, 384, 256, 8),
    "C": Shape("C", 12, 12, 768, 1024, 8),  # GPT-2 small's body: a GPU-sized step (not in the default run)
}
VOCAB = 65


def make_data(shape: Shape, steps: int, seed: int = 0) -> list[torch.Tensor]:
    """Batches of random windows of a random stream: what is timed does not depend on the tokens."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, VOCAB, (4096,), generator=g)
    out = []
    for _ in range(steps):
        starts = torch.randint(0, 4096 - shape.block - 1, (shape.batch,), generator=g)
        out.append(torch.stack([base[s : s + shape.block + 1] for s in starts]))
    return out


def ours(shape: Shape) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=shape.block, d_model=shape.d_model,
                         n_heads=shape.n_heads, n_layers=shape.n_layers, dropout=0.0))


HF_ATTENTION = {"impl": None}  # None: transformers' default (SDPA in recent versions); set by --hf-attention


def hf(shape: Shape, activation: str = "gelu_new"):
    """GPT-2 as its config defines it: "gelu_new", the tanh approximation written as separate operations;
    "gelu" (the "HF fp32 exact GELU" row) is torch's exact GELU, the function attnlab's GPT uses by default."""
    import transformers

    transformers.logging.set_verbosity_error()  # its notes on generation defaults are not ours to act on
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=shape.block, n_embd=shape.d_model,
                                  n_layer=shape.n_layers, n_head=shape.n_heads, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, activation_function=activation)
    model = transformers.GPT2LMHeadModel(cfg)
    if HF_ATTENTION["impl"] is not None:
        model.set_attn_implementation(HF_ATTENTION["impl"])
    return model


def hf_attention_name(model) -> str:
    return str(getattr(model.config, "_attn_implementation", None) or "unknown")


def train_step_fn(model, kind: str, dtype: torch.dtype | None, lr: float = 3e-4, device: torch.device | str = "cpu"):
    device = torch.device(device)
    model.to(device)
    if kind == "ours":  # attnlab's optimizer as its Trainer builds it: fused AdamW, decay on matrices only
        from attnlab.training.optim import build_optimizer
        from attnlab.training.trainer import TrainerConfig

        opt = build_optimizer(model, TrainerConfig(lr=lr, weight_decay=0.1), device)
    else:  # AdamW as HF's Trainer builds it by default (optim="adamw_torch_fused"): the same fused kernel
        try:
            opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, fused=True)
        except (RuntimeError, TypeError, ValueError):  # a torch or device without it: the plain one
            opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    # Like attnlab's Trainer: fp32 training of wide models takes oneDNN's matmuls where verified exact.
    onednn = kind == "ours" and dtype is None and wants_onednn_fp32(model)

    def step(batch: torch.Tensor) -> float:
        batch = batch.to(device)
        x, y = batch[:, :-1], batch[:, 1:]
        with fast_fp32_matmul(device, enabled=onednn):
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = model(x, labels=y).loss if kind == "ours" else model(x, labels=x).loss
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def dtype_name(dtype: torch.dtype | None) -> str:
    """How a row's dtype travels to the process that builds it ("bf16" for bf16 autocast, "fp32" for none), and
    back with `dtype_of`."""
    return "fp32" if dtype is None else "bf16"


def dtype_of(name: str) -> torch.dtype | None:
    return torch.bfloat16 if name == "bf16" else None


def setup_process(hf_attention: str | None, keep_freed: bool) -> None:
    """The settings a row's process needs: HF's attention (a new process starts from the module's default), and
    with `keep_freed` glibc told to keep freed memory, as the `attnlab` command does (`attnlab.allocator`)."""
    HF_ATTENTION["impl"] = hf_attention
    if keep_freed:
        from attnlab.allocator import keep_freed_memory

        keep_freed_memory()


def build_row_model(kind: str, shape: Shape):
    """A training row's model: "ours", "hf" (GPT-2 as defined, gelu_new) or "hf-gelu" (GPT-2 with exact GELU)."""
    if kind == "ours":
        return ours(shape)
    return hf(shape, "gelu" if kind == "hf-gelu" else "gelu_new")


def training_row(kind: str, dtype: str, shape_name: str, device_name: str, warmup: int, repeats: int,
                 hf_attention: str | None, keep_freed: bool = False) -> tuple:
    """Build one training row where it is called (model, optimizer, data, `warmup` untimed steps): returns the step
    of round i and the device's sync. Its arguments are plain values, so a process of its own can build it."""
    setup_process(hf_attention, keep_freed)
    device = torch.device(device_name)
    shape = SHAPES[shape_name]
    data = [b.to(device) for b in make_data(shape, warmup + repeats)]
    model = build_row_model(kind, shape)
    model.train()
    step = train_step_fn(model, kind, dtype_of(dtype), device=device)
    for b in data[:warmup]:
        step(b)
    return (lambda i: step(data[(warmup + i) % len(data)])), partial(synchronize, device)


def decoding_row(label: str, shape_name: str, n_new: int, device_name: str, hf_attention: str | None,
                 keep_freed: bool = False) -> tuple:
    """Build one decoding row where it is called: batch-1 greedy generation of `n_new` tokens after an 8-token
    prompt, KV cache, by attnlab's `generate` ("ours fp32", "ours bf16 weights") or HF's ("HF fp32"); checks that
    it makes exactly `n_new` tokens, and returns the generation (of any round) and the device's sync."""
    from attnlab.inference.generate import generate

    setup_process(hf_attention, keep_freed)
    device = torch.device(device_name)
    shape = SHAPES[shape_name]
    prompt = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(1)).to(device)
    s = Shape(shape.name, shape.n_layers, shape.n_heads, shape.d_model, max(shape.block, 8 + n_new), 1)
    if label == "HF fp32":
        peer = hf(s).to(device).eval()

        def run():
            # GPT-2's eos id (50256) is outside this vocabulary of 65, so HF generates all n_new tokens (checked
            # below) without a min_new_tokens processor's extra work per token.
            return peer.generate(prompt, max_new_tokens=n_new, do_sample=False, pad_token_id=0).shape[1] - 8
    else:
        model = ours(s).to(device).eval()
        if label == "ours bf16 weights":
            model = model.bfloat16()

        def run():
            return len(generate(model, prompt, n_new, greedy=True)[0])
    with torch.no_grad():
        made = run()
    if made != n_new:
        raise RuntimeError(f"the decoding row {label!r} generated {made} tokens, not {n_new}")

    def timed(_: int) -> None:
        with torch.no_grad():
            run()
    return timed, partial(synchronize, device)


def time_rows(makers: dict, repeats: int, apart: bool, device: torch.device | str) -> dict[str, float]:
    """Median seconds per call of each row, timed in turns (one call of every row per round, so that a slow or
    fast spell of a shared machine touches every row alike): each row in a process of its own (`apart`, see
    `turns.time_in_turns_apart`), or all built and timed in this one."""
    if apart:
        return time_in_turns_apart(makers, repeats)
    fns = {label: make()[0] for label, make in makers.items()}
    return time_in_turns(fns, repeats, sync=partial(synchronize, device))


def time_training_rows(specs: dict, shape: Shape, warmup: int, repeats: int, device: torch.device | str = "cpu",
                       apart: bool = True, keep_freed: bool = False) -> dict:
    """Median tokens/s of each training row, {label: (kind, dtype)}, timed in turns (`time_rows`)."""
    makers = {label: partial(training_row, kind, dtype_name(dtype), shape.name, str(device),
                             warmup, repeats, HF_ATTENTION["impl"], keep_freed)
              for label, (kind, dtype) in specs.items()}
    medians = time_rows(makers, repeats, apart, device)
    return {label: {"tokens_per_s": shape.batch * shape.block / sec, "step_s": sec} for label, sec in medians.items()}


def time_decoding_rows(shape: Shape, n_new: int, repeats: int, device: torch.device | str = "cpu",
                       apart: bool = True, keep_freed: bool = False) -> dict:
    """tokens/s of batch-1 greedy generation (`decoding_row`): attnlab's `generate` with fp32 and with bf16 weights,
    HF's `generate` with fp32 weights (the reference), timed in turns (`time_rows`)."""
    makers = {label: partial(decoding_row, label, shape.name, n_new, str(device), HF_ATTENTION["impl"], keep_freed)
              for label in ("ours fp32", "ours bf16 weights", "HF fp32")}
    medians = time_rows(makers, repeats, apart, device)
    out = {label: {"tokens_per_s": n_new / sec} for label, sec in medians.items()}
    for r in out.values():
        r["vs_HF"] = r["tokens_per_s"] / out["HF fp32"]["tokens_per_s"]
    return out


def text_data(shape: Shape, steps: int, n_val: int = 8, seed: int = 3) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Training batches of random windows of the first nine tenths of the pydoc texts (written as 65 symbols: the
    64 most common characters, and one for all others), and `n_val` batches of windows of the last tenth."""
    from collections import Counter

    from attnlab.data.corpus import pydoc_corpus

    text = pydoc_corpus()
    common = [c for c, _ in Counter(text).most_common(VOCAB - 1)]
    index = {c: i for i, c in enumerate(common)}
    ids = torch.tensor([index.get(c, VOCAB - 1) for c in text])
    cut = len(ids) * 9 // 10
    g = torch.Generator().manual_seed(seed)

    def windows(part: torch.Tensor, n: int) -> list[torch.Tensor]:
        starts = torch.randint(0, len(part) - shape.block - 1, (n, shape.batch), generator=g)
        return [torch.stack([part[s : s + shape.block + 1] for s in row]) for row in starts]

    return windows(ids[:cut], steps), windows(ids[cut:], n_val)


def accuracy(shape: Shape, steps: int, device: torch.device | str = "cpu") -> dict:
    """Loss on held-out text after `steps` identical steps on the same text, default (bf16 autocast) vs fp32
    training; both models are evaluated in fp32, so the gap is the training precision's."""
    train, val = text_data(shape, steps)
    train, val = [b.to(device) for b in train], [b.to(device) for b in val]
    out = {}
    for label, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        model = ours(shape)
        step = train_step_fn(model, "ours", dtype, lr=1e-3, device=device)
        for b in train:
            step(b)
        model.eval()
        with torch.no_grad():
            out[label] = statistics.mean(float(model(b[:, :-1], labels=b[:, 1:]).loss) for b in val)
    out["relative_gap"] = abs(out["bf16"] - out["fp32"]) / out["fp32"]
    return out


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_row(spec: str, keep_freed: bool = False) -> None:
    """Child process: build one row's model, take 3 training steps, print the peak above the baseline (resident
    memory on the CPU, torch's allocations on a GPU)."""
    kind, dtype, shape_name, device_name = spec.split(",")
    device = torch.device(device_name)
    step, _ = training_row(kind, dtype, shape_name, device_name, 0, 3, HF_ATTENTION["impl"], keep_freed)
    if device.type == "cuda":
        synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
    else:
        base = _rss_kib("VmRSS") * 1024
    for i in range(3):
        step(i)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else _rss_kib("VmHWM") * 1024
    print(json.dumps({"peak_mib": (peak - base) / 2**20}))


def peak_memory(kind: str, dtype: torch.dtype | None, shape: Shape, device: str = "cpu",
                keep_freed: bool = False) -> float | None:
    """Peak training memory (MiB) of one row, measured in a fresh process (keeping freed memory with `keep_freed`,
    as the timed rows then do); None where /proc is missing, or where the process failed (said on stderr: every
    peak had printed "-" without a word)."""
    spec = f"{kind},{dtype_name(dtype)},{shape.name},{device}"
    try:
        done = subprocess.run([sys.executable, __file__, "--memory-row", spec, "--hf-attention",
                               HF_ATTENTION["impl"] or "default"] + (["--keep-freed-memory"] if keep_freed else []),
                              capture_output=True, text=True, timeout=600, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"]
    except (subprocess.SubprocessError, ValueError, KeyError, IndexError, OSError) as e:
        said = (getattr(e, "stderr", None) or "").strip().splitlines()
        print(f"peak memory of row {spec} not measured: {said[-1] if said else e}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="A,B", help="comma-separated shapes to run: A (4 layers, 128 wide, block 64, "
                   "batch 12), B (6 layers, 384 wide, block 256, batch 8), C (12 layers, 768 wide, "
                   "block 1024, batch 8: GPT-2 small's body, a size for a GPU)")
    p.add_argument("--repeats", type=count, default=8, help="timed steps per row (median reported)")
    p.add_argument("--warmup", type=count0, default=2, help="untimed steps per row before timing")
    p.add_argument("--decode-tokens", type=count, default=200, help="tokens generated per decoding row (batch 1)")
    p.add_argument("--decode-repeats", type=count, default=3, help="timed generations per decoding row (median)")
    p.add_argument("--accuracy-steps", type=count0, default=300, help="0 skips the bf16-vs-fp32 accuracy row")
    p.add_argument("--json", type=json_file, help="also write the results to this JSON file")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory column")
    p.add_argument("--bf16", choices=("auto", "yes", "no"), default="auto",
                   help="run the bf16 rows: auto = only where bf16 is native (CPU bf16 instructions, Ampere+ GPU)")
    p.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then the CPU), cpu, cuda, cuda:N or mps")
    p.add_argument("--hf-attention", choices=("default", "eager", "sdpa"), default="default",
                   help="the HF model's attention: transformers' default (SDPA), or a named implementation")
    p.add_argument("--one-process", action="store_true",
                   help="time every row in this process, as before 2026-11-28 (rows then share a heap, and each "
                        "row's page faults depend on its neighbours); by default each row has a process of its own")
    p.add_argument("--keep-freed-memory", action="store_true",
                   help="every row's process keeps freed memory for reuse, as the `attnlab` command's does "
                        "(attnlab.allocator; both sides alike); by default glibc's settings, as a library user has")
    p.add_argument("--memory-row", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    HF_ATTENTION["impl"] = None if args.hf_attention == "default" else args.hf_attention
    if args.memory_row:
        memory_row(args.memory_row, args.keep_freed_memory)
        return {}
    unknown = [name for name in args.shapes.split(",") if name not in SHAPES]
    if unknown:
        p.error(f"unknown shape {unknown[0]!r} in --shapes; choose from {', '.join(SHAPES)}")

    keep_freed = args.keep_freed_memory
    if keep_freed:  # here as well: --one-process rows run in this process
        from attnlab.allocator import keep_freed_memory

        keep_freed = keep_freed_memory()
        if not keep_freed:
            print("--keep-freed-memory does nothing here (not glibc, ATTNLAB_MALLOC=system, or allocator settings of "
                  "your own): every row keeps the allocator as it is")
    device = device_or_exit(p, args.device)
    default_dtype = resolve_precision("auto", device)  # what `precision = "auto"` trains in there
    bf16 = args.bf16 == "yes" or (args.bf16 == "auto" and default_dtype is not None)
    if args.bf16 == "no":
        print("--bf16 no: the bf16 training rows left out (the default row trains as `precision = \"auto\"` does, "
              f"in {'bf16' if default_dtype is not None else 'fp32'} here)")
    elif not bf16:
        print(f"bf16 is not native on this {device.type}: bf16 training rows left out (--bf16 yes runs them, "
              "emulated and slow)")
    transformers = require_transformers("bench_gpt")

    results: dict = {"torch": torch.__version__, "transformers": transformers.__version__,
                     "threads": torch.get_num_threads(), "device": str(device), "cpu_bf16": cpu_has_bf16(),
                     "default_precision": "bf16" if default_dtype is not None else "fp32",  # the "ours default" row
                     "hf_attention": hf_attention_name(hf(SHAPES["A"])),
                     "rows_timed": "in one process" if args.one_process else "each in a process of its own",
                     "keep_freed_memory": keep_freed,
                     "shapes": {}}
    try:  # as train_step_fn builds HF's optimizer
        torch.optim.AdamW([torch.zeros(1, device=device, requires_grad=True)], fused=True)
        results["hf_optimizer"] = "fused AdamW"
    except (RuntimeError, TypeError, ValueError):
        results["hf_optimizer"] = "AdamW (fused unavailable here)"
    print(f"HF GPT-2: transformers {transformers.__version__}, attention {results['hf_attention']}, "
          f"{results['hf_optimizer']}")
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        specs = {
            "ours default": ("ours", default_dtype),
            "ours fp32": ("ours", None),
            "HF fp32": ("hf", None),
            "HF fp32 exact GELU": ("hf-gelu", None),
            "HF bf16": ("hf", torch.bfloat16),
        }
        if not bf16:
            del specs["HF bf16"]
        rows = time_training_rows(specs, shape, args.warmup, args.repeats, device, apart=not args.one_process,
                                  keep_freed=keep_freed)
        ref = rows["HF fp32"]["tokens_per_s"]
        for label, r in rows.items():
            r["vs_HF_fp32"] = r["tokens_per_s"] / ref
            if not args.no_memory:
                kind, dtype = specs[label]
                r["peak_mib"] = peak_memory(kind, dtype, shape, str(device), keep_freed)
        dec = time_decoding_rows(shape, args.decode_tokens, max(1, args.decode_repeats), device,
                                 apart=not args.one_process, keep_freed=keep_freed)
        results["shapes"][name] = {"shape": shape.__dict__, "train": rows, "decode": dec}
        print(f"\nshape {name}: {shape.n_layers} layers, {shape.n_heads} heads, {shape.d_model} wide, "
              f"block {shape.block}, batch {shape.batch}, device {device}")
        width = max(len("decode, batch 1"), *(len(f"train {k}") for k in rows), *(len(f"decode {k}") for k in dec))
        print(f"  {'row':<{width}}{'tokens/s':>12}{'vs HF fp32':>12}{'peak MiB':>10}")
        for label, r in rows.items():
            peak = r.get("peak_mib")
            shown = f"{peak:>10.0f}" if peak is not None else f"{'-':>10}"
            print(f"  {'train ' + label:<{width}}{r['tokens_per_s']:>12,.0f}{r['vs_HF_fp32']:>11.2f}x{shown}")
        print(f"  {'decode, batch 1':<{width}}{'tokens/s':>12}{'vs HF':>12}")
        for label, r in dec.items():
            print(f"  {'decode ' + label:<{width}}{r['tokens_per_s']:>12,.0f}{r['vs_HF']:>11.2f}x")
    if args.accuracy_steps and bf16:
        print()
        for name in args.shapes.split(","):  # issue 5 asks it of shape B's default row, issue 3 of the default
            acc = accuracy(SHAPES[name], args.accuracy_steps, device)
            results[f"accuracy_shape_{name}"] = acc
            bf16_label = "default (bf16)" if default_dtype == torch.bfloat16 else "bf16 (forced; not the default here)"
            print(f"loss on held-out text after {args.accuracy_steps} steps (shape {name}): fp32 {acc['fp32']:.4f}, "
                  f"{bf16_label} {acc['bf16']:.4f}, relative gap {100 * acc['relative_gap']:.2f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    main()
