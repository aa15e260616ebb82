"""A setting that needs an evaluation, in a run without one, is warned of with the settings that give this task an
evaluation: a translation or classification run was told to give data.eval_path or data.val_fraction, which those
tasks refuse. The default run's own evaluation every 200 steps, in a run the user turned into one with nothing held
out, is not warned of as the user's setting ("drop it" could not be done)."""

from __future__ import annotations

import json
import warnings

import pytest
from cli_helpers import run_cli
from cli_helpers import toml_str as _q
from training_helpers import ToySource, tiny_model

from attnlab.training.recipe import load_run_config
from attnlab.training.trainer import Trainer, TrainerConfig

FAST = ["--set", "train.steps=2", "--set", "train.batch_size=4", "--set", "train.progress=false",
        "--set", "train.precision=fp32", "--set", "train.device=cpu", "--set", "train.warmup_steps=1"]


def _translation(tmp_path, *extra):
    (tmp_path / "src.txt").write_text("a b c\nb c d\nc d e\nd e a\n")
    (tmp_path / "tgt.txt").write_text("x y z\ny z w\nz w v\nw v x\n")
    return ["train", "--set", "model.family=seq2seq", "--set", "model.d_model=16", "--set", "model.d_ff=16",
            "--set", "model.n_heads=2", "--set", "model.n_encoder_layers=1", "--set", "model.n_decoder_layers=1",
            "--set", "data.task=translation", "--set", "data.tokenizer=word",
            "--set", f"data.src_path={_q(tmp_path / 'src.txt')}", "--set", f"data.tgt_path={_q(tmp_path / 'tgt.txt')}",
            "--set", "data.max_length=16", *FAST, "--set", f"train.out_dir={_q(tmp_path / 'run')}", *extra]


def _classification(tmp_path, *extra):
    (tmp_path / "a.tsv").write_text("sentence\tlabel\ngreat movie\t1\nawful movie\t0\nfine film\t1\nbad film\t0\n")
    return ["train", "--set", "model.family=encoder", "--set", "model.d_model=16", "--set", "model.n_heads=2",
            "--set", "model.d_ff=16", "--set", "model.n_layers=1", "--set", "data.task=classification",
            "--set", "data.tokenizer=word", "--set", f"data.path={_q(tmp_path / 'a.tsv')}", *FAST,
            "--set", f"train.out_dir={_q(tmp_path / 'run')}", *extra]


def _warnings(capsys, argv) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = run_cli(capsys, *argv)
    assert code == 0, err
    return [str(w.message) for w in caught]


def test_a_translation_run_is_told_of_its_own_evaluation_files(capsys, tmp_path):
    said = _warnings(capsys, _translation(tmp_path, "--set", "train.eval_every=1"))
    inert = [line for line in said if "eval_every = 1 does nothing" in line]
    assert inert and "give data.eval_src_path and data.eval_tgt_path, or drop it" in inert[0], said
    assert "data.eval_path" not in inert[0] and "val_fraction" not in inert[0]


def test_a_classification_run_is_told_of_data_eval_path_only(capsys, tmp_path):
    said = _warnings(capsys, _classification(tmp_path, "--set", "train.best_metric=\"accuracy\""))
    inert = [line for line in said if "cannot pick best/" in line]
    assert inert and "give data.eval_path, or drop it" in inert[0], said


def test_the_default_runs_evaluation_is_not_the_users_setting(capsys, tmp_path):
    # `attnlab train --set data.task=translation ...` starts from the default run, which evaluates every 200 steps
    said = _warnings(capsys, _translation(tmp_path))
    assert not [line for line in said if "eval_every" in line], said
    assert json.loads((tmp_path / "run" / "run.json").read_text())["train"]["eval_every"] == 0


def test_whose_eval_every_it_is(tmp_path):
    assert load_run_config(None, []).default_eval_every  # the default run's 200
    assert not load_run_config(None, ["train.eval_every=50"]).default_eval_every
    path = tmp_path / "run.toml"  # a config file's is the user's, whatever the data gives
    path.write_text('[data]\nval_fraction = 0\n[train]\neval_every = 200\nout_dir = "x"\n')
    assert not load_run_config(path).default_eval_every


def _lm(tmp_path, text: str, *extra: str):
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    return ["train", "--set", "model.preset=gpt-char-tiny", "--set", f"data.path={_q(path)}", *FAST,
            "--set", f"train.out_dir={_q(tmp_path / 'run')}", *extra]


@pytest.mark.parametrize("text, extra, kept", [
    ("a" * 29 + "\nb\ncc\n", [], 0),  # a tail too short to score: the whole text trained on (review of stop 42)
    ("abcdefgh\n" * 60, ["--set", "data.val_fraction=0"], 0),  # nothing held out asked
    ("abcdefgh\n" * 60, [], 200),  # a tail that scores: the default run's evaluation stays
])
def test_the_default_runs_eval_every_goes_where_nothing_is_held_out(capsys, tmp_path, text, extra, kept):
    said = _warnings(capsys, _lm(tmp_path, text, *extra))
    assert not [line for line in said if "eval_every" in line], said
    assert json.loads((tmp_path / "run" / "run.json").read_text())["train"]["eval_every"] == kept


def test_the_users_eval_every_with_nothing_held_out_is_warned_of(capsys, tmp_path):
    said = _warnings(capsys, _lm(tmp_path, "abcdefgh\n" * 60, "--set", "data.val_fraction=0",
                                 "--set", "train.eval_every=50"))
    assert [line for line in said if "train.eval_every = 50 does nothing" in line], said


def test_the_python_api_is_told_to_give_an_eval_source(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = TrainerConfig(steps=2, batch_size=8, warmup_steps=1, eval_every=1, precision="fp32", device="cpu",
                            progress=False)
        Trainer(tiny_model(), cfg, ToySource(), out_dir=tmp_path / "a").fit()
    said = [str(w.message) for w in caught if "does nothing" in str(w.message)]
    assert said and "give Trainer(eval_source=...), or drop it" in said[0], said
