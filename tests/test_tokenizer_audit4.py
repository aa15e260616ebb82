"""Tokenizer audit 4: WordPiece spends no vocabulary on "##" forms that can never occur, byte-level BPE decodes
specials of Latin-1 characters as written, lone surrogates and non-str texts are refused in one line by every
kind (encode, encode_batch, training), a word tokenizer file with a non-string token is refused at load, and
decode takes one sequence of integer ids and refuses a batch or floats in one line."""

from __future__ import annotations

import json
import re
import unicodedata
import warnings

import numpy as np
import pytest
import torch

from attnlab.data.tokenizers import load_tokenizer, train_tokenizer
from attnlab.errors import DataError

KINDS = {"char": None, "word": None, "bpe": 300, "wordpiece": 80}
TEXT = "the quick brown fox jumps over the lazy dog\n" * 5


def _train(kind: str, texts=TEXT, size=None, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # wordpiece: the vocabulary is raised to fit the alphabet
        if kind in ("bpe", "wordpiece"):
            options.setdefault("min_frequency", 1)
        return train_tokenizer(kind, texts, size if size is not None else KINDS[kind], **options)


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert message and "\n" not in message
    return message


# -- WordPiece: "##" forms only for characters that can follow another inside a word ---------------------------
HANZI = "".join(chr(0x4E00 + i) for i in range(20))
CJK_LINES = [f"{HANZI[i % 20]}{HANZI[(3 * i) % 20]}，attention weights sum to one. the tokens, the tokenizer!"
             for i in range(40)]


def _is_cjk(c: str) -> bool:
    return "\u4e00" <= c <= "\u9fff"


def test_wordpiece_on_cjk_text_learns_pieces_within_a_vocab_size_its_real_need_fits():
    letters = {c for line in CJK_LINES for c in line if c.isalpha() and not _is_cjk(c)}
    punctuation = {c for line in CJK_LINES for c in line if unicodedata.category(c).startswith("P")}
    # specials, every character alone, and only the letters also as "##" pieces: 7 + 20 + 15 + 4 + 15 = 61
    need = 7 + len(HANZI) + len(letters) + len(punctuation) + len(letters)
    tok = _train("wordpiece", CJK_LINES, need + 30)
    vocab = tok.vocab()
    assert not [t for t in vocab if t.startswith("##") and (_is_cjk(t[2]) or t[2] in punctuation)]
    learned = [t for t in vocab if len(t.removeprefix("##")) > 1 and t not in tok.specials.tokens()]
    assert len(learned) >= 20  # without the fix: the 24 dead "##" forms left 6 places


def test_wordpiece_warning_counts_the_tokens_the_characters_really_need():
    letters = {c for line in CJK_LINES for c in line if c.isalpha() and not _is_cjk(c)}
    with pytest.warns(UserWarning) as caught:
        tok = train_tokenizer("wordpiece", CJK_LINES, 30, min_frequency=1)
    need = 7 + len(HANZI) + len(letters) + 4 + len(letters)
    message = next(str(w.message) for w in caught if "wordpiece vocab_size" in str(w.message))
    assert f"below the {need} tokens" in message and tok.vocab_size == need


def test_every_single_character_continuation_piece_can_be_encoded():
    tok = _train("wordpiece", CJK_LINES, 200)
    vocab = set(tok.vocab())
    for piece in (t for t in vocab if t.startswith("##") and len(t) == 3):
        word = "z" + piece[2]  # "z" is a letter of the text: one word, cut into "z" and the piece
        if word not in vocab:
            assert piece in [tok.id_to_token(i) for i in tok.encode(word)], piece


# -- byte-level BPE: specials come back as written --------------------------------------------------------------
def test_bpe_specials_of_latin1_characters_decode_as_written():
    bpe = _train("bpe", TEXT + "café\n", 300, specials={"mask": "«mask»", "eos": "¶", "unk": "ünk", "sep": "<sep>"})
    text = "the fox «mask» ünk café¶ <sep> über¶"
    ids = bpe.encode(text)
    assert {bpe.mask_id, bpe.eos_id, bpe.unk_id, bpe.sep_id} <= set(ids)
    assert bpe.decode(ids) == text
    assert bpe.decode(ids, skip_special_tokens=True) == "the fox   café  über"
    assert bpe.decode([bpe.mask_id]) == "«mask»"


def test_bpe_ascii_specials_and_wordpiece_spacing_are_unchanged():
    bpe = _train("bpe", TEXT, 300)
    assert bpe.decode(bpe.encode("x<mask>y <eos>")) == "x<mask>y <eos>"
    wordpiece = _train("wordpiece", TEXT + "café\n", 100, specials={"mask": "⁇"})
    assert wordpiece.decode(wordpiece.encode("fox⁇dog café⁇")) == "fox ⁇ dog café ⁇"


# -- lone surrogates ---------------------------------------------------------------------------------------------
SURROGATE = re.escape("has an invalid character '\\udcff' at position 4 (a lone surrogate)")


@pytest.mark.parametrize("kind", KINDS)
def test_a_lone_surrogate_is_refused_by_every_kind_naming_its_position(kind):
    tok = _train(kind, specials={"unk": "<unk>"} if kind == "char" else None)
    text = "abc \udcff def"
    for encode in (tok.encode, tok.encode_array):
        with pytest.raises(DataError, match="^text " + SURROGATE) as err:
            encode(text)
        _one_line(err)
    with pytest.raises(DataError, match="^text 1 " + SURROGATE):
        tok.encode_batch(["fine", text])


@pytest.mark.parametrize("kind", KINDS)
def test_training_on_a_lone_surrogate_is_refused_naming_the_text(kind):
    with pytest.raises(DataError, match="^text 1 " + SURROGATE):
        _train(kind, ["the fox\n", "abc \udcff def\n"])


# -- a non-string token in a word tokenizer file -----------------------------------------------------------------
def test_a_word_tokenizer_file_with_a_non_string_token_is_refused_at_load(tmp_path):
    data = _train("word").to_dict()
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({**data, "tokens": [*data["tokens"], 5]}), encoding="utf-8")
    with pytest.raises(DataError, match=r"word vocabulary entry \d+ is 5, not a string") as err:
        load_tokenizer(path)
    assert str(path) in _one_line(err)


