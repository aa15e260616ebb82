"""The training loop: schedules, gradient accumulation, exact resume, Ctrl-C, logging, precision."""

from __future__ import annotations

import copy
import json
import math
import warnings

import pytest
import torch
from training_helpers import ToySource, stopped_and_resumed, tiny_model, token_accuracy_counts

from attnlab.errors import ConfigError, DataError
from attnlab.training import (
    Trainer,
    TrainerConfig,
    TrainingInterrupted,
    cpu_has_bf16,
    load_model,
    lr_at,
    param_groups,
    read_trainer_state,
    resolve_precision,
    select_device,
)


def config(**changes) -> TrainerConfig:
    settings = dict(steps=4, batch_size=8, micro_batch_size=None, lr=1e-2, warmup_steps=1, precision="fp32",
                    device="cpu", progress=False, log_every=1)
    settings.update(changes)
    return TrainerConfig(**settings)


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ----------------------------------------------------------------------------------------------------
# Config and schedules


def test_schedules():
    cos = TrainerConfig(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1, schedule="cosine")
    assert [lr_at(s, cos) for s in range(3)] == pytest.approx([0.1, 0.2, 0.3])  # linear warmup
    assert lr_at(9, cos) == pytest.approx(1.0)  # peak at the end of warmup
    assert lr_at(100, cos) == pytest.approx(0.1)  # cosine endpoint = min_lr_ratio * lr
    assert lr_at(55, cos) == pytest.approx(0.55)  # half way down the cosine
    assert lr_at(500, cos) == pytest.approx(0.1)
    lin = cos.replace(schedule="linear")
    assert lr_at(55, lin) == pytest.approx(0.55) and lr_at(100, lin) == pytest.approx(0.1)
    assert lr_at(80, cos.replace(schedule="constant")) == 1.0
    # decay_steps: the cosine reaches its floor early and stays there (the CS224n a5 token schedule)
    early = cos.replace(decay_steps=50)
    assert lr_at(30, early) == pytest.approx(0.55) and lr_at(50, early) == pytest.approx(0.1)
    assert lr_at(99, early) == pytest.approx(0.1)
    noam = TrainerConfig(steps=100, lr=2.0, warmup_steps=16, schedule="noam")
    values = [lr_at(s, noam) for s in range(60)]
    assert max(values) == pytest.approx(2.0) and values.index(max(values)) == 15  # peak at warmup
    # the paper's shape: d^-0.5 * min(n^-0.5, n * w^-1.5), up to the constant that makes the peak lr
    paper = [512**-0.5 * min(n**-0.5, n * 16**-1.5) for n in range(1, 61)]
    assert values == pytest.approx([p / max(paper) * 2.0 for p in paper])


def test_config_validation():
    with pytest.raises(ConfigError, match="divisible by micro_batch_size"):
        TrainerConfig(batch_size=10, micro_batch_size=4)
    with pytest.raises(ConfigError, match="schedule"):
        TrainerConfig(schedule="cosin")
    with pytest.raises(ConfigError, match="warmup_steps"):
        TrainerConfig(schedule="noam", warmup_steps=0)
    with pytest.raises(ConfigError, match="unknown setting"):
        TrainerConfig.from_dict({"stepz": 3})
    cfg = TrainerConfig(betas=(0.8, 0.9))
    assert TrainerConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_weight_decay_groups():
    model = tiny_model(tie=True)
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert [id(p) for p in decay["params"]] == []  # the only matrix is the tied embedding
    model = tiny_model(tie=False)
    decay, no_decay = param_groups(model, 0.1)
    assert {id(p) for p in decay["params"]} == {id(model.head.weight)}
    assert id(model.embed.weight) in {id(p) for p in no_decay["params"]}


# ----------------------------------------------------------------------------------------------------
# Gradient accumulation


