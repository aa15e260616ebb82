"""Tests written for the mutants that survived the fifth mutation audit (stop-40): each pins one behaviour a
mutant changed without any test noticing. Tiny models, stand-ins for GPUs and process groups, fake clocks."""

from __future__ import annotations

import io
import os
import sys
from types import SimpleNamespace

import pytest
import torch
from cli_helpers import run_cli

# The knowledge experiment at its smallest (1 layer, 32 wide, one epoch a phase), on files the tests write.
KNOWLEDGE_TINY = {"n_layers": 1, "n_heads": 2, "d_model": 32, "block_size": 64, "pretrain_epochs": 1,
                  "pretrain_batch": 8, "finetune_batch": 8, "finetune_epochs_scratch": 1,
                  "finetune_epochs_pretrained": 1, "precision": "fp32"}
PLACES = ["Lyon", "Oslo", "Porto", "Quito", "Accra", "Hanoi"]


def _people(n: int) -> list[tuple[str, str]]:
    """`n` distinct (name, birthplace) pairs."""
    names = [f"{a} {b}" for a in ("Ada", "Bo", "Cy", "Di", "Ed") for b in ("Varn", "Tesk", "Mordo", "Lansk", "Pirro")]
    return [(name, PLACES[i % len(PLACES)]) for i, name in enumerate(names[:n])]


def _write_knowledge_data(folder, people, n_train: int) -> dict[str, str]:
    """A corpus with a sentence per person, and the birthplace questions split into fine-tuning / evaluation."""
    (folder / "wiki.txt").write_text("".join(f"{n}. {n} was born in {p} .\n" for n, p in people), encoding="utf-8")
    qa = [f"Where was {n} born?\t{p}\n" for n, p in people]
    (folder / "train.tsv").write_text("".join(qa[:n_train]), encoding="utf-8")
    (folder / "dev.tsv").write_text("".join(qa[n_train:]), encoding="utf-8")
    return {"corpus": str(folder / "wiki.txt"), "train": str(folder / "train.tsv"),
            "eval_path": str(folder / "dev.tsv")}


def _quiet(*_args) -> None:
    pass


# ------------------------------------------------------------------------------------------------
# The knowledge experiment
# ------------------------------------------------------------------------------------------------


def test_knowledge_rows_do_not_depend_on_the_rows_before_them(tmp_path):
    # K3: each row starts from the run's seed, so "dot" trains alike alone and after "none" (stop-40 mutation audit)
    from attnlab.experiments.knowledge import run_knowledge

    files = _write_knowledge_data(tmp_path, _people(8), n_train=5)
    alone = run_knowledge(tmp_path / "alone", variants="dot", **files, device="cpu", overrides=KNOWLEDGE_TINY,
                          progress=False, echo=_quiet)
    after = run_knowledge(tmp_path / "after", variants="none,dot", **files, device="cpu", overrides=KNOWLEDGE_TINY,
                          progress=False, echo=_quiet)
    dot_alone = alone["variants"][0]
    dot_after = {row["variant"]: row for row in after["variants"]}["dot"]
    for phase in ("pretrain", "finetune"):
        assert dot_after[phase]["final_train_loss"] == dot_alone[phase]["final_train_loss"], phase


def test_knowledge_correct_count_is_rounded_not_truncated(tmp_path, monkeypatch):
    # K4: 5 right of 19 is 26.3...%, which times 19 / 100 is 4.999...: "correct" is 5 (stop-40 mutation audit)
    import attnlab.experiments.knowledge as knowledge

    people = _people(24)
    files = _write_knowledge_data(tmp_path, people, n_train=5)
    truth = {f"Where was {n} born?": p for n, p in people}
    evaluated = [f"Where was {n} born?" for n, _ in people[5:]]
    right = set(evaluated[:5])  # the first 5 of the 19 evaluation questions, and every fine-tuning one
    monkeypatch.setattr(knowledge, "answer_questions", lambda model, vocab, questions, **kw: [
        truth[q] if q in right or q not in evaluated else "Rome" for q in questions])
    summary = knowledge.run_knowledge(tmp_path / "out", variants="none", **files, device="cpu",
                                      overrides=KNOWLEDGE_TINY, progress=False, echo=_quiet)
    row = summary["variants"][0]
    assert summary["data"]["eval_questions"] == 19
    assert row["accuracy"] == pytest.approx(100 * 5 / 19)
    assert row["correct"] == 5
    assert row["train_accuracy"] == 100.0


def test_knowledge_phases_save_every_quarter_of_their_steps():
    # K5: a phase of 8 (or 41) steps saves a checkpoint every 2 (or 10) steps: --resume loses at most a
    # quarter of it (stop-40 mutation audit)
    from attnlab.experiments.knowledge import _phase_config, scale_settings

    settings = scale_settings("quick", KNOWLEDGE_TINY)
    for steps, every in ((8, 2), (41, 10), (3, 0)):
        config = _phase_config(settings, batch=1, lr=1e-3, epochs=steps, n_examples=1, n_corpus=1, seed=0,
                               device="cpu", progress=False)
        assert (config["steps"], config["save_every"]) == (steps, every)


