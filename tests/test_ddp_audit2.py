"""What a second audit of training under torchrun found: a BERT whose pooler no head reads stopped DDP at its
second step, a batch the processes cannot share was refused only after a language model's token files had
replaced a finished run's, and a Ctrl-C that reached a process waiting in a collective was reported as an
error (exit 2) when its peer, stopped by the same Ctrl-C, closed the connection."""

from __future__ import annotations

import hashlib
import signal
import threading

import pytest
import torch
import torch.distributed as dist
from cli_helpers import one_line_error, train_in_process
from cli_helpers import toml_str as _q

from attnlab.training.distributed import World
from attnlab.training.trainer import _interrupts_deferred

LM = ["--set", "model.preset=gpt-char-tiny", "--set", "train.eval_every=0", "--set", "train.batch_size=4",
      "--set", "train.warmup_steps=0", "--set", "train.progress=false", "--set", "train.device=cpu"]


@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                    reason="torch.distributed with gloo is not available")
def test_two_processes_train_a_bert_whose_pooler_no_head_reads_as_one_does(tmp_path):
    from test_ddp import run_two_processes
    from training_helpers import bert_nsp_run

    from attnlab.training import Trainer, load_model

    run_two_processes(tmp_path / "ddp", "bert-mlm-pooler")
    model, config, source = bert_nsp_run(nsp=False, pooler=True)
    assert model.parameters_outside_loss() == ["pooler.dense.weight", "pooler.dense.bias"]
    pooler = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("pooler.")}
    Trainer(model, config, source, out_dir=tmp_path / "single").fit()
    distributed = load_model(tmp_path / "ddp")
    for name, value in model.state_dict().items():
        torch.testing.assert_close(distributed.state_dict()[name], value, rtol=0, atol=1e-6, msg=name)
    for name, value in pooler.items():  # kept as it was, for a classifier fine-tuned from the run later
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=0)


def test_only_a_pooler_that_no_head_reads_is_outside_the_loss():
    from attnlab.models.bert import BertConfig, BertModel

    def outside(**options):
        return BertModel(BertConfig(vocab_size=20, d_model=8, n_layers=1, n_heads=2, d_ff=16, max_len=8,
                                    **options)).parameters_outside_loss()

    assert outside(nsp=False, pooler=True) == ["pooler.dense.weight", "pooler.dense.bias"]
    for options in ({}, {"nsp": False}, {"heads": "classification", "n_classes": 2}, {"heads": "none"}):
        assert outside(**options) == [], options


def test_a_batch_the_processes_cannot_share_is_refused_before_the_data_is_written(tmp_path, monkeypatch, capsys):
    run, text = tmp_path / "run", tmp_path / "text.txt"
    text.write_text("".join(f"line {i} of a small text to train on\n" for i in range(300)), encoding="utf-8")
    data = ["--set", f"data.path={_q(text)}"]
    train_in_process("--set", "train.steps=2", "--set", f"train.out_dir={_q(run)}", *LM, *data)

    def digests():
        return {p.relative_to(run).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(run.rglob("*")) if p.is_file() and p.name != ".attnlab.lock"}

    before = digests()
    two = (World(rank=0, size=2), torch.device("cpu"))
    monkeypatch.setattr("attnlab.training.distributed.init_distributed", lambda device: two)
    monkeypatch.setattr("attnlab.training.trainer.init_distributed", lambda device: two)
    for folder in (run, tmp_path / "fresh"):  # another split of the data would have replaced the run's data/
        line = one_line_error(capsys, "train", "--set", "train.steps=2", "--set", f"train.out_dir={_q(folder)}",
                              *LM, *data, "--set", "train.batch_size=7", "--set", "data.val_fraction=0.3")
        assert "batch_size (7) must be a multiple of the 2 processes" in line
    assert digests() == before and not (tmp_path / "fresh").exists()


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_a_signal_held_before_an_error_ends_the_block_as_the_signal(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # a process of a torchrun run, whose peer is gone
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            with _interrupts_deferred():
                signal.raise_signal(signal.SIGINT)  # held
                raise RuntimeError("Connection closed by peer")  # what the peer's own Ctrl-C did to a collective
        assert isinstance(caught.value.__context__, RuntimeError)
        with pytest.raises(RuntimeError):  # no signal: the error as it was
            with _interrupts_deferred():
                raise RuntimeError("Connection closed by peer")
        from attnlab.training import TrainingDiverged

        for error in (TrainingDiverged("the training loss became nan at step 3"),  # says more than the interrupt
                      RuntimeError("CUDA out of memory")):  # in the optimizer step: half applied, not to be saved
            with pytest.raises(type(error)):
                with _interrupts_deferred():
                    signal.raise_signal(signal.SIGINT)
                    raise error
        with pytest.raises(RuntimeError):  # dropped signals stay dropped
            with _interrupts_deferred(drop=True):
                signal.raise_signal(signal.SIGINT)
                raise RuntimeError("disk full")
    finally:
        signal.signal(signal.SIGINT, previous)
