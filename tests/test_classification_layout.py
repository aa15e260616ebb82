"""A classifier reads `[CLS] text [SEP]`: the layout BERT was pre-trained on (every segment ends in [SEP]) and the
one HF's tokenizers give a single text. Runs trained before the change read `[CLS] text`; resuming or evaluating
them keeps that layout, which their checkpoints say by not recording one."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from cli_helpers import run_cli, toml_str

from attnlab.inference.runs import load_run
from attnlab.training.recipe import load_run_config, prepare, train_run

TINY = ["train.progress=false", "train.precision=fp32", "train.device=cpu"]
TEXTS = [("great movie great", "pos"), ("awful movie awful", "neg"), ("fine film", "pos"), ("bad bad film", "neg")]


def _overrides(root, out) -> list[str]:
    data = toml_str(root / "train.tsv")
    return ["model.family=encoder", "model.d_model=16", "model.n_heads=2", "model.d_ff=16", "model.n_layers=1",
            "data.task=classification", "data.tokenizer=word", f"data.path={data}", f"data.eval_path={data}",
            "train.steps=4", "train.batch_size=4", "train.eval_every=0", "train.lr=3e-3",
            f"train.out_dir={toml_str(out)}", *TINY]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    root = tmp_path_factory.mktemp("layout")
    rows = ["sentence\tlabel"] + [f"{text}\t{label}" for text, label in TEXTS * 3]
    (root / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    train_run(load_run_config(None, _overrides(root, root / "run")))
    return root


def _as_before_the_change(checkpoint) -> None:
    """Rewrite a checkpoint's trainer state as runs wrote it before the layout was recorded."""
    state_file = checkpoint / "trainer_state.json"
    state = json.loads(state_file.read_text(encoding="utf-8"))
    del state["extra_state"]["classification_sep"]
    state_file.write_text(json.dumps(state), encoding="utf-8")


def _loss(folder, sep: bool) -> float:
    """The mean cross-entropy of TEXTS, each text scored alone as `[CLS] text [SEP]` or `[CLS] text`."""
    run = load_run(folder, device="cpu")
    tok, labels = run.tokenizer, run.data["labels"]
    losses = []
    with torch.no_grad():
        for text, label in TEXTS:
            ids = [tok.cls_id, *tok.encode(text), *([tok.sep_id] if sep else [])]
            logits = run.model(torch.tensor([ids])).logits
            losses.append(F.cross_entropy(logits, torch.tensor([labels.index(label)])).item())
    return sum(losses) / len(losses)


def _evaluated(capsys, folder, data) -> float:
    code, out, err = run_cli(capsys, "evaluate", str(folder), "-d", str(data), "--json", "--device", "cpu")
    assert code == 0, err
    return json.loads(out)["loss"]


def test_training_reads_cls_text_sep_and_records_it(classifier):
    run = load_run_config(None, _overrides(classifier, classifier / "unused"))
    prep = prepare(run)
    tok = prep.tokenizer
    assert tok.cls_id is not None and tok.sep_id is not None
    assert all(ids[0] == tok.cls_id and ids[-1] == tok.sep_id and tok.sep_id not in ids[1:-1]
               for ids in prep.train_source.examples)
    assert prep.layout == {"classification_sep": True}
    state = json.loads((classifier / "run" / "checkpoint" / "trainer_state.json").read_text(encoding="utf-8"))
    assert state["extra_state"]["classification_sep"] is True


def test_evaluate_scores_texts_as_the_run_was_trained(capsys, tmp_path, classifier):
    data = tmp_path / "eval.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{t}\t{lab}\n" for t, lab in TEXTS), encoding="utf-8")
    with_sep, without = _loss(classifier / "run", sep=True), _loss(classifier / "run", sep=False)
    assert abs(with_sep - without) > 1e-4  # the two layouts score differently: the test can tell them apart
    assert _evaluated(capsys, classifier / "run", data) == pytest.approx(with_sep, abs=1e-5)
    # A checkpoint with no recorded data settings (weights converted from HF and saved with a tokenizer) reads
    # texts as HF's tokenizers encode them.
    bare = tmp_path / "bare"
    shutil.copytree(classifier / "run" / "checkpoint", bare)
    (bare / "trainer_state.json").unlink()
    assert _evaluated(capsys, bare, data) == pytest.approx(with_sep, abs=1e-5)
    # A run folder whose checkpoint lost its trainer state: run.json says the layout (the data settings it gives
    # have a task, which alone would mean a run from before the change).
    stateless = tmp_path / "stateless"
    shutil.copytree(classifier / "run", stateless)
    (stateless / "checkpoint" / "trainer_state.json").unlink()
    assert json.loads((stateless / "run.json").read_text(encoding="utf-8"))["classification_sep"] is True
    for folder in (stateless, stateless / "checkpoint"):
        assert _evaluated(capsys, folder, data) == pytest.approx(with_sep, abs=1e-5)
    # A run from before the change is scored as it was trained, without [SEP].
    old = tmp_path / "old"
    shutil.copytree(classifier / "run", old)
    _as_before_the_change(old / "checkpoint")
    assert _evaluated(capsys, old, data) == pytest.approx(without, abs=1e-5)


def test_resuming_a_run_from_before_the_change_keeps_its_layout(tmp_path, classifier):
    old = tmp_path / "old"
    shutil.copytree(classifier / "run", old)
    run = load_run_config(None, _overrides(classifier, old))
    assert prepare(run, tokenizer_from=old / "checkpoint").layout == {"classification_sep": True}
    _as_before_the_change(old / "checkpoint")
    prep = prepare(run, tokenizer_from=old / "checkpoint")
    assert prep.layout == {"classification_sep": False}
    assert all(ids[-1] != prep.tokenizer.sep_id for ids in prep.train_source.examples)
    train_run(load_run_config(None, [*_overrides(classifier, old), "train.steps=6"]), resume=True)
    state = json.loads((old / "checkpoint" / "trainer_state.json").read_text(encoding="utf-8"))
    assert state["step"] == 6 and state["extra_state"]["classification_sep"] is False
    assert json.loads((old / "run.json").read_text(encoding="utf-8"))["classification_sep"] is False
