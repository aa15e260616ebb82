"""The knowledge experiment's prediction files keep one row per question when a prediction holds a line end
or a tab (the corpus's line end is in the vocabulary, and an undertrained model writes it)."""

from __future__ import annotations

from attnlab.experiments.knowledge import _write_predictions


def test_a_prediction_with_a_line_end_or_a_tab_keeps_its_row(tmp_path):
    questions = ["Where was A born?", "Where was B born?", "Where was C born?"]
    predictions = ["Ly\non", "Os\tlo", "Rome"]
    path = tmp_path / "dot.tsv"
    _write_predictions(path, [1, 2, 4], questions, predictions, ["Lyon", "Os\tlo".replace("\t", ""), "Rome"])
    rows = path.read_text(encoding="utf-8").splitlines()
    assert rows[0] == "line\tquestion\tprediction\tanswer\tcorrect"
    assert rows[1:] == ["1\tWhere was A born?\tLy\\non\tLyon\t0", "2\tWhere was B born?\tOs\\tlo\tOslo\t0",
                        "4\tWhere was C born?\tRome\tRome\t1"]
    _write_predictions(path, [1, 2, 4], questions, ["A\r\nB", "", "Rome"], None)
    rows = path.read_text(encoding="utf-8").splitlines()
    assert rows[1:] == ["1\tWhere was A born?\tA\\r\\nB", "2\tWhere was B born?\t", "4\tWhere was C born?\tRome"]
    assert all(len(r.split("\t")) == 3 for r in rows)


def test_a_backslash_in_a_prediction_is_doubled_so_an_escape_reads_one_way(tmp_path):
    # "a\\nb" (a backslash, then n) must not be written like "a\nb" (a line end)
    path = tmp_path / "dot.tsv"
    _write_predictions(path, [1, 2], ["Where was A born?", "Where was B born?"], ["a\\nb", "a\nb"], None)
    rows = path.read_text(encoding="utf-8").splitlines()
    assert rows[1:] == ["1\tWhere was A born?\ta\\\\nb", "2\tWhere was B born?\ta\\nb"]


def test_questions_and_answers_are_escaped_as_predictions_are(tmp_path):
    """A backslash in an answer was written as it is beside a prediction with it doubled: the row said correct
    while its two columns differed."""
    path = tmp_path / "dot.tsv"
    _write_predictions(path, [1, 2], ["Where was A\\B born?", "Where was C born?"], ["Lyon\\Nord", "Oslo"],
                       ["Lyon\\Nord", "Rome"])
    rows = [r.split("\t") for r in path.read_text(encoding="utf-8").splitlines()[1:]]
    assert rows == [["1", "Where was A\\\\B born?", "Lyon\\\\Nord", "Lyon\\\\Nord", "1"],
                    ["2", "Where was C born?", "Oslo", "Rome", "0"]]
    assert all((r[2] == r[3]) == (r[4] == "1") for r in rows)
