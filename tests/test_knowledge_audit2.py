"""`attnlab run knowledge` found wrong by a second audit: files with CR-only line ends read as one line (a corpus
of one document, a --predict file of one question), the same row spelt two ways trained twice, and an earlier
run's prediction files left beside a new table where the user had put a file of their own."""

from __future__ import annotations

import pytest

from attnlab.data.knowledge import read_corpus, read_qa_lines
from attnlab.errors import ConfigError, DataError
from attnlab.experiments.knowledge import _earlier_outputs, parse_variants


def test_cr_only_line_ends_are_refused_in_the_corpus_and_the_question_files(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"Ann Lee. Ann was born in Lyon.\rBo Kim. Bo was born in Oslo.\r")
    with pytest.raises(DataError, match="corpus.txt' uses CR-only line ends"):
        read_corpus(corpus)
    questions = tmp_path / "predict.tsv"
    questions.write_bytes(b"Where was A born?\rWhere was B born?\r")
    with pytest.raises(DataError, match="predict.tsv' uses CR-only line ends"):
        read_qa_lines(questions, require_answers=False)
    corpus.write_bytes(b"Ann Lee. Ann was born in Lyon.\r\nBo Kim. Bo was born in Oslo.\r\n")  # CRLF still reads
    assert read_corpus(corpus) == ["Ann Lee. Ann was born in Lyon.", "Bo Kim. Bo was born in Oslo."]


def test_one_row_per_model_whatever_its_spelling():
    rows = parse_variants("none,scratch,dot,dot+learned,learned,rotary,dot+rotary,rotary+dot")
    assert [(v.name, v.pretrain, v.position) for v in rows] == [
        ("none", False, "learned"), ("dot", True, "learned"), ("rotary", True, "rotary")]


def test_spaces_around_a_plus_and_a_part_named_twice():
    assert [v.name for v in parse_variants("none, dot + rotary")] == ["none", "dot+rotary"]
    for spec, part in (("none+none", "position scheme none"), ("dot+dot", "attention variant dot")):
        with pytest.raises(ConfigError, match=f"names the {part} twice; name it once"):
            parse_variants(spec)


def test_an_earlier_runs_prediction_files_go_and_the_users_stay(tmp_path):
    for phase in ("pretrain-dot", "finetune-dot", "finetune-none"):
        (tmp_path / phase / "checkpoint").mkdir(parents=True)
    (tmp_path / "results.json").write_text("{}", encoding="utf-8")
    predictions = tmp_path / "predictions"
    predictions.mkdir()
    for name in ("dot.tsv", "dot.predict.tsv", "none.tsv", "notes.txt", "mine.tsv"):
        (predictions / name).write_text("x", encoding="utf-8")
    found = {path.relative_to(tmp_path).as_posix() for path in _earlier_outputs(tmp_path, [])}
    assert {"predictions/dot.tsv", "predictions/dot.predict.tsv", "predictions/none.tsv"} <= found
    assert not found & {"predictions", "predictions/notes.txt", "predictions/mine.tsv"}
    (predictions / "notes.txt").unlink()  # only .tsv files, one of them not a row's: still the user's
    found = {path.relative_to(tmp_path).as_posix() for path in _earlier_outputs(tmp_path, [])}
    assert "predictions/dot.tsv" in found and not found & {"predictions", "predictions/mine.tsv"}
    (predictions / "mine.tsv").unlink()  # only the rows' files: the whole folder is the earlier run's
    assert "predictions" in {path.relative_to(tmp_path).as_posix() for path in _earlier_outputs(tmp_path, [])}
