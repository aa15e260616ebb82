"""Data files found misread by a fourth audit of the data pipeline: each case failed (a byte-order mark hiding a
repeated header, a JSONL message blaming the line for a setting, a long CSV field refused, CR-only line ends read
as one line, a max_length error naming no setting) before its fix."""

from __future__ import annotations

import csv
import json
import warnings

import pytest
from cli_helpers import one_line_error
from cli_helpers import toml_str as _q

from attnlab.data.text_files import read_classification_file, read_lines
from attnlab.errors import ConfigError, DataError

TINY = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu",
        "--set", "train.steps=1", "--set", "train.eval_every=0"]
BOM = "\ufeff"


@pytest.mark.parametrize("name, part, says, line", [
    ("joined.tsv", "sentence\tlabel\ngood film\t1\nbad film\t0\n", "repeat the header", 4),
    ("joined.csv", "text,label\ngood film,1\nbad film,0\n", "repeat the header", 4),
    # a headerless file first, a BOM-carrying one with a header after it
    ("mixed.tsv", None, "name the columns, as a header does", 3),
], ids=["tsv", "csv", "no header at the top"])
def test_a_header_after_a_byte_order_mark_inside_a_file_is_never_an_example(tmp_path, name, part, says, line):
    # Two files saved with a BOM (Notepad, Excel's "UTF-8" export) joined with `cat`: the second header's first cell
    # is "\ufeffsentence", which str.strip keeps, so the header became an example of a class "label".
    path = tmp_path / name
    if part is None:
        path.write_text("good film\t1\nbad film\t0\n" + BOM + "sentence\tlabel\nok film\t1\n", encoding="utf-8")
    else:
        path.write_text(BOM + part + BOM + part.replace("good film", "ok film").replace("bad film", "poor film"),
                        encoding="utf-8")
    with pytest.warns(UserWarning, match=f"1 row\\(s\\) {says} \\(the first at line {line}"):
        data = read_classification_file(path)
    assert data.label_names == ["0", "1"] and not any(BOM in text for text in data.texts)
    assert "sentence" not in data.texts and "text" not in data.texts


@pytest.mark.parametrize("name, part", [
    ("joined.tsv", "1\tgood film\n0\tbad film\n"),  # label first, as AG News files are: the BOM met the label
    ("joined.csv", "1,good film\r\n0,bad film\r\n"),
    ("joined.jsonl", '{"label": 1, "text": "good film"}\n{"label": 0, "text": "bad film"}\n'),  # not valid JSON
])
def test_a_byte_order_mark_inside_a_headerless_file_sticks_to_no_cell(tmp_path, name, part):
    path = tmp_path / name
    path.write_text(BOM + part + BOM + part, encoding="utf-8")
    columns = (None, None) if name.endswith(".jsonl") else (1, 0)
    data = read_classification_file(path, *columns)
    assert data.labels == ["1", "0", "1", "0"] and data.label_names == ["0", "1"]
    assert data.texts == ["good film", "bad film"] * 2


