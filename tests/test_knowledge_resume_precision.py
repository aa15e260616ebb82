"""`run knowledge --resume` on a machine where precision "auto" resolves otherwise than where a finished phase was
trained (bf16 there, fp32 here): the phase was reused without a word and results.json gave the whole table this
machine's precision. Now the reuse is warned of and results.json gives each phase's precision."""

from __future__ import annotations

import json
import warnings

from test_knowledge_experiment import TINY

from attnlab.experiments.knowledge import run_knowledge
from attnlab.training import device

ARGS = dict(device="cpu", overrides={**TINY, "precision": "auto"}, progress=False, echo=lambda *_: None)


def test_a_phase_reused_from_another_precision_is_warned_of_and_recorded(tmp_path, monkeypatch):
    out = tmp_path / "k"
    monkeypatch.setattr(device, "cpu_has_bf16", lambda: False)  # here: "auto" is fp32
    run_knowledge(out, variants="none", **ARGS)
    assert json.loads((out / "results.json").read_text())["variants"][0]["finetune"]["precision"] == "fp32"
    state_file = out / "finetune-none" / "checkpoint" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["precision_used"] = "bf16"  # as the phase records it where it was trained with bf16 instructions
    state_file.write_text(json.dumps(state))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_knowledge(out, variants="none,dot", resume=True, **ARGS)
    said = [str(w.message) for w in caught if "was trained in" in str(w.message)]
    assert said == ["finetune-none was trained in bf16, but precision 'auto' gives fp32 here: its row mixes the two "
                    "(results.json gives each phase's precision); for one precision throughout, start without "
                    "--resume"], said
    rows = {row["variant"]: row for row in json.loads((out / "results.json").read_text())["variants"]}
    assert rows["none"]["finetune"]["skipped"] and rows["none"]["finetune"]["precision"] == "bf16"
    assert rows["dot"]["pretrain"]["precision"] == rows["dot"]["finetune"]["precision"] == "fp32"


def test_a_phase_reused_in_its_own_precision_says_nothing(tmp_path, monkeypatch):
    out = tmp_path / "k"
    monkeypatch.setattr(device, "cpu_has_bf16", lambda: False)
    run_knowledge(out, variants="none", **ARGS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_knowledge(out, variants="none", resume=True, **ARGS)
    assert not [w for w in caught if "was trained in" in str(w.message)]
    assert json.loads((out / "results.json").read_text())["variants"][0]["finetune"]["precision"] == "fp32"
