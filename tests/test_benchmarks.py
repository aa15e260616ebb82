"""The benchmark scripts run end to end (tiny settings: this checks they work, not how fast anything is)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    if str(BENCH) not in sys.path:  # the scripts import their shared helper as `python benchmarks/x.py` does
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_bench_gpt_runs(tmp_path, capsys):
    pytest.importorskip("transformers")
    out = tmp_path / "gpt.json"
    results = load("bench_gpt").main(["--shapes", "A", "--repeats", "1", "--warmup", "0", "--decode-tokens", "4",
                                      "--decode-repeats", "1", "--accuracy-steps", "0", "--no-memory",
                                      "--bf16", "no", "--json", str(out)])
    shape = results["shapes"]["A"]
    assert set(shape["train"]) == {"ours default", "ours fp32", "HF fp32", "HF fp32 exact GELU"}  # no HF bf16 row
    assert shape["train"]["HF fp32"]["vs_HF_fp32"] == pytest.approx(1.0)
    assert all(r["tokens_per_s"] > 0 for r in shape["train"].values())
    assert set(shape["decode"]) == {"ours fp32", "ours bf16 weights", "HF fp32"}
    # The ratios against the right row (the stop-40 benchmark audit: a mutant's were not caught), and the JSON is
    # the results returned, whole.
    for part, key in (("train", "vs_HF_fp32"), ("decode", "vs_HF")):
        ref = shape[part]["HF fp32"]["tokens_per_s"]
        assert all(r[key] == pytest.approx(r["tokens_per_s"] / ref) for r in shape[part].values())
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["hf_attention"] not in ("", "unknown")  # the peer's attention, as users get it, is recorded
    assert "vs HF fp32" in capsys.readouterr().out


def test_bench_gpt_accuracy_data_is_held_out_text_and_shapes_are_checked():
    bench = load("bench_gpt")
    shape = bench.SHAPES["A"]
    train, val = bench.text_data(shape, 3, n_val=2)
    assert len(train) == 3 and len(val) == 2
    assert all(b.shape == (shape.batch, shape.block + 1) and 0 <= int(b.min()) and int(b.max()) < bench.VOCAB
               for b in train + val)
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--shapes", "A,Z"])
    assert exit_info.value.code == 2


@pytest.mark.slow
def test_bench_attention_runs(tmp_path, capsys):
    rows = load("bench_attention").main(["--repeats", "1", "--bf16", "no", "--json", str(tmp_path / "a.json")])
    assert [r["dtype"] for r in rows] == ["float32"] * 3
    assert all(r["sdpa"] > 0 and r["lean"] > 0 and r["attnlab"] > 0 and r["vs_sdpa"] > 0 for r in rows)
    assert all(r["vs_best"] == pytest.approx(min(r["sdpa"], r["plain"], r["lean"]) / r["attnlab"]) for r in rows)
    assert all(r["vs_sdpa"] == pytest.approx(r["sdpa"] / r["attnlab"]) for r in rows)
    assert json.loads((tmp_path / "a.json").read_text()) == json.loads(json.dumps(rows))


@pytest.mark.slow
def test_bench_dropout_runs(tmp_path, capsys):
    import attnlab.modules.dropout as dropout_module

    before = dropout_module.DROPOUT_MIN_ELEMENTS
    results = load("bench_dropout").main(["--repeats", "1", "--json", str(tmp_path / "d.json")])
    assert dropout_module.DROPOUT_MIN_ELEMENTS == before  # the steps' switch to torch's dropout is undone
    assert len(results["op"]) == 8 and len(results["attention"]) == 3
    assert {r["model"] for r in results["steps"]} == {"translation", "bert-mlm"}
    assert all(r["torch"] > 0 and r["attnlab"] > 0 for part in ("op", "attention", "steps") for r in results[part])
    assert json.loads((tmp_path / "d.json").read_text()) == json.loads(json.dumps(results))
    assert "training step" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_loss_runs(tmp_path, capsys):
    import attnlab.models.common as common

    before = common.SELECT_ROWS_BELOW
    results = load("bench_loss").main(["--repeats", "1", "--json", str(tmp_path / "l.json")])
    assert common.SELECT_ROWS_BELOW == before  # the "torch" columns' switch is undone
    assert {r["case"] for r in results["loss"]} == {"bert-mlm", "knowledge", "translation"}
    assert {r["model"] for r in results["steps"]} == {"translation", "bert-mlm"}
    assert {r["model"] for r in results["head"]} == {"bert-mlm", "translation"}
    assert all(r["torch"] > 0 and r["attnlab"] > 0 for part in ("loss", "steps", "head") for r in results[part])
    assert json.loads((tmp_path / "l.json").read_text()) == json.loads(json.dumps(results))
    assert "token loss" in capsys.readouterr().out


def test_turns_wait_for_the_device_around_every_timed_call():
    """A GPU runs behind the host: each call is timed from an idle device to the end of its own work."""
    events = []
    load("bench_attention")  # puts benchmarks/ on the path
    from turns import time_in_turns

    time_in_turns({"a": lambda i: events.append(f"a{i}"), "b": lambda i: events.append(f"b{i}")}, 2,
                  sync=lambda: events.append("sync"))
    # odd rounds go in reverse order: no function always follows the same one
    assert events == ["sync", "a0", "sync", "sync", "b0", "sync", "sync", "b1", "sync", "sync", "a1", "sync"]


def test_every_row_follows_itself_equally_often():
    """The first and the last row of a round had been the only ones to follow themselves (their own caches warm),
    the reference row in the middle never (benchmarks audit 4). Over 2·n rounds each of n rows does so once."""
    load("bench_attention")  # puts benchmarks/ on the path
    from collections import Counter

    from turns import rounds

    names = ["ours default", "ours fp32", "HF fp32", "HF fp32 exact GELU"]
    order = [name for _, name in rounds(names, 8)]
    assert Counter(order) == {name: 8 for name in names}
    assert all(sorted(order[4 * i:4 * i + 4]) == sorted(names) for i in range(8))  # each round visits each once
    follows_itself = Counter(a for a, b in zip(order, order[1:]) if a == b)
    assert follows_itself == {name: 1 for name in names}
    predecessors = {name: {a for a, b in zip(order, order[1:]) if b == name and a != name} for name in names}
    assert all(len(seen) >= 2 for seen in predecessors.values())  # no row always follows the same neighbour


def test_rows_apart_run_each_in_a_process_of_its_own_in_turns(tmp_path):
    """bench_gpt's rows share no heap (one row's freed memory was another's page faults): each has a process."""
    from functools import partial

    import turns_helpers

    load("bench_attention")  # puts benchmarks/ on the path
    from turns import time_in_turns_apart

    log = tmp_path / "calls.txt"
    medians = time_in_turns_apart({name: partial(turns_helpers.logging_row, name, str(log)) for name in "ab"}, 2)
    assert set(medians) == {"a", "b"} and all(t > 0 for t in medians.values())
    calls = [line.split() for line in log.read_text(encoding="utf-8").splitlines()]
    assert [call for call, _ in calls] == ["a0", "b0", "b1", "a1"]  # the rounds of time_in_turns
    pids = {call[0]: pid for call, pid in calls}
    assert pids["a"] != pids["b"] and str(os.getpid()) not in pids.values()
    with pytest.raises(RuntimeError, match=r"(?s)row 'bad' failed in its process:.*ValueError: no such model"):
        time_in_turns_apart({"bad": turns_helpers.failing_row}, 1)
    # A row computes on the parent's number of threads, which the results record: a spawned process had started
    # with torch's default whatever the parent set (stop-40 benchmark audit).
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # neither the machine's default nor OMP_NUM_THREADS's
    try:
        time_in_turns_apart({"t": partial(turns_helpers.threads_row, str(tmp_path / "threads.txt"))}, 1)
    finally:
        torch.set_num_threads(before)
    assert (tmp_path / "threads.txt").read_text(encoding="utf-8") == "3"


