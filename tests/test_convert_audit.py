"""Converter cases an audit found: tied configs whose files hold a separate output matrix, BERT keys without a
dot, a config without pad_token_id, and GPT-2's training dropouts."""

import warnings

import pytest
import torch
import transformers
from safetensors.torch import save_file

from attnlab.convert import bert_config_from_hf, bert_from_hf, gpt2_config, load_hf_bert, load_hf_gpt2
from attnlab.errors import CheckpointError

BERT = dict(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=64)
GPT2 = dict(vocab_size=97, n_positions=48, n_embd=32, n_layer=1, n_head=4)


def _save(folder, config, state):
    config.save_pretrained(folder)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def test_gpt2_tied_config_with_a_separate_lm_head_is_refused(tmp_path):
    """Tying would drop the file's lm_head (HF 5 loads it untied, HF 4 dropped it): refused, naming the fix."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(**GPT2)
    state = {k: v.clone() for k, v in transformers.GPT2LMHeadModel(cfg).state_dict().items()}
    _save(tmp_path, cfg, {**state, "lm_head.weight": torch.randn(97, 32)})
    with pytest.raises(CheckpointError, match=r"lm_head.weight differs from its wte.weight.*tie_word_embeddings"):
        load_hf_gpt2(tmp_path)
    _save(tmp_path, cfg, {**state, "lm_head.weight": state["transformer.wte.weight"].clone()})
    assert load_hf_gpt2(tmp_path).lm_head.weight is not None  # an equal copy is the tied matrix: accepted


def test_bert_tied_config_with_a_separate_decoder_is_refused(tmp_path):
    """Loaded into the tied model, the decoder matrix overwrote the word embeddings (the encoder changed too)."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(**BERT)
    state = {k: v.clone() for k, v in transformers.BertForMaskedLM(cfg).state_dict().items()}
    _save(tmp_path, cfg, {**state, "cls.predictions.decoder.weight": torch.randn(99, 32)})
    with pytest.raises(CheckpointError, match=r"cls.predictions.decoder.weight differs.*tie_word_embeddings"):
        load_hf_bert(tmp_path)
    word = state["bert.embeddings.word_embeddings.weight"]
    _save(tmp_path, cfg, {**state, "cls.predictions.decoder.weight": word.clone()})
    assert torch.equal(load_hf_bert(tmp_path).embeddings.token.weight, word)


@pytest.mark.parametrize("extra", ["logit_scale", "bert.temperature", "encoder.layer.extra"])
def test_a_bert_key_without_a_dot_is_an_unknown_key(extra):
    cfg = transformers.BertConfig(**BERT)
    state = transformers.BertModel(cfg).state_dict()
    with pytest.raises(CheckpointError, match=f"unknown keys in the BERT checkpoint: {extra}"):
        bert_from_hf({**state, extra: torch.zeros(1)}, cfg.to_dict())


def test_bert_pad_id_is_hfs_default_when_absent_and_none_when_null():
    assert transformers.BertModel(transformers.BertConfig(**BERT)).embeddings.word_embeddings.padding_idx == 0
    assert bert_config_from_hf(dict(BERT)).pad_id == 0
    assert bert_config_from_hf({**BERT, "pad_token_id": None}).pad_id is None
    assert bert_config_from_hf({**BERT, "pad_token_id": 3}).pad_id == 3


def test_gpt2_training_dropouts_come_from_the_config():
    assert (gpt2_config(GPT2).dropout, gpt2_config(GPT2).attention_dropout) == (0.1, 0.1)  # HF's defaults
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = gpt2_config({**GPT2, "resid_pdrop": 0.05, "embd_pdrop": 0.05, "attn_pdrop": 0.2})
    assert (config.dropout, config.attention_dropout) == (0.05, 0.2)
    with pytest.warns(UserWarning, match="embd_pdrop 0.3 differs from resid_pdrop 0.05.*takes 0.05"):
        assert gpt2_config({**GPT2, "resid_pdrop": 0.05, "embd_pdrop": 0.3}).dropout == 0.05
    with pytest.raises(CheckpointError, match="attn_pdrop"):
        gpt2_config({**GPT2, "attn_pdrop": 1.0})


def test_a_sharded_folder_loads_as_the_whole_file(tmp_path):
    """`save_pretrained` beyond its shard size writes model-0000i-of-0000n.safetensors and an index."""
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2)).eval()
    hf.save_pretrained(tmp_path / "whole")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    shards = sorted((tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 1 and not (tmp_path / "sharded" / "model.safetensors").exists()
    whole, sharded = load_hf_gpt2(tmp_path / "whole"), load_hf_gpt2(tmp_path / "sharded")
    for (name, a), b in zip(whole.state_dict().items(), sharded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name

    shards[-1].unlink()
    with pytest.raises(CheckpointError, match=f"{shards[-1].name}, named in model.safetensors.index.json, is missing"):
        load_hf_gpt2(tmp_path / "sharded")
    index = tmp_path / "sharded" / "model.safetensors.index.json"
    index.write_text('{"weight_map": {"transformer.wte.weight": "../elsewhere.safetensors"}}')
    with pytest.raises(CheckpointError, match="no valid weight_map"):
        load_hf_gpt2(tmp_path / "sharded")


def test_a_token_classifier_is_named_as_such_not_as_a_missing_pooler():
    cfg = transformers.BertConfig(**BERT, num_labels=3)
    hf_config = {k: v for k, v in cfg.to_dict().items() if k != "architectures"}  # a state dict and a bare config
    with pytest.raises(CheckpointError, match="a classifier but no pooler .*BertForTokenClassification"):
        bert_from_hf(transformers.BertForTokenClassification(cfg).state_dict(), hf_config)


@pytest.mark.parametrize("order", [1, -1])
def test_an_untied_bert_mlm_head_takes_the_bias_hf_adds_in_any_key_order(order):
    # HF keeps the MLM bias twice and, untied, the two differ: the one that came last in the dict won.
    from attnlab.models.bert import BertModel

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=53, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                  intermediate_size=37, max_position_embeddings=40, tie_word_embeddings=False)
    hf = transformers.BertForMaskedLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.1 * torch.randn_like(p))
    state = hf.state_dict()
    assert not torch.equal(state["cls.predictions.decoder.bias"], state["cls.predictions.bias"])
    config, ours = bert_from_hf(dict(list(state.items())[::order]), cfg.to_dict())
    model = BertModel(config).eval()
    model.load_state_dict(ours)
    ids = torch.randint(1, 53, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, atol=1e-4, rtol=0)


def test_a_converted_encoder_without_a_head_is_not_sent_from_generate_to_evaluate(capsys, tmp_path):
    # generate said "`attnlab evaluate` scores it on a file", and evaluate then refused it: both now say what such
    # a model (a converted HF BertModel, all-MiniLM-L6-v2's kind) is for.
    from cli_helpers import one_line_error

    from attnlab.data.tokenizers import train_tokenizer
    from attnlab.models.bert import BertConfig, BertModel
    from attnlab.training import save_checkpoint

    tok = train_tokenizer("word", "the cat sat on the mat")
    model = BertModel(BertConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=16,
                                 heads="none"))
    save_checkpoint(tmp_path / "run" / "checkpoint", model, tokenizer=tok)
    text = tmp_path / "text.txt"
    text.write_text("the cat sat\n", encoding="utf-8")
    run = str(tmp_path / "run")
    for argv in (["generate", run, "-p", "the"], ["evaluate", run, "-d", str(text)]):
        line = one_line_error(capsys, *argv, "--device", "cpu")
        assert "an encoder without a head" in line and "model.init_from" in line and "evaluate` scores" not in line
