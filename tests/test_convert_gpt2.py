"""Parity with HF transformers' GPT-2: converted weights give the same logits and greedy text."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnlab.convert.gpt2 import gpt_from_hf  # noqa: E402
from attnlab.inference.generate import generate  # noqa: E402


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=97, n_positions=48, n_embd=32, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    ours = gpt_from_hf(hf.state_dict(), cfg.to_dict()).eval()
    return hf, ours


def test_logits_match(pair):
    hf, ours = pair
    ids = torch.randint(0, 97, (3, 20))
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_logits_match_with_padding_mask(pair):
    hf, ours = pair
    ids = torch.randint(0, 97, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0  # right padding
    with torch.no_grad():
        expected = hf(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[0], expected[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1, :8], expected[1, :8], atol=1e-4, rtol=1e-4)


def test_greedy_generation_identical(pair):
    hf, ours = pair
    prompt = torch.tensor([[5, 17, 42, 8]])
    with torch.no_grad():
        expected = hf.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)[0, 4:].tolist()
    assert generate(ours, prompt, 20, greedy=True) == [expected]


def test_loss_matches(pair):
    hf, ours = pair
    ids = torch.randint(0, 97, (2, 16))
    labels = ids[:, 1:]
    with torch.no_grad():
        expected = hf(ids, labels=ids).loss  # HF shifts internally
        got = ours(ids[:, :-1], labels=labels).loss
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
