"""Explicit positions must be one a token, (B|1, T): a 1-D tensor was broadcast over rotary's head axis (every
token of head h sat at position h, logits off by 2.9) and failed with raw torch errors under other schemes."""

from __future__ import annotations

import re

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.gpt import GPT, GPTConfig


@pytest.mark.parametrize("position", ["rotary", "learned", "alibi", "t5-bias"])
def test_gpt_positions_of_another_shape_are_refused(position):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, d_model=16, n_layers=1, n_heads=4, block_size=16, position=position)).eval()
    ids = torch.randint(0, 20, (2, 4))
    for bad in (torch.arange(4), torch.arange(3)[None], torch.arange(4)[None, None]):
        said = re.escape(f"positions has shape {tuple(bad.shape)}; it must be (2, 4) or (1, 4), one position a token")
        with pytest.raises(ConfigError, match=said):
            model(ids, positions=bad)
    torch.testing.assert_close(model(ids, positions=torch.arange(4)[None]).logits, model(ids).logits)


def test_bert_position_ids_of_another_shape_are_refused():
    model = BertModel(BertConfig(vocab_size=20, d_model=16, n_layers=1, n_heads=4, d_ff=32, max_len=16,
                                 position="rotary")).eval()
    ids = torch.randint(5, 20, (2, 4))
    with pytest.raises(ConfigError, match=r"position_ids has shape \(4,\); it must be \(2, 4\) or \(1, 4\)"):
        model(ids, position_ids=torch.arange(4))
    model(ids, position_ids=torch.arange(4).expand(2, 4))