# -- what decode and encode take ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_decode_takes_one_sequence_of_integer_ids_in_any_container(kind):
    tok = _train(kind)
    ids = tok.encode("the lazy dog")
    expected = tok.decode(ids)
    for given in (tuple(ids), np.array(ids), torch.tensor(ids), [np.int64(i) for i in ids], iter(ids)):
        assert tok.decode(given) == expected


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("given, says", [
    ([[8, 9, 10]], "decode takes one sequence of ids, not a batch (item 0 is a list); decode each row"),
    (torch.tensor([[8, 9, 10]]), "decode takes one sequence of ids, not a batch of shape (1, 3); decode each row"),
    (torch.tensor(8), "decode takes a sequence of ids, got a single id"),
    ([8.9, 9.9], "token id 8.9 at position 0 is not an integer"),
    (np.array([8, 9.5]), "token id 8.0 at position 0 is not an integer"),
    ([8, True], "token id True at position 1 is not an integer"),
    (8, "decode takes a sequence of ids, got int"),
], ids=["nested-list", "2d-tensor", "0d-tensor", "floats", "float-array", "bool", "int"])
def test_decode_refuses_a_batch_a_single_id_and_floats_in_one_line(kind, given, says):
    tok = _train(kind)
    with pytest.raises(DataError, match="^" + re.escape(says)) as err:
        tok.decode(given)
    _one_line(err)


@pytest.mark.parametrize("kind", KINDS)
def test_encode_refuses_anything_but_one_str_and_encode_batch_one_str(kind):
    tok = _train(kind)
    with pytest.raises(DataError, match=r"^encode takes one text \(a str\), got list; .*encode_batch") as err:
        tok.encode(["the", "fox"])
    _one_line(err)
    with pytest.raises(DataError, match=r"^encode_batch takes a list of texts, got one str"):
        tok.encode_batch("the fox")
    with pytest.raises(DataError, match=r"^text 1 is bytes, not a str"):
        tok.encode_batch(["the", b"fox"])
