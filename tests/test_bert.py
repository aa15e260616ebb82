"""BERT: tied MLM head, the loss contract, outputs, gradients, heads and padding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.errors import ConfigError
from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.registry import build_model, config_to_dict, get_preset

B, T, V = 3, 10, 99


def tiny(**changes) -> BertModel:
    torch.manual_seed(0)
    return BertModel(get_preset("bert-tiny")[1].replace(**changes))


def batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, V, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 7:] = 0
    ids[1, 7:] = 0
    token_type_ids = torch.zeros(B, T, dtype=torch.long)
    token_type_ids[:, 5:] = 1
    labels = torch.full((B, T), -100)
    labels[0, 2], labels[0, 6], labels[2, 1] = 11, 12, 13
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=token_type_ids, labels=labels,
                next_sentence_label=torch.tensor([0, 1, 1]))


def test_mlm_decoder_is_the_token_embedding():
    model = tiny()
    assert model.mlm.decoder.weight is model.embeddings.token.weight
    assert model.mlm.decoder.weight.data_ptr() == model.embeddings.token.weight.data_ptr()
    assert model.mlm.decoder.bias.shape == (V,)
    untied = tiny(tie_output=False)
    assert untied.mlm.decoder.weight.data_ptr() != untied.embeddings.token.weight.data_ptr()


def test_pretraining_loss_contract():
    model = tiny().eval()
    b = batch()
    out = model(**b)
    assert out.logits.shape == (B, T, V) and out.extra["nsp_logits"].shape == (B, 2)
    keep = b["labels"] != -100
    mlm = F.cross_entropy(out.logits[keep], b["labels"][keep])
    nsp = F.cross_entropy(out.extra["nsp_logits"], b["next_sentence_label"])
    torch.testing.assert_close(out.extra["mlm_loss"], mlm)
    torch.testing.assert_close(out.extra["nsp_loss"], nsp)
    torch.testing.assert_close(out.loss, mlm + nsp)
    assert int(out.n_targets) == 3  # the MLM targets

    only_nsp = model(**{k: v for k, v in b.items() if k != "labels"})
    torch.testing.assert_close(only_nsp.loss, nsp)
    assert int(only_nsp.n_targets) == B
    no_labels = model(b["input_ids"])
    assert no_labels.loss is None and no_labels.n_targets is None


def test_no_nsp_ablation_has_mlm_loss_only():
    model = tiny(nsp=False).eval()
    assert model.nsp is None and model.pooler is None
    out = model(**batch())
    assert "nsp_logits" not in out.extra
    torch.testing.assert_close(out.loss, out.extra["mlm_loss"])


def test_attention_weights_and_hidden_states():
    model = tiny().eval()
    out = model(**batch(), need_weights=True, output_hidden_states=True)
    assert len(out.attentions) == 2
    for w in out.attentions:
        assert w.shape == (B, 4, T, T)
        assert torch.all(w[1, :, :, 7:] == 0)  # padding keys get no weight
    assert len(out.hidden_states) == 3 and all(h.shape == (B, T, 32) for h in out.hidden_states)


def test_every_parameter_receives_a_gradient():
    for heads in ("pretraining", "classification"):
        model = tiny(heads=heads).train()
        b = batch()
        if heads == "classification":
            b["labels"] = torch.tensor([0, 1, 0])
        model(**b).loss.backward()
        for name, p in model.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, (heads, name)


def test_heads_none_and_classification():
    b = batch()
    plain = tiny(heads="none").eval()
    out = plain(b["input_ids"], b["attention_mask"], b["token_type_ids"])
    assert out.logits.shape == (B, T, 32) and out.extra["pooled_output"].shape == (B, 32)
    assert out.loss is None
    cls = tiny(heads="classification", n_classes=3).eval()
    out = cls(b["input_ids"], b["attention_mask"], b["token_type_ids"], labels=torch.tensor([2, 0, 1]))
    assert out.logits.shape == (B, 3) and int(out.n_targets) == B
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, torch.tensor([2, 0, 1])))


def test_right_padding_does_not_change_real_tokens():
    model = tiny(heads="none").eval()
    b = batch()
    with torch.no_grad():
        padded = model(b["input_ids"], b["attention_mask"], b["token_type_ids"]).logits
        alone = model(b["input_ids"][1:2, :7], token_type_ids=b["token_type_ids"][1:2, :7]).logits
    torch.testing.assert_close(padded[1, :7], alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("heads", ["classification", "pretraining"])
def test_left_padding_pools_the_first_real_token(heads):
    """The pooler reads [CLS], the first real token: a left-padded row gives the classification (or NSP)
    logits it gives alone, as a right-padded one does."""
    model = tiny(heads=heads, n_classes=3).eval()
    ids = torch.tensor([[2, 40, 41, 3, 50, 3]])
    types = torch.tensor([[0, 0, 0, 0, 1, 1]])
    left = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1)
    right = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1)
    mask_left, mask_right = (left != 0).long(), (right != 0).long()

    def summary(out):
        return out.logits if heads == "classification" else out.extra["nsp_logits"]

    with torch.no_grad():
        alone = summary(model(ids, token_type_ids=types))
        for padded, mask in ((left, mask_left), (right, mask_right)):
            padded_types = torch.zeros_like(padded)
            padded_types[mask.bool()] = types[0]
            torch.testing.assert_close(summary(model(padded, mask, padded_types)), alone, atol=1e-5, rtol=0)


def test_left_to_right_ablation_is_causal():
    model = tiny(causal=True, heads="none").eval()
    ids = torch.randint(5, V, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits[:, :5], model(ids[:, :5]).logits, atol=1e-5, rtol=0)


def test_config_validation_presets_and_round_trip():
    with pytest.raises(ConfigError, match="pooler"):
        BertConfig(heads="pretraining", nsp=True, pooler=False)
    with pytest.raises(ConfigError, match="heads"):
        BertConfig(heads="mlm")
    base = get_preset("bert-base")[1]
    shape = (base.d_model, base.n_layers, base.n_heads, base.d_ff, base.vocab_size)
    assert shape == (768, 12, 12, 3072, 30522)
    cfg = get_preset("bert-tiny")[1]
    assert build_model(config_to_dict(cfg)).config == cfg