def test_accumulated_gradient_equals_big_batch_gradient(tmp_path):
    batch = ToySource(batch_size=8).batch(0)
    model = tiny_model()
    reference = copy.deepcopy(model)
    trainer = Trainer(model, config(micro_batch_size=2), ToySource(), out_dir=tmp_path)
    counts = [int((mb["labels"] != -100).sum()) for mb in trainer.micro_batches(batch)]
    assert len(counts) == 4 and len(set(counts)) > 1  # micro-batches with different target counts

    trainer.optimizer.zero_grad()
    trainer.backward(batch)
    reference(**batch).loss.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)

    # the naive mean of micro-batch losses would give another gradient
    naive = copy.deepcopy(reference)
    naive.zero_grad()
    sum(naive(**mb).loss / 4 for mb in trainer.micro_batches(batch)).backward()
    assert not torch.allclose(naive.head.bias.grad, reference.head.bias.grad, atol=1e-6)


def test_a_gpu_is_waited_for_before_the_clock_closes_a_log_window_or_evaluation(tmp_path, monkeypatch):
    """A GPU runs behind the host: tokens/s of a window must count its steps' work, so the trainer waits for the
    device at each step that ends a window (log_every, the last step) or precedes an evaluation, and no other."""
    from attnlab.training import trainer as trainer_module

    waited = []
    trainer = Trainer(tiny_model(), config(steps=7, log_every=3, eval_every=2), ToySource(), eval_source=ToySource(),
                      out_dir=tmp_path)
    monkeypatch.setattr(trainer_module, "synchronize", lambda device: waited.append((trainer.step, device)))
    trainer.fit()
    assert waited == [(step, torch.device("cpu")) for step in (2, 3, 4, 6, 7)]


def test_synchronize_waits_for_the_run_s_gpu(monkeypatch):
    from attnlab.training.device import synchronize

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    synchronize("cpu")
    synchronize("cuda:1")
    assert calls == [torch.device("cuda:1")]


def test_source_batch_size_must_match(tmp_path):
    trainer = Trainer(tiny_model(), config(), ToySource(batch_size=6), out_dir=tmp_path)
    with pytest.raises(DataError, match="batch of 6 examples"):
        trainer.fit()


# ----------------------------------------------------------------------------------------------------
# A whole run


def test_fit_writes_metrics_plot_and_checkpoints(tmp_path):
    cfg = config(steps=6, eval_every=2, save_every=3, micro_batch_size=4)
    trainer = Trainer(tiny_model(), cfg, ToySource(), eval_source=ToySource(), out_dir=tmp_path,
                      metrics_fn=lambda m: {"answer": 42.0}, extra_state={"note": "hi"})
    summary = trainer.fit()
    assert summary["steps"] == 6 and not summary["stopped_early"]
    assert summary["final_eval_loss"] < math.log(13) + 0.5 and summary["tokens_per_s"] > 0
    assert summary["best_eval_loss"] <= summary["final_eval_loss"]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert {"lr", "tokens_per_s", "elapsed", "grad_norm"} <= set(train[0])
    assert [r["step"] for r in evals] == [2, 4, 6]
    assert evals[-1]["eval_perplexity"] == pytest.approx(math.exp(evals[-1]["eval_loss"]))
    assert evals[-1]["eval_answer"] == 42.0
    assert (tmp_path / "loss.png").stat().st_size > 1000
    state = read_trainer_state(tmp_path / "checkpoint")
    assert state["step"] == 6 and state["data_position"] == 6 and state["extra_state"] == {"note": "hi"}
    best = read_trainer_state(tmp_path / "best")
    assert best["best"]["step"] == best["step"]
    loaded = load_model(tmp_path)
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)


def test_evaluations_are_printed_without_the_progress_bar(tmp_path, capsys):
    """progress = false hides the bar (for logs and captured output), not the evaluation lines."""
    Trainer(tiny_model(), config(eval_every=2), ToySource(), eval_source=ToySource(), out_dir=tmp_path).fit()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["step 2", "step 4"]
    assert lines[0].startswith("step 2: eval loss ")


