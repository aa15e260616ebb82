"""GPT-2 conversions refused for what they are: a config.json counting fewer layers than the weights hold, and
a decoder with cross-attention, had been refused as "unknown keys in the GPT-2 checkpoint: h.1.attn..." alone."""

from __future__ import annotations

import pytest

from attnlab.convert.gpt2 import gpt2_from_hf
from attnlab.errors import CheckpointError

transformers = pytest.importorskip("transformers")


def _gpt2(**options):
    config = transformers.GPT2Config(vocab_size=61, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                     bos_token_id=0, eos_token_id=0, **options)
    return transformers.GPT2LMHeadModel(config).state_dict(), config.to_dict()


def test_a_config_with_fewer_layers_than_the_weights_is_named():
    state, config = _gpt2()
    with pytest.raises(CheckpointError, match=r"config.json: n_layer 1, but the weights have layers up to h.1; give "
                                              r"the config.json saved with these weights"):
        gpt2_from_hf(state, {**config, "n_layer": 1})
    gpt2_from_hf(state, config)


def test_a_layer_key_numbered_by_a_digit_that_is_not_ascii_is_an_unknown_key():
    # "h.².attn..." passed str.isdigit and failed int() with a traceback (stop-40 review).
    state, config = _gpt2()
    state["transformer.h.².attn.c_attn.weight"] = state["transformer.h.0.attn.c_attn.weight"]
    with pytest.raises(CheckpointError, match=r"unknown keys in the GPT-2 checkpoint: h.².attn.c_attn.weight"):
        gpt2_from_hf(state, config)


def test_cross_attention_is_named_as_unsupported():
    state, config = _gpt2(add_cross_attention=True)
    with pytest.raises(CheckpointError, match="add_cross_attention true .* is not supported"):
        gpt2_from_hf(state, config)


def test_a_hugging_face_tokenizer_file_is_named_as_such(tmp_path):
    from tokenizers import Tokenizer, models

    from attnlab.data.tokenizers import load_tokenizer
    from attnlab.errors import DataError

    path = tmp_path / "tokenizer.json"
    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(path))
    with pytest.raises(DataError, match="is a Hugging Face tokenizers file, not attnlab's"):  # "unknown type None"
        load_tokenizer(path)


def test_a_transformers_config_object_and_a_config_file_for_the_folder_are_named(tmp_path):
    """model.config (an object, not config.json's dict) failed in transformers' words ("'GPT2Config' object has no
    attribute 'get'"); config.json given for its folder was said to have "no config.json"."""
    from attnlab.convert import bert_config_from_hf, gpt_from_hf, load_hf_gpt2

    state, config = _gpt2()
    with pytest.raises(CheckpointError, match=r"the GPT-2 config must be a dict .*got GPT2Config: give "
                                              r"hf_model.config.to_dict\(\)"):
        gpt_from_hf(state, transformers.GPT2Config(**config))
    with pytest.raises(CheckpointError, match="the BERT config must be a dict .*got BertConfig"):
        bert_config_from_hf(transformers.BertConfig())
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(CheckpointError, match="config.json is a file; give the GPT-2 model's folder"):
        load_hf_gpt2(tmp_path / "config.json")
    assert gpt_from_hf(state, config).config.n_layers == 2  # the dict, as before
