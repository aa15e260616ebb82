"""`evaluate`'s BLEU reads the references as the tokenizer decodes them; an unknown word was written as its unk
token's name, "<unk>", which sacrebleu's tokenizer counts as three words: longer references, a lower brevity
penalty (21.7 for 34.9 in the audit's run). It is now one word no translation writes."""

from __future__ import annotations

import warnings

import pytest

from attnlab.data.tokenizers import CharTokenizer, WordTokenizer
from attnlab.inference.runs import _as_decoded

sacrebleu = pytest.importorskip("sacrebleu")


@pytest.mark.parametrize("tokenizer, references", [
    (WordTokenizer.train(["the cat sat on the mat"]), ["the cat sat on the zoo", "the mat sat"]),
    (CharTokenizer.train(["the cat sat on the mat"]), ["The cat sat", "the mat sat on the cat"]),
])
def test_an_unknown_word_is_one_word_that_no_translation_matches(tokenizer, references):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the lines that read otherwise decoded are named
        decoded = _as_decoded(tokenizer, references, "refs.txt")
    hypotheses = ["the cat sat on the mat", "the mat sat on"]
    as_written = sacrebleu.corpus_bleu(hypotheses, [references])
    as_read = sacrebleu.corpus_bleu(hypotheses, [decoded])
    assert as_read.ref_len == as_written.ref_len and as_read.score == pytest.approx(as_written.score)
    assert "unk" not in " ".join(decoded).lower()


def test_text_that_spells_the_unk_token_is_text_to_a_character_tokenizer():
    # The unk token's name was replaced in the decoded text: a character tokenizer reads a written "<unk>" as five
    # characters a translation writes too, and a translation of the reference's own tokens scored 43 for 100.
    tokenizer = CharTokenizer.train(["the <unk> sat on the mat", "a cat"])
    references = ["the <unk> sat on the mat", "a cat sat"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        decoded = _as_decoded(tokenizer, references, "refs.txt")
    hypotheses = [tokenizer.decode(tokenizer.encode(r), skip_special_tokens=True) for r in references]
    assert sacrebleu.corpus_bleu(hypotheses, [decoded]).score == pytest.approx(100.0)
