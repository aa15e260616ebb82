"""Atomic writes: the target holds the old content or the new, never a part; no temporary file is left."""

import json
import os

import numpy as np
import pytest
import torch

from attnlab.data.corpus import build_token_file
from attnlab.data.tokenizers import CharTokenizer
from attnlab.errors import DataError
from attnlab.files import atomic_path, write_text_atomic
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.training.checkpoint import save_checkpoint
from attnlab.training.logging import MetricsLog, plot_losses


def test_write_replaces_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "results.md"
    path.write_text("old")
    assert write_text_atomic(path, "new\nlines\n") == path
    assert path.read_bytes() == b"new\nlines\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.md"]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_failed_write_keeps_the_old_file(tmp_path, error):
    path = tmp_path / "run.json"
    path.write_text("old")
    with pytest.raises(error), atomic_path(path) as tmp:
        tmp.write_text("half of the ne")
        raise error()
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_failed_first_write_creates_nothing(tmp_path):
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "new.txt") as tmp:
        tmp.write_text("x")
        raise RuntimeError
    assert list(tmp_path.iterdir()) == []


def test_temporary_name_keeps_the_suffix_and_the_process(tmp_path):
    with atomic_path(tmp_path / "curve.png") as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".png" and str(os.getpid()) in tmp.name
        tmp.write_bytes(b"png")
    assert (tmp_path / "curve.png").read_bytes() == b"png"


def test_block_that_writes_nothing_is_an_error(tmp_path):
    # A writer that forgot to create the file must not be mistaken for success.
    with pytest.raises(FileNotFoundError), atomic_path(tmp_path / "x.txt"):
        pass
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.name != "posix", reason="file modes")
def test_saved_files_get_ordinary_permissions(tmp_path):
    # The tokenizer was written through mkstemp once, which made tokenizer.json readable by its owner only.
    # safetensors creates owner-only files too; a checkpoint's weights should be as readable as its config.
    model = GPT(GPTConfig(vocab_size=5, block_size=4, d_model=8, n_heads=2, n_layers=1))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 3, dtype=torch.long), labels=torch.zeros(1, 3, dtype=torch.long)).loss.backward()
    optimizer.step()
    tok = CharTokenizer.train(["abc"])
    old = os.umask(0o022)
    try:
        tok.save(tmp_path)
        write_text_atomic(tmp_path / "results.md", "x")
        folder = save_checkpoint(tmp_path / "checkpoint", model, optimizer, {"step": 1}, tok)
    finally:
        os.umask(old)
    assert os.umask(old) == old  # the umask is left as it was
    files = [tmp_path / "tokenizer.json", tmp_path / "results.md", *folder.iterdir()]
    assert {p.name for p in folder.iterdir()} >= {"model.safetensors", "optimizer.safetensors", "config.json"}
    for path in files:
        assert path.stat().st_mode & 0o777 == 0o644, path


def test_token_file_of_an_empty_text_leaves_nothing(tmp_path):
    tok = CharTokenizer.train(["abc"])
    out = tmp_path / "tokens.bin"
    with pytest.raises(DataError, match="empty"):
        build_token_file([""], tok, out)
    assert list(tmp_path.iterdir()) == []
    build_token_file(["abcab"], tok, out)
    assert np.fromfile(out, dtype=np.uint16).tolist() == tok.encode("abcab")


