"""Classification tables of the fifth data audit: a TSV written with CSV quoting (pandas, Python's csv module), a
file whose extension names the other separator, and a headerless two-column file given only its text column."""

from __future__ import annotations

import csv

import pytest
from cli_helpers import one_line_error
from cli_helpers import toml_str as _q

from attnlab.data.text_files import read_classification_file
from attnlab.errors import DataError


def _quoted_tsv(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")  # quotes only the cells that need it
        writer.writerow(["sentence", "label"])
        writer.writerows(rows)


def test_a_csv_quoted_tsv_cell_is_read_as_written_and_warned_of(tmp_path):
    path = tmp_path / "q.tsv"
    _quoted_tsv(path, [['the "best" film', 1], ["dull", 0], ['a "b" c', 1]])
    with pytest.warns(UserWarning, match=r"line 2: the text looks quoted as a CSV writer quotes it .*read without "
                                         r"quoting.*save it unquoted \(pandas: quoting=csv.QUOTE_NONE\) or as a "
                                         r"\.csv file") as caught:
        data = read_classification_file(path)
    assert data.texts[0] == '"the ""best"" film"'  # a TSV has no quoting: GLUE's texts hold bare quotes
    assert len([w for w in caught if "looks quoted" in str(w.message)]) == 1  # one warning for the file


def test_bare_quotes_of_a_glue_tsv_are_not_warned_of(tmp_path, recwarn):
    path = tmp_path / "glue.tsv"
    path.write_text('sentence\tlabel\n"hide new secretions\t0\nit \'s "" fun\t1\n"quoted" whole\t1\n"" \t0\n')
    assert read_classification_file(path).texts[0] == '"hide new secretions'
    assert not [w for w in recwarn if "looks quoted" in str(w.message)]


@pytest.mark.parametrize("cell", ["a\tb", "first line\nsecond line"])
def test_a_quoted_tab_or_line_break_in_a_tsv_says_why_the_row_splits(tmp_path, cell):
    path = tmp_path / "q.tsv"
    _quoted_tsv(path, [[cell, 1], ["dull", 0]])
    with pytest.raises(DataError, match=r"line 2: expected 2 tab-separated columns, found [13]; a \.tsv file is read "
                                        r"without quoting .*so a quoted tab or line break splits a row"):
        read_classification_file(path)


def test_a_short_tsv_row_without_quotes_keeps_the_plain_fix(tmp_path):
    path = tmp_path / "a.tsv"
    path.write_text("sentence\tlabel\ngreat\t1\nshort row\n")
    with pytest.raises(DataError, match=r"line 3: expected 2 tab-separated columns, found 1; fix the line$"):
        read_classification_file(path)


@pytest.mark.parametrize("name, content, other", [
    ("tabs.csv", "sentence\tlabel\ngreat movie\t1\n", ".tsv"),
    ("commas.tsv", "sentence,label\ngreat movie,1\n", ".csv"),
    ("bare.csv", "great movie\t1\ndull\t0\n", ".tsv"),
])
def test_a_file_named_for_the_other_separator_is_told_to_be_renamed(tmp_path, name, content, other):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError, match=rf"line 1 has one .* column but looks .*name the file \{other}$"):
        read_classification_file(path)


def test_the_renaming_fix_on_the_command_line(capsys, tmp_path):
    path = tmp_path / "tabs.csv"
    path.write_text("sentence\tlabel\ngreat movie\t1\ndull film\t0\n")
    line = one_line_error(capsys, "train", "--set", "model.family=encoder", "--set", "data.task=classification",
                          "--set", f"data.path={_q(path)}", "--set", f"train.out_dir={_q(tmp_path / 'run')}")
    assert line.endswith("looks tab-separated (the separator is chosen by the file's extension); name the file .tsv")


def test_naming_the_text_column_of_a_headerless_pair_takes_the_other_for_the_labels(tmp_path):
    path = tmp_path / "label_first.tsv"
    path.write_text("1\tgreat movie\n0\tdull film\n")
    data = read_classification_file(path, 1)
    assert (data.texts, data.labels) == (["great movie", "dull film"], ["1", "0"])
    data = read_classification_file(path, 0)  # text first: the label stays column 1
    assert (data.texts, data.labels) == (["1", "0"], ["great movie", "dull film"])