@pytest.mark.parametrize("eval_batches", [0, 2])
def test_eval_counts_come_from_the_loss_pass(tmp_path, eval_batches):
    model = tiny_model()
    trainer = Trainer(model, config(micro_batch_size=4, eval_batches=eval_batches), ToySource(),
                      eval_source=ToySource(), eval_counts=token_accuracy_counts, out_dir=tmp_path)
    calls = []
    model.register_forward_hook(lambda *args: calls.append(1))
    metrics = trainer.evaluate()
    batches = list(ToySource().iter_batches(4))[:2 * eval_batches or None]  # eval_batches of 8 examples
    assert len(calls) == len(batches)  # one forward pass per batch gives the loss and the counts
    hits = targets = one = rows = 0
    with torch.no_grad():
        for batch in batches:
            picked = batch["labels"] != -100
            hits += int((model(**batch).logits.argmax(-1)[picked] == batch["labels"][picked]).sum())
            targets += int(picked.sum())
            ignored_one = (~picked).sum(dim=1) == 1
            if ignored_one.any():
                one, rows = one + int(ignored_one.sum()), rows + len(ignored_one)
    assert metrics["token_accuracy"] == pytest.approx(100.0 * hits / targets)
    assert metrics["one_ignored"] == pytest.approx(one / rows)
    assert set(metrics) == {"loss", "perplexity", "token_accuracy", "one_ignored"}


def test_eval_batches_are_the_same_examples_whatever_the_micro_batches(tmp_path):
    """eval_batches counts batches of batch_size examples: micro-batches change how they are scored, not which."""
    losses = {micro: Trainer(tiny_model(), config(micro_batch_size=micro, eval_batches=1), ToySource(),
                             eval_source=ToySource(), out_dir=tmp_path / str(micro)).evaluate()["loss"]
              for micro in (None, 4, 2, 1)}
    full = Trainer(tiny_model(), config(eval_batches=0), ToySource(), eval_source=ToySource(),
                   out_dir=tmp_path / "all").evaluate()["loss"]
    assert max(losses.values()) - min(losses.values()) < 1e-6 and abs(losses[None] - full) > 1e-4


def test_settings_that_cannot_act_are_named(tmp_path):
    with pytest.warns(UserWarning, match="early_stopping_patience = 2 cannot stop this run: there is no evaluation"):
        Trainer(tiny_model(), config(early_stopping_patience=2), ToySource(), out_dir=tmp_path / "a").fit()
    with pytest.warns(UserWarning, match="eval_every = 0 evaluates only at the end"):
        Trainer(tiny_model(), config(early_stopping_patience=2), ToySource(), eval_source=ToySource(),
                out_dir=tmp_path / "b").fit()
    with pytest.warns(UserWarning, match=r"warmup_steps \(8\) is larger than train.steps \(4\).*at most 0.005"):
        Trainer(tiny_model(), config(warmup_steps=8), ToySource(), out_dir=tmp_path / "c").fit()
    with pytest.warns(UserWarning, match="eval_every = 4 evaluates only at the end of 4 steps"):
        Trainer(tiny_model(), config(early_stopping_patience=2, eval_every=4), ToySource(), eval_source=ToySource(),
                out_dir=tmp_path / "d").fit()
    with pytest.warns(UserWarning, match='decay_steps = 3 does nothing under schedule = "constant"'):
        Trainer(tiny_model(), config(schedule="constant", decay_steps=3), ToySource(), out_dir=tmp_path / "e").fit()
    with pytest.warns(UserWarning, match="best_metric = 'accuracy' cannot pick best/: there is no evaluation"):
        Trainer(tiny_model(), config(best_metric="accuracy"), ToySource(), out_dir=tmp_path / "g").fit()
    with pytest.warns(UserWarning, match='min_lr_ratio = 0.5 does nothing under schedule = "noam"'):
        Trainer(tiny_model(), config(schedule="noam", warmup_steps=2, min_lr_ratio=0.5), ToySource(),
                out_dir=tmp_path / "f").fit()
    # (stop-41 audit: a config's eval_every, its evaluation file dropped, went unsaid)
    with pytest.warns(UserWarning, match=r"train.eval_every = 2 and train.eval_batches = 3 do nothing: there is no "
                                         r"evaluation \(nothing held out\); give Trainer\(eval_source=...\), "
                                         r"or drop them"):
        Trainer(tiny_model(), config(eval_every=2, eval_batches=3), ToySource(), out_dir=tmp_path / "h").fit()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # with an evaluation, nothing to say
        Trainer(tiny_model(), config(eval_every=2, eval_batches=3), ToySource(), eval_source=ToySource(),
                out_dir=tmp_path / "i").fit()
    with pytest.raises(ConfigError, match=r"decay_steps \(3\) must be larger than warmup_steps \(3\)"):
        config(warmup_steps=3, decay_steps=3)


