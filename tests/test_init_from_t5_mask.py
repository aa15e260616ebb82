"""A T5-bias model fine-tuned under another mask: its buckets are laid out for the mask it was trained with (a
causal model spends them all on the past), so another mask reads the pretrained table's rows for other distances,
silently. The change is refused; keeping the mask, or any other position scheme, is not."""

from __future__ import annotations

import pytest
from cli_helpers import toml_str as _q
from test_init_from import TINY, _classify, files  # noqa: F401  (a fixture)

from attnlab.errors import ConfigError
from attnlab.training.recipe import load_run_config, prepare, train_run


def _encoder_lm(files, position):  # noqa: F811
    out = files / f"encoder-lm-{position}"
    if not out.exists():
        train_run(load_run_config(None, [
            "model.family=encoder", "model.head=lm", f"model.position={position}", "model.d_model=16",
            "model.n_layers=1", "model.n_heads=2", "model.d_ff=32", "data.tokenizer=word", "data.block_size=8",
            f"data.path={_q(files / 'docs.txt')}", f"train.out_dir={_q(out)}", *TINY]))
    return out


def test_a_t5_bias_model_keeps_its_mask(files):  # noqa: F811
    source = _encoder_lm(files, "t5-bias")
    with pytest.raises(ConfigError, match="model.causal = False, but the model in model.init_from has T5 bias "
                                          "buckets learned under causal = True"):
        prepare(_classify(files, source, "model.causal=false"))
    assert prepare(_classify(files, source)).model.config.causal  # kept, as init_from keeps an encoder's mask
    assert prepare(_classify(files, source, "model.causal=true")).model.config.causal


def test_other_schemes_may_change_the_mask(files):  # noqa: F811
    source = _encoder_lm(files, "alibi")
    assert not prepare(_classify(files, source, "model.causal=false")).model.config.causal


def test_with_head_keeps_a_t5_bias_models_mask():
    from attnlab.models.encoder import EncoderConfig, EncoderModel

    lm = EncoderModel(EncoderConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1, d_ff=32, head="lm",
                                    position="t5-bias"))
    with pytest.raises(ConfigError, match="causal = False, but this model's T5 bias buckets were learned under "
                                          "causal = True"):
        lm.with_head("classification", causal=False)
    assert lm.with_head("classification").config.is_causal
    alibi = EncoderModel(EncoderConfig(vocab_size=20, d_model=16, n_heads=2, n_layers=1, d_ff=32, head="lm",
                                       position="alibi"))
    assert not alibi.with_head("classification", causal=False).config.is_causal
