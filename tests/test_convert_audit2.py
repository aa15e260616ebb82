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
