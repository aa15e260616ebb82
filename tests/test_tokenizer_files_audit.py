"""Tokenizer audit: token files of a one-line corpus (text8) have the ids of one `encode`, tokenizer files with
bad fields are refused in one line, word patterns that match the empty string are refused, and the WordPiece
docstring says what decode does."""

from __future__ import annotations

import itertools
import json
import warnings

import numpy as np
import pytest

import attnlab.data.corpus as corpus
from attnlab.data.text_files import iter_text_blocks
from attnlab.data.tokenizers import (
    WordPieceTokenizer,
    WordTokenizer,
    last_word_cut,
    load_tokenizer,
    train_tokenizer,
)
from attnlab.errors import ConfigError, DataError

# One line, as text8 is: without the fix a block ended inside a word ("aga" + "inst" for "against").
ONE_LINE = "the quick brown fox jumps against the lazy dog and\tagainst  the cat " * 40
SIZES = {"char": None, "word": None, "bpe": 300, "wordpiece": 80}


def _tokenizer(kind: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # wordpiece: the vocabulary is raised to fit the alphabet
        if kind == "word-pattern":
            return train_tokenizer("word", ONE_LINE, pattern=r"\w+|[^\w\s]+")
        return train_tokenizer(kind, ONE_LINE, SIZES[kind], **({} if kind in ("char", "word") else
                                                                {"min_frequency": 1}))


def _ids(file) -> list[int]:
    return np.asarray(file).tolist()


@pytest.mark.parametrize("kind", ["char", "word", "bpe", "wordpiece", "word-pattern"])
def test_a_one_line_corpus_is_cut_between_words_and_keeps_the_ids_of_one_encode(tmp_path, monkeypatch, kind):
    tok = _tokenizer(kind)
    whole = tok.encode(ONE_LINE)
    # A string: blocks of 97 characters, none holding a line end, cut before a space or tab.
    assert _ids(corpus.build_token_file(ONE_LINE, tok, tmp_path / "s.bin", block_chars=97)) == whole
    blocks = list(corpus._blocks(ONE_LINE, 97))
    assert len(blocks) > 20 and "".join(blocks) == ONE_LINE
    ends = itertools.accumulate(map(len, blocks[:-1]))
    assert all(ONE_LINE[e] in " \t" and not ONE_LINE[e - 1].isspace() for e in ends)
    # A file, streamed (iter_text_blocks cuts the one line anywhere after four blocks), and a TextStream of
    # pieces cut anywhere: re-cut between words once four blocks hold no line end.
    path = tmp_path / "text8.txt"
    path.write_text(ONE_LINE, encoding="utf-8")
    monkeypatch.setattr(corpus, "BLOCK_BYTES", 16)
    assert _ids(corpus.build_token_file(path, tok, tmp_path / "p.bin")) == whole
    stream = corpus.TextStream(iter_text_blocks(path, 16))
    assert _ids(corpus.build_token_file(stream, tok, tmp_path / "t.bin")) == whole
    pieces = [ONE_LINE[i : i + 7] for i in range(0, len(ONE_LINE), 7)]
    assert _ids(corpus.build_token_file(corpus.TextStream(pieces), tok, tmp_path / "q.bin")) == whole


def test_a_text_without_spaces_or_tabs_is_still_cut_at_the_block_size(monkeypatch):
    assert list(corpus._blocks("abcdefg", 3)) == ["abc", "def", "g"]
    assert list(corpus._blocks("ab\u3000cd ef", 5)) == ["ab\u3000cd", " ef"]
    monkeypatch.setattr(corpus, "BLOCK_BYTES", 4)  # a piece of 16 characters without a line end is cut
    assert list(corpus._recut(["ab\u3000cd" * 4] * 2)) == ["ab\u3000cd" * 4] * 2  # other whitespace: at its end
    assert list(corpus._recut(["ab cd" * 4] * 2)) == ["ab cdab cdab cdab", " cd" + "ab cd" * 3 + "ab", " cd"]
    assert last_word_cut("ab  cd ef") == 6 and last_word_cut("ab  cd", 0, 6) == 2 and last_word_cut("ab\tcd") == 2
    assert last_word_cut(" ab") == -1 and last_word_cut("ab cd", 2) == -1 and last_word_cut("ab\u3000cd") == -1
    assert last_word_cut("ab" + " " * 1000) == 2


# ------------------------------------------------------------------------------------------------
# Tokenizer files
# ------------------------------------------------------------------------------------------------
def _saved(tmp_path, kind: str, edit) -> str:
    data = _tokenizer(kind).to_dict()
    edit(data)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _load_error(path) -> str:
    with pytest.raises(DataError) as info:
        load_tokenizer(path)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("version, says", [("1", "is not a whole number"), (True, "is not a whole number"),
                                           (1.0, "is not a whole number"), (-5, "does not exist"),
                                           (0, "does not exist"), (2, "is newer than this attnlab reads")])
def test_a_bad_format_version_is_refused_with_its_own_fix(tmp_path, version, says):
    message = _load_error(_saved(tmp_path, "char", lambda d: d.update(version=version)))
    assert says in message and repr(version) in message
    assert ("upgrade attnlab" in message) == (version == 2)
    assert load_tokenizer(_saved(tmp_path, "char", lambda d: d.update(version=1))).vocab_size > 0


def test_the_format_version_of_a_run_folder_is_one_line_at_the_command_line(tmp_path, capsys):
    from cli_helpers import one_line_error, toml_str

    from attnlab.cli import main

    run = tmp_path / "run"
    main(["train", "--set", "model.preset=gpt-char-tiny", "--set", "model.block_size=16", "--set",
          "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu", "--set",
          "train.eval_every=0", "--set", f"train.out_dir={toml_str(run)}", "--set", "train.steps=1", "--set",
          "train.warmup_steps=0"])
    file = run / "checkpoint" / "tokenizer.json"
    data = json.loads(file.read_text(encoding="utf-8"))
    file.write_text(json.dumps({**data, "version": "1"}), encoding="utf-8")
    line = one_line_error(capsys, "generate", str(run), "-p", "a", "-n", "2", "--device", "cpu")
    assert "tokenizer format version '1' is not a whole number" in line and "upgrade" not in line


def test_word_lowercase_must_be_a_boolean(tmp_path):
    # bool("false") is True: the file loaded as a lowercasing tokenizer
    message = _load_error(_saved(tmp_path, "word", lambda d: d.update(lowercase="false")))
    assert "lowercase must be true or false, got 'false'" in message
    with pytest.raises(ConfigError, match="lowercase must be true or false, got 1"):
        WordTokenizer(["<unk>"], specials={"pad": None, "mask": None, "cls": None, "sep": None, "bos": None,
                                           "eos": None}, lowercase=1)
    assert load_tokenizer(_saved(tmp_path, "word", lambda d: d.update(lowercase=True))).lowercase is True


def _edit_hf(data, edit) -> None:
    hf = json.loads(data["hf_tokenizer"])
    edit(hf)
    data["hf_tokenizer"] = json.dumps(hf)


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_the_embedded_truncation_and_padding_settings_are_ignored(tmp_path, kind):
    from tokenizers import Tokenizer as HFTokenizer

    def truncate_and_pad(data):
        hf = HFTokenizer.from_str(data["hf_tokenizer"])
        hf.enable_truncation(max_length=3)
        hf.enable_padding(length=50)
        data["hf_tokenizer"] = hf.to_str()

    tok = _tokenizer(kind)
    text = "the quick brown fox jumps against the lazy dog"
    loaded = load_tokenizer(_saved(tmp_path, kind, truncate_and_pad))
    assert loaded.encode(text) == tok.encode(text) and len(tok.encode(text)) > 3
    assert loaded.encode_batch([text, "the"]) == [tok.encode(text), tok.encode("the")]
    assert json.loads(loaded.to_dict()["hf_tokenizer"])["truncation"] is None


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_a_wrapped_hf_tokenizer_drops_its_truncation_padding_and_dropout(kind):
    # An HF tokenizer.json brought in by the constructor (the way to use a converted model's vocabulary, e.g.
    # all-MiniLM-L6-v2's, which pads and cuts to 128) kept those settings until saved and loaded again:
    # encode("hello world") gave 128 ids, a long text was cut short, without a word.
    from tokenizers import Tokenizer as HFTokenizer

    tok = _tokenizer(kind)
    text = "the quick brown fox jumps against the lazy dog"
    hf = HFTokenizer.from_str(tok.hf.to_str())
    hf.enable_truncation(max_length=3)
    hf.enable_padding(length=50)
    if kind == "bpe":
        hf.model.dropout = 0.9
    wrapped = type(tok)(hf, tok.specials)
    assert wrapped.encode(text) == tok.encode(text) and len(tok.encode(text)) > 3
    assert wrapped.encode_batch([text, "the"]) == [tok.encode(text), tok.encode("the")]
    assert wrapped.encode_array("the\nlazy dog").tolist() == tok.encode_array("the\nlazy dog").tolist()
    assert hf.truncation is not None and hf.padding is not None  # the caller's own tokenizer is left as it was


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
@pytest.mark.parametrize("new_id", [100_000, 9])  # a gap; an id two tokens share
def test_a_vocabulary_whose_ids_are_not_0_to_size_is_refused(tmp_path, kind, new_id):
    def move_the(hf):
        hf["model"]["vocab"]["the"] = new_id  # encode("the") gave id 100000, beyond any embedding

    message = _load_error(_saved(tmp_path, kind, lambda d: _edit_hf(d, move_the)))
    assert f"the embedded {kind} tokenizer's" in message and "do not have the ids 0 to" in message
    assert "none has id" in message and "save the tokenizer again" in message


# ------------------------------------------------------------------------------------------------
# Word patterns
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pattern", [r"\w*", r"\s*", r"\b", r"a?", r"(?=\w)"])
def test_a_word_pattern_matching_the_empty_string_is_refused(tmp_path, pattern):
    with pytest.raises(ConfigError, match="matches the empty string; make every match take at least one"):
        train_tokenizer("word", ONE_LINE, pattern=pattern)
    message = _load_error(_saved(tmp_path, "word", lambda d: d.update(pattern=pattern)))
    assert "matches the empty string" in message


def test_an_empty_match_the_probe_text_misses_is_refused_when_it_happens():
    specials = {"pad": None, "mask": None, "cls": None, "sep": None, "bos": None, "eos": None}
    tok = WordTokenizer(["<unk>", "x"], specials=specials, pattern=r"(?<=z)x*|x")
    assert tok.encode("x x") == [1, 1]
    with pytest.raises(ConfigError, match="matches the empty string"):
        tok.encode("z y")  # the empty match after "z" would be a word ''


# ------------------------------------------------------------------------------------------------
# WordPiece decode
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, decoded", [("Hello, world!", "Hello, world!"), ("It's (a) test.", "It ' s ( a ) test."),
                                           ("3.14", "3. 14")])
