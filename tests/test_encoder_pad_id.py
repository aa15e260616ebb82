"""model.pad_id of an encoder (the id it hides from attention where a batch has no attention_mask) against the
tokenizer's pad token. A language model's run took any value (stop 43): with a char tokenizer, which has no pad,
every newline (id 0) was hidden from attention without a word; with another id than the tokenizer's, or beside
model.init_from of a language model (whose config leaves pad_id unset), the run trained and then evaluate, generate and
--resume refused its own tokenizer.json."""

from __future__ import annotations

import pytest
from cli_helpers import one_line_error, run_cli
from cli_helpers import toml_str as _q

TINY = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu",
        "--set", "train.steps=2", "--set", "train.batch_size=4", "--set", "train.warmup_steps=1",
        "--set", "train.eval_every=0"]
TEXT = "".join(f"the {w} sat on the mat and looked at the {w} next door\n" for w in ("cat", "dog", "fox", "owl") * 8)


def _lm(tmp_path, tokenizer, *extra):
    (tmp_path / "docs.txt").write_text(TEXT, encoding="utf-8")
    return ("train", "--set", "model.preset=\"encoder-tiny\"", "--set", f"data.tokenizer=\"{tokenizer}\"",
            "--set", f"data.path={_q(tmp_path / 'docs.txt')}", "--set", "data.block_size=8", *TINY, *extra)


@pytest.mark.parametrize("tokenizer, pad_id, says", [("char", 0, "the tokenizer has no pad token"),
                                                     ("word", 5, "the tokenizer's pad id is 0")])
def test_a_language_model_pad_id_the_tokenizer_does_not_have_is_refused(capsys, tmp_path, tokenizer, pad_id, says):
    line = one_line_error(capsys, *_lm(tmp_path, tokenizer, "--set", f"model.pad_id={pad_id}",
                                       "--set", f"train.out_dir={_q(tmp_path / 'lm')}"))
    assert f"model.pad_id = {pad_id}, but {says}" in line and line.endswith("drop model.pad_id")
    assert not (tmp_path / "lm" / "checkpoint").exists()


def test_a_language_model_pad_id_equal_to_the_tokenizer_s_trains_and_evaluates(capsys, tmp_path):
    code, _, err = run_cli(capsys, *_lm(tmp_path, "word", "--set", "model.pad_id=0",
                                        "--set", f"train.out_dir={_q(tmp_path / 'lm')}"))
    assert code == 0, err
    code, out, err = run_cli(capsys, "evaluate", str(tmp_path / "lm"), "--data", str(tmp_path / "docs.txt"),
                             "--device", "cpu")
    assert code == 0 and "perplexity" in out, err


def test_a_pad_id_beside_init_from_of_a_language_model_is_checked_against_its_tokenizer(capsys, tmp_path):
    code, _, err = run_cli(capsys, *_lm(tmp_path, "word", "--set", f"train.out_dir={_q(tmp_path / 'lm')}"))
    assert code == 0, err
    table = tmp_path / "cls.tsv"
    table.write_text("".join(f"the {w} sat\t{w}\n" for w in ("cat", "dog") * 6), encoding="utf-8")
    line = one_line_error(capsys, "train", "--set", f"model.init_from={_q(tmp_path / 'lm')}", "--set",
                          "model.pad_id=5", "--set", "data.task=\"classification\"", "--set",
                          f"data.path={_q(table)}", "--set", "data.max_length=16", *TINY,
                          "--set", f"train.out_dir={_q(tmp_path / 'cls')}")
    assert "model.pad_id = 5, but the tokenizer's pad id is 0; drop model.pad_id" in line
    assert not (tmp_path / "cls" / "checkpoint").exists()
