"""Fifth data audit: a text that fills one window only with its held-out tail (whose tenth is too short to score)
was refused, told to lower data.val_fraction, where the documented fallback (nothing held out, the whole text trained
on) applies."""

from __future__ import annotations

import warnings

from cli_helpers import one_line_error, run_cli
from cli_helpers import toml_str as _q

TINY = ["--set", "model.preset=gpt-char-tiny", "--set", "train.steps=2", "--set", "train.eval_every=0",
        "--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu"]  # block 32


def _train(capsys, tmp_path, text: str, *extra: str):
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    return ["train", *TINY, "--set", f"data.path={_q(path)}", "--set", f"train.out_dir={_q(tmp_path / 'run')}",
            *extra]


def test_a_text_whose_tail_is_too_short_to_score_trains_on_the_whole(capsys, tmp_path):
    argv = _train(capsys, tmp_path, "a" * 29 + "\nb\ncc\n")  # 35 characters: 32 + a tail of 3, one window is 33
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    said = [str(w.message) for w in caught]
    assert any(m.startswith("nothing held out for evaluation: the last data.val_fraction = 0.1") for m in said), said
    assert not (tmp_path / "run" / "data" / "val.bin").exists()


def test_a_text_too_short_even_whole_is_refused_as_the_training_text(capsys, tmp_path):
    argv = _train(capsys, tmp_path, "a" * 25 + "\nb\ncc\n")  # 31 characters
    line = one_line_error(capsys, *argv)
    assert "the training text has 31 tokens, fewer than one window of 33; give a longer text or a smaller " \
           "data.block_size" in line, line


def test_a_held_out_tail_that_scores_leaves_the_part_trained_on_to_be_refused(capsys, tmp_path):
    # the tail fills a window (it is scored), so the part trained on is what falls short: lower val_fraction
    argv = _train(capsys, tmp_path, "a" * 20 + "\n" + "b" * 40 + "\n", "--set", "data.val_fraction=0.6")
    line = one_line_error(capsys, *argv)
    assert "the part of the text trained on (data.val_fraction = 0.6 of it held out) has" in line, line
    assert "lower data.val_fraction" in line


def test_without_a_held_out_part_a_short_text_is_the_training_texts_fault(capsys, tmp_path):
    argv = _train(capsys, tmp_path, "a" * 25 + "\n", "--set", "data.val_fraction=0")
    assert "the training text has 26 tokens" in one_line_error(capsys, *argv)
