"""Mutation round 12, on stop 46's code: each test kills a change the suite let through (settling reads of a run
being saved, the -1 label warnings, the fast decoder's as-built check, the attention core's argument checks), and
one pins a gap the round found: a module whose forward is set on the instance is decoded by its own forward."""
from __future__ import annotations

import os
import shutil

import pytest
import test_checkpoint_audit5 as audit5

import attnlab.training.checkpoint as ckpt
from attnlab.errors import CheckpointError

trained, run, _saving = audit5.trained, audit5.run, audit5._saving  # the fixtures and helper of the checkpoint audit


@pytest.mark.parametrize("reader", ["load_model", "load_run"])
def test_k_c2_c8_a_failed_read_beside_a_save_waits_real_waits_at_the_outermost_call_only(run, monkeypatch, reader):
    from attnlab.inference.runs import load_run

    waits = []
    monkeypatch.setattr("time.sleep", waits.append)
    (run / ".checkpoint.tmp").mkdir()
    (run / "checkpoint" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError):
        (ckpt.load_model if reader == "load_model" else load_run)(run)
    assert ckpt.SETTLE_WAIT_S > 0 and waits == [ckpt.SETTLE_WAIT_S] * (ckpt.SETTLE_TRIES - 1)


def _swap_whole(run):
    """A save that ran from start to end while the reader read: checkpoint/ is a new folder, no sibling left."""
    folder, old = run / "checkpoint", run / ".checkpoint.old"
    shutil.copytree(folder, run / ".checkpoint.tmp")
    os.rename(folder, old)
    os.rename(run / ".checkpoint.tmp", folder)
    shutil.rmtree(old)


def test_k_c3_a_save_that_finished_during_a_failed_read_is_read_again(run, monkeypatch):
    waits = []
    monkeypatch.setattr("time.sleep", waits.append)
    real, calls = ckpt._build_saved, []

    def build(folder, config):
        calls.append(folder)
        if len(calls) == 1:
            _swap_whole(run)
            raise CheckpointError(f"{folder}/model.safetensors vanished")
        return real(folder, config)

    monkeypatch.setattr(ckpt, "_build_saved", build)
    ckpt.load_model(run)
    assert len(calls) >= 2 and len(waits) == 1


def test_k_c9_an_os_error_during_a_save_is_read_again(run, monkeypatch):
    first, waits = _saving(run, monkeypatch)
    real, calls = ckpt._build_saved, []

    def build(folder, config):
        calls.append(folder)
        if len(calls) == 1:
            first()
            raise FileNotFoundError(2, "No such file or directory", str(folder / "model.safetensors"))
        return real(folder, config)

    monkeypatch.setattr(ckpt, "_build_saved", build)
    ckpt.load_model(run)
    assert len(calls) >= 2 and len(waits) == 1


def test_k_c5_a_failed_read_of_best_beside_its_save_waits(run, monkeypatch):
    # A leftover .best.tmp is a save of best/ under way (or one a kill cut short): the read is tried again.
    from attnlab.inference.runs import load_run

    waits = []
    monkeypatch.setattr("time.sleep", waits.append)
    (run / ".best.tmp").mkdir()
    (run / "best" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError):
        load_run(run, which="best")
    assert waits == [ckpt.SETTLE_WAIT_S] * (ckpt.SETTLE_TRIES - 1)


def test_k_c6_a_checkpoint_folder_given_itself_is_read_again(run, monkeypatch):
    import attnlab.data.tokenizers as tokenizers
    from attnlab.inference.runs import load_run

    first, waits = _saving(run, monkeypatch)
    real, calls = tokenizers.load_tokenizer, []

    def load_tokenizer(folder):
        calls.append(folder)
        if len(calls) == 1:
            first()
        return real(folder)

    monkeypatch.setattr(tokenizers, "load_tokenizer", load_tokenizer)
    # the "best" entry of _save_marks must not mask this: give the checkpoint folder directly
    shutil.rmtree(run / "best")
    loaded = load_run(run / "checkpoint")
    assert len(waits) == 1 and loaded.folder == run / "checkpoint"


def test_k_c13_c14_a_runs_checkpoint_given_itself_names_best(run):
    shutil.rmtree(run / "checkpoint")
    (run / "checkpoint").write_text("x", encoding="utf-8")
    with pytest.raises(CheckpointError, match="is a file, not a checkpoint folder; the run's best checkpoint is"):
        ckpt.find_checkpoint(run / "checkpoint")
    (run / "checkpoint").unlink()
    (run / "checkpoint").mkdir()
    with pytest.raises(CheckpointError, match="holds no checkpoint; the run's best checkpoint is"):
        ckpt.find_checkpoint(run / "checkpoint")