def test_tokens_per_second_count_real_tokens_only():
    from attnlab.training.trainer import _count_tokens

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    labels = torch.tensor([[5, 6, -100, -100], [7, -100, -100, -100]])
    assert _count_tokens({"input_ids": mask, "attention_mask": mask, "labels": labels}) == 5
    # Translation: the source's real tokens and the target's (padded positions carry no label).
    assert _count_tokens({"src_ids": mask, "src_mask": mask, "tgt_ids": mask, "labels": labels}) == 5 + 3


def test_early_stopping(tmp_path):
    cfg = config(steps=20, eval_every=1, early_stopping_patience=2, best_metric="score", best_mode="max")
    trainer = Trainer(tiny_model(), cfg, ToySource(), out_dir=tmp_path, metrics_fn=lambda m: {"score": 1.0})
    summary = trainer.fit()
    assert summary["stopped_early"] and summary["steps"] == 3
    assert summary["best"] == {"metric": "score", "value": 1.0, "step": 1}
    assert read_trainer_state(tmp_path)["step"] == 3


def test_best_mode_follows_the_metric(tmp_path):
    # An accuracy picked as best_metric kept the *lowest* accuracy in best/ unless best_mode = "max" was set too.
    assert TrainerConfig().direction == "min"
    assert TrainerConfig(best_metric="perplexity").direction == "min"
    assert TrainerConfig(best_metric="accuracy").direction == "max"
    assert TrainerConfig(best_metric="nsp_accuracy").direction == "max"
    assert TrainerConfig(best_metric="accuracy", best_mode="min").direction == "min"  # an explicit choice stays
    # Recorded as given (run.json): the resolved "min" of a loss run, given back with best_metric = accuracy,
    # kept the lowest accuracy in best/.
    recorded = TrainerConfig().to_dict()
    assert recorded["best_mode"] is None
    assert TrainerConfig.from_dict({**recorded, "best_metric": "accuracy"}).direction == "max"
    scores = iter([0.2, 0.9, 0.5])
    cfg = config(steps=3, eval_every=1, best_metric="accuracy")
    summary = Trainer(tiny_model(), cfg, ToySource(), out_dir=tmp_path,
                      metrics_fn=lambda m: {"accuracy": next(scores)}).fit()
    assert summary["best"] == {"metric": "accuracy", "value": 0.9, "step": 2}


# ----------------------------------------------------------------------------------------------------
# Exact resume and Ctrl-C


def test_resume_is_bit_identical(tmp_path):
    # noam does not depend on `steps`, so stopping with steps=3 and resuming with steps=6 changes nothing
    cfg = config(steps=6, schedule="noam", warmup_steps=2, micro_batch_size=4, eval_every=2)
    full, second = stopped_and_resumed(cfg, tmp_path)
    for k, v in full.model.state_dict().items():
        assert torch.equal(second.model.state_dict()[k], v), k
    # the resumed log continues the first one
    steps = [json.loads(line)["step"] for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 6


def test_ctrl_c_saves_a_checkpoint_and_resume_is_exact(tmp_path):
    cfg = config(steps=5, micro_batch_size=4)  # cosine: depends on `steps`, unchanged here
    full = Trainer(tiny_model(dropout=0.3), cfg, ToySource(), out_dir=tmp_path / "a")
    full.fit()

    run = tmp_path / "b"
    trainer = Trainer(tiny_model(dropout=0.3), cfg, ToySource(interrupt_at=2), out_dir=run)
    with pytest.raises(TrainingInterrupted, match="interrupted at step 2") as info:
        trainer.fit()
    assert str(run / "checkpoint") in str(info.value) and "resume" in str(info.value)
    assert "\n" not in str(info.value)
    assert read_trainer_state(run)["step"] == 2
    load_model(run)  # a valid checkpoint

    resumed = Trainer(tiny_model(dropout=0.3), cfg, ToySource(), out_dir=run)
    resumed.fit(resume=True)
    for k, v in full.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[k], v), k


