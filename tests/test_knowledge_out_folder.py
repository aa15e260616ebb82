"""What the knowledge experiment cannot do is refused before it replaces an earlier run or trains a phase: a setting
the trainer refuses (named as the experiment's setting it comes from) and an entry of the user's where an output
goes (both had been found only when a row reached them, after the earlier run was deleted or phases trained)."""

from __future__ import annotations

import re

import pytest
from test_knowledge_experiment import TINY

from attnlab.errors import ConfigError
from attnlab.experiments.knowledge import run_knowledge

ARGS = dict(device="cpu", progress=False)


@pytest.mark.parametrize("setting, named", [
    ({"decay_epochs": 1e300}, r"from decay_epochs \(train.decay_steps: an integer of 3\d\d digits does not fit "),
    ({"decay_epochs": 1e308}, r"from decay_epochs \(train.decay_steps: 9223372036854775808 does not fit"),  # inf
    ({"finetune_epochs_scratch": 1e308}, r"from finetune_epochs_scratch and finetune_batch \(train.steps: "),
    ({"pretrain_epochs": 1e300}, "pretraining phase of row dot gets a setting the trainer refuses from "
                                 "pretrain_epochs and pretrain_batch"),
])
def test_a_phase_setting_the_trainer_refuses_is_refused_before_the_earlier_run_is_replaced(tmp_path, setting, named):
    out = tmp_path / "out"
    run_knowledge(out, variants="none", overrides=TINY, echo=lambda *_: None, **ARGS)
    before = sorted(p.name for p in out.iterdir())
    said = []
    with pytest.raises(ConfigError) as e:
        run_knowledge(out, variants="none,dot", overrides={**TINY, **setting}, echo=said.append, **ARGS)
    assert re.search(named, str(e.value)) and "\n" not in str(e.value) and str(e.value).startswith("--set: ")
    assert sorted(p.name for p in out.iterdir()) == before and (out / "finetune-none" / "checkpoint").is_dir()
    assert not any("fine-tune" in line or "pretrain " in line for line in said)  # no phase started


@pytest.mark.parametrize("entry, folder", [("pretrain-dot", False), ("results.json", True), ("curves.png", True),
                                           ("predictions/dot.tsv", True), ("predictions", False)])
def test_an_entry_in_an_outputs_way_is_refused_before_any_phase_trains(tmp_path, entry, folder):
    out = tmp_path / "out"
    path = out / entry
    path.parent.mkdir(parents=True)
    if folder:
        path.mkdir()
    else:
        path.write_text("mine\n", encoding="utf-8")
    said = []
    for resume in (False, True):
        with pytest.raises(ConfigError, match=f"'{path}' is a {'folder' if folder else 'file'}, where this run "
                                              "writes its"):
            run_knowledge(out, variants="none,dot", overrides=TINY, echo=said.append, resume=resume, **ARGS)
    assert not list(out.glob("finetune-*")) and not any("fine-tune" in line for line in said)
    assert path.is_dir() if folder else path.read_text(encoding="utf-8") == "mine\n"


def test_ctrl_c_between_phases_says_how_to_go_on(tmp_path, capsys, monkeypatch):
    """Ctrl-C while the questions were answered ended with a bare "attnlab: interrupted", though --resume goes on
    from the phases trained."""
    from cli_helpers import run_cli

    import attnlab.experiments.knowledge as knowledge

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(knowledge, "answer_questions", stopped)
    out = tmp_path / "out"
    sets = [arg for key, value in {**TINY, "n_people": 20}.items() for arg in ("--set", f"{key}={value}")]
    code, _, err = run_cli(capsys, "run", "knowledge", "--variants", "none", "--quiet", "--device", "cpu", "-o",
                           str(out), *sets)
    assert code == 130
    assert err.strip().splitlines()[-1] == (f"attnlab: interrupted; what was trained is kept in {out}: to go on, run "
                                            "the same command with --resume")
    assert (out / "finetune-none" / "checkpoint").is_dir()
    monkeypatch.undo()
    code, out_text, err = run_cli(capsys, "run", "knowledge", "--variants", "none", "--quiet", "--device", "cpu",
                                  "-o", str(out), "--resume", *sets)
    assert code == 0 and "already done" in out_text, err
