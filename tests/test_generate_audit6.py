"""`attnlab generate` shows an unknown word the model generates (a word-level model's unk) as the tokenizer writes
it (sixth generation audit): the new tokens' specials were all left out, unk too, so "for <unk> statement" printed as
"for statement", and a model emitting unk seven times of eight printed one word."""

from __future__ import annotations

import torch

from attnlab.data.tokenizers import train_tokenizer
from attnlab.inference.runs import _continuation


def test_a_generated_unk_is_shown_and_the_other_new_specials_are_not():
    tok = train_tokenizer("word", ["the for statement is here"] * 3)
    prompt = "the"
    ids = tok.encode(prompt)
    new = [tok.token_to_id("for"), tok.unk_id, tok.token_to_id("statement"), tok.pad_id, tok.eos_id]
    assert _continuation(tok, prompt, ids, new) == " for <unk> statement"
    assert _continuation(tok, prompt, ids, [tok.eos_id]) == ""


def test_generate_prints_a_generated_unk(tmp_path):
    from attnlab.inference.runs import LoadedRun, generate_text
    from attnlab.models.gpt import GPT, GPTConfig

    tok = train_tokenizer("word", ["the for statement is here"] * 3)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=16, d_model=16, n_heads=2, n_layers=1)).eval()
    with torch.no_grad():  # a model that always puts the unknown word next: the final norm's output is its bias,
        v = torch.ones(16)     # which the tied head scores against each token's row: unk's alone is not zero
        model.blocks.norm.weight.zero_()
        model.blocks.norm.bias.copy_(v)
        model.lm_head.weight.zero_()
        model.lm_head.weight[tok.unk_id] = v
    run = LoadedRun(model, tok, "gpt", tmp_path, {})
    assert generate_text(run, "the", max_new_tokens=3, greedy=True) == " <unk> <unk> <unk>"  # the new text