@pytest.mark.parametrize("stop", ["ctrl-c", "crash"])
def test_the_log_records_of_a_resumed_run_are_the_uninterrupted_run_s(tmp_path, stop):
    """Steps trained since the last log record are kept with the checkpoint: the record after a resume
    averages the same steps as the uninterrupted run's (its loss and gradient norm equal)."""
    cfg = config(steps=7, log_every=3, micro_batch_size=4, save_every=2, grad_clip=1.0)

    def records(folder):
        return [{k: v for k, v in json.loads(line).items() if k not in ("elapsed", "tokens_per_s")}
                for line in (folder / "metrics.jsonl").read_text().splitlines()]

    Trainer(tiny_model(dropout=0.3), cfg, ToySource(), out_dir=tmp_path / "a").fit()
    if stop == "ctrl-c":  # at step 5: steps 4 and 5 (... and the checkpoint of step 4) are since the last record
        with pytest.raises(TrainingInterrupted):
            Trainer(tiny_model(dropout=0.3), cfg, ToySource(interrupt_at=5), out_dir=tmp_path / "b").fit()
    else:  # a crash in step 5, after step 4's checkpoint: the resumed run redoes step 5 from it
        class Crashing(ToySource):
            def batch(self, step):
                if step == 5:
                    raise RuntimeError("killed")
                return super().batch(step)

        with pytest.raises(RuntimeError, match="killed"):
            Trainer(tiny_model(dropout=0.3), cfg, Crashing(), out_dir=tmp_path / "b").fit()
        assert read_trainer_state(tmp_path / "b")["step"] == 4
    Trainer(tiny_model(dropout=0.3), cfg, ToySource(), out_dir=tmp_path / "b", resume=True).fit()
    assert records(tmp_path / "b") == records(tmp_path / "a")


def test_ctrl_c_in_the_middle_of_a_step(tmp_path):
    # interrupted in the second micro-batch's forward, after dropout has drawn random numbers: the
    # checkpoint must hold the RNG state of the step's start and no half-accumulated gradient
    cfg = config(steps=4, micro_batch_size=2)
    full = Trainer(tiny_model(dropout=0.3), cfg, ToySource(), out_dir=tmp_path / "a")
    full.fit()

    model = tiny_model(dropout=0.3)
    calls = []
    forward = model.forward

    def interrupting_forward(**batch):
        calls.append(1)
        if len(calls) == 4 * 2 + 2:  # step 2, micro-batch 2
            raise KeyboardInterrupt
        return forward(**batch)

    model.forward = interrupting_forward
    with pytest.raises(TrainingInterrupted, match="at step 2"):
        Trainer(model, cfg, ToySource(), out_dir=tmp_path / "b").fit()
    resumed = Trainer(tiny_model(dropout=0.3), cfg, ToySource(), out_dir=tmp_path / "b", resume=True)
    resumed.fit()
    for k, v in full.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[k], v), k


