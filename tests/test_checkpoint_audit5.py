"""Fifth checkpoint audit: reading a run while its training saves it, and symbolic-link loops.

A save puts its new folder in place by two renames (checkpoint/ → .checkpoint.old, .checkpoint.tmp → checkpoint/)
and then removes the old copy. A reader between the renames was told the checkpoint was missing or incomplete, or
`load_model`/`model.init_from` of the run folder took its older best/ without a word; it now looks again. A
checkpoint folder (or run folder) that is a symbolic link to itself gave Python's RuntimeError with a traceback."""

from __future__ import annotations

import os
import re
import shutil
import warnings

import pytest
from cli_helpers import one_line_error, train_in_process
from cli_helpers import toml_str as _q

import attnlab.training.checkpoint as ckpt
from attnlab.errors import CheckpointError

TINY = ["--set", "model.preset=gpt-char-tiny", "--set", "train.progress=false", "--set", "train.precision=fp32",
        "--set", "train.device=cpu"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny char GPT trained 3 steps, with best/ (at step 2) and checkpoint/ (at step 3)."""
    out = tmp_path_factory.mktemp("lm") / "run"
    train_in_process("--set", "train.steps=3", "--set", "train.eval_every=2", "--set", f"train.out_dir={_q(out)}",
                     *TINY)
    return out


@pytest.fixture
def run(tmp_path, trained):
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


def _saving(run, monkeypatch, name: str = "checkpoint"):
    """A save of `name` (checkpoint/ or best/) under way: its new folder written, the first rename done when the
    reader first looks (`first`), the second and the removal of the old copy done while the reader waits before
    looking again."""
    folder, new, old = run / name, run / f".{name}.tmp", run / f".{name}.old"
    shutil.copytree(folder, new)
    waits = []

    def first():
        os.rename(folder, old)

    def wait(seconds):
        waits.append(seconds)
        if new.exists():
            os.rename(new, folder)
            shutil.rmtree(old)

    monkeypatch.setattr("time.sleep", wait)
    return first, waits


def test_load_run_reads_again_a_checkpoint_a_save_replaced_under_it(run, monkeypatch):
    import attnlab.data.tokenizers as tokenizers
    from attnlab.inference.runs import load_run

    first, waits = _saving(run, monkeypatch)
    real, calls = tokenizers.load_tokenizer, []

    def load_tokenizer(folder):  # the weights read, the save's first rename, then the tokenizer
        calls.append(folder)
        if len(calls) == 1:
            first()
        return real(folder)

    monkeypatch.setattr(tokenizers, "load_tokenizer", load_tokenizer)
    loaded = load_run(run)
    assert len(waits) == 1 and len(calls) == 2 and loaded.folder == run / "checkpoint"


def test_load_model_of_a_run_being_saved_never_takes_its_best(run, monkeypatch):
    first, waits = _saving(run, monkeypatch)
    real = ckpt._complete
    looked = []

    def complete(folder):  # the reader finds checkpoint/ gone (first rename), then the new one in place
        if folder == run / "checkpoint" and not looked:
            looked.append(folder)
            first()
            result = real(folder)
            os.rename(run / ".checkpoint.tmp", folder)  # the second rename, before the reader's next look
            return result
        return real(folder)

    monkeypatch.setattr(ckpt, "_complete", complete)
    assert ckpt.find_checkpoint(run) == run / "checkpoint"
    assert ckpt.read_trainer_state(ckpt.find_checkpoint(run))["step"] == 3


def test_an_error_with_no_save_under_way_is_raised_at_once(run, monkeypatch):
    waits = []
    monkeypatch.setattr("time.sleep", waits.append)
    (run / "checkpoint" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError):
        ckpt.load_model(run)
    assert waits == []


def test_an_error_that_stays_is_raised_after_a_few_looks(run, monkeypatch):
    waits = []
    monkeypatch.setattr("time.sleep", waits.append)
    (run / ".checkpoint.tmp").mkdir()  # a save cut short by a kill: a save may be under way
    (run / "checkpoint" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError):
        ckpt.load_model(run)
    assert len(waits) == ckpt.SETTLE_TRIES - 1


@pytest.mark.parametrize("where", ["checkpoint", "run"])
def test_a_symbolic_link_loop_is_one_line(capsys, tmp_path, run, where):
    if where == "checkpoint":
        shutil.rmtree(run / "checkpoint")
        (run / "checkpoint").symlink_to("checkpoint")
        given = run
    else:
        given = tmp_path / "loop"
        given.symlink_to("loop")
    named = run / "checkpoint" if where == "checkpoint" else given
    expected = f"{named} is a symbolic link that leads back to itself (a loop); point it at a checkpoint folder, " \
               "or remove it"
    assert one_line_error(capsys, "generate", str(given), "-p", "a", "--device", "cpu").endswith(expected)
    with pytest.raises(CheckpointError, match="leads back to itself"):
        ckpt.load_model(given)
    if where == "checkpoint":
        assert one_line_error(capsys, "train", "--resume", "--set", f"train.out_dir={_q(run)}",
                              *TINY).endswith(expected)


@pytest.mark.parametrize("state", ["missing", "empty", "file"])
def test_a_run_without_a_usable_checkpoint_folder_is_read_alike_everywhere(capsys, run, state):
    """checkpoint/ gone: its best/ is read, with a warning that says so (it had been without a word). checkpoint/ an
    empty folder or a file: refused by generate, evaluate and load_model alike, naming best/ (load_model and
    model.init_from had taken best/ without a word, generate called the run folder a file)."""
    from attnlab.inference.runs import load_run

    shutil.rmtree(run / "checkpoint")
    if state == "empty":
        (run / "checkpoint").mkdir()
    elif state == "file":
        (run / "checkpoint").write_text("x", encoding="utf-8")
    if state == "missing":
        said = f"{run} has no checkpoint/ (its latest weights): using its best/ checkpoint (step 3)"
        with pytest.warns(UserWarning, match=re.escape(said)):
            assert load_run(run).folder == run / "best"
        with warnings.catch_warnings():  # said once per process for a run (model.init_from reads it six times)
            warnings.simplefilter("error")
            ckpt.load_model(run)
        return
    what = "holds no checkpoint" if state == "empty" else "is a file, not a checkpoint folder"
    expected = f"{run / 'checkpoint'} {what}; the run's best checkpoint is {run / 'best'}: give that folder " \
               "(generate and evaluate: --best)"
    for command in (["generate", str(run), "-p", "a"], ["evaluate", str(run), "-d", str(run / "run.json")]):
        assert one_line_error(capsys, *command, "--device", "cpu") == f"attnlab: error: {expected}"
    with pytest.raises(CheckpointError) as info:
        ckpt.load_model(run)
    assert str(info.value) == expected


@pytest.mark.parametrize("argument", [{"which": "latest"}, {"dtype": "fp8"}, {"device": "cuda:99"}])
def test_a_bad_argument_is_refused_at_once_beside_a_leftover_save(run, monkeypatch, argument):
    # (review of stop 46) a save a kill cut short leaves .checkpoint.tmp, which reads as a save under way: the
    # call's own mistakes were read again five times before they were said
    from attnlab.errors import ConfigError
    from attnlab.inference.runs import load_run

    waits = []
    monkeypatch.setattr("time.sleep", waits.append)
    (run / ".checkpoint.tmp").mkdir()
    with pytest.raises(ConfigError):
        load_run(run, **argument)
    assert waits == []
