"""Model settings and checkpoints found wrong by an audit of the model families: each case was accepted (and
failed later with a traceback, printed negative parameter counts, or loaded another model than the one saved)
before its fix."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.models.gpt import GPT, GPTConfig


def _gpt(**changes) -> GPT:
    return GPT(GPTConfig(vocab_size=11, block_size=8, d_model=8, n_heads=2, n_layers=1, **changes))


@pytest.mark.parametrize(("changes", "message"), [
    ({"position": "relative", "position_options": {"max_distance": -1}}, "max_distance .* at least 1, got -1"),
    ({"position": "relative", "position_options": {"max_distance": 2.5}}, "'max_distance' must be an integer"),
    ({"position": "relative", "position_options": {"max_distance": "4"}}, "'max_distance' must be an integer"),
    ({"position": "t5-bias", "position_options": {"num_buckets": 0}}, "num_buckets must be at least 2"),
    ({"position": "t5-bias", "position_options": {"num_buckets": 32, "max_distance": 16}},
     "max_distance must be larger than the 16 exact distances"),
    ({"position": "sinusoidal", "position_options": {"base": 0}}, "base must be a number larger than 1"),
    ({"position": "rotary", "position_options": {"base": -5.0}}, "base must be a number larger than 1"),
    ({"position": "rotary", "position_options": {"base": "x"}}, "'base' must be a finite number"),
    ({"attention": "synthesizer-random", "attention_options": {"freeze": "no"}}, "'freeze' must be true or false"),
])
def test_option_values_are_checked_when_the_model_is_built(changes, message):
    with pytest.raises(ConfigError, match=message):
        _gpt(**changes)


def test_valid_option_values_still_build_and_run():
    for changes in ({"position": "relative", "position_options": {"max_distance": 3}},
                    {"position": "t5-bias", "position_options": {"num_buckets": 8, "max_distance": 5}},
                    {"position": "rotary", "position_options": {"base": 500}},  # an int where a float is typed
                    {"attention": "synthesizer-random", "attention_options": {"freeze": True}}):
        out = _gpt(**changes)(torch.arange(8)[None] % 11).logits
        assert torch.isfinite(out).all()
    from attnlab.modules.positions import T5RelativeBias

    with pytest.raises(ConfigError, match="at least 4 \\(bidirectional"):
        T5RelativeBias(n_heads=2, causal=False, num_buckets=3)


def test_seq2seq_special_ids_must_be_in_the_vocabularies():
    from attnlab.models.transformer import TransformerConfig

    base = dict(src_vocab_size=11, tgt_vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1,
                n_decoder_layers=1)
    for name, value in (("pad_id", -1), ("pad_id", 11), ("bos_id", 99), ("eos_id", -2)):
        with pytest.raises(ConfigError, match=f"{name} \\({value}\\) must be a token id"):
            TransformerConfig(**base, **{name: value})
    with pytest.raises(ConfigError, match="pad_id \\(9\\) must be a token id of both vocabularies"):
        TransformerConfig(**{**base, "src_vocab_size": 9, "share_embeddings": False}, pad_id=9)


def test_params_refuses_a_model_it_could_not_build(tmp_path, capsys):
    from cli_helpers import one_line_error

    from attnlab.training.checkpoint import save_checkpoint

    folder = tmp_path / "ck"
    save_checkpoint(folder, _gpt(position="relative", position_options={"max_distance": 3}))
    config = json.loads((folder / "config.json").read_text())
    config["position_options"] = {"max_distance": -3}  # it printed rows of -20 parameters
    (folder / "config.json").write_text(json.dumps(config))
    assert "max_distance (the farthest distance told apart) must be at least 1" in one_line_error(
        capsys, "params", str(folder))


def test_a_checkpoint_saved_untied_does_not_load_into_a_tied_model(tmp_path):
    from attnlab.training.checkpoint import ModelMismatch, load_model, save_checkpoint

    torch.manual_seed(0)
    untied, tied = _gpt(tie_embeddings=False), _gpt(tie_embeddings=True)
    save_checkpoint(tmp_path / "u", untied)
    save_checkpoint(tmp_path / "t", tied)
    config = json.loads((tmp_path / "u" / "config.json").read_text())
    config["tie_embeddings"] = True
    (tmp_path / "u" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelMismatch, match="'embed.token.weight' and 'lm_head.weight' are one tensor in the model"):
        load_model(tmp_path / "u")
    loaded = load_model(tmp_path / "t")  # saved tied: loads as ever
    assert torch.equal(loaded.lm_head.weight, tied.lm_head.weight)


def test_with_head_keeps_a_float64_body_exact():
    from attnlab.models.encoder import EncoderConfig, EncoderModel

    torch.manual_seed(0)
    lm = EncoderModel(EncoderConfig(vocab_size=11, d_model=8, n_heads=2, d_ff=16, n_layers=1, max_len=8)).double()
    classifier = lm.with_head("classification", n_classes=3)
    body = {k: v for k, v in lm.state_dict().items() if not k.startswith("head.")}
    new = classifier.state_dict()
    assert all(new[k].dtype == torch.float64 and torch.equal(new[k], v) for k, v in body.items())


def test_an_integer_tensor_where_a_weight_belongs_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from attnlab.training.checkpoint import ModelMismatch, load_model, save_checkpoint

    save_checkpoint(tmp_path / "ck", _gpt())
    path = tmp_path / "ck" / "model.safetensors"
    tensors = load_file(path)
    tensors["lm_head.weight" if "lm_head.weight" in tensors else "embed.token.weight"] = torch.ones(
        tensors["embed.token.weight"].shape, dtype=torch.int64)
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    save_file(tensors, path, metadata=metadata)
    with pytest.raises(ModelMismatch, match="is int64 in the checkpoint but float32 in the model"):
        load_model(tmp_path / "ck")


def test_a_checkpoint_does_not_load_into_a_model_of_other_settings_of_the_same_shapes(tmp_path, capsys):
    """Sinusoidal and ALiBi GPTs have the same weights: a resume with --set model.position=alibi trained the
    sinusoidal run's weights on as another model, silently. Training-only settings (dropout) may change."""
    from cli_helpers import one_line_error, run_cli, toml_str

    from attnlab.training.checkpoint import ModelMismatch, load_checkpoint_into, save_checkpoint

    save_checkpoint(tmp_path / "ck", _gpt(position="sinusoidal"))
    with pytest.raises(ModelMismatch, match="other settings \\(position 'sinusoidal' → 'alibi'\\)"):
        load_checkpoint_into(tmp_path / "ck", _gpt(position="alibi"))
    load_checkpoint_into(tmp_path / "ck", _gpt(position="sinusoidal", dropout=0.2))

    run = ["train", "--set", "model.preset=gpt-char-tiny", "--set", f"train.out_dir={toml_str(tmp_path / 'run')}",
           "--set", "train.progress=false", "--set", "train.eval_every=0", "--set", "train.warmup_steps=0",
           "--set", "train.precision=fp32", "--set", "train.device=cpu"]
    code, _, err = run_cli(capsys, *run, "--set", "train.steps=2", "--set", "model.position=\"sinusoidal\"")
    assert code == 0, err
    line = one_line_error(capsys, *run, "--set", "train.steps=4", "--set", "model.position=\"alibi\"", "--resume")
    assert "position 'sinusoidal' → 'alibi'" in line and "cannot resume" in line