@pytest.mark.parametrize("where", ["metrics", "best"])
def test_ctrl_c_inside_an_evaluation_is_redone_on_resume(tmp_path, monkeypatch, where):
    """Stopped inside step 2's evaluation (while scoring, or while writing best/), the resumed run evaluates
    step 2 again: the same records, best/ and early stop (at step 4, patience 2) as the uninterrupted run."""
    from safetensors.torch import load_file

    scores = {1: 0.5, 2: 0.9, 3: 0.3, 4: 0.2, 5: 0.95, 6: 0.1}
    cfg = config(steps=6, eval_every=1, early_stopping_patience=2, best_metric="score", best_mode="max",
                 micro_batch_size=4)
    state = {}

    def run(folder, stop_at=None, resume=False):
        def metrics_fn(model):
            step = state["trainer"].step
            if step == state.get("stop_at"):
                del state["stop_at"]
                raise KeyboardInterrupt
            return {"score": scores[step]}

        if stop_at is not None:
            state["stop_at"] = stop_at
        trainer = Trainer(tiny_model(dropout=0.3), cfg, ToySource(), eval_source=ToySource(), out_dir=folder,
                          metrics_fn=metrics_fn, resume=resume)
        state["trainer"] = trainer
        return trainer, trainer.fit()

    _, whole = run(tmp_path / "a")
    assert whole["stopped_early"] and whole["steps"] == 4 and whole["best"]["step"] == 2
    if where == "best":  # Ctrl-C while best/ is written after step 2's evaluation
        real_save = Trainer._save

        def save(self, folder, **kwargs):
            if folder.name == "best" and self.step == 2:
                raise KeyboardInterrupt
            return real_save(self, folder, **kwargs)

        monkeypatch.setattr(Trainer, "_save", save)
        with pytest.raises(TrainingInterrupted, match="at step 2"):
            run(tmp_path / "b")
        monkeypatch.setattr(Trainer, "_save", real_save)
    else:
        with pytest.raises(TrainingInterrupted, match="at step 2"):
            run(tmp_path / "b", stop_at=2)  # while scoring step 2
    assert read_trainer_state(tmp_path / "b")["eval_pending"] is True
    assert read_trainer_state(tmp_path / "b")["best"]["step"] == 1  # as before step 2's evaluation
    _, resumed = run(tmp_path / "b", resume=True)
    assert resumed["stopped_early"] and resumed["steps"] == 4 and resumed["best"] == whole["best"]

    def records(folder):
        return [{k: v for k, v in json.loads(line).items() if k not in ("elapsed", "tokens_per_s")}
                for line in (folder / "metrics.jsonl").read_text().splitlines()]

    assert records(tmp_path / "b") == records(tmp_path / "a")
    for name in ("checkpoint", "best"):
        a, b = (load_file(folder / name / "model.safetensors") for folder in (tmp_path / "a", tmp_path / "b"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    # Resumed again, a run that stopped early has nothing to train, unless given a larger patience.
    _, again = run(tmp_path / "b", resume=True)
    assert again["start_step"] == again["steps"] == 4 and again["stopped_early"]
    cfg = cfg.replace(early_stopping_patience=3)
    _, longer = run(tmp_path / "b", resume=True)
    assert longer["start_step"] == 4 and longer["steps"] == 6 and longer["best"]["step"] == 5


def test_resume_without_checkpoint(tmp_path):
    from attnlab.errors import CheckpointError

    with pytest.raises(CheckpointError, match="cannot resume"):
        Trainer(tiny_model(), config(), ToySource(), out_dir=tmp_path, resume=True).fit()


# ----------------------------------------------------------------------------------------------------
# Devices, precision, compile


def test_devices_and_precision():
    assert select_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="unknown device"):
        select_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="not available"):
            select_device("cuda")
    assert resolve_precision("fp32", "cpu") is None
    assert resolve_precision("auto", "cpu") == (torch.bfloat16 if cpu_has_bf16() else None)
    with pytest.raises(ConfigError):
        resolve_precision("fp8", "cpu")


@pytest.mark.parametrize("precision", ["auto", "fp32"])
def test_the_precision_a_run_trained_in_is_recorded(tmp_path, precision):
    # "auto" was all a run folder said: whether it had trained in bf16 or fp32 on its machine was nowhere.
    config = TrainerConfig(steps=1, batch_size=8, precision=precision, device="cpu", progress=False)
    summary = Trainer(tiny_model(), config, ToySource(), out_dir=tmp_path).fit()
    used = "bf16" if precision == "auto" and cpu_has_bf16() else "fp32"
    assert summary["precision"] == used
    assert read_trainer_state(tmp_path / "checkpoint")["precision_used"] == used


def test_train_device_takes_one_gpu_by_number_as_generate_does(monkeypatch):
    """train.device refused "cuda:1", which generate --device and run knowledge --device take; under torchrun a
    numbered GPU is refused (every process would take it: each takes GPU LOCAL_RANK)."""
    from attnlab.training import distributed

    assert TrainerConfig(device="cuda:1").device == "cuda:1"
    for bad in ("cuda:x", "cuda:", "gpu", "cpu:0"):
        with pytest.raises(ConfigError, match=r"choose one of: auto, cpu, cuda, mps, cuda:N"):
            TrainerConfig(device=bad)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(distributed, "select_device", lambda name: torch.device(name))
    with pytest.raises(ConfigError, match="each process takes GPU LOCAL_RANK; use device \"cuda\""):
        distributed.init_distributed("cuda:1")


