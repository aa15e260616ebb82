"""Checkpoint folders: round trip, tied weights, atomic writes, and clear errors for bad checkpoints."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from training_helpers import TinyLM, TinyLMConfig, ToySource, tiny_model

import attnlab.training.checkpoint as ckpt
from attnlab.config import Config
from attnlab.errors import CheckpointError
from attnlab.models.registry import FAMILIES, register_family
from attnlab.training import (
    TrainerConfig,
    build_optimizer,
    load_checkpoint_into,
    load_model,
    read_trainer_state,
    save_checkpoint,
)


@dataclass
class OtherConfig(Config):
    width: int = 3


class OtherModel(nn.Module):
    def __init__(self, config: OtherConfig):
        super().__init__()
        self.config = config
        self.proj = nn.Linear(config.width, config.width)


if "test-other" not in FAMILIES:
    register_family("test-other", OtherConfig, OtherModel)


class FakeTokenizer:
    def save(self, path):
        Path(path).write_text(json.dumps({"kind": "fake"}))


def trained(tie: bool = False, seed: int = 0):
    """A tiny model and an AdamW optimizer after one step (so the optimizer has state)."""
    model = tiny_model(seed=seed, tie=tie)
    optimizer = build_optimizer(model, TrainerConfig(), torch.device("cpu"))
    model(**ToySource().batch(seed)).loss.backward()
    optimizer.step()
    return model, optimizer


def assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_round_trip_with_tied_weights_and_optimizer(tmp_path):
    model, optimizer = trained(tie=True)
    folder = save_checkpoint(tmp_path / "checkpoint", model, optimizer, {"step": 7}, FakeTokenizer())
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "model.safetensors", "optimizer.safetensors", "tokenizer.json", "trainer_state.json"]
    assert json.loads((folder / "config.json").read_text())["family"] == "test-tiny-lm"

    loaded = load_model(tmp_path)  # a run folder: finds checkpoint/
    assert isinstance(loaded, TinyLM) and not loaded.training
    assert loaded.head.weight is loaded.embed.weight  # still tied after loading
    assert_same_weights(model, loaded)

    fresh = tiny_model(seed=5, tie=True)
    fresh_opt = build_optimizer(fresh, TrainerConfig(), torch.device("cpu"))
    state = load_checkpoint_into(folder, fresh, fresh_opt)
    assert state["step"] == 7
    assert_same_weights(model, fresh)
    saved, restored = optimizer.state_dict(), fresh_opt.state_dict()
    assert saved["param_groups"] == restored["param_groups"]
    for i, values in saved["state"].items():
        for name, value in values.items():
            assert torch.equal(value, restored["state"][i][name]), (i, name)


def test_load_model_prefers_checkpoint_then_best(tmp_path):
    best, _ = trained(seed=1)
    save_checkpoint(tmp_path / "best", best)
    assert_same_weights(load_model(tmp_path), best)
    latest, _ = trained(seed=2)
    save_checkpoint(tmp_path / "checkpoint", latest)
    assert_same_weights(load_model(tmp_path), latest)
    assert_same_weights(load_model(tmp_path / "best"), best)


def test_rng_states_round_trip_through_json():
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = json.loads(json.dumps(ckpt.capture_rng()))
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    ckpt.restore_rng(state)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


def test_gpu_random_states_for_another_gpu_count_are_left_quietly(monkeypatch):
    """A checkpoint from a machine with 2 GPUs resumed on one with 1: which state is whose is unknown, so none
    is restored. No warning: the trainer seeds every generator at each step, so training never draws from them
    (it said the resumed dropout would differ, which it does not)."""
    state = json.loads(json.dumps(ckpt.capture_rng()))
    state["cuda"] = [state["torch"]] * 2  # two GPUs' states (any valid bytes: they must not be set)
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    for count in (1, 2):
        monkeypatch.setattr(torch.cuda, "device_count", lambda count=count: count)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ckpt.restore_rng(state)
    assert len(restored) == 1 and len(restored[0]) == 2


# ----------------------------------------------------------------------------------------------------
# Atomic writes


def test_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    old, old_opt = trained(seed=1)
    folder = save_checkpoint(tmp_path / "checkpoint", old, old_opt, {"step": 1})
    new, new_opt = trained(seed=2)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "_write_json", crash)  # model.safetensors is written, then the crash
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(folder, new, new_opt, {"step": 2})
    monkeypatch.undo()
    assert_same_weights(load_model(tmp_path), old)
    assert read_trainer_state(tmp_path)["step"] == 1


def test_crash_between_the_renames_keeps_a_loadable_checkpoint(tmp_path, monkeypatch):
    old, _ = trained(seed=1)
    folder = save_checkpoint(tmp_path / "checkpoint", old, trainer_state={"step": 1})
    new, _ = trained(seed=2)
    real_rename = os.rename
    calls = []

    def rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the current folder has been moved aside; the new one is not in place yet
            raise KeyboardInterrupt
        real_rename(src, dst)

    monkeypatch.setattr(ckpt.os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(folder, new, trainer_state={"step": 2})
    monkeypatch.undo()
    assert not folder.exists()
    assert_same_weights(load_model(tmp_path), old)  # falls back to .checkpoint.old
    assert read_trainer_state(folder)["step"] == 1

    save_checkpoint(folder, new, trainer_state={"step": 2})  # the next save recovers and cleans up
    assert_same_weights(load_model(tmp_path), new)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


# ----------------------------------------------------------------------------------------------------
# Bad checkpoints


@contextlib.contextmanager
def one_line_error(match: str):
    """Expect a CheckpointError matching `match` whose message is one line."""
    with pytest.raises(CheckpointError, match=match) as info:
        yield
    assert "\n" not in str(info.value)


def test_missing_folder_and_files(tmp_path):
    with one_line_error("does not exist"):
        load_model(tmp_path / "nowhere")
    with one_line_error("no model.safetensors"):
        load_model(tmp_path)
    model, _ = trained()
    folder = save_checkpoint(tmp_path / "checkpoint", model)
    (folder / "config.json").unlink()
    with one_line_error("config.json is missing"):
        load_model(folder)
    with one_line_error("optimizer.safetensors is missing"):
        save_checkpoint(folder, model)
        load_checkpoint_into(folder, model, build_optimizer(model, TrainerConfig(), torch.device("cpu")))


def test_corrupt_files(tmp_path):
    model, optimizer = trained()
    folder = save_checkpoint(tmp_path / "c", model, optimizer, {"step": 1})
    (folder / "config.json").write_text("{not json")
    with one_line_error(r"config.json is corrupt \(Expecting"):
        load_model(folder)
    folder = save_checkpoint(tmp_path / "c", model, optimizer, {"step": 1})
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(b"\xff" * 8 + data[8:])
    with one_line_error("model.safetensors is corrupt or not a safetensors file"):
        load_model(folder)
    (folder / "model.safetensors").write_bytes(data[:-4])  # truncated
    with one_line_error("model.safetensors is corrupt"):
        load_model(folder)


def test_checkpoint_of_another_model(tmp_path):
    model, _ = trained()
    save_checkpoint(tmp_path / "c", model)
    wider = TinyLM(TinyLMConfig(d_model=12))
    with one_line_error(re.escape("holds a model with other settings (d_model 8 → 12)")):  # named by its config
        load_checkpoint_into(tmp_path / "c", wider)
    config = json.loads((tmp_path / "c" / "config.json").read_text())  # a config.json that does not say
    (tmp_path / "c" / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "d_model"}))
    with one_line_error(re.escape("weight 'embed.weight' has shape (13, 8) in the checkpoint but (13, 12)")):
        load_checkpoint_into(tmp_path / "c", wider)
    with one_line_error("holds a 'test-tiny-lm' model but the model is 'test-other'"):
        load_checkpoint_into(tmp_path / "c", OtherModel(OtherConfig()))
    # a config.json claiming the right family over weights of another model: the first missing weight
    save_checkpoint(tmp_path / "d", OtherModel(OtherConfig()))
    (tmp_path / "d" / "config.json").write_text(json.dumps({"family": "test-tiny-lm"}))
    with one_line_error("has no weight 'embed.weight', which the model needs"):
        load_checkpoint_into(tmp_path / "d", model)


def test_messages_are_one_line(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "model.safetensors").write_text("nonsense\nmore nonsense")
    with pytest.raises(CheckpointError) as info:
        load_model(tmp_path / "c")
    assert "\n" not in str(info.value)


def test_attnlab_never_unpickles():
    # the whole package, not training/ alone: a converter or a data reader reading a pickle is as unsafe
    source = Path(ckpt.__file__).parents[1]
    files = list(source.rglob("*.py"))
    assert len(files) > 30 and source / "convert" / "to_run.py" in files
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"torch\.load\s*\(|import pickle|pickle\.loads?\(|allow_pickle\s*=\s*True|"
                             r"import dill|joblib\.load", text), path


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads the process's mappings (Linux)")
def test_loaded_optimizer_state_does_not_stay_mapped_onto_the_checkpoint(tmp_path):
    """safetensors maps the file, and the optimizer kept its moments as loaded: mapped onto optimizer.safetensors
    for the rest of a resumed run, which Windows refuses to rename or delete at the next save."""
    import gc

    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 13, (2, 6))
    model(ids, labels=ids).loss.backward()
    optimizer.step()
    folder = tmp_path / "checkpoint"
    ckpt.save_checkpoint(folder, model, optimizer)
    again = tiny_model()
    loaded = torch.optim.AdamW(again.parameters(), lr=1e-3)
    ckpt.load_checkpoint_into(folder, again, loaded)
    gc.collect()
    mapped = [line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if str(folder) in line]
    assert mapped == []
    for saved, state in zip(optimizer.state.values(), loaded.state.values()):
        assert torch.equal(saved["exp_avg"], state["exp_avg"])
