"""Tokenizers: round trips, specials, training, save/load, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnlab.data.tokenizers import (
    BPETokenizer,
    CharTokenizer,
    SpecialTokens,
    WordPieceTokenizer,
    WordTokenizer,
    load_tokenizer,
    train_tokenizer,
)
from attnlab.errors import AttnlabError, CheckpointError, ConfigError, DataError

TEXT = (
    "The quick brown fox jumps over the lazy dog.\n"
    "A tokenizer maps text to ids, and ids back to text!\n"
    "Attention is all you need; attention weights sum to one.\n"
    "The dog sleeps. The fox runs. Tokens, tokens, tokens.\n"
) * 5
LINES = TEXT.splitlines()
SAMPLE = "The lazy fox, attention; ids to text!"


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message and message
    return message


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(LINES, vocab_size=320, min_frequency=2)


@pytest.fixture(scope="module")
def wordpiece() -> WordPieceTokenizer:
    return WordPieceTokenizer.train(LINES, vocab_size=200, min_frequency=1)


def test_char_train_vocab_and_specials():
    tok = CharTokenizer.train(TEXT)
    specials = SpecialTokens().tokens()
    assert tok.vocab()[: len(specials)] == specials
    assert tok.vocab()[len(specials) :] == sorted(set(TEXT))
    assert (tok.pad_id, tok.unk_id, tok.mask_id, tok.cls_id, tok.sep_id, tok.bos_id, tok.eos_id) == tuple(
        range(7)
    )
    assert tok.vocab_size == 7 + len(set(TEXT))
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert tok.encode_batch(["ab", "", "The"]) == [tok.encode("ab"), [], tok.encode("The")]
    assert tok.encode_batch([]) == []


def test_char_explicit_list_in_given_order():
    chars = ["□", "⁇", *sorted(set(TEXT))]
    tok = CharTokenizer(chars, pad="□", mask="⁇")
    assert tok.pad_id == 0 and tok.mask_id == 1
    assert tok.unk_id is None and tok.cls_id is None and tok.eos_id is None
    assert tok.vocab() == chars
    ids = tok.encode("⁇The fox□")
    assert ids[0] == 1 and ids[-1] == 0
    assert tok.decode(ids) == "⁇The fox"  # padding dropped
    assert tok.decode(ids, skip_special_tokens=True) == "The fox"


def test_char_unknown_character():
    tok = CharTokenizer(["a", "b"])
    with pytest.raises(DataError) as err:
        tok.encode("abé")
    assert "'é'" in one_line(err) and "U+00E9" in str(err.value)
    with pytest.raises(DataError) as err:
        tok.encode_batch(["ab", "bbé"])
    assert "position 2" in one_line(err)
    with_unk = CharTokenizer(["<unk>", "a", "b"], unk="<unk>")
    assert with_unk.encode("abé✓a") == [1, 2, 0, 0, 1]
    assert with_unk.encode("") == []


def test_char_rejects_bad_lists():
    with pytest.raises(ConfigError):
        CharTokenizer(["a", "a"])
    with pytest.raises(ConfigError):
        CharTokenizer(["a", "bc"])
    with pytest.raises(ConfigError):
        CharTokenizer(["a", "b"], pad="□")


def test_char_vectorised_encode_matches_per_character_lookup():
    rng = np.random.default_rng(0)
    alphabet = sorted(set("abcdefgh \n\tπ∑😀"))
    text = "".join(rng.choice(alphabet, size=5000))
    tok = CharTokenizer.train(text, specials={"cls": None, "sep": None})
    expected = [tok.token_to_id(c) for c in text]
    assert tok.encode(text) == expected
    assert tok.encode_array([text[:100], text[100:]]).tolist() == expected


def test_char_vocab_size_keeps_most_frequent():
    tok = CharTokenizer.train("aaaabbbcc d", vocab_size=7 + 2)
    assert tok.vocab()[7:] == ["a", "b"]
    assert tok.encode("abc") == [7, 8, tok.unk_id]


def test_word_tokenizer():
    tok = WordTokenizer.train(LINES, vocab_size=20, min_frequency=2)
    assert tok.vocab_size == 20
    assert tok.vocab()[:7] == SpecialTokens().tokens()
    assert tok.vocab()[7] == "The"  # most frequent word first
    ids = tok.encode("The fox zebra")
    assert ids[2] == tok.unk_id
    assert tok.decode(ids) == "The fox <unk>"
    assert tok.decode(ids, skip_special_tokens=True) == "The fox"
    regex = WordTokenizer.train(TEXT, pattern=r"\w+|[^\w\s]", lowercase=True)
    assert regex.decode(regex.encode("The dog, the fox.")) == "the dog , the fox ."


def test_word_without_unk_raises():
    tok = WordTokenizer.train("a b c", specials=SpecialTokens.none())
    assert tok.encode("c b a") == [2, 1, 0]
    with pytest.raises(DataError) as err:
        tok.encode("a zebra")
    assert "'zebra'" in one_line(err)


def test_bpe_round_trip_is_exact(bpe):
    assert bpe.vocab_size == 320
    assert bpe.special_ids == list(range(7))
    for text in (SAMPLE, TEXT, "  odd   spacing\n\ttabs ✓ déjà vu 😀", ""):
        assert bpe.decode(bpe.encode(text)) == text
    assert bpe.encode_batch(LINES[:3]) == [bpe.encode(line) for line in LINES[:3]]
    assert bpe.encode_array(TEXT + "tail").tolist() == bpe.encode(TEXT + "tail")
    assert len(bpe.encode("attention")) < len("attention")  # merges learnt


CODE = "def f():\n    return 1\n\ndef g():\n    x = 2  \n    return x\r\n\tif y:\n  \n\n        pass\n" * 20


@pytest.mark.parametrize("kind", ["bpe", "wordpiece", "word", "char"])
def test_corpus_ids_equal_one_encode_of_the_whole_text(tmp_path, monkeypatch, kind):
    """Token files encode a text in pieces (lines encoded in parallel, ~1 MB blocks from disk). The pieces
    are cut before a line end that follows a non-space character, so the ids are those of one `encode`:
    byte-level BPE joins a line end to the next line's indentation ("\n   " + " return"), which a cut after
    the newline would part."""
    import attnlab.data.corpus as corpus
    from attnlab.data.tokenizers import last_piece_cut, text_pieces, train_tokenizer

    tok = train_tokenizer(kind, [CODE], vocab_size=300)
    text = CODE * 5 + "tail   "
    whole = tok.encode(text)
    if kind == "bpe":
        assert any("Ċ" in t and "Ġ" in t for t in map(tok.id_to_token, whole))  # a line end merged with indentation
    assert "".join(text_pieces(text)) == text and len(text_pieces(text)) > 100
    assert tok.encode_array(text).tolist() == whole
    (tmp_path / "code.txt").write_text(text, encoding="utf-8", newline="")
    monkeypatch.setattr(corpus, "BLOCK_BYTES", 97)  # many blocks from disk
    assert np.asarray(corpus.build_token_file(tmp_path / "code.txt", tok, tmp_path / "a.bin")).tolist() == whole
    assert np.asarray(corpus.build_token_file(text, tok, tmp_path / "b.bin", block_chars=97)).tolist() == whole
    from attnlab.data.text_files import iter_text_blocks  # the blocks `attnlab train` reads, cut after line ends

    stream = corpus.TextStream(iter_text_blocks(tmp_path / "code.txt", 97))
    assert np.asarray(corpus.build_token_file(stream, tok, tmp_path / "c.bin")).tolist() == whole
    assert last_piece_cut("ab\n  cd\n\n  \n") == 7 and last_piece_cut("ab\r\n cd  \n") == 2
    assert last_piece_cut("\n\n  \n") == -1 and last_piece_cut("ab\ncd", 2) == -1


def test_bpe_specials_in_text_and_decode(bpe):
    ids = bpe.encode("fox <mask> dog")
    assert bpe.mask_id in ids
    assert bpe.decode([bpe.pad_id, *ids, bpe.pad_id]) == "fox <mask> dog"
    assert bpe.decode([bpe.bos_id, *bpe.encode("fox")], skip_special_tokens=True) == "fox"


def test_bpe_too_small_vocab():
    with pytest.raises(ConfigError) as err:
        BPETokenizer.train(LINES, vocab_size=100)
    assert "263" in one_line(err)


def test_wordpiece_round_trip(wordpiece):
    assert wordpiece.unk_id == 1
    # The WordPiece decoder re-attaches . , ! ? but puts a space before other punctuation.
    text = "The lazy fox, attention ids to text!"
    assert wordpiece.decode(wordpiece.encode(text)) == text
    assert wordpiece.decode(wordpiece.encode("one; two")) == "one ; two"
    ids = wordpiece.encode("The fox \u03a9\u03c8")  # Greek letters: not in the training text
    assert ids.count(wordpiece.unk_id) == 1
    assert wordpiece.decode(ids) == "The fox <unk>"
    # Every character of the training text has a word-initial and a "##" form: no unknown pieces there.
    assert wordpiece.unk_id not in wordpiece.encode("zzqx xqzz")
    assert any(wordpiece.id_to_token(i).startswith("##") for i in range(wordpiece.vocab_size))


def test_wordpiece_training_is_deterministic_across_processes(tmp_path):
    """HF's WordPiece trainer numbers the "##" pieces in hash-map order (huggingface/tokenizers#1794), which
    varies from process to process; attnlab fixes their numbers first, so every process gets one vocabulary."""
    import subprocess
    import sys

    script = ("import hashlib, json; from pydoc_data.topics import topics; "
              "from attnlab.data.tokenizers import WordPieceTokenizer as W; "
              "t = W.train(list(topics.values())[:200], vocab_size=1500); "
              "print(hashlib.sha1(json.dumps(t.to_dict(), sort_keys=True).encode()).hexdigest())")
    digests = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                              timeout=120).stdout for _ in range(3)}
    assert len(digests) == 1


@pytest.mark.parametrize("kind", ["char", "word", "bpe", "wordpiece"])
def test_save_load_equal(kind, tmp_path, bpe, wordpiece):
    tok = {
        "char": CharTokenizer.train(TEXT),
        "word": WordTokenizer.train(TEXT, pattern=r"\w+|\S", lowercase=True),
        "bpe": bpe,
        "wordpiece": wordpiece,
    }[kind]
    path = tok.save(tmp_path)
    assert path == tmp_path / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["type"] == kind
    loaded = load_tokenizer(tmp_path)
    assert type(loaded) is type(tok)
    assert loaded.to_dict() == tok.to_dict()
    assert loaded.encode(SAMPLE) == tok.encode(SAMPLE)
    assert loaded.decode(tok.encode(SAMPLE)) == tok.decode(tok.encode(SAMPLE))
    assert [loaded.pad_id, loaded.mask_id, loaded.eos_id] == [tok.pad_id, tok.mask_id, tok.eos_id]


def test_a_run_folder_gives_the_tokenizer_of_its_checkpoint(tmp_path):
    # `attnlab train` saves tokenizer.json in checkpoint/ and best/, never at the top of the run folder.
    tok = CharTokenizer.train(TEXT)
    (tmp_path / "checkpoint").mkdir()
    tok.save(tmp_path / "checkpoint")
    assert load_tokenizer(tmp_path).to_dict() == tok.to_dict()
    (tmp_path / "checkpoint").rename(tmp_path / ".checkpoint.old")  # a save that crashed between its two renames
    assert load_tokenizer(tmp_path).to_dict() == tok.to_dict()


def test_a_run_folder_of_best_alone_gives_its_tokenizer(tmp_path):
    # A run whose only checkpoint is best/ (its checkpoint/ removed): load_model read it, load_tokenizer did not.
    from attnlab.models.registry import build_model, get_preset
    from attnlab.training.checkpoint import load_model, save_checkpoint

    tok = CharTokenizer.train(TEXT)
    model = build_model(get_preset("gpt-char-tiny")[1].replace(vocab_size=tok.vocab_size))
    save_checkpoint(tmp_path / "best", model, tokenizer=tok)
    assert load_model(tmp_path) is not None
    assert load_tokenizer(tmp_path).to_dict() == tok.to_dict()


def test_save_load_explicit_char_list(tmp_path):
    tok = CharTokenizer(["□", "⁇", "a", "b"], pad="□", mask="⁇")
    loaded = load_tokenizer(tok.save(tmp_path / "x" / "chars.json"))
    assert (
        loaded.vocab() == tok.vocab() and loaded.pad_id == 0 and loaded.mask_id == 1 and loaded.unk_id is None
    )


def test_load_errors(tmp_path):
    with pytest.raises(DataError) as err:
        load_tokenizer(tmp_path / "missing.json")
    one_line(err)
    with pytest.raises(CheckpointError) as err:
        load_tokenizer(tmp_path)
    one_line(err)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(DataError) as err:
        load_tokenizer(bad)
    one_line(err)
    bad.write_text(json.dumps({"type": "sentencepiece"}), encoding="utf-8")
    with pytest.raises(DataError) as err:
        load_tokenizer(bad)
    assert "char, word, bpe, wordpiece" in one_line(err)
    bad.write_text(json.dumps({"type": "char", "version": 1}), encoding="utf-8")
    with pytest.raises(DataError) as err:
        load_tokenizer(bad)
    one_line(err)
    bad.write_text(json.dumps({"type": "bpe", "specials": {}, "hf_tokenizer": "{}"}), encoding="utf-8")
    with pytest.raises(DataError) as err:
        load_tokenizer(bad)
    one_line(err)


def test_train_tokenizer_factory():
    for kind, size in (("char", None), ("word", 30), ("bpe", 300), ("wordpiece", 120)):
        tok = train_tokenizer(kind, LINES, size)
        assert tok.kind == kind
        if size is not None:
            assert tok.vocab_size <= size
    with pytest.raises(ConfigError) as err:
        train_tokenizer("sentencepiece", LINES, 100)
    assert "char, word, bpe, wordpiece" in one_line(err)
    with pytest.raises(ConfigError) as err:
        train_tokenizer("char", LINES, None, min_frequency=3)
    assert "min_frequency" in one_line(err)


def test_custom_special_strings():
    specials = {"pad": "[PAD]", "unk": "[UNK]", "mask": "[MASK]", "cls": "[CLS]", "sep": "[SEP]", "bos": None}
    tok = WordPieceTokenizer.train(LINES, vocab_size=150, specials=specials)
    assert tok.id_to_token(tok.cls_id) == "[CLS]" and tok.bos_id is None and tok.eos_id == 5
    with pytest.raises(ConfigError):
        SpecialTokens(pad="x", unk="x")
    with pytest.raises(ConfigError):
        SpecialTokens.coerce({"padding": "x"})


def test_decode_out_of_range_id():
    tok = CharTokenizer.train("abc")
    with pytest.raises(DataError) as err:
        tok.decode([tok.vocab_size])
    one_line(err)
    with pytest.raises(AttnlabError):
        tok.id_to_token(-1)


@pytest.mark.slow
def test_real_corpus_tokenizers(tmp_path, shared_data):
    path = shared_data("tinyshakespeare", "input.txt")
    text = path.read_text(encoding="utf-8")
    char = CharTokenizer.train(text)
    assert char.decode(char.encode(text)) == text
    bpe = BPETokenizer.train(text.splitlines(keepends=True), vocab_size=1000)
    part = text[:20000]
    assert bpe.decode(bpe.encode(part)) == part
    assert len(bpe.encode(part)) < len(part) / 2