# ------------------------------------------------------------------------------------------------
# Converters
# ------------------------------------------------------------------------------------------------


def _same_as_hf(table: dict[str, str]) -> None:
    from transformers.activations import ACT2FN

    from attnlab.modules.feedforward import ACTIVATIONS

    x = torch.linspace(-6.0, 6.0, 1201, dtype=torch.float64)
    for hf_name, ours in table.items():
        expected = ACT2FN[hf_name](x)
        got = ACTIVATIONS.get(ours)(x)
        assert torch.allclose(got, expected, rtol=0, atol=1e-6), (hf_name, ours,
                                                                  float((got - expected).abs().max()))


def test_hf_activation_names_compute_what_hf_computes():
    # P1/B1: every HF activation name the converters map (gelu_pytorch_tanh and gelu_fast: tanh GELU) gives HF's
    # function (stop-40 mutation audit; one table for GPT-2 and BERT since stop 44)
    from attnlab.convert.hf_folder import HF_ACTIVATIONS

    assert "gelu_pytorch_tanh" in HF_ACTIVATIONS and "gelu_fast" in HF_ACTIVATIONS
    _same_as_hf(HF_ACTIVATIONS)


def test_bert_pretraining_weights_without_their_pooler_name_the_missing_weights():
    # B3: a BertForPreTraining state dict lacking its pooler is refused as lacking pooler.dense, not as a setting
    # to change (stop-40 mutation audit)
    import transformers

    from attnlab.convert import bert_from_hf
    from attnlab.errors import CheckpointError

    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16)
    state = {k: v for k, v in transformers.BertForPreTraining(config).state_dict().items() if ".pooler." not in k}
    with pytest.raises(CheckpointError) as caught:
        bert_from_hf(state, config.to_dict())
    message = str(caught.value)
    assert "lacks" in message and "pooler.dense.weight" in message and "pooler.dense.bias" in message
    assert "set pooler" not in message


@pytest.mark.parametrize("model_type", [None, ""])
def test_a_config_whose_model_type_is_null_or_empty_is_refused(model_type):
    # H2: only an absent model_type is taken as the expected one; null or "" names no model (stop-40 mutation audit)
    from attnlab.convert.hf_folder import check_model_type
    from attnlab.errors import CheckpointError

    check_model_type({"n_embd": 8}, "gpt2", "config.json", "GPT-2")  # absent: accepted
    with pytest.raises(CheckpointError, match="model_type is .*not 'gpt2'"):
        check_model_type({"model_type": model_type}, "gpt2", "config.json", "GPT-2")


# ------------------------------------------------------------------------------------------------
# Devices and torchrun
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device, kind", [("cuda", "cuda"), ("cuda:1", "cuda"), ("mps", "mps"), ("cpu", "cpu")])
def test_autocast_is_asked_for_the_devices_own_type(monkeypatch, device, kind):
    # V4: the training autocast runs on the run's device type (a GPU run under a CPU autocast stays fp32)
    # (stop-40 mutation audit)
    from attnlab.training import device as device_module

    asked = []

    class Recording:
        def __init__(self, device_type, **kwargs):
            asked.append((device_type, kwargs.get("dtype")))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch, "autocast", Recording)
    with device_module.autocast(device, torch.bfloat16):
        pass
    assert asked == [(kind, torch.bfloat16)]


def test_a_numbered_gpu_is_refused_under_torchrun(monkeypatch):
    # D2: under torchrun (WORLD_SIZE 2, LOCAL_RANK 1) device "cuda:0" would put every process on GPU 0: refused
    # before the process group starts (stop-40 mutation audit)
    import torch.distributed as dist

    from attnlab.errors import ConfigError
    from attnlab.training import distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)

    def no_group(**kwargs):
        raise AssertionError(f"the process group was started: {kwargs}")

    monkeypatch.setattr(dist, "init_process_group", no_group)
    with pytest.raises(ConfigError, match="each process takes GPU LOCAL_RANK.*not 'cuda:0'"):
        distributed.init_distributed("cuda:0")


def test_a_broken_pipe_in_a_single_process_is_no_peer_gone(monkeypatch):
    # D5: outside torchrun no other process can have stopped: "Broken pipe" is this process's own error
    # (stop-40 mutation audit)
    from attnlab.training.distributed import peer_gone

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not peer_gone(RuntimeError("Broken pipe"))
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not peer_gone(RuntimeError("Connection closed by peer"))
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun the same words are another process gone
    assert peer_gone(RuntimeError("Broken pipe"))


def test_onednn_stays_off_while_a_second_holder_is_inside():
    # V6: overlapping onednn_off blocks: the first to leave must not switch oneDNN back on under the second; the
    # last to leave gives it back (stop-40 mutation audit)
    from attnlab.training.device import onednn_off

    was = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(True)
    try:
        first, second = onednn_off(), onednn_off()
        first.__enter__()
        second.__enter__()
        assert not torch._C._get_mkldnn_enabled()
        first.__exit__(None, None, None)
        inside_second = torch._C._get_mkldnn_enabled()
        second.__exit__(None, None, None)
        assert inside_second is False
        assert torch._C._get_mkldnn_enabled() is True
    finally:
        torch._C._set_mkldnn_enabled(was)