def test_two_spellings_of_one_number_as_labels_are_warned_of(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("text,label\ngood,1\nfine,1.0\nbad,0\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="the labels '1' and '1.0' are one number but two classes"):
        data = read_classification_file(path)
    assert data.label_names == ["0", "1", "1.0"]  # kept as written: the warning says how to mend the file
    path.write_text("text,label\ngood,1\nbad,0\nodd,-1\nother,pos\nbig,10000000000000000\nbigger,10000000000000001\n",
                    encoding="utf-8")  # two numbers a float takes for one
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_classification_file(path).label_names == ["-1", "0", "1", "10000000000000000",
                                                              "10000000000000001", "pos"]


@pytest.mark.parametrize("content, columns, says", [
    # the text field named "sentence" (as configs/encoder-classify.toml did), the file calls it "text"
    ('{"text": "good", "label": 1}\n', ("sentence", None),
     "line 1: no text field 'sentence' among the fields ['label', 'text']; set data.text_column "
     "(evaluate: --text-column) to one of them"),
    ('{"text": "good", "label": 1}\n', ("text", "lable"),
     "line 1: no label field 'lable' among the fields ['label', 'text']; if the file has no labels (a test split), "
     "give a labelled file, else set data.label_column (evaluate: --label-column) to one of them"),
    # no known name: the setting, as for a TSV header, not the library's argument
    ('{"review_body": "good", "stars": 1}\n', (None, None),
     "line 1: no text field among the fields ['review_body', 'stars']; set data.text_column "
     "(evaluate: --text-column) to one of them"),
    ('{"text": "good", "stars": 1}\n', (None, None),
     "line 1: no label field among the fields ['stars', 'text']; if the file has no labels (a test split), give a "
     "labelled file, else set data.label_column (evaluate: --label-column) to one of them"),
    # the field is there but holds no string: said so, with both fixes on the first line, "fix the line" after it
    ('{"text": 5, "label": 1}\n', (None, None),
     "line 1: no string field 'text': it holds a number, not a string; if another of the fields ['label', 'text'] "
     "holds the texts, set data.text_column (evaluate: --text-column) to it, else fix the line"),
    ('{"text": "good", "label": 1}\n{"text": {"a": 1}, "label": 0}\n', (None, None),
     "line 2: no string field 'text': it holds an object, not a string; fix the line"),
    ('{"text": "good", "label": 1}\n{"label": 0}\n', (None, None), "line 2: no string field 'text'; fix the line"),
], ids=["named text", "named label", "unknown text", "unknown label", "number on line 1", "object on line 2",
        "missing on line 2"])
def test_json_lines_name_the_setting_where_the_first_object_lacks_the_field(tmp_path, content, columns, says):
    path = tmp_path / "d.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_classification_file(path, *columns)
    assert str(err.value) == f"data file '{path}' {says}"


def test_json_lines_with_another_text_field_name_the_setting_in_the_command_line_error(tmp_path, capsys):
    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "this is good", "label": 1}\n{"text": "this is bad", "label": 0}\n', encoding="utf-8")
    line = one_line_error(capsys, "train", "configs/encoder-classify.toml", "--set", f"data.path={_q(path)}",
                          "--set", "data.text_column=\"sentence\"",  # named: the file calls it "text"
                          "--set", "data.eval_path=\"\"", "--set", f"train.out_dir={_q(tmp_path / 'run')}", *TINY)
    assert "line 1: no text field 'sentence' among the fields ['label', 'text']; set data.text_column" in line
    assert "fix the line" not in line


def test_a_csv_field_longer_than_csv_s_default_limit_is_read(tmp_path):
    # 150,000 characters: over csv's default field_size_limit (131,072), which refused the file as "malformed".
    long = ("word " * 30000).strip()
    limit = csv.field_size_limit()
    for name, content in [("a.csv", f'text,label\n"{long}",1\nshort,0\n'),
                          ("a.tsv", f"text\tlabel\n{long}\t1\nshort\t0\n"),
                          ("a.jsonl", json.dumps({"text": long, "label": 1}) + "\n"
                           + json.dumps({"text": "short", "label": 0}) + "\n")]:
        path = tmp_path / name
        path.write_text(content, encoding="utf-8")
        data = read_classification_file(path)
        assert data.texts == [long, "short"] and data.labels == ["1", "0"], name
    assert csv.field_size_limit() == limit  # raised for attnlab's read only
    bad = tmp_path / "bad.csv"
    bad.write_text('text,label\n"open quote,1\n', encoding="utf-8")
    with pytest.raises(DataError, match="line 2: malformed CSV"):
        read_classification_file(bad)
    assert csv.field_size_limit() == limit
    # Rows after the open quote: the line named is still the one where the bad row starts, not where csv gave up.
    bad.write_text('text,label\ngood,1\n"open quote,1\n' + "".join(f"row {i},0\n" for i in range(50)),
                   encoding="utf-8")
    with pytest.raises(DataError, match=r"line 3: malformed CSV \(.*runs on to line 53: a quote left open\?"):
        read_classification_file(bad)


@pytest.mark.parametrize("name, content", [
    ("cr.tsv", "sentence\tlabel\rthis is good\t1\rthis is bad\t0\r"),
    ("cr.jsonl", '{"text": "good", "label": 1}\r{"text": "bad", "label": 0}\r'),
    ("cr.src", "ein hund läuft\reine katze schläft\rder mann isst\r"),
    ("crlf_end.src", "ein hund läuft\reine katze schläft\rder mann isst\n"),  # CR line ends, one final LF
], ids=["tsv", "jsonl", "parallel text", "parallel text with a final LF"])
def test_cr_only_line_ends_are_refused_naming_the_file_and_the_fix(tmp_path, name, content):
    # Classic Mac OS line ends: the TSV read its rows as one header row, parallel text 40 pairs as one.
    path = tmp_path / name
    path.write_bytes(content.encode())
    read = read_lines if path.suffix == ".src" else read_classification_file
    with pytest.raises(DataError) as err:
        read(path)
    message = str(err.value)
    assert message.startswith(f"data file '{path}' uses CR-only line ends") and "\n" not in message
    assert "tr '\\r' '\\n'" in message and "mac2unix" in message


def test_cr_only_parallel_text_is_refused_by_the_source_and_crlf_still_reads(tmp_path):
    from attnlab.data.sources import ParallelTextSource
    from attnlab.data.tokenizers import WordTokenizer

    src, tgt = ["ein hund läuft", "eine katze schläft"] * 20, ["a dog runs", "a cat sleeps"] * 20
    (tmp_path / "cr.src").write_bytes(("\r".join(src) + "\r").encode())
    (tmp_path / "cr.tgt").write_bytes(("\r".join(tgt) + "\r").encode())
    tok = WordTokenizer.train(src + tgt, specials={"pad": "<pad>", "unk": "<unk>", "bos": "<bos>", "eos": "<eos>"})
    with pytest.raises(DataError, match="cr.src' uses CR-only line ends"):
        ParallelTextSource(tmp_path / "cr.src", tmp_path / "cr.tgt", tok, tok, 8)
    # CRLF line ends, and a stray CR inside a line of an LF file, read as before
    (tmp_path / "crlf.src").write_bytes(("\r\n".join(src) + "\r\n").encode())
    (tmp_path / "crlf.tgt").write_bytes(("\n".join(tgt[:-1]) + "\nlast\rline\n").encode())
    source = ParallelTextSource(tmp_path / "crlf.src", tmp_path / "crlf.tgt", tok, tok, 8)
    assert len(source) == 40 and read_lines(tmp_path / "crlf.src") == src
    assert read_lines(tmp_path / "crlf.tgt")[-1] == "last\rline"
    # csv reads CR-only and CRLF rows itself; the check on CR-only line ends covers the formats split on LF.
    for name, content in [("cr.csv", "text,label\rgood,1\rbad,0\r"), ("crlf.csv", 'text,label\r\n"a, b",1\r\nc,0\r\n'),
                          ("crlf.tsv", "sentence\tlabel\r\ngood\t1\r\nbad\t0\r\n"),
                          ("crlf.jsonl", '{"text": "good", "label": 1}\r\n{"text": "bad", "label": 0}\r\n')]:
        path = tmp_path / name
        path.write_bytes(content.encode())
        assert read_classification_file(path).labels == ["1", "0"], name


@pytest.mark.parametrize("prefix, suffix, least", [(True, True, 3), (True, False, 2)], ids=["cls sep", "cls"])
def test_a_max_length_too_short_for_the_special_tokens_names_the_setting_and_the_least(prefix, suffix, least):
    from attnlab.data.sources import ClassificationSource
    from attnlab.data.text_files import ClassificationData
    from attnlab.data.tokenizers import CharTokenizer

    tok = CharTokenizer.train("this is good, this is bad")
    data = ClassificationData(["this is good", "this is bad"], ["1", "0"], [2, 3])
    ends = {"prefix_ids": [tok.cls_id] if prefix else [], "suffix_ids": [tok.sep_id] if suffix else []}
    with pytest.raises(ConfigError) as err:
        ClassificationSource(data, tok, 2, max_length=least - 1, **ends)
    message = str(err.value)
    assert message.startswith(f"data.max_length {least - 1} leaves no room for text beside the {least - 1} special "
                              "token")
    assert f"raise data.max_length to at least {least} (evaluate" in message
    assert len(ClassificationSource(data, tok, 2, max_length=least, **ends).examples[0]) == least


def test_a_max_length_too_short_for_cls_and_sep_is_one_line_naming_the_setting(tmp_path, capsys):
    path = tmp_path / "t.tsv"
    path.write_text("sentence\tlabel\nthis is good\t1\nthis is bad\t0\n", encoding="utf-8")
    line = one_line_error(capsys, "train", "configs/encoder-classify.toml", "--set", f"data.path={_q(path)}",
                          "--set", "data.eval_path=\"\"", "--set", "data.max_length=2",
                          "--set", f"train.out_dir={_q(tmp_path / 'run')}", *TINY)
    assert "data.max_length 2 leaves no room" in line and "raise data.max_length to at least 3" in line


def test_bert_pretraining_text_with_cr_only_line_ends_is_refused(tmp_path, capsys):
    # Documents of one sentence a line, separated by blank lines, made one document of one "sentence" there.
    path = tmp_path / "docs.txt"
    path.write_text("The cat sat.\rIt was warm.\r\rA dog ran.\rIt was fast.\r" * 20, encoding="utf-8", newline="")
    line = one_line_error(capsys, "train", "configs/bert-mlm.toml", "--set", f"data.path={_q(path)}",
                          "--set", f"train.out_dir={_q(tmp_path / 'run')}", *TINY)
    assert f"'{path}' uses CR-only line ends" in line


def test_jsonl_texts_are_stripped_as_tsv_and_csv_cells_are(tmp_path):
    # The same padded examples read as "nice film" from a TSV but "  nice film  " from JSONL, and a classifier with a
    # BPE tokenizer scored the two files differently (stop-40 corpus audit).
    rows = [("  nice film  ", "1"), (" dull film ", "0")]
    (tmp_path / "a.tsv").write_text("text\tlabel\n" + "".join(f"{t}\t{lab}\n" for t, lab in rows), encoding="utf-8")
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in rows),
                                      encoding="utf-8")
    tsv, jsonl = (read_classification_file(tmp_path / name, None, None) for name in ("a.tsv", "a.jsonl"))
    assert jsonl.texts == tsv.texts == ["nice film", "dull film"]
