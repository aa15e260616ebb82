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
