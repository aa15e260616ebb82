"""Parity with HF transformers' GPT-2: converted weights give the same logits and greedy text, from a state
dict or from a folder saved by `save_pretrained`; what the converter cannot reproduce is refused."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnlab.convert import gpt2_from_hf, gpt_from_hf, load_hf_gpt2  # noqa: E402
from attnlab.errors import CheckpointError  # noqa: E402
from attnlab.inference.generate import generate  # noqa: E402


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=48, n_embd=32, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    ours = gpt_from_hf(hf.state_dict(), cfg.to_dict()).eval()
    return hf, ours


def test_logits_match(pair):
    hf, ours = pair
    ids = torch.randint(0, 97, (3, 20))
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_logits_match_with_padding_mask(pair):
    hf, ours = pair
    ids = torch.randint(0, 97, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0  # right padding
    with torch.no_grad():
        expected = hf(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[0], expected[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1, :8], expected[1, :8], atol=1e-4, rtol=1e-4)


def test_hidden_states_match(pair):
    """HF's last hidden state is taken after the final norm (ln_f), the states the LM head reads."""
    hf, ours = pair
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        expected = hf(ids, output_hidden_states=True).hidden_states
        got = ours(ids, output_hidden_states=True)
    assert len(got.hidden_states) == len(expected) == 3
    for mine, theirs in zip(got.hidden_states, expected):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.lm_head(got.hidden_states[-1]), got.logits)


def test_greedy_generation_identical(pair):
    hf, ours = pair
    prompt = torch.tensor([[5, 17, 42, 8]])
    with torch.no_grad():
        expected = hf.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)[0, 4:].tolist()
    assert generate(ours, prompt, 20, greedy=True) == [expected]


def test_loss_matches(pair):
    hf, ours = pair
    ids = torch.randint(0, 97, (2, 16))
    labels = ids[:, 1:]
    with torch.no_grad():
        expected = hf(ids, labels=ids).loss  # HF shifts internally
        got = ours(ids[:, :-1], labels=labels).loss
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tied", [True, False])
def test_load_hf_gpt2_from_a_saved_folder(tmp_path, tied):
    torch.manual_seed(1)
    cfg = transformers.GPT2Config(vocab_size=61, n_positions=32, n_embd=24, n_layer=2, n_head=3, n_inner=40,
                                  activation_function="gelu", tie_word_embeddings=tied)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(tmp_path)  # safetensors; a tied output weight is not stored
    ours = load_hf_gpt2(tmp_path)
    assert not ours.training and ours.config.d_ff == 40 and ours.config.activation == "gelu"
    assert (ours.lm_head.weight is ours.embed.token.weight) == tied
    ids = torch.randint(0, 61, (2, 15), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("activation", ["gelu_fast", "silu", "swish", "relu"])
def test_every_activation_the_bert_converter_maps_converts_gpt2_too(activation):
    # The GPT-2 converter had a table of its own without gelu_fast, silu and swish (stop-44 BERT audit).
    torch.manual_seed(2)
    cfg = transformers.GPT2Config(vocab_size=61, n_positions=16, n_embd=24, n_layer=1, n_head=3,
                                  activation_function=activation)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    ours = gpt_from_hf(hf.state_dict(), cfg.to_dict()).eval()
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-4, rtol=1e-4)


def test_converter_errors(tmp_path, pair):
    hf, _ = pair
    state, config = hf.state_dict(), hf.config.to_dict()
    with pytest.raises(CheckpointError, match="unknown keys.*h.0.attn.adapter"):
        gpt2_from_hf({**state, "transformer.h.0.attn.adapter.weight": torch.zeros(1)}, config)
    with pytest.raises(CheckpointError, match="lacks: h.1.mlp.c_fc.bias"):
        gpt2_from_hf({k: v for k, v in state.items() if k != "transformer.h.1.mlp.c_fc.bias"}, config)
    with pytest.raises(CheckpointError, match="lacks: lm_head.weight"):  # untied, without its output layer
        untied = {**config, "tie_word_embeddings": False}
        gpt2_from_hf({k: v for k, v in state.items() if k != "lm_head.weight"}, untied)
    with pytest.raises(CheckpointError, match="scale_attn_by_inverse_layer_idx"):
        gpt2_from_hf(state, {**config, "scale_attn_by_inverse_layer_idx": True})
    with pytest.raises(CheckpointError, match="activation 'quick_gelu' is not supported; known: gelu, gelu_new"):
        gpt2_from_hf(state, {**config, "activation_function": "quick_gelu"})
    with pytest.raises(CheckpointError, match="lacks n_embd"):
        gpt2_from_hf(state, {k: v for k, v in config.items() if k != "n_embd"})
    with pytest.raises(CheckpointError, match="not 'gpt2'"):
        gpt2_from_hf(state, {**config, "model_type": "gpt_neo"})
    with pytest.raises(CheckpointError, match="no config.json"):
        load_hf_gpt2(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match="pytorch_model.bin is not read"):
        load_hf_gpt2(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="cannot read GPT-2 weights"):
        load_hf_gpt2(tmp_path)


@pytest.mark.parametrize("key, value, message", [
    ("n_embd", "32", 'n_embd is "32"; it must be an integer'),
    ("n_embd", 32.0, "n_embd is 32.0; it must be an integer"),
    ("n_layer", False, "n_layer is false; it must be an integer"),
    ("n_inner", "128", 'n_inner is "128"; it must be an integer'),
    ("layer_norm_epsilon", "1e-5", 'layer_norm_epsilon is "1e-5"; it must be a number'),
    ("tie_word_embeddings", "false", 'tie_word_embeddings is "false"; it must be true or false'),
    ("n_head", 5, "n_embd 32 is not divisible by n_head 5"),
])
def test_malformed_config_values_are_named(pair, key, value, message):
    hf, _ = pair
    with pytest.raises(CheckpointError, match="^my/config.json: " + message):
        gpt2_from_hf(hf.state_dict(), {**hf.config.to_dict(), key: value}, source="my/config.json")


@pytest.mark.parametrize("key, value, weight, shapes", [
    ("vocab_size", 98, "transformer.wte.weight", r"\(98, 32\); the weights say \(97, 32\)"),
    ("n_positions", 64, "transformer.wpe.weight", r"\(64, 32\); the weights say \(48, 32\)"),
    ("n_inner", 64, "transformer.h.0.mlp.c_fc.weight", r"\(32, 64\); the weights say \(32, 128\)"),
    ("n_embd", 36, "transformer.wte.weight", r"\(97, 36\); the weights say \(97, 32\)"),
])
def test_config_that_does_not_fit_the_weights_names_the_weight(pair, key, value, weight, shapes):
    """It used to fail in load_state_dict with a many-line RuntimeError (or in the Q/K/V split, for n_embd)."""
    hf, _ = pair
    with pytest.raises(CheckpointError, match=f"^{weight}: the config says {shapes}: config.json does not belong"):
        gpt_from_hf(hf.state_dict(), {**hf.config.to_dict(), key: value})


def test_gpt2_loader_on_a_bert_folder_names_the_model_type(tmp_path):
    """The model type is checked before the keys: a BERT config is not 'a GPT-2 config lacking n_positions'."""
    transformers.BertModel(transformers.BertConfig(vocab_size=60, hidden_size=16, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=24,
                                                   max_position_embeddings=32)).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"config.json: model_type is 'bert', not 'gpt2'"):
        load_hf_gpt2(tmp_path)
