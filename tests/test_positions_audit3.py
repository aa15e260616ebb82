"""Positions, segment ids and document ids of small integer types (uint8, int8, int16) are refused in one line, as
token ids of those types are: ALiBi and T5 biases computed their relative distances in the positions' own dtype and
wrapped around silently (a key one step back read as 255 steps ahead), other schemes failed in torch's words (a uint8
tensor indexes as a mask)."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.gpt import GPT, GPTConfig

SMALL = [torch.uint8, torch.int8, torch.int16]


@pytest.mark.parametrize("dtype", SMALL)
@pytest.mark.parametrize("position", ["alibi", "t5-bias", "rotary", "learned"])
def test_gpt_positions_of_a_small_integer_type_are_refused(dtype, position):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, d_model=16, n_heads=2, n_layers=1, position=position)).eval()
    ids = torch.randint(0, 11, (1, 5))
    positions = torch.arange(5)[None]
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(ConfigError, match=rf"^positions must be int64 or int32 \(as token ids are\); got {name}; "
                                          r"convert them with \.long\(\)$"):
        model(ids, positions=positions.to(dtype))
    with pytest.raises(ConfigError, match=rf"^document_ids must be int64 or int32 .* got {name};"):
        model(ids, document_ids=torch.zeros(1, 5, dtype=dtype))
    # int32 gives the int64 logits
    assert torch.equal(model(ids, positions=positions.to(torch.int32)).logits, model(ids, positions=positions).logits)


@pytest.mark.parametrize("dtype", SMALL)
def test_bert_position_and_segment_ids_of_a_small_integer_type_are_refused(dtype):
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=11, max_len=8, d_model=16, n_heads=2, n_layers=1,
                                 position="t5-bias")).eval()
    ids = torch.randint(0, 11, (2, 5))
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(ConfigError, match=rf"^token_type_ids must be int64 or int32 .* got {name};"):
        model(ids, token_type_ids=torch.zeros(2, 5, dtype=dtype))
    with pytest.raises(ConfigError, match=rf"must be int64 or int32 .* got {name};"):
        model(ids, position_ids=torch.arange(5)[None].to(dtype))