def test_bench_attention_builds_its_tensors_on_the_device():
    """Every tensor of a timed function follows the inputs' device (meta tensors stand in for a GPU's)."""
    bench = load("bench_attention")
    q, k, v = (torch.randn(1, 2, 5, 4, device="meta") for _ in range(3))
    for fn in (bench.plain, bench.lean, bench.sdpa, bench.ours):
        assert fn(q, k, v).device.type == "meta"


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_bench_attention_peers_compute_causal_attention(dtype, atol):
    bench = load("bench_attention")
    q, k, v = (torch.randn(2, 3, 40, 8, generator=torch.Generator().manual_seed(i)).to(dtype) for i in range(3))
    reference = bench.sdpa(q.double(), k.double(), v.double())
    for fn in (bench.plain, bench.lean, bench.ours):
        torch.testing.assert_close(fn(q, k, v).double(), reference, atol=atol, rtol=0)


@pytest.mark.slow
def test_bench_scripts_take_a_device(tmp_path, capsys):
    rows = load("bench_attention").main(["--repeats", "1", "--bf16", "no", "--device", "cpu"])
    assert {r["device"] for r in rows} == {"cpu"}
    bench = load("bench_gpt")
    bench.memory_row("ours,fp32,A,cpu")  # the peak-memory child process, in this one
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["peak_mib"] >= 0


