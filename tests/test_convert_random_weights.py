"""HF checkpoints with random (not freshly initialised) biases and norms, TF-style LayerNorm names, and settings
read from the config: a swapped bias, an ignored epsilon or activation would pass the plain parity tests."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnlab.convert import gpt_from_hf  # noqa: E402
from attnlab.convert.bert import bert_config_from_hf, bert_from_hf  # noqa: E402
from attnlab.convert.gpt2 import gpt2_config  # noqa: E402
from attnlab.models.bert import BertModel  # noqa: E402


def _randomise(model):
    """Fresh HF models have zero biases and unit norms: a swapped bias or gain would go unseen."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def test_gpt2_logits_match_with_random_biases_and_norms():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=48, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-2)
    hf = _randomise(transformers.GPT2LMHeadModel(cfg))
    ours = gpt_from_hf(hf.state_dict(), cfg.to_dict())
    ids = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-4, rtol=1e-4)


def test_gpt2_settings_come_from_the_config():
    base = dict(vocab_size=97, n_positions=48, n_embd=32, n_layer=2, n_head=4)
    assert gpt2_config(base).activation == "gelu-tanh"  # HF's default gelu_new is the tanh approximation
    assert gpt2_config({**base, "layer_norm_epsilon": 1e-3}).layer_norm_eps == 1e-3


def test_bert_tf_style_layernorm_names_load_as_weight_and_bias():
    torch.manual_seed(0)
    hf = _randomise(transformers.BertModel(transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=64, layer_norm_eps=1e-3)))
    tf_names = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
                for k, v in hf.state_dict().items()}
    _, ours = _converted(tf_names, hf)
    ids = torch.randint(1, 99, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).last_hidden_state, atol=1e-4, rtol=0)


def test_bert_settings_come_from_the_config():
    base = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    config = bert_config_from_hf({**base, "pad_token_id": 3, "layer_norm_eps": 1e-6, "type_vocab_size": 1})
    assert (config.pad_id, config.layer_norm_eps, config.type_vocab_size) == (3, 1e-6, 1)


def _converted(state: dict, hf) -> tuple:
    """Our BERT (config, model in eval mode) from a state dict in HF's names and the HF model's config."""
    config, ours_state = bert_from_hf(state, hf.config.to_dict())
    ours = BertModel(config)
    ours.load_state_dict(ours_state)
    return config, ours.eval()


def _tiny_bert_config(**changes):
    return transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                   intermediate_size=37, max_position_embeddings=64, **changes)


def test_bert_untied_mlm_decoder_keeps_its_own_weights():
    """tie_word_embeddings = false: the MLM decoder is its own matrix. A converter that ignored the setting
    would tie it to the token embeddings, and one of the two loaded matrices would overwrite the other."""
    torch.manual_seed(0)
    hf = _randomise(transformers.BertForPreTraining(_tiny_bert_config(tie_word_embeddings=False)))
    assert not torch.equal(hf.cls.predictions.decoder.weight, hf.bert.embeddings.word_embeddings.weight)
    config, ours = _converted(hf.state_dict(), hf)
    assert not config.tie_output
    ids = torch.randint(1, 99, (2, 10))
    with torch.no_grad():
        expected = hf(ids)
        out = ours(ids)
    torch.testing.assert_close(out.logits, expected.prediction_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.extra["nsp_logits"], expected.seq_relationship_logits, atol=1e-4, rtol=1e-4)


def test_bert_without_a_pooler_converts():
    """HF BertModel(add_pooling_layer=False) has no pooler keys: the converter must not ask for one."""
    torch.manual_seed(0)
    hf = _randomise(transformers.BertModel(_tiny_bert_config(), add_pooling_layer=False))
    config, ours = _converted(hf.state_dict(), hf)
    assert config.heads == "none" and not config.has_pooler
    ids = torch.randint(1, 99, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).last_hidden_state, atol=1e-4, rtol=0)


def test_bert_dropouts_come_from_their_own_settings():
    base = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    config = bert_config_from_hf({**base, "hidden_dropout_prob": 0.05, "attention_probs_dropout_prob": 0.25,
                                  "classifier_dropout": 0.4})
    assert (config.dropout, config.attention_dropout, config.classifier_dropout) == (0.05, 0.25, 0.4)


def test_config_values_are_checked_but_whole_numbers_pass_as_floats():
    """A float setting written as 0 is a valid JSON number; a size written 512.0 or "512" is not an integer."""
    from attnlab.errors import CheckpointError

    base = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    config = bert_config_from_hf({**base, "hidden_dropout_prob": 0, "classifier_dropout": None})
    assert (config.dropout, config.classifier_dropout) == (0.0, None)
    with pytest.raises(CheckpointError, match="^config.json: max_position_embeddings is 512.0"):
        bert_config_from_hf({**base, "max_position_embeddings": 512.0})
    gpt = dict(vocab_size=97, n_positions=48, n_embd=32, n_layer=2, n_head=4)
    assert gpt2_config({**gpt, "n_inner": None}).d_ff == 128  # null: HF's 4 * n_embd
    with pytest.raises(CheckpointError, match='^config.json: n_positions is "48"'):
        gpt2_config({**gpt, "n_positions": "48"})
