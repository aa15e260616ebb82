"""A run whose latest checkpoint lost its weights file: `model.init_from` (and `load_model`) took best/ instead,
older weights, without a word, while `evaluate` refused it with a message naming folders that do not exist
(RUN/checkpoint/checkpoint, RUN/checkpoint/best) and not the usable best/."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import CheckpointError
from attnlab.models.registry import build_model, get_preset
from attnlab.training.checkpoint import find_checkpoint, load_model, save_checkpoint


def _model(seed):
    torch.manual_seed(seed)
    return build_model(get_preset("gpt-char-tiny")[1])


@pytest.mark.parametrize("given", ["run", "run/checkpoint"])
def test_a_latest_checkpoint_without_weights_is_refused_naming_best(tmp_path, given):
    run = tmp_path / "run"
    save_checkpoint(run / "best", _model(1))
    save_checkpoint(run / "checkpoint", _model(2))
    (run / "checkpoint" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=rf"^{run / 'checkpoint'} has no model.safetensors .*the run's best "
                                              rf"checkpoint is {run / 'best'}: give that folder"):
        load_model(tmp_path / given)
    assert find_checkpoint(run / "best") == run / "best"  # the fix the message gives


def test_without_a_best_checkpoint_the_message_says_to_restore_or_retrain(tmp_path):
    save_checkpoint(tmp_path / "checkpoint", _model(2))
    (tmp_path / "checkpoint" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="has no model.safetensors .*restore the file, or train the run again"):
        find_checkpoint(tmp_path)


def test_a_folder_named_checkpoint_is_not_said_to_hold_folders_of_its_own(tmp_path):
    (tmp_path / "best").mkdir()
    with pytest.raises(CheckpointError) as e:
        find_checkpoint(tmp_path / "best")
    assert str(e.value) == f"no model.safetensors in {tmp_path / 'best'}; give a checkpoint folder written by attnlab"


def test_a_run_folder_named_checkpoint_is_still_a_run(tmp_path):
    # Its own checkpoint/ lies inside it: taking the folder for a checkpoint that lost its weights refused it.
    run = tmp_path / "checkpoint"
    save_checkpoint(run / "checkpoint", _model(2))
    assert find_checkpoint(run) == run / "checkpoint"


def test_a_folder_holding_a_run_named_checkpoint_names_that_run(tmp_path):
    save_checkpoint(tmp_path / "checkpoint" / "checkpoint", _model(2))
    with pytest.raises(CheckpointError, match=f"holds no model itself but the runs {tmp_path / 'checkpoint'}"):
        find_checkpoint(tmp_path)


@pytest.mark.parametrize("leftover", [".checkpoint.tmp", ".best.tmp"])
def test_a_save_cut_short_is_not_offered_as_a_run(tmp_path, leftover):
    # (fourth checkpoint audit) a kill during a run's first save left .checkpoint.tmp with a config and weights, and
    # generate/evaluate told the user to give that hidden folder as the run
    run = tmp_path / "run"
    save_checkpoint(run / "saved", _model(2))
    (run / "saved").rename(run / leftover)
    (run / "run.json").write_text("{}", encoding="utf-8")
    with pytest.raises(CheckpointError) as e:
        find_checkpoint(run)
    assert str(e.value) == f"{run} is a run that saved no checkpoint (it stopped before its first save); train it " \
        "again, or give another run folder"
