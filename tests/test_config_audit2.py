"""What a second audit of config files and settings found."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnlab.errors import ConfigError
from attnlab.training.recipe import DataConfig, _lm_text_parts, load_run_config, prepare

ROOT = Path(__file__).resolve().parents[1]


def test_a_val_fraction_too_small_for_a_line_of_the_pydoc_texts_is_said(recwarn):
    # A data.path file warned; the embedded texts trained without evaluations and said nothing.
    with pytest.warns(UserWarning, match="nothing held out for evaluation: no line of the pydoc texts starts"):
        _, held_out = _lm_text_parts(DataConfig(val_fraction=1e-5))
    assert held_out is None
    _, held_out = _lm_text_parts(DataConfig(val_fraction=0.1))
    assert held_out is not None and not [w for w in recwarn if "nothing held out" in str(w.message)]


def test_a_bert_pad_id_other_than_the_tokenizers_is_named_as_such(tmp_path):
    # It said "model.pad_id (3) must be a token id below vocab_size (1)": the placeholder size of the check that
    # reads model.nsp before the tokenizer exists, where the vocabulary had 300 tokens.
    docs = tmp_path / "docs.txt"
    docs.write_text("\n\n".join(f"the cat {i} sat.\nthe dog {i} ran." for i in range(20)) + "\n", encoding="utf-8")
    run = load_run_config(ROOT / "configs" / "bert-mlm.toml", [
        f"data.path={json.dumps(str(docs))}", "data.vocab_size=60", "model.pad_id=3", "train.device=\"cpu\"",
        f"train.out_dir={json.dumps(str(tmp_path / 'run'))}"])
    with pytest.raises(ConfigError, match=r"model.pad_id = 3, but the tokenizer's pad id is 0; drop model.pad_id"):
        prepare(run)


def test_a_missing_relative_data_file_names_the_folder_it_was_looked_for_in(tmp_path, monkeypatch):
    # Relative paths are taken from the working folder, not the config file's; the message did not say where.
    monkeypatch.chdir(tmp_path)
    run = load_run_config(ROOT / "configs" / "gpt-text.toml", ['data.path="corpus.txt"'])
    with pytest.raises(Exception, match=rf"'corpus.txt' \(data.path\) does not exist in {tmp_path} \(where relative"):
        prepare(run)
    absolute = tmp_path / "nowhere" / "corpus.txt"
    run = load_run_config(ROOT / "configs" / "gpt-text.toml", [f"data.path={json.dumps(str(absolute))}"])
    with pytest.raises(Exception, match=r"does not exist; check the path"):
        prepare(run)


def test_sizes_beyond_any_use_are_refused_in_one_line(capsys, tmp_path):
    from cli_helpers import one_line_error

    from attnlab.modules.positions import ShawRelativePosition

    # A tokenizer trainer reserved memory by data.vocab_size: 10**9 aborted the process from Rust (exit 134).
    with pytest.raises(ConfigError, match=r"data.vocab_size = 1,000,000,000 is beyond any tokenizer's needs"):
        DataConfig(vocab_size=10**9)
    DataConfig(vocab_size=1 << 24)
    with pytest.raises(ConfigError, match="max_distance 9,223,372,036,854,775,807 is beyond any sequence's length"):
        ShawRelativePosition(d_model=8, n_heads=2, max_distance=2**63 - 1)  # a TypeError from torch's sizes
    # Valid 64-bit sizes too large to allocate: torch's and numpy's own words for it were tracebacks (exit 1).
    common = ["--set", "model.preset=gpt-char-tiny", "--set", "train.steps=2", "--set", "train.device=cpu",
              "--set", "train.progress=false", "--set", f"train.out_dir={json.dumps(str(tmp_path / 'run'))}"]
    for setting in (f"model.d_ff={2**62}", f"train.batch_size={2**60}"):
        line = one_line_error(capsys, "train", *common, "--set", setting)
        assert line.startswith("attnlab: error: out of memory; use a smaller model"), (setting, line)


def test_an_empty_data_path_is_named_as_empty():
    from attnlab.data.text_files import check_file
    from attnlab.errors import DataError

    with pytest.raises(DataError, match="^data file: the path is empty; give a file's path$"):  # "'.' is a directory"
        check_file("")
    with pytest.raises(DataError, match="the path is empty"):
        check_file("  ")


def test_a_data_file_named_none_says_how_to_unset_the_setting(tmp_path, monkeypatch):
    # `=none` unsets numbers and switches; a path setting takes it as a file name, which the message now says.
    from attnlab.errors import DataError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.txt").write_text("some text\n" * 50, encoding="utf-8")
    run = load_run_config(ROOT / "configs" / "gpt-text.toml", ['data.path="text.txt"', "data.eval_path=none"])
    with pytest.raises(DataError, match="""'none' \\(data.eval_path\\) does not exist.*, or leave it unset with """
                                        """--set data.eval_path='""'$"""):
        prepare(run)


def test_the_pydoc_texts_evaluate_on_a_given_eval_path(tmp_path):
    # data.eval_path was ignored without data.path: the pydoc tail was scored instead, and run.json named the file.
    held_out = tmp_path / "held_out.txt"
    held_out.write_text("a held-out text of my own\n" * 20, encoding="utf-8")
    train, evaluated = _lm_text_parts(DataConfig(eval_path=str(held_out)))
    assert "".join(evaluated()) == held_out.read_text(encoding="utf-8")
    from attnlab.data.corpus import pydoc_corpus

    assert "".join(train()) == pydoc_corpus()  # the whole, as with a data.path and an eval_path


def test_lengths_beyond_any_sequence_are_refused_as_data_settings():
    # translation's data.max_length = 2**63 - 1 was refused as "model.max_len: ... does not fit in 64 bits", a
    # setting derived from it that the user never gave.
    for name in ("max_length", "block_size"):
        with pytest.raises(ConfigError, match=f"data.{name} = 9,223,372,036,854,775,807 is beyond any sequence"):
            DataConfig(**{name: 2**63 - 1})
        DataConfig(**{name: 1 << 30})
