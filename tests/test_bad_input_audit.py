"""Bad input found by an audit of every command: each case gives one line naming the problem and the fix, exit
code 2, no traceback, and leaves an existing run folder as it was."""

from __future__ import annotations

import json
import shutil

import pytest
from cli_helpers import one_line_error, run_cli, train_in_process
from cli_helpers import toml_str as _q

TINY = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu"]
LM = ["--set", "model.preset=gpt-char-tiny", "--set", "train.eval_every=0", *TINY]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A tiny char GPT (block 32) trained for 2 steps."""
    out = tmp_path_factory.mktemp("lm") / "run"
    train_in_process("--set", "train.steps=2", "--set", f"train.out_dir={_q(out)}", *LM)
    return out


@pytest.fixture
def lm_copy(tmp_path, lm_run):
    shutil.copytree(lm_run, tmp_path / "run")
    return tmp_path / "run"


def test_a_refused_knowledge_run_leaves_the_earlier_runs_data_alone(tmp_path, capsys):
    out = tmp_path / "k"
    (out / "data").mkdir(parents=True)
    (out / "results.json").write_text("{}", encoding="utf-8")
    (out / "data" / "train.tsv").write_text("Where was A born?\tB\n", encoding="utf-8")
    # The synthetic world's questions do not fit a block of 5 characters: refused, and without the warning that
    # this run replaces the earlier one (which it does not).
    argv = ["run", "knowledge", "--variants", "none", "--quiet", "--device", "cpu", "--set", "block_size=5"]
    assert "raise block_size" in one_line_error(capsys, *argv, "--out", str(out))
    assert (out / "data" / "train.tsv").read_text(encoding="utf-8") == "Where was A born?\tB\n"
    assert sorted(p.name for p in (out / "data").iterdir()) == ["train.tsv"]
    one_line_error(capsys, *argv, "--out", str(tmp_path / "new"))
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_generate_refuses_a_seed_out_of_range(capsys, lm_run, seed):
    line = one_line_error(capsys, "generate", str(lm_run), "--prompt", "x", "-n", "2", "--device", "cpu",
                          "--seed", seed)
    assert f"--seed must be an integer from 0 to 2**63 - 1, got {seed}" in line


@pytest.mark.parametrize("step", ["1e999", "2.5", '"2"', "true"])
def test_resume_refuses_a_step_that_is_not_a_whole_number(capsys, lm_copy, step):
    path = lm_copy / "checkpoint" / "trainer_state.json"
    state = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**state, "step": "STEP"}).replace('"STEP"', step), encoding="utf-8")
    before = (lm_copy / "run.json").read_bytes()
    line = one_line_error(capsys, "train", "--resume", "--set", "train.steps=4",
                          "--set", f"train.out_dir={_q(lm_copy)}", *LM)
    assert "trainer_state.json is malformed" in line and "is not a whole number" in line
    assert (lm_copy / "run.json").read_bytes() == before


def test_an_evaluation_text_shorter_than_a_window_is_refused(tmp_path, capsys):
    text, short = tmp_path / "text.txt", tmp_path / "short.txt"
    text.write_text("abcdefghij" * 100 + "\n", encoding="utf-8")
    short.write_text("abc\n", encoding="utf-8")
    line = one_line_error(capsys, "train", "--set", f"data.path={_q(text)}", "--set", f"data.eval_path={_q(short)}",
                          "--set", "train.steps=2", "--set", f"train.out_dir={_q(tmp_path / 'run')}", *LM)
    assert "the evaluation text" in line and "fewer than one window of 33" in line and "data.eval_path" in line


def test_a_held_out_part_shorter_than_a_window_is_said(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("abcdefghij" * 100 + "\nabc\n", encoding="utf-8")  # the last tenth, cut at a line: "abc\n"
    with pytest.warns(UserWarning, match="nothing held out for evaluation: the last data.val_fraction = 0.1"):
        code, _, err = run_cli(capsys, "train", "--set", f"data.path={_q(text)}", "--set", "train.steps=2",
                               "--set", f"train.out_dir={_q(tmp_path / 'run')}", *LM)
    assert code == 0, err


def test_a_run_holding_nothing_out_leaves_no_earlier_held_out_tokens(tmp_path, capsys):
    """A run that holds nothing out removes the held-out token file an earlier run left in the folder. (A text of
    one line, newline-terminated, held nothing out, where the same text without its final line end held out its
    tail: both now hold out the tail, cut at a character boundary, see test_corpus_audit.)"""
    text = tmp_path / "text.txt"
    text.write_text("abcdefghij" * 100 + "\nklmnopqrst" * 50 + "\n", encoding="utf-8")
    code, _, err = run_cli(capsys, "train", "--set", f"data.path={_q(text)}", "--set", "train.steps=2",
                           "--set", f"train.out_dir={_q(tmp_path / 'run')}", *LM)
    assert code == 0 and (tmp_path / "run" / "data" / "val.bin").exists(), err
    code, _, err = run_cli(capsys, "train", "--set", f"data.path={_q(text)}", "--set", "train.steps=2",
                           "--set", "data.val_fraction=0", "--set", f"train.out_dir={_q(tmp_path / 'run')}", *LM)
    assert code == 0, err
    assert not (tmp_path / "run" / "data" / "val.bin").exists()  # the earlier run's held-out tokens are gone


def test_a_folder_in_place_of_a_run_file_is_named(capsys, lm_copy):
    (lm_copy / "run.json").unlink()
    (lm_copy / "run.json").mkdir()
    line = one_line_error(capsys, "train", "--resume", "--set", "train.steps=3",
                          "--set", f"train.out_dir={_q(lm_copy)}", *LM)
    assert line.endswith(f"{lm_copy / 'run.json'}; check the path and its permissions") and ".tmp" not in line


def test_params_names_the_config_file_that_holds_a_bad_setting(capsys, lm_copy):
    config = lm_copy / "checkpoint" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text(encoding="utf-8")), "colour": 1}), encoding="utf-8")
    line = one_line_error(capsys, "params", str(lm_copy))
    assert line.startswith(f"attnlab: error: {config}: unknown setting model.colour")
    assert "the model name is empty" in one_line_error(capsys, "params", "")


@pytest.mark.filterwarnings("ignore:.*already holds a trained run", "ignore:.*were cut")
def test_max_length_beyond_a_bounded_models_positions_is_refused_before_the_run_folder_changes(tmp_path, capsys):
    rows = "".join(f"{'great movie ' * 20}\t1\n{'awful movie ' * 20}\t0\n" for _ in range(4))
    data = tmp_path / "train.tsv"
    data.write_text("sentence\tlabel\n" + rows, encoding="utf-8")
    run = tmp_path / "run"
    common = ["train", "--set", "data.task=classification", "--set", "model.family=encoder", "--set",
              f"data.path={_q(data)}", "--set", "data.text_column=sentence", "--set", "data.label_column=label",
              "--set", "data.tokenizer=word", "--set", "model.d_model=16", "--set", "model.n_heads=2", "--set",
              "model.d_ff=16", "--set", "model.n_layers=1", "--set", "model.max_len=16", "--set", "train.steps=1",
              "--set", "train.batch_size=4", "--set", f"train.out_dir={_q(run)}", *TINY]
    code, _, err = run_cli(capsys, *common, "--set", "data.max_length=16")
    assert code == 0, err
    before = {name: (run / name).read_bytes() for name in ("run.json", "metrics.jsonl")}
    # Learned positions stop at 16: texts of 41 tokens used to fail at the first step, after run.json was replaced
    # and metrics.jsonl emptied.
    line = one_line_error(capsys, *common, "--set", "data.max_length=64", "--set", "model.position=learned")
    assert "data.max_length 64 is longer than the model's 16 positions; lower data.max_length or raise model.max_len" \
        in line
    assert {name: (run / name).read_bytes() for name in before} == before


def test_resume_with_fewer_steps_than_the_checkpoint_is_refused(capsys, lm_copy):
    before = (lm_copy / "run.json").read_bytes()
    resume = ["train", "--resume", "--set", f"train.out_dir={_q(lm_copy)}", *LM]
    line = one_line_error(capsys, *resume, "--set", "train.steps=1")
    assert "the checkpoint is at step 2, past train.steps = 1; set train.steps above 2" in line
    assert (lm_copy / "run.json").read_bytes() == before  # not rewritten to describe a run of 1 step
    code, out, err = run_cli(capsys, *resume, "--set", "train.steps=2")  # a finished run, resumed: nothing to do
    assert code == 0 and "nothing to train: the checkpoint is already at train.steps = 2" in out, err
    # ... with other settings too: run.json still describes the run as trained (it took the new lr and text)
    code, out, err = run_cli(capsys, *resume, "--set", "train.steps=2", "--set", "train.lr=0.5")
    assert code == 0 and "nothing to train" in out, err
    assert (lm_copy / "run.json").read_bytes() == before


def test_out_of_memory_while_generating_names_the_number_of_new_tokens(capsys, monkeypatch, lm_run):
    import attnlab.inference.runs as runs

    def fail(*args, **kwargs):  # what -n 10**11 meets: a (1, 10**11) buffer of token ids
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(runs, "generate_texts", fail)
    line = one_line_error(capsys, "generate", str(lm_run), "--prompt", "x", "-n", str(10**11), "--device", "cpu")
    assert "out of memory" in line and "fewer new tokens (-n when generating)" in line


def test_a_pipe_is_read_as_a_config_and_refused_as_data_in_words_that_hold(tmp_path, capsys, lm_run):
    # `train <(printf ...)` said "not found" of a path that exists, and `evaluate -d <(cat text)` said the data file
    # was empty (a pipe's size is 0) while it held text (stop-39 CLI audit). A config is read once, so a pipe serves;
    # data is read more than once, so it is refused as what it is.
    import os

    from attnlab.errors import ConfigError
    from attnlab.training.recipe import load_run_config

    read, write = os.pipe()
    os.write(write, b"[train]\nsteps = 3\n")
    os.close(write)
    try:
        # It names no run folder: runs/<its name> would be runs/12 for every pipe (stop-39 review)
        with pytest.raises(ConfigError, match=r"is not a regular file \(a pipe\), so it names no run folder"):
            load_run_config(f"/dev/fd/{read}", [])
    finally:
        os.close(read)
    read, write = os.pipe()
    os.write(write, b"[train]\nsteps = 3\n")
    os.close(write)
    try:
        assert load_run_config(f"/dev/fd/{read}", [f"train.out_dir={_q(tmp_path / 'run')}"]).train.steps == 3
    finally:
        os.close(read)
    fifo = tmp_path / "text.fifo"
    os.mkfifo(fifo)
    line = one_line_error(capsys, "evaluate", str(lm_run), "-d", str(fifo), "--device", "cpu")
    assert line.endswith(f"data file '{fifo}' is not a regular file (a pipe or a device), which attnlab does not "
                         "read (most data is read more than once); save it to a file and give that")