def test_k_c17_a_best_left_as_old_by_a_crash_is_warned_of(run):
    shutil.rmtree(run / "checkpoint")
    os.rename(run / "best", run / ".best.old")
    with pytest.warns(UserWarning, match="has no checkpoint/ .*using its best/ checkpoint"):
        assert ckpt.find_checkpoint(run) == run / ".best.old"


def test_k_c19_a_file_checkpoint_without_best_says_remove_it(run):
    shutil.rmtree(run / "checkpoint")
    shutil.rmtree(run / "best")
    (run / "checkpoint").write_text("x", encoding="utf-8")
    (run / "best").mkdir()  # no best checkpoint
    with pytest.raises(CheckpointError, match=r"checkpoint is a file, not a checkpoint folder; remove or rename it$"):
        ckpt.find_checkpoint(run)


def _minus_one_file(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text("sentence\tlabel\n" + "".join(f"s{i}\t{i % 3}\n" for i in range(60)) + "x\t-1\n",
                    encoding="utf-8")
    return path


def test_k_d8_a_source_given_the_trained_class_names_is_not_warned_of_minus_one(tmp_path):
    import warnings

    from attnlab.data.sources import ClassificationSource
    from attnlab.data.tokenizers import CharTokenizer

    path = _minus_one_file(tmp_path)
    tok = CharTokenizer.train("sx0123456789-\n")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ClassificationSource.from_file(path, tok, 4, label_names=["-1", "0", "1", "2"])
    assert [str(w.message) for w in seen if "labelled -1" in str(w.message)] == []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ClassificationSource.from_file(path, tok, 4)
    assert any("labelled -1" in str(w.message) for w in seen)


def test_k_r5_a_line_of_standard_input_is_named_as_standard_input(monkeypatch):
    import io
    import sys

    from test_translation_blank_lines import _run

    from attnlab.errors import DataError
    from attnlab.inference.runs import translate_file

    run_, _ = _run()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("the cat\n\u2603\u2603\n".encode())))
    with pytest.raises(DataError) as info:
        translate_file(run_, "-", max_len=8)
    assert str(info.value).startswith("<standard input> line 2"), str(info.value)


def _said(tmp_path, labels):
    import warnings

    from attnlab.data.text_files import read_classification_file

    path = tmp_path / "train.tsv"
    path.write_text("sentence\tlabel\n" + "".join(f"s{i}\t{label}\n" for i, label in enumerate(labels)),
                    encoding="utf-8")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        read_classification_file(path)
    return [str(w.message) for w in seen]


def test_k_d5_minus_one_at_exactly_five_percent_is_a_class(tmp_path):
    assert _said(tmp_path, [-1] + [i % 2 for i in range(19)]) == []  # 1 of 20: 5 %
    assert len(_said(tmp_path, [-1] + [i % 2 for i in range(20)])) == 1  # 1 of 21: under 5 %


def test_k_f3_a_global_forward_pre_hook_is_heard():
    from test_fast_decode_as_built import _model
    from torch import nn

    from attnlab.inference.fast_decode import FastGPTDecoder

    model = _model()
    assert FastGPTDecoder.supports(model)
    handle = nn.modules.module.register_module_forward_pre_hook(lambda module, args: None)
    try:
        assert not FastGPTDecoder.supports(model)
    finally:
        handle.remove()
    assert FastGPTDecoder.supports(model)


def test_k_instance_forward_replaced_is_heard():
    """Not a mutant: a gap (a module whose forward is replaced on the instance was decoded as if unchanged)."""
    import types

    from test_fast_decode_as_built import _model

    from attnlab.inference.fast_decode import FastGPTDecoder

    model = _model()
    real = model.lm_head.forward
    model.lm_head.forward = types.MethodType(lambda self, x: real(x) * 0, model.lm_head)
    assert not FastGPTDecoder.supports(model)


def test_k_a1_fp16_scores_that_fit_once_scaled_stay_finite_on_the_explicit_path():
    import torch

    from attnlab.modules.attention import attention

    d = 64
    q = torch.full((1, 1, 2, d), 40.0, dtype=torch.float16)  # q·k = 64·40·40 = 102400 > 65504; scaled 12800
    k = torch.full((1, 1, 2, d), 40.0, dtype=torch.float16)
    v = torch.randn(1, 1, 2, d).half()
    out, weights = attention(q, k, v, need_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()


def test_k_a2_a3_fractional_heads_and_dropout_of_one_are_refused():
    from attnlab.errors import ConfigError
    from attnlab.modules.attention import MultiHeadAttention

    with pytest.raises(ConfigError, match="n_heads must be a whole number of at least 1, got 2.0"):
        MultiHeadAttention(8, 2.0)
    with pytest.raises(ConfigError, match=r"dropout is a probability from 0 up to \(not including\) 1, got 1"):
        MultiHeadAttention(8, 2, dropout=1)
