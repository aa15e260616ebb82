"""Two kinds of classification rows that train without a word, now warned: a row whose text cell is empty (a
classifier saw [CLS] [SEP] and learned its label from nothing), and a few rows labelled -1 among classes 0, 1, ...
(how Hugging Face datasets write SNLI's pairs without a gold label), a class of its own."""

from __future__ import annotations

import warnings

import pytest

from attnlab.data.text_files import read_classification_file


def _read(path):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        data = read_classification_file(path)
    return data, [str(w.message) for w in seen]


def test_empty_texts_are_kept_and_warned_with_their_count_and_first_line(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\ngood film\t1\n\t0\nawful\t0\n   \t1\n", encoding="utf-8")
    data, said = _read(path)
    assert data.texts == ["good film", "", "awful", ""] and data.labels == ["1", "0", "0", "1"]
    assert said == [f"data file '{path}': 2 row(s) have an empty text (the first at line 3); they are read as "
                    "examples of no words, labelled as written; fill or drop them"]
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text('{"text": "fine", "label": 1}\n{"text": "", "label": 0}\n', encoding="utf-8")
    assert _read(jsonl)[1] == [f"data file '{jsonl}': 1 row(s) have an empty text (the first at line 2); they are "
                               "read as examples of no words, labelled as written; fill or drop them"]


def test_a_file_without_empty_texts_or_minus_one_says_nothing(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\n" + "".join(f"s{i}\t{i % 3}\n" for i in range(60)), encoding="utf-8")
    assert _read(path)[1] == []


def test_a_few_minus_one_rows_beside_classes_from_zero_are_warned(tmp_path):
    path = tmp_path / "snli.tsv"
    rows = [f"pair {i}\t{i % 3}" for i in range(60)]
    rows[10:10] = ["no gold\t-1"]
    rows.append("no gold either\t-1")
    path.write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    data, said = _read(path)
    assert data.labels.count("-1") == 2  # still read: the warning says, the user decides
    assert said == [f"data file '{path}': 2 row(s) are labelled -1 (the first at line 12), beside classes numbered "
                    "from 0; -1 is how Hugging Face datasets mark a row without a label, and here it is a class of "
                    "its own; drop those rows unless -1 is meant as a class"]


@pytest.mark.parametrize("labels", [
    [i % 3 - 1 for i in range(60)],  # sentiment as -1, 0, 1: a third of the rows are -1
    [-1] * 10 + [1] * 400,  # a binary task labelled -1 and 1 (no class 0), -1 rare (2.4 %: under the 5 % rule)
    [i % 3 for i in range(20)] + [-1, -2],  # other negative labels: numbered classes of the user's own
])
def test_minus_one_as_a_class_of_the_users_is_not_warned(tmp_path, labels):
    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\n" + "".join(f"s{i}\t{label}\n" for i, label in enumerate(labels)),
                    encoding="utf-8")
    assert _read(path)[1] == []


def test_a_file_scored_by_a_trained_classifier_is_not_warned_of_minus_one(tmp_path):
    # -1 there is a class the model was trained with, or refused as unknown: no warning (review of stop 46)
    path = tmp_path / "dev.tsv"
    path.write_text("sentence\tlabel\n" + "".join(f"s{i}\t{i % 3}\n" for i in range(60)) + "x\t-1\n",
                    encoding="utf-8")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        read_classification_file(path, training=False)
    assert seen == []
    assert len(_read(path)[1]) == 1  # the same file as training data is warned of
