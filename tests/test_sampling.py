"""The sampling distribution handed to torch.multinomial, pinned exactly: temperature divides the logits
once (0 is greedy), top-k keeps exactly the k largest, top-p the smallest prefix reaching p, in vocabulary
order."""

from __future__ import annotations

import torch

from attnlab.inference.generate import sample_next


def _sampled_probs(monkeypatch, logits, **options):
    """The distribution sample_next hands to torch.multinomial."""
    seen = {}

    def fake(probs, n, generator=None):
        seen["p"] = probs.clone()
        return torch.zeros(probs.shape[0], n, dtype=torch.long)

    monkeypatch.setattr(torch, "multinomial", fake)
    sample_next(logits, **options)
    return seen["p"]


def test_temperature_divides_the_logits_once(monkeypatch):
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.0]])
    p = _sampled_probs(monkeypatch, logits, temperature=2.0)
    torch.testing.assert_close(p, torch.softmax(logits / 2.0, -1))


def test_temperature_zero_is_greedy():
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.0], [4.0, 0.0, 1.0, 2.0]])
    assert sample_next(logits, temperature=0).tolist() == [1, 0]


def test_top_k_keeps_exactly_the_k_largest(monkeypatch):
    logits = torch.tensor([[0.3, 2.0, -1.0, 1.0, 0.5]])
    p = _sampled_probs(monkeypatch, logits, top_k=2)
    kept = torch.tensor([[False, True, False, True, False]])
    expected = torch.softmax(logits.masked_fill(~kept, float("-inf")), -1)
    torch.testing.assert_close(p, expected)


def test_top_p_keeps_the_smallest_prefix_reaching_p_in_vocabulary_order(monkeypatch):
    probs = torch.tensor([[0.1, 0.5, 0.05, 0.35]])  # sorted: 1 (0.5), 3 (0.35), 0, 2
    p = _sampled_probs(monkeypatch, probs.log(), top_p=0.7)  # 0.5 < 0.7, then 0.85 >= 0.7: keep {1, 3}
    torch.testing.assert_close(p, torch.tensor([[0.0, 0.5 / 0.85, 0.0, 0.35 / 0.85]]))


def test_top_p_drops_a_token_once_the_tokens_above_hold_exactly_p(monkeypatch):
    p = _sampled_probs(monkeypatch, torch.zeros(1, 2), top_p=0.5)  # probabilities 0.5, 0.5 exactly
    assert sorted(p[0].tolist()) == [0.0, 1.0]