@pytest.mark.slow
def test_bench_ceiling_runs(tmp_path, capsys):
    pytest.importorskip("transformers")
    out = tmp_path / "ceiling.json"
    results = load("bench_ceiling").main(["--shapes", "A", "--repeats", "1", "--decode-tokens", "4",
                                          "--no-attention", "--json", str(out)])
    rows = results["rows"]
    assert set(rows) == {"train A default", "decode A fp32"}
    for row in rows.values():
        # The bound is a lower bound on the time of the workload: the ceiling is the reference over it.
        assert row["ceiling"] == pytest.approx(row["reference_s"] / row["bound_s"])
        assert row["bound_s"] > 0 and row["now"] > 0
    assert rows["train A default"]["aten_calls"] > 100
    assert results["bare"]["read_bytes_per_s"] > 0
    assert json.loads(out.read_text())["rows"].keys() == rows.keys()
    printed = capsys.readouterr().out
    assert "ceiling" in printed
    # The training bound is the products plus attention's causal half: both printed, so it can be redone by hand.
    x = results["bare"]["rates"]["A"]
    attention = x.get("attn_low_s", x["attn_fp32_s"])
    assert f"plus attention's causal half, ms: fp32 {x['attn_fp32_s'] * 1e3:,.2f}" in printed
    assert rows["train A default"]["bound_s"] == pytest.approx(x.get("low_s", x["fp32_s"]) + attention)


def test_bench_ceiling_takes_only_the_shapes_it_has_targets_and_bounds_for(capsys):
    # --shapes C ran, with a "nanx" target, the attention note on its training rows and NaN in the JSON file
    # (stop-44 README audit).
    with pytest.raises(SystemExit) as exited:
        load("bench_ceiling").main(["--shapes", "A,C"])
    assert exited.value.code == 2 and "--shapes: choose among A, B" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["bench_gpt", "bench_attention", "bench_ceiling", "bench_dropout", "bench_loss"])
def test_bad_options_are_one_line_errors(script, capsys):
    # --repeats 0 failed with "no median for empty data" (bench_gpt after starting and warming every row's
    # process), and a device the machine lacks with a ConfigError traceback.
    module = load(script)
    bad = [["--repeats", "0"]]
    if not torch.cuda.is_available():
        bad.append(["--device", "cuda"])
    for argv in bad:
        with pytest.raises(SystemExit) as exited:
            module.main(argv)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and "Traceback" not in err
        assert "must be at least 1, got 0" in err or "device 'cuda' is not available" in err


@pytest.mark.parametrize("script", ["bench_gpt", "bench_attention", "bench_ceiling", "bench_dropout", "bench_loss"])
def test_options_are_checked_before_the_run(script, capsys, tmp_path):
    # A --json path in no folder failed after the whole run (its figures lost); bench_gpt's --warmup -1 took warm-up
    # steps from the end of the data or divided by zero, --accuracy-steps -1 failed after every timed row; and
    # bench_ceiling said transformers was missing before a bad --device.
    module = load(script)
    bad = [(["--json", str(tmp_path / "nowhere" / "x.json")], "does not exist; make it first"),
           (["--json", str(tmp_path)], "is a folder; give a file name")]
    if script == "bench_gpt":
        bad += [(["--warmup", "-1"], "must be at least 0, got -1"), (["--accuracy-steps", "-1"], "must be at least 0")]
    if script == "bench_ceiling":
        bad += [(["--shapes", "Z"], "--shapes: choose among")]
    bad += [(["--device", "foo"], "error: --device: unknown device 'foo'")]  # said "--device: device: ..."
    for argv, says in bad:
        with pytest.raises(SystemExit) as exited:
            module.main(["--device", "cpu", *argv])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and says in err and "Traceback" not in err, (argv, err)


