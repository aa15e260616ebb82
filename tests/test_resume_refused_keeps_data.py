"""A resume refused for its model settings had already replaced the finished run's data/ token files with another
text's (the model was checked by the trainer, after the token files were written)."""

from __future__ import annotations

import hashlib

from cli_helpers import one_line_error, train_in_process
from cli_helpers import toml_str as _q

COMMON = ["--set", "model.preset=gpt-char-tiny", "--set", "train.batch_size=4", "--set", "train.precision=fp32",
          "--set", "train.progress=false", "--set", "train.device=cpu", "--set", "train.warmup_steps=0"]


def _run_and_other_text(tmp_path, steps: int):
    """A run trained `steps` steps on a text, and another text (the same lines reversed) to resume it on."""
    a, b, run = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "run"
    lines = [f"line {i} of the text, with words enough\n" for i in range(200)]
    a.write_text("".join(lines), encoding="utf-8")
    b.write_text("".join(reversed(lines)), encoding="utf-8")
    train_in_process(*COMMON, "--set", f"data.path={_q(a)}", "--set", f"train.steps={steps}",
                     "--set", f"train.out_dir={_q(run)}")
    return run, b


def test_a_refused_resume_leaves_data_as_it_was(tmp_path, capsys):
    run, b = _run_and_other_text(tmp_path, 2)

    def digests():
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((run / "data").iterdir())}

    before = digests()
    line = one_line_error(capsys, "train", *COMMON, "--set", f"data.path={_q(b)}", "--set", "train.steps=4",
                          "--set", "model.n_layers=3", "--set", f"train.out_dir={_q(run)}", "--resume")
    assert "cannot resume: " in line and "holds a model with other settings (n_layers 2 → 3)" in line
    assert digests() == before


def test_a_training_part_too_short_after_holding_out_says_so(tmp_path, capsys):
    # "the training text has 31 tokens, fewer than one window of 33; give a longer text" for a text of 93: the
    # part left after data.val_fraction fell short.
    text = tmp_path / "t.txt"
    text.write_text("abcdefghij klmnopq rstuvwxyz a\n"
                    "wxyz abcdefghij klmnopq rstuvwxyz abcdefghij klmnopq rstuvwxy\n", encoding="utf-8")
    line = one_line_error(capsys, "train", *COMMON, "--set", f"data.path={_q(text)}", "--set", "data.val_fraction=0.7",
                          "--set", "train.steps=2", "--set", f"train.out_dir={_q(tmp_path / 'run')}")
    assert "the part of the text trained on (data.val_fraction = 0.7 of it held out) has 31 tokens" in line
    assert "lower data.val_fraction, give a longer text or a smaller data.block_size" in line


def test_a_resume_refused_for_its_steps_leaves_data_as_it_was(tmp_path, capsys):
    # A resume to fewer steps than the checkpoint's is refused by the trainer, after the token files had been
    # moved in: data/ held b.txt's tokens beside a.txt's run (stop-40 corpus audit).
    run, b = _run_and_other_text(tmp_path, 3)
    before = {p.name: p.read_bytes() for p in sorted((run / "data").iterdir())}
    line = one_line_error(capsys, "train", *COMMON, "--set", f"data.path={_q(b)}", "--set", "train.steps=2",
                          "--set", f"train.out_dir={_q(run)}", "--resume")
    assert line == ("attnlab: error: cannot resume: the checkpoint is at step 3, past train.steps = 2; set "
                    "train.steps above 3 to train on (or to 3: the run is finished)")
    assert {p.name: p.read_bytes() for p in sorted((run / "data").iterdir())} == before
