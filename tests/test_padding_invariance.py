"""Padding changes nothing for the real tokens, for every attention variant × position scheme: the encoder
(LM head under its causal mask, classification head bidirectional) and BERT, padded on the left or on the
right with an attention mask, give each row what it gives alone (positions count real tokens only)."""

from __future__ import annotations

import pytest
import torch

from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.encoder import EncoderConfig, EncoderModel
from attnlab.modules.positions import compatible_pairs

SHORT = {"t5-bias": {"num_buckets": 8, "max_distance": 8}, "relative": {"max_distance": 3}}


PAIRS = compatible_pairs()


def _perturbed(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def _padded(row: torch.Tensor, n_pad: int = 3):
    """(left-padded ids, its mask, right-padded ids, its mask), padding id 0."""
    pad = torch.zeros(1, n_pad, dtype=torch.long)
    keep = torch.tensor([[0] * n_pad + [1] * row.shape[1]])
    return torch.cat([pad, row], 1), keep, torch.cat([row, pad], 1), keep.flip(1)


@pytest.mark.parametrize("variant,position", PAIRS)
@pytest.mark.parametrize("head", ["lm", "classification"])
def test_encoder(variant, position, head):
    torch.manual_seed(5)
    model = _perturbed(EncoderModel(EncoderConfig(
        vocab_size=31, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout=0.0, max_len=16, head=head,
        attention=variant, position=position, position_options=SHORT.get(position, {}))))
    row = torch.randint(1, 31, (1, 6))
    with torch.no_grad():
        alone = model(row).logits
        left, keep_left, right, keep_right = _padded(row)
        from_left = model(left, attention_mask=keep_left).logits
        from_right = model(right, attention_mask=keep_right).logits
    if head == "lm":
        from_left, from_right = from_left[:, 3:], from_right[:, :6]
    torch.testing.assert_close(from_left, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(from_right, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant,position", PAIRS)
def test_bert(variant, position):
    torch.manual_seed(6)
    model = _perturbed(BertModel(BertConfig(
        vocab_size=31, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=16, dropout=0.0,
        attention_dropout=0.0, attention=variant, position=position,
        position_options=SHORT.get(position, {}))))
    row = torch.randint(1, 31, (1, 6))
    segments = torch.tensor([[0, 0, 0, 1, 1, 1]])
    with torch.no_grad():
        alone = model(row, token_type_ids=segments)
        left, keep_left, right, keep_right = _padded(row)
        zeros = torch.zeros(1, 3, dtype=torch.long)
        from_left = model(left, attention_mask=keep_left, token_type_ids=torch.cat([zeros, segments], 1))
        from_right = model(right, attention_mask=keep_right, token_type_ids=torch.cat([segments, zeros], 1))
    torch.testing.assert_close(from_left.logits[:, 3:], alone.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(from_right.logits[:, :6], alone.logits, atol=1e-5, rtol=1e-5)
    # The pooled [CLS] state (read by next-sentence prediction) is the first real token's.
    torch.testing.assert_close(from_right.extra["nsp_logits"], alone.extra["nsp_logits"], atol=1e-5, rtol=1e-5)
