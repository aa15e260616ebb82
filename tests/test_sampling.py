"""The sampling distribution handed to torch.multinomial, pinned exactly: temperature divides the logits
once (0 is greedy), top-k keeps exactly the k largest, top-p the smallest prefix reaching p, ties in
vocabulary order."""

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


def test_top_k_keeps_exactly_k_tokens_where_logits_tie_in_vocabulary_order(monkeypatch):
    # Kept by value, every token tied with the k-th stayed: top_k = 1 sampled among three tied maxima (bf16
    # weights give such ties), where it must be greedy.
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0]])
    for k, kept in ((1, [1]), (2, [1, 2]), (4, [1, 2, 4, 0])):
        p = _sampled_probs(monkeypatch, logits, top_k=k)
        assert sorted(torch.nonzero(p[0]).flatten().tolist()) == sorted(kept), k


def test_top_p_of_exactly_j_tied_tokens_keeps_j(monkeypatch):
    # n equally likely tokens and p = j/n: the float32 running sum fell an ulp short of p for 32 such (n, j)
    # pairs, keeping j + 1 tokens (10 tokens at top_p 0.6 kept 7).
    for n in (3, 10, 20, 50, 100):
        for j in range(1, n):
            p = _sampled_probs(monkeypatch, torch.zeros(1, n), top_p=j / n)
            assert int((p > 0).sum()) == j, (n, j)
    p = _sampled_probs(monkeypatch, torch.tensor([[0.0, 1.0, 0.5]]), top_p=1e-15)  # below the margin: the top one
    assert p[0].tolist() == [0.0, 1.0, 0.0]


def test_a_tiny_temperature_samples_the_argmax_instead_of_overflowing(monkeypatch):
    """Logits divided by 1e-37 overflow to ±inf (NaN probabilities); shifted to a maximum of 0 first, the others
    go to -inf and the distribution is the greedy one. (Below float32's smallest normal number, ~1.2e-38, the
    temperature takes the argmax without sampling: test_generation_audit.py.)"""
    logits = torch.tensor([[0.5, 3.0, -1.0, 2.0], [40.0, -30.0, 1.0, 39.0]])
    p = _sampled_probs(monkeypatch, logits, temperature=1e-37)
    torch.testing.assert_close(p, torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))


def test_generation_inputs_of_the_wrong_kind_get_one_line():
    import numpy as np
    import pytest

    from attnlab.errors import ConfigError
    from attnlab.inference.generate import beam_search, generate, greedy_translate
    from attnlab.models.registry import build_model, get_preset

    torch.manual_seed(0)
    gpt = build_model(get_preset("gpt-char-tiny")[1]).eval()
    assert generate(gpt, [np.array([1, 2]), torch.tensor([3])], 2, greedy=True) == \
        generate(gpt, [[1, 2], [3]], 2, greedy=True) == generate(gpt, [[1, 2], [3]], np.int64(2), greedy=True)
    for prompt, words in (([1, 2, 3], "list of id lists"), ("hello", "tokenizer"), (torch.tensor([1, 2]), "(2,)"),
                          (torch.tensor([[1.0, 2.0]]), "float32"), ([[1.5, 2]], "whole number")):
        with pytest.raises(ConfigError, match=words):
            generate(gpt, prompt, 3)
    for options, words in ((dict(max_new_tokens=2.0), "max_new_tokens"), (dict(max_new_tokens=2, top_k=2.5), "top_k")):
        with pytest.raises(ConfigError, match=words):
            generate(gpt, [[1]], **options)
    seq2seq = build_model(get_preset("seq2seq-tiny")[1]).eval()
    src = torch.randint(3, 20, (1, 5))
    for call, words in ((lambda: beam_search(seq2seq, src, length_penalty=float("nan")), "length_penalty"),
                        (lambda: beam_search(seq2seq, src, length_penalty=float("inf")), "length_penalty"),
                        (lambda: beam_search(seq2seq, src, max_len=-1), "max_len"),
                        (lambda: greedy_translate(seq2seq, src, max_len=-1), "max_len")):
        with pytest.raises(ConfigError, match=words):
            call()
