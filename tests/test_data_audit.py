"""Data files found wrong by an audit of the data pipeline: each case failed (a wrong line number, a
held-out part cut inside a word, UTF-16 read as text, a header read as an example...) before its fix."""

from __future__ import annotations

import json
import warnings

import pytest
from cli_helpers import one_line_error, run_cli
from cli_helpers import toml_str as _q

from attnlab.errors import DataError

TINY = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu",
        "--set", "train.steps=1", "--set", "train.eval_every=0"]


def test_a_bad_byte_in_the_held_out_part_is_reported_at_its_line_in_the_file(tmp_path):
    from attnlab.data.text_files import iter_text_blocks, line_split_offset

    path = tmp_path / "t.txt"
    lines = [f"line {i} of the text".encode() for i in range(2000)]
    lines[1950] = b"caf\xe9 au lait"  # latin-1
    path.write_bytes(b"\n".join(lines) + b"\n")
    cut = line_split_offset(path, 0.9)
    assert cut > 0
    for start in (0, cut):
        with pytest.raises(DataError, match="byte 0xe9 at line 1951 "):
            list(iter_text_blocks(path, block_bytes=4096, start=start))


def test_no_held_out_part_starts_inside_the_last_line(tmp_path):
    """A last line without a line end that spans the cut: it is held out whole (it was cut between two
    characters of a word) where that holds out at most twice the share asked for."""
    from attnlab.data.text_files import line_split_offset

    path = tmp_path / "t.txt"
    lines = "a first line of the text\n" * 40
    path.write_text(lines + "and a last line that runs on " * 4, encoding="utf-8")  # ~11 % of the file
    assert line_split_offset(path, 0.9) == len(lines)
    path.write_text("a first line\n" * 50 + "the last\n", encoding="utf-8")
    cut = line_split_offset(path, 0.9)
    assert path.read_bytes()[cut - 1:cut] == b"\n" and cut < path.stat().st_size


def test_a_whitespace_held_out_part_holds_nothing_out_with_a_warning(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 200 + (" " * 60 + "\n") * 40, encoding="utf-8")
    with pytest.warns(UserWarning, match="nothing held out for evaluation: .* holds only whitespace"):
        code, _, err = run_cli(capsys, "train", "--set", f"data.path={_q(text)}", "--set", "data.tokenizer=word",
                               "--set", "data.block_size=8", "--set", f"train.out_dir={_q(tmp_path / 'run')}",
                               "--set", "model.preset=gpt-char-tiny", "--set", "train.warmup_steps=0", *TINY)
    assert code == 0, err
    assert not (tmp_path / "run" / "data" / "val.bin").exists()


def test_held_out_whole_documents_must_give_sentence_pairs():
    """The last whole documents held out were one sentence each: no pair to evaluate, and the run failed
    blaming the whole file. Now the last sentences are held out instead."""
    from attnlab.data.text_files import held_out_documents

    docs = [[f"d{d} s{s}" for s in range(4)] for d in range(18)] + [["closing"], ["another"]]
    train, held = held_out_documents(docs, 0.1, min_documents=2)
    assert held and any(len(doc) >= 2 for doc in held) and len(held) >= 2
    assert [s for doc in train + held for s in doc] == [s for doc in docs for s in doc]
    # Whole documents still go out whole where they give pairs.
    assert held_out_documents(docs[:18] + [["x", "y"], ["z", "w"]], 0.1)[1] == [["x", "y"], ["z", "w"]]


@pytest.mark.parametrize("name", ["t.txt", "t.tsv"])
def test_utf16_without_a_byte_order_mark_is_refused(tmp_path, name):
    from attnlab.data.text_files import iter_text_blocks, read_text

    path = tmp_path / name
    path.write_bytes("The quick brown fox.\tpos\n".encode("utf-16-le") * 40)
    for read in (read_text, lambda p: list(iter_text_blocks(p))):
        with pytest.raises(DataError, match="holds NUL characters .*UTF-16 without a byte-order mark.*iconv"):
            read(path)