# ------------------------------------------------------------------------------------------------
# Files
# ------------------------------------------------------------------------------------------------


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
def test_written_files_get_0o666_less_the_umask(tmp_path):
    # F3: a file made owner-only (as safetensors makes it) gets what open() would give: 0o666 & ~umask, 0o664
    # under umask 002 (stop-40 mutation audit)
    from attnlab.files import ordinary_permissions

    path = tmp_path / "model.safetensors"
    path.write_bytes(b"")
    os.chmod(path, 0o600)
    old = os.umask(0o002)
    try:
        ordinary_permissions(path)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o664


# ------------------------------------------------------------------------------------------------
# Progress lines and the train command's summary
# ------------------------------------------------------------------------------------------------


def _progress_lines(monkeypatch, *, total: int, initial: int, seconds: float, steps: int) -> list[str]:
    """The plain lines (stderr not a terminal) of a Progress that makes `steps` updates in `seconds`."""
    from attnlab.training import logging as training_logging

    clock = [0.0]
    monkeypatch.setattr(training_logging, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    progress = training_logging.Progress(total=total, initial=initial, enabled=True)
    clock[0] = seconds
    progress.update(steps)
    progress.show(loss=0.5)
    return stream.getvalue().splitlines()


def test_progress_eta_counts_the_steps_left_from_the_current_step(monkeypatch):
    # L3: resumed at step 20, 30 steps in 30 s, 50 to go: ETA 0:50, not the 80 steps from the start (stop-40
    # mutation audit)
    lines = _progress_lines(monkeypatch, total=100, initial=20, seconds=30.0, steps=30)
    assert lines == ["train: step 50/100  loss=0.5  ETA 0:50"]


def test_progress_writes_the_last_steps_line_within_the_interval(monkeypatch):
    # L4: a 10-step run that took 5 s (under LINE_EVERY_S) still gets its last step's line in a log
    # (stop-40 mutation audit)
    lines = _progress_lines(monkeypatch, total=10, initial=0, seconds=5.0, steps=10)
    assert lines == ["train: step 10/10  loss=0.5"]


def test_progress_eta_seconds_have_two_digits(monkeypatch):
    # L5: 65 s reads 1:05 (not 1:5), in the ETA of a line and in _duration (stop-40 mutation audit)
    from attnlab.training.logging import _duration

    assert (_duration(65), _duration(3605), _duration(5)) == ("1:05", "1:00:05", "0:05")
    lines = _progress_lines(monkeypatch, total=100, initial=0, seconds=65.0, steps=50)
    assert lines == ["train: step 50/100  loss=0.5  ETA 1:05"]


def test_train_prints_no_best_line_when_best_is_the_final_step(monkeypatch, capsys):
    # C3: "best/: step ..." only where best/ holds an earlier step than the summary's (stop-40 mutation audit)
    import attnlab.training.recipe as recipe

    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    run = SimpleNamespace(train=SimpleNamespace(out_dir="runs/x", steps=10, early_stopping_patience=0))
    monkeypatch.setattr(recipe, "load_run_config", lambda *a, **k: run)
    summary = {"steps": 10, "start_step": 0, "final_eval_loss": 1.5}
    monkeypatch.setattr(recipe, "train_run", lambda *a, **k: {
        **summary, "best": {"metric": "eval_loss", "step": 10, "value": 1.5}})
    code, out, err = run_cli(capsys, "train")
    assert code == 0, err
    assert "best/" not in out and "run folder: runs/x" in out
    # best/ at an earlier step is named
    monkeypatch.setattr(recipe, "train_run", lambda *a, **k: {
        **summary, "best": {"metric": "eval_loss", "step": 5, "value": 1.25}})
    code, out, err = run_cli(capsys, "train")
    assert code == 0, err
    assert "best/: step 5, eval_loss 1.25" in out


# ------------------------------------------------------------------------------------------------
# Options given twice
# ------------------------------------------------------------------------------------------------


def test_a_short_option_with_its_value_attached_counts_as_given(capsys, tmp_path):
    # C1: "-n20 -n5" gives -n twice (-n20 is -n with the value 20 attached): refused (stop-40 mutation audit)
    code, _, err = run_cli(capsys, "generate", str(tmp_path / "no-run"), "-p", "hi", "-n20", "-n5")
    assert code == 2, err
    assert "--max-new-tokens (-n) is given twice; give it once" in err


def test_an_option_like_value_is_not_an_option(capsys, tmp_path):
    # C2: in "-p -n -n 5" the first -n is the prompt, so -n is given once: accepted by the check (the command then
    # fails on the missing run folder) (stop-40 mutation audit)
    code, _, err = run_cli(capsys, "generate", str(tmp_path / "no-run"), "-p", "-n", "-n", "5")
    assert code == 2, err
    assert "given twice" not in err
    assert "no-run" in err and "does not exist" in err