def test_the_wordpiece_docstring_says_what_decode_does(text, decoded):
    tok = train_tokenizer("wordpiece", "Hello, world! It's (a) test. 3.14\n" * 5, 200, min_frequency=1)
    assert tok.decode(tok.encode(text)) == decoded
    doc = " ".join(WordPieceTokenizer.__doc__.split())
    assert f'"{decoded}"' in doc and "re-attaches punctuation" not in doc


def test_embedded_bpe_dropout_is_ignored(tmp_path):
    """BPE dropout skips merges at random, so a file that sets it encoded one text to other ids at every call."""
    def set_dropout(hf):
        hf["model"]["dropout"] = 0.5

    tok = _tokenizer("bpe")
    text = "the quick brown fox jumps against the lazy dog " * 3
    loaded = load_tokenizer(_saved(tmp_path, "bpe", lambda d: _edit_hf(d, set_dropout)))
    assert all(loaded.encode(text) == tok.encode(text) for _ in range(5))
    assert json.loads(loaded.to_dict()["hf_tokenizer"])["model"]["dropout"] is None


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_an_embedded_unknown_token_missing_from_the_vocabulary_is_refused(tmp_path, kind):
    """HF would load it and fail at the first unknown word with an exception of its own."""
    def rename_unk(hf):
        hf["model"]["unk_token"] = "[UNK]"

    message = _load_error(_saved(tmp_path, kind, lambda d: _edit_hf(d, rename_unk)))
    assert "unknown token '[UNK]' is not in its vocabulary" in message and "save the tokenizer again" in message


def test_char_decode_of_an_id_beyond_64_bits_is_out_of_range():
    tok = _tokenizer("char")
    with pytest.raises(DataError, match=f"token id {2**70} is out of range"):
        tok.decode([1, 2**70])
