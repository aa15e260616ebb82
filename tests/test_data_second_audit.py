"""Data cases a second audit found: a held-out tail too short to score is trained on, `evaluate` streams a
language model's text instead of reading it whole, sentence-pair files are refused unless a text column is
named, and an mlm evaluation file's problem names that file."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from cli_helpers import one_line_error, run_cli
from cli_helpers import toml_str as _q

from attnlab.data import text_files
from attnlab.data.text_files import read_classification_file
from attnlab.errors import DataError
from attnlab.training.recipe import load_run_config, prepare

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TINY = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu"]


def test_a_held_out_tail_too_short_to_score_is_trained_on(tmp_path):
    path = tmp_path / "tail.txt"
    path.write_text("".join(f"line {i} of the text\n" for i in range(60)) + "UNIQUE TAIL LINE\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="fewer than one window of 33, so the whole text is trained on"):
        prep = prepare(load_run_config(None, ["model.preset=gpt-char-tiny", f"data.path={_q(path)}",
                                              "data.val_fraction=0.03", f"train.out_dir={_q(tmp_path / 'run')}"]))
    assert prep.eval_source is None
    trained = prep.tokenizer.decode(prep.train_source.tokens[:].tolist())
    assert trained == path.read_text(encoding="utf-8")
    assert not (tmp_path / "run" / "data" / "val.bin").exists()


def test_evaluate_streams_a_language_models_text(tmp_path, capsys, monkeypatch):
    """The text goes through the block reader into a token file; nothing reads it whole (a 100 MB text took
    ~2 GB that way). The loss is the one training reported for the same file."""
    text = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(200))
    (tmp_path / "train.txt").write_text(text, encoding="utf-8")
    (tmp_path / "eval.txt").write_text(text[:3000], encoding="utf-8")
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=3",
                           "--set", f"data.path={_q(tmp_path / 'train.txt')}",
                           "--set", f"data.eval_path={_q(tmp_path / 'eval.txt')}",
                           "--set", f"train.out_dir={_q(out)}", *TINY)
    assert code == 0, err
    final = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "eval_loss" in line]

    def whole(*args, **kwargs):
        raise AssertionError("the text was read whole")

    monkeypatch.setattr(text_files, "read_text", whole)
    code, stdout, err = run_cli(capsys, "evaluate", str(out), "--data", str(tmp_path / "eval.txt"), "--json",
                                "--device", "cpu")
    assert code == 0, err
    assert json.loads(stdout)["loss"] == pytest.approx(final[-1]["eval_loss"], abs=1e-5)
    bad = tmp_path / "bad.txt"
    bad.write_text("the fox\nthe dog\nthe \u2603\n", encoding="utf-8")
    line = one_line_error(capsys, "evaluate", str(out), "--data", str(bad), "--device", "cpu")
    assert f"{bad}: line 3: '\u2603' is not in the vocabulary" in line

    from attnlab.data import corpus

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    real_blocks, calls = text_files.iter_text_blocks, []

    def failing_read(path, *args, **kwargs):  # the check reads the text's start; the tokens' reading then fails
        calls.append(path)
        yield from real_blocks(path, *args, **kwargs) if len(calls) == 1 else ()
        if len(calls) > 1:
            raise OSError(5, "Input/output error", str(path))

    with monkeypatch.context() as patch:
        patch.setattr(text_files, "iter_text_blocks", failing_read)
        line = one_line_error(capsys, "evaluate", str(out), "--data", str(tmp_path / "eval.txt"), "--device", "cpu")
    assert line.endswith(f"cannot read data file '{tmp_path / 'eval.txt'}': Input/output error")

    monkeypatch.setattr(corpus, "build_token_file", full_disk)  # a full temporary folder names TMPDIR, not the run
    line = one_line_error(capsys, "evaluate", str(out), "--data", str(tmp_path / "eval.txt"), "--device", "cpu")
    assert "cannot write the text's tokens to the temporary folder" in line and "No space left" in line
    assert "MiB are needed): set TMPDIR to a folder on a disk with room" in line and "out_dir" not in line


@pytest.mark.parametrize("header,first,second", [
    ("index\tsentence1\tsentence2\tlabel", "sentence1", "sentence2"),  # RTE, WNLI, MRPC
    ("index\tquestion\tsentence\tlabel", "question", "sentence"),  # QNLI
    ("id\tquestion1\tquestion2\tlabel", "question1", "question2"),  # QQP
    ("premise\thypothesis\tlabel", "premise", "hypothesis"),  # MNLI, SNLI
])
def test_a_sentence_pair_file_is_refused_unless_the_text_column_is_named(tmp_path, header, first, second):
    cells = len(header.split("\t"))
    rows = ["\t".join(["0", "It rains.", "The ground is wet.", "entailment"][-cells:]),
            "\t".join(["1", "A man sleeps.", "Nobody sleeps.", "not_entailment"][-cells:])]
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"two text columns, '{first}' and '{second}'.*data.text_column"):
        read_classification_file(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_classification_file(path, text_column=second).labels[0] == "entailment"
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text(json.dumps({first: "It rains.", second: "It is wet.", "label": "yes"}) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"two text fields, '{first}' and '{second}'"):
        read_classification_file(jsonl)
    assert read_classification_file(jsonl, text_column=first).texts == ["It rains."]


def test_an_mlm_evaluation_files_problem_names_that_file(tmp_path, capsys):
    train = tmp_path / "train.txt"
    train.write_text("a b.\nc d.\n\ne f.\ng h.\n", encoding="utf-8")
    held_out = tmp_path / "held_out.txt"
    held_out.write_text("x.\n", encoding="utf-8")
    line = one_line_error(capsys, "train", str(CONFIGS / "bert-mlm.toml"), "--set", f"data.path={_q(train)}",
                          "--set", f"data.eval_path={_q(held_out)}", "--set", "data.vocab_size=60",
                          "--set", "train.steps=1", "--set", f"train.out_dir={_q(tmp_path / 'run')}", *TINY)
    assert f"{held_out} (data.eval_path): " in line and "sentence" in line


@pytest.mark.parametrize("header,first,second", [
    ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "question1", "question2"),  # GLUE's own QQP
    ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "#1 String", "#2 String"),  # GLUE's own MRPC
])
def test_glues_own_pair_files_are_recognised_and_refused(tmp_path, header, first, second):
    """Their headers hold no name of a single-text file: read as data, the first column (an id) became the
    text and the next one the label."""
    cells = header.split("\t")
    row = ["0", "1", "2", "How?", "Why?", "0"][: len(cells)] if "id" in cells else ["1", "7", "8", "A b.", "C d."]
    path = tmp_path / "pairs.tsv"
    path.write_text(header + "\n" + "\t".join(row) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"two text columns, '{first}' and '{second}'"):
        read_classification_file(path)
    # the fix the message names works as written: the column as the file spells it; the label column is known
    assert read_classification_file(path, text_column=first).texts == [row[cells.index(first)]]