def test_utf16_text_is_refused_by_train_in_one_line(tmp_path, capsys):
    path = tmp_path / "t.txt"
    path.write_bytes("The quick brown fox jumps over the lazy dog.\n".encode("utf-16-le") * 40)
    line = one_line_error(capsys, "train", "--set", f"data.path={_q(path)}", "--set", "data.block_size=8",
                          "--set", f"train.out_dir={_q(tmp_path / 'run')}", *TINY)
    assert "UTF-16 without a byte-order mark" in line


def test_an_unknown_header_read_with_numbered_columns_is_warned_about(tmp_path):
    from attnlab.data.text_files import read_classification_file

    path = tmp_path / "unknown.tsv"
    path.write_text("id\tquery\tpassage\tis_relevant\n0\tHow?\tWhy?\t1\n1\tWhat?\tWho?\t0\n2\tA?\tB?\t1\n",
                    encoding="utf-8")
    with pytest.warns(UserWarning, match="line 1: the label 'is_relevant' is the only one that is not a number"):
        read_classification_file(path, 1, 3)
    by_name = read_classification_file(path, "query", "is_relevant")  # the header, read as one
    assert by_name.labels == ["1", "0", "1"]
    # QQP's header (question1, question2: a sentence pair) is recognised as one, numbered columns or not
    qqp = tmp_path / "qqp.tsv"
    qqp.write_text(path.read_text(encoding="utf-8").replace("query\tpassage\tis_relevant",
                                                            "question1\tquestion2\tis_duplicate"), encoding="utf-8")
    assert read_classification_file(qqp, 1, 3).labels == ["1", "0", "1"]


