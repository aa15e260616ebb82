"""Mutation-testing gaps in the converters' fixes: the embd_pdrop warning's defaults, resid_pdrop's bound, and
the sharded-folder reader's index checks."""

import json
import warnings

import pytest
import torch
from safetensors.torch import save_file

from attnlab.convert import gpt2_config
from attnlab.convert.hf_folder import read_hf_folder
from attnlab.errors import CheckpointError

GPT2 = dict(vocab_size=97, n_positions=48, n_embd=32, n_layer=1, n_head=4)


def test_gpt2_default_dropouts_do_not_warn():
    """Absent embd_pdrop and resid_pdrop are both HF's 0.1: no 'differs' warning for a plain config."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gpt2_config(GPT2).dropout == 0.1
        assert gpt2_config({**GPT2, "resid_pdrop": 0.1}).dropout == 0.1


def test_gpt2_embd_pdrop_warning_points_at_the_caller():
    with pytest.warns(UserWarning, match="embd_pdrop") as record:
        gpt2_config({**GPT2, "resid_pdrop": 0.05, "embd_pdrop": 0.3})
    assert record[0].filename == __file__


def test_gpt2_resid_pdrop_of_one_is_refused_naming_it():
    with pytest.raises(CheckpointError, match="resid_pdrop is 1.0; it must be a number at least 0 and below 1"):
        gpt2_config({**GPT2, "resid_pdrop": 1.0})


def _sharded(folder, shards: dict[str, dict], weight_map: dict):
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text("{}")
    for name, state in shards.items():
        save_file(state, str(folder / name), metadata={"format": "pt"})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_a_shard_weight_is_taken_only_from_the_file_the_index_names(tmp_path):
    """A stale copy in another shard, or a tensor the index does not list, is not read."""
    a, b, stale = torch.zeros(2), torch.ones(2), torch.full((2,), 7.0)
    _sharded(tmp_path, {"model-00001-of-00002.safetensors": {"a": a, "b": b},
                        "model-00002-of-00002.safetensors": {"b": stale, "c": a.clone(), "extra": stale.clone()}},
             {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
              "c": "model-00002-of-00002.safetensors"})
    _, state = read_hf_folder(tmp_path, "GPT-2")
    assert sorted(state) == ["a", "b", "c"] and torch.equal(state["b"], b)


def test_shards_lacking_a_listed_weight_are_refused_naming_the_index(tmp_path):
    listed = {k: "model-00001-of-00001.safetensors" for k in ["a", "m1", "m2", "m3", "m4", "m5"]}
    _sharded(tmp_path, {"model-00001-of-00001.safetensors": {"a": torch.zeros(1)}}, listed)
    with pytest.raises(CheckpointError) as e:
        read_hf_folder(tmp_path, "GPT-2")
    assert str(e.value) == (f"{tmp_path}: the shards lack m1, m2, m3, m4 ..., which model.safetensors.index.json "
                            "lists")  # not re-wrapped as "cannot read GPT-2 weights ..."


@pytest.mark.parametrize("weight_map", [{}, {"a": ""}])
def test_an_empty_weight_map_or_file_name_is_no_valid_index(tmp_path, weight_map):
    _sharded(tmp_path, {}, weight_map)
    with pytest.raises(CheckpointError, match="no valid weight_map"):
        read_hf_folder(tmp_path, "GPT-2")


def test_a_sharded_pytorch_bin_folder_gets_the_conversion_hint(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin.index.json").write_text('{"weight_map": {}}')
    with pytest.raises(CheckpointError, match=r"no model.safetensors \(pytorch_model.bin is not read"):
        read_hf_folder(tmp_path, "GPT-2")