@pytest.mark.parametrize("native", [True, False])
def test_forced_bf16_warns_only_on_a_cpu_without_bf16_instructions(monkeypatch, native):
    import warnings

    from attnlab.training import device

    monkeypatch.setattr(device, "cpu_has_bf16", lambda: native)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve_precision("bf16", "cpu") is torch.bfloat16
        assert resolve_precision("auto", "cpu") == (torch.bfloat16 if native else None)
    messages = [str(w.message) for w in caught]
    assert bool(messages) != native
    assert all("without bf16 instructions" in m for m in messages)


def test_bf16_autocast_runs_on_cpu(tmp_path):
    import contextlib

    expect = contextlib.nullcontext() if cpu_has_bf16() else pytest.warns(UserWarning, match="without bf16")
    with expect:
        trainer = Trainer(tiny_model(), config(precision="bf16", steps=3), ToySource(), eval_source=ToySource(),
                          out_dir=tmp_path)
    assert trainer.dtype is torch.bfloat16
    summary = trainer.fit()
    assert math.isfinite(summary["final_train_loss"]) and math.isfinite(summary["final_eval_loss"])
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # master weights stay fp32


def test_compile_failure_falls_back_with_a_warning(tmp_path, monkeypatch):
    def broken_compile(module, *args, **kwargs):
        def run(**batch):
            raise RuntimeError("backend exploded\nwith details")

        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    trainer = Trainer(tiny_model(), config(compile=True, steps=2), ToySource(), out_dir=tmp_path)
    with pytest.warns(UserWarning, match="torch.compile failed"):
        summary = trainer.fit()
    assert summary["steps"] == 2


def test_a_backward_that_cannot_compile_falls_back_like_a_forward(tmp_path, monkeypatch):
    """AOTAutograd lowers a graph's backward at its first backward() by default: a failure there (a kernel
    inductor cannot build) stopped the run with a traceback. It is now built with the forward, inside the
    fallback, and the run trains eagerly: the eager run's weights exactly."""
    pytest.importorskip("functorch.compile")
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def refuse_backward(graph, example_inputs):
        raise RuntimeError("cannot build this backward kernel")

    backend = aot_autograd(fw_compiler=lambda graph, example_inputs: make_boxed_func(graph.forward),
                           bw_compiler=refuse_backward)
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: real_compile(module, backend=backend))
    torch._dynamo.reset()
    trainer = Trainer(tiny_model(), config(compile=True, steps=3), ToySource(), out_dir=tmp_path / "compiled")
    with pytest.warns(UserWarning, match="torch.compile failed .*cannot build this backward kernel"):
        assert trainer.fit()["steps"] == 3
    eager = Trainer(tiny_model(), config(steps=3), ToySource(), out_dir=tmp_path / "eager")
    eager.fit()
    for a, b in zip(trainer.model.state_dict().values(), eager.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_fast_fp32_matmul_is_exact_and_scoped():
    """The oneDNN fp32 switch is used only where it computes in fp32 (checked against float64 here too),
    and the global torch setting is restored after the block."""
    from attnlab.training.device import fast_fp32_matmul, onednn_fp32_is_exact

    backend = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)
    before = getattr(backend, "fp32_precision", None)
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(300, 200, generator=g), torch.randn(200, 500, generator=g)
    exact = a.double() @ b.double()
    with fast_fp32_matmul("cpu") as used:
        assert used == onednn_fp32_is_exact()
        error = ((a @ b).double() - exact).abs().max() / exact.abs().max()
        assert error < 1e-5
    assert getattr(backend, "fp32_precision", None) == before
    with fast_fp32_matmul("cpu", enabled=False) as used:
        assert not used


def test_last_level_cache_size_from_sysfs(tmp_path):
    from attnlab.training.device import DEFAULT_LAST_LEVEL_CACHE, cpu_last_level_cache_bytes

    for index, (level, size) in enumerate([(1, "32K"), (1, "32K"), (2, "512K"), (3, "32768K")]):
        folder = tmp_path / "cache" / f"index{index}"
        folder.mkdir(parents=True)
        (folder / "level").write_text(f"{level}\n")
        (folder / "size").write_text(f"{size}\n")
    assert cpu_last_level_cache_bytes(str(tmp_path / "cache")) == 32 << 20
    (tmp_path / "cache" / "index3" / "size").write_text("garbage\n")  # unreadable: the next level down
    assert cpu_last_level_cache_bytes.__wrapped__(str(tmp_path / "cache")) == 512 << 10
    assert cpu_last_level_cache_bytes(str(tmp_path / "none")) == DEFAULT_LAST_LEVEL_CACHE


