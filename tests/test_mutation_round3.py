"""Behaviour no test pinned, found by the stop-39 mutation audit (generation, encoder, tokenizers, seq2seq, BERT
inputs, LM evaluation windows): each test fails on the one-line mutant the audit made and passes on the code."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.data.sources import CausalLMSource
from attnlab.data.tokenizers import CharTokenizer
from attnlab.errors import ConfigError
from attnlab.inference.generate import generate, sample_next
from attnlab.models.common import SequenceTooLong
from attnlab.models.encoder import EncoderConfig, EncoderModel
from attnlab.models.registry import build_model, get_preset
from attnlab.models.transformer import Seq2SeqTransformer, TransformerConfig

NO_SPECIALS = {k: None for k in ("pad", "unk", "mask", "cls", "sep", "bos", "eos")}


def test_a_row_that_ends_does_not_end_the_batch():
    torch.manual_seed(0)
    model = build_model(get_preset("gpt-char-tiny")[1]).eval()
    prompts = [[1, 2, 3], [4, 5, 6]]
    free = generate(model, prompts, 6, greedy=True)
    eos = next(t for t in free[0] if t not in free[1])  # a token the first row emits and the second never does
    ended = generate(model, prompts, 6, greedy=True, eos_id=eos)
    assert ended[0][-1] == eos and len(ended[0]) < 6
    assert ended[1] == free[1] == generate(model, prompts[1:], 6, greedy=True, eos_id=eos)[0]


def test_top_p_reads_the_mass_left_by_top_k():
    # top_k = 2 keeps 0.4 and 0.3, renormalised 0.571 and 0.429: top_p = 0.5 then keeps the first alone (over the
    # whole distribution the first holds 0.4 < 0.5, and the second would be kept too).
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.3 - 1e-3, 1e-3]]))
    g = torch.Generator().manual_seed(0)
    assert {int(sample_next(logits, top_k=2, top_p=0.5, generator=g)) for _ in range(200)} == {0}


@pytest.mark.parametrize("top_p", [0.0, -0.1, 1.5])
def test_top_p_outside_0_to_1_is_refused(top_p):
    model = build_model(get_preset("gpt-char-tiny")[1])
    with pytest.raises(ConfigError, match=rf"top_p \(--top-p\) must be in \(0, 1\], got {top_p}"):
        generate(model, [[1, 2, 3]], 4, top_p=top_p, seed=1)


def test_with_head_keeps_the_callers_train_or_eval_mode():
    lm = EncoderModel(EncoderConfig(vocab_size=20, d_model=8, n_heads=2, d_ff=16, n_layers=1, dropout=0.5))
    for training in (False, True):
        classifier = lm.train(training).with_head("classification", n_classes=2)
        assert classifier.training is training
        assert all(m.training is training for m in classifier.modules())


def test_mean_pooling_of_a_row_of_no_real_token_is_finite():
    # A row whose attention mask is all 0 (allowed) pooled to 0, not 0 / 0.
    torch.manual_seed(0)
    model = EncoderModel(EncoderConfig(vocab_size=20, d_model=8, n_heads=2, d_ff=16, n_layers=1, dropout=0.0,
                                       head="classification", pooling="mean")).eval()
    keep = torch.tensor([[1, 1, 0], [0, 0, 0]])
    logits = model(torch.tensor([[5, 6, 7], [0, 0, 0]]), attention_mask=keep).logits
    assert torch.isfinite(logits).all()


def test_a_one_character_special_that_the_text_holds_is_one_entry():
    specials = {**NO_SPECIALS, "pad": "□"}
    tok = CharTokenizer.train("ab□c", specials=specials)
    assert tok.vocab() == ["□", "a", "b", "c"] and tok.pad_id == 0


def test_equally_frequent_characters_are_kept_whatever_their_order_in_the_text():
    kept = {text: CharTokenizer.train(text, vocab_size=1, specials=NO_SPECIALS).vocab() for text in ("ab", "ba")}
    assert kept == {"ab": ["a"], "ba": ["a"]}


def test_cached_decoding_past_the_target_positions_is_refused_in_one_line():
    torch.manual_seed(0)
    model = Seq2SeqTransformer(TransformerConfig(src_vocab_size=16, tgt_vocab_size=16, d_model=8, n_heads=2, d_ff=16,
                                                 n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_len=4,
                                                 position="learned")).eval()
    memory, _, _ = model.encode(torch.tensor([[3, 4, 5]]))
    cache = model.new_cache()
    with torch.no_grad():
        for _ in range(4):
            model.decode(torch.tensor([[1]]), memory, cache=cache)
        with pytest.raises(SequenceTooLong, match="target sequence of 5 tokens"):
            model.decode(torch.tensor([[1]]), memory, cache=cache)


def test_token_type_ids_for_another_batch_are_refused_in_one_line():
    model = build_model(get_preset("bert-tiny")[1]).eval()
    ids = torch.tensor([[2, 5, 6, 3], [2, 7, 8, 3]])
    with pytest.raises(ConfigError, match=r"token_type_ids has shape \(3, 4\); it must be \(2, 4\)"):
        model(ids, token_type_ids=torch.zeros(3, 4, dtype=torch.long))


@pytest.mark.parametrize("n_tokens", [9, 10, 12, 13])
def test_lm_evaluation_windows_each_hold_targets(n_tokens):
    # 9 tokens in windows of 4: two windows of 4 targets (a third, of none, had been counted at k·T + 1 tokens).
    source = CausalLMSource(np.arange(n_tokens) % 60, block_size=4, batch_size=1)
    targets = [int((b["labels"] != -100).sum()) for b in source.iter_batches(1)]
    assert len(targets) == source.eval_windows and all(targets) and sum(targets) == n_tokens - 1
