"""The shipped classification config leaves the text column to the file's header: it named "sentence", which
took a GLUE QNLI file's second text alone (question, sentence) without a word, where a file of two texts is
refused unless the user names the one to read."""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "encoder-classify.toml"
TINY = ["--set", "train.progress=false", "--set", "train.device=cpu", "--set", "train.precision=fp32",
        "--set", "model.d_model=16", "--set", "model.d_ff=16", "--set", "model.n_layers=1",
        "--set", "train.steps=2", "--set", "train.batch_size=4", "--set", "train.eval_every=0"]


def _train(capsys, tmp_path, path, *extra):
    return run_cli(capsys, "train", str(CONFIG), "--set", f"data.path={json.dumps(str(path))}",
                   "--set", f"data.eval_path={json.dumps(str(path))}",
                   "--set", f"train.out_dir={json.dumps(str(tmp_path / 'run'))}", *TINY, *extra)


def test_a_sentence_pair_file_is_refused_under_the_shipped_config(tmp_path, capsys):
    qnli = tmp_path / "qnli.tsv"
    qnli.write_text("index\tquestion\tsentence\tlabel\n" + "".join(
        f"{i}\twhat is {i}?\t{i} is a number.\t{'entailment' if i % 2 else 'not_entailment'}\n" for i in range(12)),
        encoding="utf-8")
    code, _, err = _train(capsys, tmp_path, qnli)
    assert code == 2 and "'question' and 'sentence' (a sentence-pair task)" in err, err
    code, _, err = _train(capsys, tmp_path, qnli, "--set", "data.text_column=\"sentence\"")  # named: read
    assert code == 0, err


def _sentiment(path: Path, header: str) -> Path:
    path.write_text(header + "".join(f"film {i} was {'good' if i % 2 else 'bad'}\t{i % 2}\n" for i in range(12)),
                    encoding="utf-8")
    return path


def test_single_text_files_still_find_their_columns(tmp_path, capsys):
    code, _, err = _train(capsys, tmp_path, _sentiment(tmp_path / "sst2.tsv", "sentence\tlabel\n"))
    assert code == 0, err
    reviews = tmp_path / "reviews.jsonl"  # named "text", as many JSONL sets do: it failed on "sentence"
    reviews.write_text("".join(json.dumps({"text": f"film {i}", "label": i % 2}) + "\n" for i in range(12)),
                       encoding="utf-8")
    code, _, err = _train(capsys, tmp_path, reviews, "--set", f"train.out_dir={json.dumps(str(tmp_path / 'r2'))}")
    assert code == 0, err


def test_the_label_column_is_found_by_its_header_as_the_config_says(tmp_path, capsys):
    # The config pinned label_column = "label" under a comment saying labels are found by their header names:
    # a file headed "text  class" was refused (stop-39 README audit).
    code, _, err = _train(capsys, tmp_path, _sentiment(tmp_path / "topics.tsv", "text\tclass\n"))
    assert code == 0, err


def test_a_headerless_file_of_more_than_two_columns_asks_for_its_columns(tmp_path, capsys):
    # Columns 0 and 1 were read without a word: a GLUE CoLA file (source, label, mark, sentence) trained on its
    # source codes (stop-39 review, once the config stopped pinning label_column).
    cola = tmp_path / "cola.tsv"
    cola.write_text("".join(f"w_{i}\t{i % 2}\t\tthe film {i} was {'good' if i % 2 else 'bad'} .\n" for i in range(12)),
                    encoding="utf-8")
    code, _, err = _train(capsys, tmp_path, cola)
    assert code == 2 and "has 4 tab-separated columns and no header row, so which holds the text and which the " \
                          "label is not known; give them by 0-based number" in err, err
    code, _, err = _train(capsys, tmp_path, cola, "--set", "data.text_column=\"3\"", "--set", "data.label_column=\"1\"")
    assert code == 0, err