def test_an_unknown_header_over_word_labels_is_warned_about(tmp_path):
    """With word labels the header's label is a class of its one row: it was read as an example without a word."""
    from attnlab.data.text_files import read_classification_file

    path = tmp_path / "words.tsv"
    rows = "".join(f"{i}\tphrase number {i}\t{'pos' if i % 3 else 'neg'}\n" for i in range(12))
    path.write_text("id\tphrase\tpolarity\n" + rows, encoding="utf-8")
    with pytest.warns(UserWarning, match="line 1: the label 'polarity' is on no other row, while every other class "
                                         "has several, so the row may name the columns"):
        data = read_classification_file(path, 1, 2)
    assert data.labels[0] == "polarity"  # still read as an example: the warning says how to read it as a header
    assert read_classification_file(path, "phrase", "polarity").labels[0] == "neg"
    # a headerless file whose first class is merely rare in a small file, or has other rows, is not warned about
    small = tmp_path / "small.tsv"
    small.write_text("a\tx\nb\ty\nc\ty\n", encoding="utf-8")
    plain = tmp_path / "plain.tsv"
    plain.write_text(rows.replace("phrase number 0\tneg", "phrase number 0\tpos"), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_classification_file(small, 0, 1)
        read_classification_file(plain, 1, 2)


def test_a_json_array_is_told_apart_from_json_lines(tmp_path):
    from attnlab.data.text_files import read_classification_file

    records = [{"text": "good", "label": 1}, {"text": "bad", "label": 0}]
    one_line, pretty = tmp_path / "a.json", tmp_path / "b.json"
    one_line.write_text(json.dumps(records), encoding="utf-8")
    pretty.write_text(json.dumps(records, indent=2), encoding="utf-8")
    for path in (one_line, pretty):
        with pytest.raises(DataError, match=r"a JSON array is not JSON Lines: write one object per line"):
            read_classification_file(path)


def test_numbered_columns_of_json_lines_name_fields(tmp_path):
    from attnlab.data.text_files import read_classification_file

    path = tmp_path / "n.jsonl"
    path.write_text('{"0": "good film", "1": "pos"}\n{"0": "bad film", "1": "neg"}\n', encoding="utf-8")
    data = read_classification_file(path, 0, 1)
    assert data.texts == ["good film", "bad film"] and data.labels == ["pos", "neg"]
    with pytest.raises(DataError, match=r"fields have names, not numbers, and there is no field '2'.*\['0', '1'\]"):
        read_classification_file(path, 2, 1)


def test_a_repeated_header_row_is_skipped_with_a_warning(tmp_path):
    from attnlab.data.text_files import read_classification_file

    path = tmp_path / "joined.tsv"
    path.write_text("sentence\tlabel\ngood\t1\nbad\t0\nsentence\tlabel\nfine\t1\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="1 row\\(s\\) repeat the header \\(the first at line 4"):
        data = read_classification_file(path)
    assert data.texts == ["good", "bad", "fine"] and data.label_names == ["0", "1"] and data.line_numbers == [2, 3, 5]


@pytest.mark.parametrize("text, says, line", [
    # a headerless file with a labelled one appended (`cat`): the header row became a class "label"
    ("good film\t1\nbad film\t0\nsentence\tlabel\nok film\t1\n", "name the columns, as a header does", 3),
    # the header repeated in another case: compared as written, it became a class "Label"
    ("sentence\tlabel\ngood film\t1\nbad film\t0\nSentence\tLabel\nok film\t1\n", "repeat the header", 4),
], ids=["no header at the top", "another case"])
def test_a_header_row_inside_a_file_is_never_an_example(tmp_path, text, says, line):
    from attnlab.data.text_files import read_classification_file

    path = tmp_path / "joined.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.warns(UserWarning, match=f"1 row\\(s\\) {says} \\(the first at line {line}"):
        data = read_classification_file(path)
    assert data.texts == ["good film", "bad film", "ok film"] and data.label_names == ["0", "1"]


def test_a_header_naming_two_columns_alike_is_refused(tmp_path):
    # text,label,label read the first label column silently.
    from attnlab.data.text_files import read_classification_file

    path = tmp_path / "twice.csv"
    path.write_text("text,label,Label\ngood,1,pos\nbad,0,neg\n", encoding="utf-8")
    with pytest.raises(DataError, match="the header names columns 1 and 2 'label', so the label column is ambiguous"):
        read_classification_file(path)


def test_as_many_labels_as_examples_is_warned_about(tmp_path, capsys):
    """A headerless label-first CSV read with the default columns: the texts became the labels."""
    path = tmp_path / "label_first.csv"
    path.write_text("".join(f"{i % 2},a review of film number {i}\n" for i in range(40)), encoding="utf-8")
    with pytest.warns(UserWarning, match="has 40 different labels in 40 examples"):
        code, _, err = run_cli(capsys, "train", "configs/encoder-classify.toml", "--set", f"data.path={_q(path)}",
                               "--set", "data.eval_path=\"\"", "--set", "data.text_column=\"0\"",
                               "--set", "data.label_column=\"1\"", "--set", f"train.out_dir={_q(tmp_path / 'run')}",
                               *TINY)
    assert code == 0, err


def test_pairs_blank_on_both_sides_are_warned_about():
    from attnlab.data.sources import ParallelTextSource
    from attnlab.data.tokenizers import WordTokenizer

    tok = WordTokenizer.train(["a b c"], specials={"pad": "<pad>", "unk": "<unk>", "bos": "<bos>", "eos": "<eos>"})
    with pytest.warns(UserWarning, match="1 of 3 sentence pairs are blank on both sides \\(the first at line 2"):
        ParallelTextSource(["a b", "", "c"], ["b a", " ", "c"], tok, tok, 2)
    # the same source serves `evaluate`, which trains nothing: the warnings had said the pairs "teach" (seq2seq4)
    with pytest.warns(UserWarning) as caught:
        ParallelTextSource(["a b", "", "c", ""], ["b a", " ", "", "a"], tok, tok, 2)
    assert [str(w.message).split("): ")[1] for w in caught] == [
        "they pair a sentence with nothing (trained or scored alike); check that the files are aligned",
        "they pair nothing with nothing (trained or scored alike); remove the blank lines from both files"]
