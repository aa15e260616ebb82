"""Tokenizer fixes from the fifth tokenizer audit: a language model's text that spells special tokens is said (the
other tasks said it; generation stops at a spelt "<eos>" and drops a "<pad>"), WordPiece's alphabet is taken from
the distinct characters (the same alphabet, without a Python pass over every word), and train_tokenizer refuses
sizes that are not whole numbers of at least 1 in one line."""

from __future__ import annotations

import warnings

import pytest
from cli_helpers import run_cli, run_cli_warned
from cli_helpers import toml_str as _q

from attnlab.data.tokenizers import train_tokenizer
from attnlab.errors import ConfigError

SPELT = "".join(f"Each target sentence {i} ends in <eos> and short batches are filled with <pad> tokens.\n"
                for i in range(30)) + "".join(f"plain line {i} about nothing special at all\n" for i in range(60))


@pytest.mark.parametrize("kind", ["bpe", "word"])
def test_a_language_models_text_that_spells_special_tokens_is_said(capsys, tmp_path, kind):
    corpus = tmp_path / "c.txt"
    corpus.write_text(SPELT, encoding="utf-8")
    args = ["train", "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=1", "--set", "train.warmup_steps=0",
            "--set", f"data.path={_q(corpus)}", "--set", f"data.tokenizer={_q(kind)}", "--set",
            "train.progress=false", "--set", "train.device=cpu",
            *(["--set", "data.vocab_size=300"] if kind == "bpe" else [])]
    code, err, said = run_cli_warned(capsys, *args, "--set", f"train.out_dir={_q(tmp_path / 'run')}",
                                     about="spells special tokens")
    assert code == 0, err
    # 30 of each in the text: the held-out tenth and the part trained on together
    assert said == [f"the text of {corpus} spells special tokens, which the {kind} tokenizer reads as those tokens "
                    "('<pad>' 30 times, '<eos>' 30 times): generation stops at an end-of-sentence token and leaves the "
                    "others out of the text it prints; respell them where they are text (an end-of-sentence token "
                    "between documents is meant as one: leave those)"], said
    # the resumed run was told at its start; plain text says nothing
    corpus_plain = tmp_path / "plain.txt"
    corpus_plain.write_text(SPELT.replace("<eos>", "eos").replace("<pad>", "pad"), encoding="utf-8")
    for more in (["--set", f"train.out_dir={_q(tmp_path / 'run')}", "--set", "train.steps=2", "--resume"],
                 ["--set", f"train.out_dir={_q(tmp_path / 'plain')}", "--set", f"data.path={_q(corpus_plain)}"]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            code, _, err = run_cli(capsys, *args, *more)
        assert code == 0, err
        assert not [w for w in caught if "spells special tokens" in str(w.message)], more


def _words_alphabet(tokenizer, texts):
    """The alphabet as the characters of every pre-tokenized word (what WordPiece training took before)."""
    hf = tokenizer.hf
    return sorted({c for text in texts for word, _ in hf.pre_tokenizer.pre_tokenize_str(hf.normalizer.normalize_str(
        text)) for c in word})


@pytest.mark.parametrize("lowercase", [True, False])
def test_wordpiece_alphabet_is_every_character_of_the_words(lowercase):
    texts = ["Ünïcode\u00a0nbsp\u2028line\u3000ideographic\u200bzero\ufeffbom caf\u00e9 cafe\u0301 \u0130stanbul",
             "tabs\tand\x0bvertical\x0cform\x1ccontrol\x07bell \x00nul\r\ncrlf\u0085nel",
             "CJK 中文字符 and emoji 😀👍🏽👨‍👩‍👧 and punctuation ¡¿!?.,;:«»—–-'\"()[]{}",
             "RTL שלום مرحبا and combining a\u0301e\u0300 and ﬁ ligature and ＦＵＬＬ width",
             "numbers 3.14 1,000 and ##hashes and [MASK] [CLS] literal"] * 3
    tokenizer = train_tokenizer("wordpiece", texts, 400, lowercase=lowercase)
    vocab = set(tokenizer.hf.get_vocab())
    expected = _words_alphabet(tokenizer, texts)
    assert expected and set(expected) <= vocab
    # every character the words hold is a token of its own, and nothing else is (no space, no control character)
    alone = {t for t in vocab if len(t) == 1}
    assert alone == set(expected), sorted(alone ^ set(expected))


@pytest.mark.parametrize(("kind", "size", "options", "named"), [
    ("word", None, {"min_frequency": "2"}, "min_frequency must be a whole number of at least 1, got '2'"),
    ("word", None, {"min_frequency": 0}, "min_frequency must be a whole number of at least 1, got 0"),
    ("bpe", 300, {"min_frequency": None}, "min_frequency must be a whole number of at least 1, got None"),
    ("bpe", 300, {"min_frequency": -1}, "min_frequency must be a whole number of at least 1, got -1"),
    ("bpe", 300.5, {}, "vocab_size must be a whole number of at least 1, got 300.5"),
    ("word", 10.5, {}, "vocab_size must be a whole number of at least 1, got 10.5"),
    ("char", 7.5, {}, "vocab_size must be a whole number of at least 1, got 7.5"),
    ("wordpiece", True, {}, "vocab_size must be a whole number of at least 1, got True"),
])
def test_train_tokenizer_refuses_sizes_that_are_not_whole_numbers(kind, size, options, named):
    with pytest.raises(ConfigError, match=f"^{kind} tokenizer: {named.replace('.', '[.]')}$"):
        train_tokenizer(kind, ["a b c a b a"] * 5, size, **options)


def test_train_tokenizer_takes_numpy_whole_numbers():
    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokenizer = train_tokenizer("bpe", ["a b c a b a"] * 5, np.int64(263), min_frequency=np.int64(1))
    assert tokenizer.vocab_size == 263


@pytest.mark.parametrize("kind", ["word", "bpe", "wordpiece"])
def test_a_special_left_out_of_a_saved_tokenizer_is_none(tmp_path, kind):
    # A hand edit that dropped "eos" from the file's specials got the default "<eos>" back (the character tokenizer
    # already read it as None, as an "eos": null).
    import json

    from attnlab.data.tokenizers import load_tokenizer

    tokenizer = train_tokenizer(kind, ["a b c a b a <eos> d"] * 5, None if kind == "word" else 300)
    data = tokenizer.to_dict()
    del data["specials"]["eos"]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    loaded = load_tokenizer(path)
    assert loaded.eos_id is None and loaded.specials.eos is None and loaded.pad_id == tokenizer.pad_id