def test_metrics_lines_are_standard_json_with_null_for_values_that_are_not_finite(tmp_path):
    # json.dumps wrote NaN and Infinity, which jq and other strict JSON readers refuse.
    from attnlab.training.logging import MetricsLog, plot_losses

    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.start()
    log.write({"step": 1, "loss": 2.5, "lr": 0.1})
    log.write({"step": 2, "eval_loss": float("nan"), "eval_perplexity": float("inf"), "elapsed": 1.0})
    log.write({"step": 3, "loss": float("-inf")})

    def strict(constant):
        raise AssertionError(f"not standard JSON: {constant}")

    lines = (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line, parse_constant=strict) for line in lines]
    assert records[1] == {"step": 2, "eval_loss": None, "eval_perplexity": None, "elapsed": 1.0}
    assert records[2] == {"step": 3, "loss": None} and log.read() == records
    log.start(keep_until_step=2)  # a resume rewrites the kept lines the same way
    assert [json.loads(line, parse_constant=strict) for line in log.path.read_text().splitlines()] == records[:2]
    assert plot_losses(log.read(), tmp_path / "loss.png") is not None


@pytest.mark.parametrize("signal", ["SIGTERM", "Ctrl-C"])
def test_a_distributed_run_stopped_by_torchrun_before_its_first_save_keeps_the_run_it_replaces(tmp_path, signal):
    # torchrun stops every process with SIGTERM when one of them dies: rank 0's save then replaced the trained run in
    # the folder (checkpoint/, best/ and its records set aside), where a one-process run's crash keeps it (stop-40
    # DDP audit). Ctrl-C, which the user gives every process, still saves the new run (stop-40 review). The stand-in
    # world is switched to two processes at the interrupt alone.
    from attnlab.errors import Terminated
    from attnlab.training.distributed import World

    run = tmp_path / "run"
    Trainer(tiny_model(), config(steps=3), ToySource(), out_dir=run).fit()
    before = (run / "checkpoint" / "model.safetensors").read_bytes()

    class Stopped(ToySource):
        def batch(self, step):
            if step == 2:
                trainer.world = World(rank=0, size=2)
                raise Terminated if signal == "SIGTERM" else KeyboardInterrupt
            return super().batch(step)

    trainer = Trainer(tiny_model(seed=1), config(steps=6), Stopped(seed=1), out_dir=run)
    with pytest.raises(TrainingInterrupted) as info:
        trainer.fit()
    if signal == "SIGTERM":
        assert "before this run's first save: nothing of it was saved, and the run it was replacing in " in \
            str(info.value) and "is kept; run the command again" in str(info.value)
        assert (run / "checkpoint" / "model.safetensors").read_bytes() == before
        assert read_trainer_state(run)["step"] == 3
    else:
        assert "checkpoint saved in" in str(info.value)
        assert read_trainer_state(run)["step"] == 2 and not (run / ".metrics.jsonl.replaced").exists()


def test_a_save_tells_every_process_that_the_run_it_replaces_is_gone(tmp_path):
    # Only rank 0 cleared its record of the replaced run at a save: a torchrun SIGTERM after this run's saves then
    # told rank 1's user that nothing of this run was saved and the old run was kept (stop-40 note). The stand-in
    # world makes this process rank 1 of two from the first step (collectives stay single-process).
    from attnlab.errors import Terminated
    from attnlab.training.distributed import World

    run = tmp_path / "run"
    Trainer(tiny_model(), config(steps=3), ToySource(), out_dir=run).fit()

    class Stopped(ToySource):
        def batch(self, step):
            if step == 1:
                trainer.world = World(rank=1, size=2)
            if step == 4:
                raise Terminated
            return super().batch(step)

    trainer = Trainer(tiny_model(seed=1), config(steps=6, save_every=2), Stopped(seed=1), out_dir=run)
    with pytest.raises(TrainingInterrupted) as info:
        trainer.fit()
    assert "before this run's first save" not in str(info.value)
    assert "training interrupted at step 4 of 6; checkpoint saved in" in str(info.value)