def test_bench_gpt_says_when_bf16_rows_were_asked_away(tmp_path, capsys):
    pytest.importorskip("transformers")
    results = load("bench_gpt").main(["--shapes", "A", "--repeats", "1", "--warmup", "0", "--decode-tokens", "2",
                                      "--decode-repeats", "1", "--accuracy-steps", "0", "--bf16", "no",
                                      "--no-memory", "--one-process", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "--bf16 no: the bf16 training rows left out" in out and "is not native" not in out
    assert results["default_precision"] in ("bf16", "fp32")


def test_a_peak_memory_process_that_fails_says_why(capsys, monkeypatch):
    # Any failure of the memory row's process (a misspelt option, a crash) printed "-" for every peak without a word
    # (stop-40 benchmark audit).
    import subprocess

    bench = load("bench_gpt")

    def failing(cmd, **kwargs):
        raise subprocess.CalledProcessError(2, cmd, output="", stderr="Traceback ...\nValueError: no such row\n")

    monkeypatch.setattr(subprocess, "run", failing)
    assert bench.peak_memory("ours", None, bench.SHAPES["A"]) is None
    assert "peak memory of row ours,fp32,A,cpu not measured: ValueError: no such row" in capsys.readouterr().err


def test_bench_gpt_accuracy_trains_both_precisions_on_the_same_batches_and_scores_held_out_ones(monkeypatch):
    # The accuracy row was never run by a test: a mutant that trained on the held-out batches passed (stop-40
    # benchmark audit).
    bench = load("bench_gpt")
    seen: dict[object, list] = {}
    real = bench.train_step_fn

    def recording(model, kind, dtype, **kwargs):
        step = real(model, kind, dtype, **kwargs)
        batches = seen.setdefault(dtype, [])

        def recorded(batch):
            batches.append(batch.clone())
            return step(batch)
        return recorded

    monkeypatch.setattr(bench, "train_step_fn", recording)
    out = bench.accuracy(bench.SHAPES["A"], 2)
    _, val = bench.text_data(bench.SHAPES["A"], 2)
    fp32, bf16 = seen[None], seen[torch.bfloat16]
    assert len(fp32) == len(bf16) == 2 and all(torch.equal(a, b) for a, b in zip(fp32, bf16))
    assert not any(torch.equal(t, v) for t in fp32 for v in val)
    assert out["relative_gap"] == pytest.approx(abs(out["bf16"] - out["fp32"]) / out["fp32"])
    assert all(math.isfinite(out[k]) and out[k] > 0 for k in ("fp32", "bf16"))


def test_the_step_tables_say_where_they_leave_bf16_out(capsys, monkeypatch):
    # (sixth README audit, on a CPU without bf16 instructions) bench_loss and bench_dropout dropped their bf16 step
    # rows without a word, where bench_gpt and bench_attention say so
    import torch

    steps = load("steps")
    monkeypatch.setattr(steps, "resolve_precision", lambda precision, device: None)
    assert steps.step_dtypes(torch.device("cpu")) == [torch.float32]
    assert "bf16 is not native on this cpu: the bf16 training-step rows are left out" in capsys.readouterr().out
    steps.step_dtypes(torch.device("cpu"), "loss, head and training-step rows")  # bench_loss drops all three
    assert "the bf16 loss, head and training-step rows are left out" in capsys.readouterr().out
    monkeypatch.setattr(steps, "resolve_precision", lambda precision, device: torch.bfloat16)
    assert steps.step_dtypes(torch.device("cpu")) == [torch.bfloat16, torch.float32]
    assert capsys.readouterr().out == ""