def test_metrics_log_restart_and_plot(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.start()
    for step in (1, 2, 3):
        log.write({"step": step, "loss": 1.0 / step})
    log.start(keep_until_step=2)
    assert [r["step"] for r in log.read()] == [1, 2]
    png = plot_losses(log.read(), tmp_path / "loss.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loss.png", "metrics.jsonl"]


def test_a_folder_lock_keeps_a_second_run_out(tmp_path, capsys):
    """Two `attnlab train` runs into one folder interleaved their checkpoints, run.json and metrics.jsonl (the
    second died on the first's temporary folder, or mixed the two runs); the second is now refused in words."""
    from cli_helpers import one_line_error

    from attnlab.errors import ConfigError
    from attnlab.files import LOCK_FILE, folder_lock

    run = tmp_path / "run"
    with folder_lock(run, "train.out_dir"):
        assert (run / LOCK_FILE).is_file()
        with pytest.raises(ConfigError, match="train.out_dir: another attnlab run is writing into"):
            with folder_lock(run, "train.out_dir"):
                pass
        line = one_line_error(capsys, "train", "--set", "model.preset=\"gpt-char-tiny\"", "--set", "train.steps=1",
                              "--set", f"train.out_dir={json.dumps(str(run))}")
        assert "another attnlab run is writing into" in line
    with folder_lock(run, "train.out_dir"):  # released with its block
        pass
    assert not run.exists()  # made by the lock and left empty: removed again
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    with pytest.raises(ConfigError, match="'.*afile' is a file, not a folder"):
        with folder_lock(tmp_path / "afile", "train.out_dir"):
            pass
    with folder_lock(run, "x", enabled=False):  # not rank 0: holds nothing
        assert not run.exists()
    with folder_lock(tmp_path / "runs" / "deep" / "run", "train.out_dir"):  # parents made for it go with it
        pass
    assert not (tmp_path / "runs").exists()


def test_a_run_inside_another_runs_folder_is_refused_either_way(tmp_path, capsys):
    """The lock held a run's folder only: `attnlab train` into a live knowledge run's phase folder mixed its records
    into the experiment's, and a knowledge run rerun over a live training run in its phase folder deleted and rewrote
    that run's folder (stop-41 newcomer audit)."""
    from cli_helpers import one_line_error

    from attnlab.errors import ConfigError
    from attnlab.files import folder_lock

    outer, inner = tmp_path / "kx", tmp_path / "kx" / "pretrain-dot"
    with folder_lock(outer, "--out"):  # a knowledge run: a training run inside it is refused
        line = one_line_error(capsys, "train", "--set", "model.preset=\"gpt-char-tiny\"", "--set", "train.steps=1",
                              "--set", f"train.out_dir={json.dumps(str(inner))}")
        assert f"'{inner}' is inside '{outer}', which another attnlab run is writing into; wait for it" in line
        assert not inner.exists()
    with folder_lock(inner, "train.out_dir"):  # a training run: a knowledge run over its folder is refused
        line = one_line_error(capsys, "run", "knowledge", "--out", str(outer), "--variants", "none")
        assert f"--out: another attnlab run is writing into '{inner}', inside '{outer}'; wait for it" in line
        with pytest.raises(ConfigError, match="another attnlab run is writing into"):
            with folder_lock(outer, "train.out_dir"):  # a training run too (the folders just inside it are looked at)
                pass
        with folder_lock(tmp_path, "train.out_dir"):  # one level apart only: a run two folders up writes elsewhere
            pass
    with folder_lock(outer, "--out"), folder_lock(tmp_path / "elsewhere", "--out"):  # free again; siblings apart
        pass


def test_a_run_refused_by_the_lock_leaves_the_holders_new_folder(tmp_path, monkeypatch):
    """Two runs into a folder not yet made: the one refused by the lock had found the folder missing, and removed
    it with the holder's lock file (a third run then took the folder beside the first)."""
    import attnlab.files as files
    from attnlab.errors import ConfigError

    folder, real, held = tmp_path / "new" / "run", files.make_folder, []

    def made_then_taken(path, setting):  # the other run takes the lock between this one's checks and its lock
        real(path, setting)
        if not held:
            held.append(files.folder_lock(path, "--out"))
            held[0].__enter__()

    monkeypatch.setattr(files, "make_folder", made_then_taken)
    with pytest.raises(ConfigError, match="another attnlab run is writing into"):
        with files.folder_lock(folder, "--out"):
            pass
    monkeypatch.undo()
    assert (folder / files.LOCK_FILE).is_file()
    with pytest.raises(ConfigError, match="another attnlab run is writing into"):  # still held by the first
        with files.folder_lock(folder, "--out"):
            pass
    held[0].__exit__(None, None, None)


@pytest.mark.parametrize("errno_name, held", [("EACCES", True), ("EINVAL", False)])
def test_windows_counts_only_a_held_lock_as_held(monkeypatch, errno_name, held):
    """msvcrt's refusal is a plain OSError: every error was read as another run holding the folder, so a file system
    that cannot lock refused every run there (POSIX runs unguarded)."""
    import errno
    import io

    import attnlab.files as files

    class FakeMsvcrt:
        LK_NBLCK, LK_UNLCK = 2, 0

        @staticmethod
        def locking(fd, mode, n):
            raise OSError(getattr(errno, errno_name), "locking failed")

    monkeypatch.setattr(files, "fcntl", None)
    monkeypatch.setattr(files, "msvcrt", FakeMsvcrt)
    handle = io.BytesIO()
    handle.fileno = lambda: 3
    assert files._lock(handle, True) is (not held)



def test_a_folder_that_cannot_be_entered_does_not_stop_the_nested_run_check(tmp_path, monkeypatch):
    # The check for a run just inside looks into every folder there: one without permission to enter raised
    # PermissionError from its lock file's stat (stood in for here: the tests may run as root, who enters any folder).
    import pathlib

    from attnlab.files import LOCK_FILE, folder_lock

    (tmp_path / "out" / "closed").mkdir(parents=True)
    real = pathlib.Path.is_file

    def is_file(path):
        if path.name == LOCK_FILE and path.parent.name == "closed":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(pathlib.Path, "is_file", is_file)
    with folder_lock(tmp_path / "out", "train.out_dir"):
        pass
