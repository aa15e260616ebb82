"""Narrow beams against a plain, uncached reference beam search (top 2k candidates, eos -> finished,
GNMT penalty on the length counting eos, no early stop)."""

from __future__ import annotations

import pytest
import torch
from test_seq2seq_decoding import V, _model, _sources

from attnlab.inference.generate import beam_search


@torch.no_grad()
def _reference_beam(model, src, k, max_len, alpha):
    c = model.config
    pen = lambda n: ((5 + n) / 6) ** alpha  # noqa: E731
    live, finished = [([], 0.0)], []
    for step in range(1, max_len + 1):
        cands = []
        for hist, score in live:
            logits = model(src, torch.tensor([[c.bos_id, *hist]])).logits[0, -1].float()
            logits[[c.pad_id, c.bos_id]] = -float("inf")  # never in a translation
            logp = torch.log_softmax(logits, -1)
            cands += [(score + float(logp[t]), hist, t) for t in range(V) if t not in (c.pad_id, c.bos_id)]
        cands.sort(key=lambda x: -x[0])
        live = []
        for score, hist, t in cands[: 2 * k]:
            if t == c.eos_id:
                finished.append((score / pen(step), hist))
            else:
                live.append((hist + [t], score))
            if len(live) == k:
                break
        if not live:
            break
    else:
        finished += [(score / pen(len(hist)), hist) for hist, score in live]
    return max(finished, key=lambda f: f[0])[1]


@pytest.mark.parametrize("alpha", [0.6, 2.0])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("seed", range(12))
def test_narrow_beams_equal_the_reference(seed, k, alpha):
    model, src = _model(seed), _sources(seed)
    assert beam_search(model, src, beam_size=k, max_len=6, length_penalty=alpha) == [
        _reference_beam(model, src, k, 6, alpha)]


@pytest.mark.parametrize("seed, k", [(73, 2), (90, 3)])
def test_beams_that_end_do_not_take_the_place_of_live_ones(seed, k):
    """Cases (found by search) where the best target needs a live beam beyond the first k candidates, some of
    which end with eos: a search that ranked only k candidates per step would lose it."""
    model, src = _model(seed), _sources(seed)
    assert beam_search(model, src, beam_size=k, max_len=6, length_penalty=2.0) == [
        _reference_beam(model, src, k, 6, 2.0)]


@pytest.mark.parametrize("seed, k, alpha", [(17, 2, 0.6), (17, 3, 2.0), (20, 3, 2.0), (22, 3, 2.0)])
def test_a_batch_of_sources_gets_what_each_gets_alone(seed, k, alpha):
    # Every source of a batch searched at once (beams of sources that stop early go on as dead rows): each gets
    # the reference's target for it alone, whichever step its search ends at. Models and sources found by search
    # for targets of three or more lengths.
    model = _model(seed)
    sources = torch.cat([_sources(seed + i) for i in range(8)])
    expected = [_reference_beam(model, sources[i : i + 1], k, 6, alpha) for i in range(8)]
    assert len({len(target) for target in expected}) >= 3  # searches of different lengths
    assert beam_search(model, sources, beam_size=k, max_len=6, length_penalty=alpha) == expected
