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


def test_a_one_column_csv_without_the_other_separator_keeps_its_message(tmp_path):
    path = tmp_path / "one.csv"
    path.write_text("great movie\ndull film\n")
    with pytest.raises(DataError, match="label column 1 does not exist, the row has 1 comma-separated columns"):
        read_classification_file(path)


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
