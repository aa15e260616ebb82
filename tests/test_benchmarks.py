"""The benchmark scripts run end to end (tiny settings: this checks they work, not how fast anything is)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

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
    assert set(shape["train"]) == {"ours default", "ours fp32", "HF fp32"}  # --bf16 no: no HF bf16 row
    assert shape["train"]["HF fp32"]["vs_HF_fp32"] == pytest.approx(1.0)
    assert all(r["tokens_per_s"] > 0 for r in shape["train"].values())
    assert set(shape["decode"]) == {"ours fp32", "ours bf16 weights", "HF fp32"}
    assert out.is_file()
    assert "vs HF fp32" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_attention_runs(tmp_path, capsys):
    rows = load("bench_attention").main(["--repeats", "1", "--bf16", "no", "--json", str(tmp_path / "a.json")])
    assert [r["dtype"] for r in rows] == ["float32"] * 3
    assert all(r["sdpa"] > 0 and r["attnlab"] > 0 and r["vs_sdpa"] > 0 for r in rows)
    assert (tmp_path / "a.json").is_file()
