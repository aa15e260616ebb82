"""Inputs at the models' boundary: what an audit of the attention variants and masks found."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.encoder import EncoderConfig, EncoderModel
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.models.transformer import Seq2SeqTransformer, TransformerConfig


def _gpt(**options) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=11, block_size=16, d_model=16, n_heads=2, n_layers=2, **options)).eval()


@torch.no_grad()
def test_a_cached_step_given_the_new_tokens_mask_alone_is_refused():
    # The mask covers every key, cached and new. A (B, 1) mask for the new token was broadcast over the keys: the
    # prompt's padding became visible and the token sat at position 0 (logits 0.14 off the prompt run alone).
    gpt = _gpt()
    ids, mask = torch.tensor([[0, 0, 3, 4, 5]]), torch.tensor([[0, 0, 1, 1, 1]])
    cache = gpt.new_cache()
    gpt(ids, attention_mask=mask, cache=cache)
    with pytest.raises(ConfigError, match=r"attention_mask has shape \(1, 1\); it must be \(1, 6\).*cached tokens"):
        gpt(torch.tensor([[6]]), attention_mask=torch.ones(1, 1, dtype=torch.long), cache=cache)
    full = torch.cat([mask, torch.ones(1, 1, dtype=torch.long)], 1)
    step = gpt(torch.tensor([[6]]), attention_mask=full, cache=cache).logits[0, -1]
    torch.testing.assert_close(step, gpt(torch.tensor([[3, 4, 5, 6]])).logits[0, -1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("width", [1, 2, 4])
def test_a_mask_of_another_width_is_refused_by_every_family(width):
    torch.manual_seed(0)
    ids, mask = torch.tensor([[3, 4, 5]]), torch.ones(1, width, dtype=torch.long)
    encoder = EncoderModel(EncoderConfig(vocab_size=11, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout=0.0,
                                         head="lm")).eval()
    bert = BertModel(BertConfig(vocab_size=11, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=16)).eval()
    seq2seq = Seq2SeqTransformer(TransformerConfig(src_vocab_size=11, tgt_vocab_size=11, d_model=16, n_heads=2,
                                                   d_ff=32, n_encoder_layers=1, n_decoder_layers=1,
                                                   dropout=0.0)).eval()
    shape = rf"\(1, {width}\); it must be \(1, 3\)"
    for call in (lambda: _gpt()(ids, attention_mask=mask), lambda: encoder(ids, attention_mask=mask),
                 lambda: bert(ids, attention_mask=mask)):
        with pytest.raises(ConfigError, match="attention_mask has shape " + shape):
            call()
    with pytest.raises(ConfigError, match="src_mask has shape " + shape):
        seq2seq(ids, ids, src_mask=mask)
    memory = seq2seq.encode(ids)[0]
    with pytest.raises(ConfigError, match="src_mask has shape " + shape):
        seq2seq.decode(ids, memory, mask)


@torch.no_grad()
def test_a_mask_of_one_row_still_serves_the_batch():
    gpt, ids = _gpt(), torch.tensor([[3, 4, 5], [6, 7, 8]])
    one_row = gpt(ids, attention_mask=torch.ones(1, 3, dtype=torch.long)).logits
    torch.testing.assert_close(one_row, gpt(ids).logits)


@torch.no_grad()
def test_int32_positions_reach_the_random_synthesizer():
    # Every other variant takes int32 positions; synthesizer-random's one_hot failed on them with a raw error.
    gpt, ids = _gpt(attention="synthesizer-random"), torch.tensor([[3, 4, 5, 6]])
    positions = torch.arange(4, dtype=torch.int32)[None]
    torch.testing.assert_close(gpt(ids, positions=positions).logits, gpt(ids).logits)