def test_a_label_defaulting_onto_the_named_text_column_names_the_label_setting(tmp_path):
    path = tmp_path / "three.tsv"
    path.write_text("x\tgreat movie\t1\ny\tdull film\t0\n")
    with pytest.raises(DataError, match=r"the text and the label column are the same \(1\).*set data.label_column "
                                        r"\(evaluate: --label-column\) to the column of the labels"):
        read_classification_file(path, 1)
    with pytest.raises(DataError, match=r"are the same \(1\).*set data.text_column \(evaluate: --text-column\) to "
                                        r"the column of the texts"):
        read_classification_file(path, 1, 1)


def test_evaluate_names_the_runs_numbered_columns_where_a_file_does_not_fit_them(capsys, tmp_path):
    from cli_helpers import run_cli

    (tmp_path / "train.tsv").write_text("great movie\t1\nbad film\t0\nfine film\t1\nawful movie\t0\n")
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--set", "model.family=encoder", "--set", "model.d_model=16",
                           "--set", "model.n_heads=2", "--set", "model.d_ff=16", "--set", "model.n_layers=1",
                           "--set", "data.task=classification", "--set", "data.tokenizer=word",
                           "--set", f"data.path={_q(tmp_path / 'train.tsv')}", "--set", "data.text_column=0",
                           "--set", "data.label_column=1", "--set", "train.steps=1", "--set", "train.batch_size=4",
                           "--set", "train.warmup_steps=1", "--set", "train.progress=false",
                           "--set", "train.precision=fp32", "--set", "train.device=cpu",
                           "--set", f"train.out_dir={_q(out)}")
    assert code == 0, err
    hint = ("(the run's data.text_column = '0' and data.label_column = '1': give this file's with --text-column and "
            "--label-column)")
    (tmp_path / "dev.jsonl").write_text('{"text": "great movie", "label": 1}\n{"text": "bad film", "label": 0}\n')
    line = one_line_error(capsys, "evaluate", str(out), "--data", str(tmp_path / "dev.jsonl"), "--device", "cpu")
    assert "JSON Lines fields have names, not numbers" in line and line.endswith(hint), line
    (tmp_path / "dev.csv").write_text('label,text\n1,great movie\n0,"bad, film"\n')
    line = one_line_error(capsys, "evaluate", str(out), "--data", str(tmp_path / "dev.csv"), "--device", "cpu")
    assert "were not in the training data" in line and line.endswith(hint), line
    code, _, err = run_cli(capsys, "evaluate", str(out), "--data", str(tmp_path / "dev.csv"), "--device", "cpu",
                           "--text-column", "text", "--label-column", "label")
    assert code == 0, err
    # where the flags give this file's columns, the run's are not named (round-8 mutation: they were, in the same
    # words, to a user who had given both)
    (tmp_path / "dev7.csv").write_text("label,text\n7,great movie\n")
    line = one_line_error(capsys, "evaluate", str(out), "--data", str(tmp_path / "dev7.csv"), "--device", "cpu",
                          "--text-column", "text", "--label-column", "label")
    assert "were not in the training data" in line and "the run's" not in line, line
    (tmp_path / "bad.csv").write_text('label,text\n1,"great movie\n')  # a quote left open: no column's fault
    line = one_line_error(capsys, "evaluate", str(out), "--data", str(tmp_path / "bad.csv"), "--device", "cpu")
    assert "malformed CSV" in line and "the run's" not in line, line


# (review of stop 42's own changes: the hints above must not be given where they do not fit)
@pytest.mark.parametrize("name, content, message", [
    ("one.csv", "great movie\ndull film\n", "label column 1 does not exist, the row has 1 comma-separated columns"),
    ("texts.tsv", "a fine film, and a long one\ndull\n",  # a comma in a sentence: no comma-separated file
     "label column 1 does not exist, the row has 1 tab-separated columns"),
    ("glue.tsv", 'sentence\tlabel\ngreat\t1\nhe said "no" to it\n',  # bare quotes, as GLUE's: no CSV quoting
     r"line 3: expected 2 tab-separated columns, found 1; fix the line$"),
])
def test_a_file_the_hints_do_not_fit_keeps_the_plain_message(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        read_classification_file(path)


def test_naming_the_label_column_of_a_headerless_pair_takes_the_other_for_the_texts(tmp_path):
    path = tmp_path / "label_first.tsv"
    path.write_text("1\tgreat movie\n0\tdull film\n")
    data = read_classification_file(path, None, 0)
    assert (data.texts, data.labels) == (["great movie", "dull film"], ["1", "0"])
