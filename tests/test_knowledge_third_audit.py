"""Third audit of the knowledge experiment: a synthetic world's pairs are checked against the block before anything
is written or trained, and its errors name the world (not a data/train.tsv that is not written yet); a --predict
line's ignored answer does not count against the block; a vocabulary listing a non-string is a DataError."""

from __future__ import annotations

import pytest

from attnlab.data.knowledge import MASK, PAD, KnowledgeVocab, read_qa_file, read_qa_lines
from attnlab.data.world import make_world
from attnlab.errors import DataError
from attnlab.experiments.knowledge import load_data, run_knowledge, scale_settings

TINY = {"n_layers": 1, "n_heads": 1, "d_model": 16, "finetune_epochs_scratch": 1, "pretrain_epochs": 1}


def _world_need(n_people: int, seed: int, eval_fraction: float) -> tuple[int, int]:
    """The smallest block_size that fits the world's fine-tuning pairs, and the one that fits its evaluation pairs."""
    train, dev = make_world(n_people, seed).split(eval_fraction, seed)
    return (max(len(q) + len(a) + 1 for q, a in train), max(len(q) + len(a) + 1 for q, a in dev))


def test_evaluation_pairs_that_do_not_fit_are_refused_before_any_phase_trains(tmp_path):
    """With block_size=36 (seed 153, n_people=10) the training pairs fit and an evaluation question does not:
    the run trained, then failed at evaluation with "a question fills the whole block"."""
    overrides = {**TINY, "n_people": 10, "block_size": 36}
    train_need, dev_need = _world_need(10, 153, scale_settings("quick", overrides).eval_fraction)
    assert train_need <= 36 < dev_need  # the case the audit found
    said = []
    out = tmp_path / "run"
    with pytest.raises(DataError) as e:
        run_knowledge(out, variants="none", seed=153, overrides=overrides, progress=False, echo=said.append)
    message = str(e.value)
    assert "synthetic world" in message and "evaluation pair" in message and "\n" not in message
    assert f"block_size={dev_need}" in message and "shorten the line" not in message
    assert said == []  # refused before the run started (no phase line, nothing trained)
    assert not list(out.glob("finetune-*")) and not (out / "data").exists()


def test_an_evaluation_answer_that_cannot_be_written_in_full_is_refused(tmp_path):
    """block_size=45 (seed 2): every training pair fits, but some evaluation answers had no room to be written in
    full and were scored wrong without a word."""
    settings = scale_settings("quick", {"block_size": 45})
    train_need, dev_need = _world_need(settings.n_people, 2, settings.eval_fraction)
    assert train_need <= 45 < dev_need
    with pytest.raises(DataError, match=r"synthetic world \(--seed 2, n_people=200\), evaluation pair \d+: .*"
                                        rf"raise block_size to {dev_need} or more"):
        load_data(tmp_path, settings, corpus=None, train=None, eval_path=None, predict=None, seed=2)
    # the suggested size is enough, and one less is not
    fits = scale_settings("quick", {"block_size": dev_need})
    data = load_data(tmp_path, fits, corpus=None, train=None, eval_path=None, predict=None, seed=2)
    assert len(data.dev) == 100
    with pytest.raises(DataError):
        load_data(tmp_path, scale_settings("quick", {"block_size": dev_need - 1}), corpus=None, train=None,
                  eval_path=None, predict=None, seed=2)
    assert not (tmp_path / "data").exists()  # load_data writes nothing: the run does, once accepted


def test_a_world_whose_training_pairs_do_not_fit_names_the_world_not_an_unwritten_file(tmp_path):
    out = tmp_path / "run"
    (out / "data").mkdir(parents=True)
    stale = "Where was Old Run born?\tNowhere\n"
    (out / "data" / "train.tsv").write_text(stale, encoding="utf-8")  # an earlier run's world: not this one's
    settings = scale_settings("quick", {"block_size": 32})
    need = max(_world_need(settings.n_people, 0, settings.eval_fraction))
    with pytest.raises(DataError) as e:
        load_data(out, settings, corpus=None, train=None, eval_path=None, predict=None, seed=0)
    message = str(e.value)
    assert "train.tsv" not in message and "shorten the line" not in message
    assert message.startswith("the synthetic world (--seed 0, n_people=200), fine-tuning pair 1: ")
    assert f"block_size={need}" in message  # the size that fits the evaluation pairs as well
    assert (out / "data" / "train.tsv").read_text(encoding="utf-8") == stale
    # the fine-tuning source of an accepted world names the world too (its errors would otherwise name train.tsv)
    data = load_data(out, scale_settings("quick"), corpus=None, train=None, eval_path=None, predict=None, seed=0)
    assert "synthetic world" in data.train_name and "train.tsv" not in data.train_name


def test_a_predict_lines_ignored_answer_does_not_count_against_the_block(tmp_path):
    path = tmp_path / "predict.tsv"
    question = "Where was Renuen Ulmark born?"
    path.write_text(f"{question}\t{'x' * 120}\nWhere was Zo born?\n", encoding="utf-8")
    rows = read_qa_lines(path, require_answers=False, block_size=128)
    assert [(n, q) for n, q, _ in rows] == [(1, question), (2, "Where was Zo born?")]
    assert read_qa_file(path, require_answers=False, block_size=128)[0][0] == question
    with pytest.raises(DataError, match="line 1: question and answer take"):  # a training or evaluation file: yes
        read_qa_lines(path, require_answers=True, block_size=128)
    # the question itself must still leave room for an answer
    with pytest.raises(DataError, match="line 1: the question takes"):
        read_qa_lines(path, require_answers=False, block_size=len(question) + 1)
    data = load_data(tmp_path / "run", scale_settings("quick"), corpus=None, train=None, eval_path=None,
                     predict=str(path), seed=0)
    assert data.predict == [question, "Where was Zo born?"]


@pytest.mark.parametrize("bad", [5, ["a"], None, 1.5])
def test_a_vocabulary_listing_a_non_string_is_a_data_error(bad):
    import json

    text = json.dumps({"kind": "char", "chars": [PAD, MASK, "a", bad]})
    with pytest.raises(DataError, match="distinct single characters"):
        KnowledgeVocab.from_json(text)
    with pytest.raises(DataError, match="distinct single characters"):
        KnowledgeVocab([PAD, MASK, bad])
    assert KnowledgeVocab.from_json(json.dumps({"kind": "char", "chars": [PAD, MASK, "a"]})).itos == [PAD, MASK, "a"]
