"""Checkpoint and resume defects found by an audit: each was a traceback (or a silent change) before its fix."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from training_helpers import ToySource, tiny_model

from attnlab.errors import CheckpointError
from attnlab.training import Trainer, TrainerConfig


def _config(steps: int) -> TrainerConfig:
    return TrainerConfig(steps=steps, batch_size=8, lr=1e-2, warmup_steps=1, precision="fp32", device="cpu",
                         progress=False, log_every=1, eval_every=2)


@pytest.fixture
def finished(tmp_path):
    Trainer(tiny_model(), _config(4), ToySource(), eval_source=ToySource(), out_dir=tmp_path).fit()
    return tmp_path


def _resume(folder):
    return Trainer(tiny_model(), _config(6), ToySource(), eval_source=ToySource(), out_dir=folder, resume=True)


@pytest.mark.parametrize("entry, value", [("best", "x"), ("best", {"metric": "loss"}),
                                          ("best", {"metric": "loss", "value": "1", "step": 2}),
                                          ("best_eval_loss", "1.5"), ("best_eval_loss", True)])
def test_a_malformed_best_record_is_refused_before_training(finished, entry, value):
    file = finished / "checkpoint" / "trainer_state.json"
    state = json.loads(file.read_text(encoding="utf-8"))
    state[entry] = value
    file.write_text(json.dumps(state), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"trainer_state.json is malformed \(best: "):
        _resume(finished).fit()


def _edit_optimizer(folder, drop: str | None = None, amsgrad: bool = False) -> None:
    path = str(folder / "checkpoint" / "optimizer.safetensors")
    tensors = load_file(path)
    with safe_open(path, framework="pt") as f:
        metadata = dict(f.metadata())
    if drop:
        del tensors[drop]
    if amsgrad:
        groups = json.loads(metadata["param_groups"])
        for group in groups:
            group["amsgrad"] = True
        metadata["param_groups"] = json.dumps(groups)
    save_file(tensors, path, metadata=metadata)


def test_an_optimizer_state_missing_an_entry_is_refused(finished):
    _edit_optimizer(finished, drop="0.exp_avg")  # torch's AdamW raised KeyError('exp_avg') at the first step
    with pytest.raises(CheckpointError, match=r"optimizer state of parameter 0 lacks 'exp_avg'; the file is damaged"):
        _resume(finished).fit()


def test_an_optimizer_header_asking_for_amsgrad_does_not_change_the_optimizer(finished):
    _edit_optimizer(finished, amsgrad=True)  # asked for max_exp_avg_sq at the first step (KeyError)
    trainer = _resume(finished)
    assert trainer.fit()["steps"] == 6
    assert not any(g["amsgrad"] for g in trainer.optimizer.param_groups)


def test_resuming_with_another_dropout_warns_as_other_changed_settings_do(finished):
    resumed = Trainer(tiny_model(dropout=0.3), _config(6), ToySource(), eval_source=ToySource(), out_dir=finished,
                      resume=True)
    with pytest.warns(UserWarning, match=r"resuming with changed settings \(model\.dropout\): the run will not "
                                         r"reproduce an uninterrupted one"):
        resumed.fit()


class _FailingSource(ToySource):
    """Fails at a step, as a crash would (nothing saved on the way out)."""

    def __init__(self, fail_at: int):
        super().__init__()
        self.fail_at = fail_at

    def batch(self, step):
        if step == self.fail_at:
            raise RuntimeError("a crash")
        return super().batch(step)


def test_a_replacing_run_that_crashes_after_its_first_best_leaves_no_checkpoint_of_the_old_run(finished):
    """The new run's best/ (step 2) replaced the old run's; its first checkpoint/ would have come later: the old
    run's checkpoint/ stayed beside the new best/, and --resume continued the old run with the new run's best."""
    config = _config(6).replace(save_every=5, seed=7)
    with pytest.raises(RuntimeError, match="a crash"):
        Trainer(tiny_model(), config, _FailingSource(fail_at=3), eval_source=ToySource(), out_dir=finished).fit()
    best = json.loads((finished / "best" / "trainer_state.json").read_text(encoding="utf-8"))
    assert best["step"] == 2 and best["trainer_config"]["seed"] == 7  # the new run's
    assert not (finished / "checkpoint").exists()


@pytest.mark.parametrize("file", ["model.safetensors", "optimizer.safetensors"])
def test_a_float8_tensor_is_refused_in_one_line(finished, file):
    # A valid safetensors type that no model here computes in: torch.isfinite raised NotImplementedError (a
    # traceback from generate, evaluate and --resume; found by the stop-32 bad-input audit).
    import torch

    path = finished / "checkpoint" / file
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(path)
    key = next(k for k, t in tensors.items() if t.is_floating_point())
    tensors[key] = tensors[key].to(torch.float8_e4m3fn)
    save_file(tensors, path, metadata=metadata)
    with pytest.raises(CheckpointError, match=rf"tensor '{key}' is float8_e4m3fn, a type attnlab does not load"):
        _resume(finished).fit()


def test_the_optimizer_state_goes_to_parameters_by_position_whatever_ids_the_header_holds(finished, tmp_path):
    # torch maps saved state to parameters through the groups' "params" ids: ids edited in the header moved or
    # dropped Adam state silently, and a non-list was a traceback (found by the stop-32 bad-input audit).
    import shutil

    import torch

    damaged = tmp_path / "damaged"
    shutil.copytree(finished, damaged)
    path = damaged / "checkpoint" / "optimizer.safetensors"
    with safe_open(str(path), "pt") as f:
        metadata = dict(f.metadata())
    tensors = load_file(path)
    groups = json.loads(metadata["param_groups"])
    for group in groups:
        group["params"] = [i + 100 for i in group["params"]][::-1]
    save_file(tensors, path, metadata={**metadata, "param_groups": json.dumps(groups)})
    intact, edited = _resume(finished), _resume(damaged)
    intact.fit()
    edited.fit()
    for (name, a), b in zip(intact.model.state_dict().items(), edited.model.state_dict().values()):
        assert torch.equal(a, b), name
    groups[0]["params"] = 3
    save_file(tensors, path, metadata={**metadata, "param_groups": json.dumps(groups)})
    with pytest.raises(CheckpointError, match="a parameter group's 'params' in its header is not a list"):
        _resume(damaged).fit()


def test_a_checkpoint_folder_linked_to_another_disk_is_saved_through_the_link(tmp_path):
    """The first save renamed the link itself to .checkpoint.old; every later save died on rmtree of that link, and
    so did every resume, at its first save."""
    run, disk = tmp_path / "run", tmp_path / "disk"
    Trainer(tiny_model(), _config(4), ToySource(), eval_source=ToySource(), out_dir=run).fit()
    disk.mkdir()
    (run / "checkpoint").rename(disk / "checkpoint")
    (run / "checkpoint").symlink_to(disk / "checkpoint", target_is_directory=True)
    for steps in (6, 8):  # two resumes: each saves (several times) through the link
        Trainer(tiny_model(), _config(steps), ToySource(), eval_source=ToySource(), out_dir=run, resume=True).fit()
        assert (run / "checkpoint").is_symlink()
        assert json.loads((disk / "checkpoint" / "trainer_state.json").read_text(encoding="utf-8"))["step"] == steps
    assert sorted(p.name for p in disk.iterdir()) == ["checkpoint"]  # no .tmp or .old left beside it
    assert not (run / ".checkpoint.old").exists() and not (run / ".checkpoint.tmp").exists()


def test_a_resume_whose_weights_were_removed_names_the_file_not_a_missing_checkpoint(finished, tmp_path):
    """It had said "no checkpoint ... train without resuming to start from scratch", which replaces the run."""
    (finished / "checkpoint" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"^cannot resume: .*checkpoint has no model.safetensors \(removed since "
                                              r"it was saved\); restore the file to resume, or train without"):
        _resume(finished).fit()
    with pytest.raises(CheckpointError, match="^cannot resume: no checkpoint in .*; train without resuming"):
        _resume(tmp_path / "never_trained").fit()


def test_a_linked_checkpoint_left_as_its_old_copy_by_a_crash_resumes(tmp_path):
    """Saved through the link, the .old copy a crash between the save's renames leaves lies beside the link's
    target: find_checkpoint looked beside the link, and resume said there was no checkpoint (start from scratch)."""
    from attnlab.training.checkpoint import find_checkpoint

    run, disk = tmp_path / "run", tmp_path / "disk"
    Trainer(tiny_model(), _config(4), ToySource(), eval_source=ToySource(), out_dir=run).fit()
    disk.mkdir()
    (run / "checkpoint").rename(disk / ".checkpoint.old")  # the crash: the target renamed away, the new not in yet
    (run / "checkpoint").symlink_to(disk / "checkpoint", target_is_directory=True)
    assert find_checkpoint(run) == disk / ".checkpoint.old"
    Trainer(tiny_model(), _config(6), ToySource(), eval_source=ToySource(), out_dir=run, resume=True).fit()
    assert json.loads((disk / "checkpoint" / "trainer_state.json").read_text(encoding="utf-8"))["step"] == 6


def _records(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


def test_a_replacing_run_that_dies_before_its_first_save_leaves_the_old_runs_records_to_its_resume(finished):
    """The old run's checkpoints stay until the new run saves its own; its metrics.jsonl went at once. A crash in
    between (a SIGKILL has no handler) left the new run's records beside the old checkpoints, and --resume kept
    them as the old run's history (found by the stop-38 run-folder audit)."""
    old = _records(finished)
    (finished / "run.json").write_text('{"old": true}', encoding="utf-8")  # as `attnlab train` writes one
    config = _config(6).replace(seed=7)
    with pytest.raises(RuntimeError, match="a crash"):
        Trainer(tiny_model(seed=7), config, _FailingSource(fail_at=1), eval_source=ToySource(),
                out_dir=finished).fit()
    (finished / "run.json").write_text('{"new": true}', encoding="utf-8")
    died = _records(finished)
    assert [r["step"] for r in died] == [1] and died[0]["loss"] != old[0]["loss"]
    assert (finished / ".metrics.jsonl.replaced").is_file()
    # A second run from scratch that dies as well: the records set aside still belong to the checkpoints there.
    with pytest.raises(RuntimeError, match="a crash"):
        Trainer(tiny_model(), config, _FailingSource(fail_at=1), eval_source=ToySource(), out_dir=finished).fit()
    _resume(finished).fit()
    assert _records(finished)[:len(old)] == old
    assert (finished / "run.json").read_text(encoding="utf-8") == '{"old": true}'
    assert not (finished / ".metrics.jsonl.replaced").exists() and not (finished / ".run.json.replaced").exists()


def test_the_records_set_aside_go_with_the_old_run_at_the_new_runs_first_save(finished):
    config = _config(6).replace(seed=7)
    with pytest.raises(RuntimeError, match="a crash"):  # after its first best/ (step 2)
        Trainer(tiny_model(), config, _FailingSource(fail_at=3), eval_source=ToySource(), out_dir=finished).fit()
    assert not (finished / ".metrics.jsonl.replaced").exists()
    assert [r["step"] for r in _records(finished)][:3] == [1, 2, 2]  # the new run's, as its resume will keep
