"""`generate` with a causal LM of the user's: its forward may return the logits tensor itself or an output with
`.logits`; anything else is refused in one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from attnlab.errors import ConfigError
from attnlab.inference.generate import generate


class _Running(nn.Module):
    """A tiny causal LM: each position's logits from the running sum of the embeddings so far."""

    def __init__(self, wrap: bool = False, last_only: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = nn.Embedding(13, 8), nn.Linear(8, 13)
        self.wrap, self.last_only = wrap, last_only

    def forward(self, input_ids, attention_mask=None):
        logits = self.out(self.emb(input_ids).cumsum(1))
        if self.last_only:
            return logits[:, -1]
        return SimpleNamespace(logits=logits) if self.wrap else logits


def _greedy_by_hand(model: nn.Module, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).argmax(-1)[0, -1]))
    return ids[len(prompt):]


def test_a_forward_that_returns_the_logits_tensor_decodes_like_one_that_returns_an_output():
    bare, wrapped = _Running(), _Running(wrap=True)
    prompt = [3, 1, 4, 1, 5]
    got = generate(bare, [prompt], 7, greedy=True)
    assert got == generate(wrapped, [prompt], 7, greedy=True)
    assert got == [_greedy_by_hand(bare, prompt, 7)]
    assert generate(bare, [prompt], 7, seed=5) == generate(wrapped, [prompt], 7, seed=5)


def test_a_forward_that_returns_no_sequence_of_logits_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"returned a \(1, 13\) tensor; generate needs the \(batch, length, "
                                          r"vocabulary\) logits"):
        generate(_Running(last_only=True), [[1, 2]], 3, greedy=True)

    class _Dict(_Running):
        def forward(self, input_ids, attention_mask=None):
            return {"scores": super().forward(input_ids)}

    with pytest.raises(ConfigError, match="returned dict; generate needs"):
        generate(_Dict(), [[1, 2]], 3, greedy=True)
