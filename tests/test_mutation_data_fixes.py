"""Mutation-testing gaps in the second data audit's fixes: the stale held-out sidecar, an mlm held-out part's
error, `evaluate` on texts shorter than a window, and a sentence-pair header in capitals."""

from __future__ import annotations

import re
import warnings

import pytest
from cli_helpers import toml_str as _q

from attnlab.data.corpus import sidecar_path
from attnlab.data.text_files import read_classification_file
from attnlab.errors import DataError
from attnlab.inference.runs import evaluate_file, load_run
from attnlab.training import recipe
from attnlab.training.recipe import load_run_config, prepare, train_run

TINY = ["train.progress=false", "train.precision=fp32", "train.device=cpu", "train.warmup_steps=0"]


def test_a_held_out_tail_trained_on_leaves_no_val_token_file_nor_its_sidecar(tmp_path):
    path = tmp_path / "tail.txt"
    path.write_text("".join(f"line {i} of the text\n" for i in range(60)) + "UNIQUE TAIL LINE\n", encoding="utf-8")
    data = tmp_path / "run" / "data"
    data.mkdir(parents=True)
    (data / "val.bin").write_text("from an earlier run")  # with its sidecar, as a run writes it
    sidecar_path(data / "val.bin").write_text('{"format": "attnlab-token-ids"}')
    with pytest.warns(UserWarning, match="so the whole text is trained on"):
        prepare(load_run_config(None, ["model.preset=gpt-char-tiny", f"data.path={_q(path)}",
                                       "data.val_fraction=0.03", f"train.out_dir={_q(tmp_path / 'run')}"]))
    assert not (data / "val.bin").exists() and not sidecar_path(data / "val.bin").exists()


def test_an_mlm_held_out_parts_problem_names_the_held_out_part(tmp_path, monkeypatch):
    """Without data.eval_path the held-out sentences are the training file's last ones: the message says so."""
    path = tmp_path / "sentences.txt"
    path.write_text("".join(f"the line number {i} is here\n" for i in range(40)), encoding="utf-8")
    real, calls = recipe.sentence_pair_source, []

    def failing_on_the_held_out_part(documents, *args):
        calls.append(documents)
        if len(calls) == 2:
            raise DataError("no pairs")
        return real(documents, *args)

    monkeypatch.setattr(recipe, "sentence_pair_source", failing_on_the_held_out_part)
    sets = ["model.family=bert", "model.d_model=16", "model.n_layers=1", "model.n_heads=2", "model.d_ff=32",
            "model.nsp=false", "data.task=mlm", "data.tokenizer=word", f"data.path={_q(path)}",
            "data.max_length=16", f"train.out_dir={_q(tmp_path / 'run')}", *TINY]
    with pytest.raises(DataError, match=f"^the held-out part of {re.escape(str(path))}: no pairs$"):
        prepare(load_run_config(None, sets))


@pytest.fixture(scope="module")
def char_lm(tmp_path_factory):
    out = tmp_path_factory.mktemp("short-eval") / "run"
    train_run(load_run_config(None, ["model.preset=gpt-char-tiny", "train.steps=1", "train.eval_every=0",
                                     f"train.out_dir={_q(out)}", *TINY]))
    return load_run(out)


@pytest.mark.parametrize("text", ["de", "def\n", "def f():\n"])
def test_evaluate_scores_a_text_shorter_than_a_window(tmp_path, char_lm, text):
    """The window shrinks to the text: every token after the first is predicted once."""
    path = tmp_path / "short.txt"
    path.write_text(text, encoding="utf-8")
    assert evaluate_file(char_lm, path)["tokens"] == len(text) - 1


def test_evaluate_refuses_a_one_token_text(tmp_path, char_lm):
    path = tmp_path / "one.txt"
    path.write_text("d", encoding="utf-8")
    with pytest.raises(DataError, match="the text has fewer than two tokens; nothing to predict"):
        evaluate_file(char_lm, path)


@pytest.mark.parametrize("header", ["Sentence1\tSentence2\tLabel", "PREMISE\tHypothesis\tlabel"])
def test_a_sentence_pair_header_in_capitals_is_refused(tmp_path, header):
    """Headers are matched without case (a "Sentence1" is found as the text column), and so are the pairs."""
    path = tmp_path / "pairs.tsv"
    path.write_text(f"{header}\nIt rains.\tThe ground is wet.\tyes\n", encoding="utf-8")
    with pytest.raises(DataError, match="two text columns"):
        read_classification_file(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_classification_file(path, text_column=header.split("\t")[0]).texts == ["It rains."]
