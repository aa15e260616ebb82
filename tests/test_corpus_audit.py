"""Text corpora to token files: what an audit of the held-out split, the run folder's data/ and empty texts found."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest
from cli_helpers import one_line_error, run_cli
from cli_helpers import toml_str as _q

from attnlab.data.text_files import line_split_offset
from attnlab.training.recipe import _HOST

LM = ["--set", "model.preset=gpt-char-tiny", "--set", "train.steps=2", "--set", "train.batch_size=4",
      "--set", "train.precision=fp32", "--set", "train.progress=false", "--set", "train.device=cpu",
      "--set", "train.eval_every=0"]
PARAGRAPHS = [f"paragraph {i}: " + "the quick brown fox jumps over the lazy dog. " * 3 for i in range(8)]


@pytest.mark.parametrize("blanks", ["", "   "])
def test_a_final_line_end_does_not_decide_whether_anything_is_held_out(tmp_path, blanks):
    # One paragraph a line: without a final line end the last paragraph was held out; with one (as files
    # usually end), the line start found after the target was the end of the file, and nothing was.
    bare, ended = tmp_path / "bare.txt", tmp_path / "ended.txt"
    bare.write_text("\n".join(PARAGRAPHS), encoding="utf-8")
    ended.write_text("\n".join(PARAGRAPHS) + "\n" + (blanks + "\n" if blanks else ""), encoding="utf-8")
    last_line = len("\n".join(PARAGRAPHS[:-1])) + 1
    assert line_split_offset(bare, 0.9) == last_line == line_split_offset(ended, 0.9)


def test_a_text_of_one_line_holds_out_its_tail_whatever_its_line_end(tmp_path):
    bare, ended = tmp_path / "bare.txt", tmp_path / "ended.txt"
    bare.write_text("abcdefghij" * 100, encoding="utf-8")
    ended.write_text("abcdefghij" * 100 + "\n", encoding="utf-8")
    assert line_split_offset(bare, 0.9) == 900 == line_split_offset(ended, 0.9)


def _digests(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".attnlab.lock"}


def test_a_run_refused_for_its_data_leaves_the_folder_as_it_was(capsys, tmp_path):
    # The token files were written into data/ before the data's checks: a refused run had replaced a finished run's
    # token files with another text's, or left a data/ where no run was.
    text, other, short = tmp_path / "text.txt", tmp_path / "other.txt", tmp_path / "short.txt"
    text.write_text("\n".join(PARAGRAPHS * 3) + "\n", encoding="utf-8")
    other.write_text("\n".join(reversed(PARAGRAPHS * 3)) + "\n", encoding="utf-8")
    short.write_text("short\n", encoding="utf-8")
    run = tmp_path / "run"
    assert run_cli(capsys, "train", *LM, "--set", f"data.path={_q(text)}", "--set", f"train.out_dir={_q(run)}")[0] == 0
    before = _digests(run)
    assert {"data/train.bin", "data/val.bin"} <= set(before)
    for out in (run, tmp_path / "fresh"):
        line = one_line_error(capsys, "train", *LM, "--set", f"data.path={_q(other)}", "--set",
                              f"data.eval_path={_q(short)}", "--set", f"train.out_dir={_q(out)}")
        assert "fewer than one window" in line
    assert _digests(run) == before and not (tmp_path / "fresh").exists()
    assert not list(run.glob(".data.*")) and not list((run / "data").glob(".partial*"))  # no staging folder left


def test_a_text_of_no_tokens_is_named_by_its_file(capsys, tmp_path):
    # Every character dropped by WordPiece's normaliser: the error named the token file it was to fill (a temporary
    # one, or the run's data/val.bin) and called the text empty.
    text, blank = tmp_path / "text.txt", tmp_path / "controls.txt"
    text.write_text("\n".join(PARAGRAPHS * 3) + "\n", encoding="utf-8")
    blank.write_text("\x01\x02\x03\n\u200b\n", encoding="utf-8")
    wordpiece = [*LM, "--set", "data.tokenizer=wordpiece", "--set", "data.vocab_size=200"]
    run = tmp_path / "run"
    assert run_cli(capsys, "train", *wordpiece, "--set", f"data.path={_q(text)}", "--set",
                   f"train.out_dir={_q(run)}")[0] == 0
    line = one_line_error(capsys, "evaluate", str(run), "--data", str(blank), "--device", "cpu")
    assert f"{blank}: encodes to no tokens" in line
    shutil.rmtree(run)
    line = one_line_error(capsys, "train", *wordpiece, "--set", f"data.path={_q(text)}", "--set",
                          f"data.eval_path={_q(blank)}", "--set", f"train.out_dir={_q(run)}")
    assert f"{blank} (data.eval_path): encodes to no tokens" in line


@pytest.mark.parametrize("kind, least", [("bpe", 263), ("wordpiece", 8)])
def test_a_subword_tokenizer_without_a_size_says_to_set_one(kind, least):
    # "must be at least 263 ..., got None; raise it": nothing was set to raise.
    from attnlab.data.tokenizers import train_tokenizer
    from attnlab.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"a {kind} tokenizer learns .* which is not set; set it, at least {least} "):
        train_tokenizer(kind, "some text to learn from", None)


def test_a_held_out_tail_of_dropped_characters_is_trained_on_as_a_short_one(capsys, tmp_path):
    # The tail held out of data.path encoding to no tokens (a DOS end-of-file run of \x1a under WordPiece) refused
    # the run, saying every character of the file was dropped; a tail too short to score trains on instead.
    text = tmp_path / "dos.txt"
    text.write_text("\n".join(PARAGRAPHS * 3) + "\n" + "\x1a" * 300 + "\n", encoding="utf-8")
    wordpiece = [*LM, "--set", "data.tokenizer=wordpiece", "--set", "data.vocab_size=200", "--set",
                 "data.val_fraction=0.03"]
    with pytest.warns(UserWarning, match="nothing held out for evaluation"):
        code, _, err = run_cli(capsys, "train", *wordpiece, "--set", f"data.path={_q(text)}", "--set",
                               f"train.out_dir={_q(tmp_path / 'run')}")
    assert code == 0, err


def test_a_stale_staging_folder_of_this_process_number_is_not_moved_in(capsys, tmp_path):
    # A run killed while encoding leaves data/.partial.<host>.<pid>; a later process with that number (a container's
    # pid 1) moved the stale val.bin into data/ as its own.
    import os

    text = tmp_path / "text.txt"
    text.write_text("\n".join(PARAGRAPHS * 3) + "\n", encoding="utf-8")
    run = tmp_path / "run"
    stale = run / "data" / f".partial.{_HOST}.{os.getpid()}"
    stale.mkdir(parents=True)
    (stale / "val.bin").write_bytes(b"\0" * 64)
    (stale / "val.bin.json").write_text('{"stale": true}', encoding="utf-8")
    code, _, err = run_cli(capsys, "train", *LM, "--set", f"data.path={_q(text)}", "--set", "data.val_fraction=0",
                           "--set", f"train.out_dir={_q(run)}")
    assert code == 0, err
    assert not (run / "data" / "val.bin").exists() and not stale.exists()


@pytest.mark.skipif(os.name != "posix", reason="a process's life is asked by signal 0 on POSIX only")
def test_staging_folders_of_dead_processes_are_cleared(capsys, tmp_path):
    # A run killed (SIGKILL) while encoding left data/.partial.<host>.<pid> with its partial token files for good; the
    # staging folder of a process still running (another rank of a torchrun run) is left alone.
    import subprocess
    import sys

    text = tmp_path / "text.txt"
    text.write_text("\n".join(PARAGRAPHS * 3) + "\n", encoding="utf-8")
    run = tmp_path / "run"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = run / "data" / f".partial.{_HOST}.{int(gone.stdout)}"
    live = run / "data" / f".partial.{_HOST}.{os.getppid()}"
    # another machine's process of that number (ranks of a multi-machine run sharing a network disk): not asked
    elsewhere = run / "data" / f".partial.other-host.{int(gone.stdout)}"
    # not a process number: "²" is a digit to str.isdigit that int() refused, with a traceback (stop-40 review)
    odd = run / "data" / f".partial.{_HOST}.²"
    for folder in (dead, live, elsewhere, odd):
        folder.mkdir(parents=True)
        (folder / "train.bin").write_bytes(b"\0" * 64)
    code, _, err = run_cli(capsys, "train", *LM, "--set", f"data.path={_q(text)}", "--set",
                           f"train.out_dir={_q(run)}")
    assert code == 0, err
    assert not dead.exists() and (live / "train.bin").exists() and (elsewhere / "train.bin").exists()
    assert (odd / "train.bin").exists()


def test_token_files_stay_on_the_disk_data_links_to(capsys, tmp_path):
    # Staged beside data/ on the run folder's disk, the files could not be moved into a data/ linking to another
    # one ("Invalid cross-device link").
    import os

    other = os.environ.get("ATTNLAB_TEST_OTHER_DISK", "/dev/shm")
    if not os.path.isdir(other) or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs a folder on another file system (/dev/shm, or ATTNLAB_TEST_OTHER_DISK)")
    import tempfile

    text = tmp_path / "text.txt"
    text.write_text("\n".join(PARAGRAPHS * 3) + "\n", encoding="utf-8")
    with tempfile.TemporaryDirectory(dir=other) as elsewhere:
        run = tmp_path / "run"
        run.mkdir()
        (run / "data").symlink_to(elsewhere, target_is_directory=True)
        code, _, err = run_cli(capsys, "train", *LM, "--set", f"data.path={_q(text)}", "--set",
                               f"train.out_dir={_q(run)}")
        assert code == 0, err
        assert (run / "data" / "train.bin").is_file() and (run / "data" / "val.bin").is_file()
