"""Trainer, device, checkpoint, parameter-table and config invariants the other tests leave open: resume
keeps the best checkpoint and the patience count, best_eval_loss is the minimum, gradients are clipped,
evaluation leaves the training random streams alone, no_weight_decay is honoured, CUDA selection and bf16
support, checkpoints with extra weights or foreign optimizer state are refused in one line, the parameter
table's own checks fire, and wrongly typed settings are refused."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from cli_helpers import run_cli
from training_helpers import ToySource, tiny_model

from attnlab.errors import CheckpointError, ConfigError


def _cfg(**changes):
    from attnlab.training import TrainerConfig

    settings = dict(steps=4, batch_size=8, lr=1e-2, warmup_steps=1, precision="fp32", device="cpu",
                    progress=False, log_every=1)
    settings.update(changes)
    return TrainerConfig(**settings)


def _scores(values):
    it = iter(values)
    return lambda model: {"score": next(it)}


def test_resume_keeps_the_best_checkpoint_and_the_patience_count(tmp_path):
    from attnlab.training import Trainer, read_trainer_state

    cfg = _cfg(steps=2, schedule="constant", eval_every=1, save_every=1, early_stopping_patience=3,
               best_metric="score", best_mode="max")
    Trainer(tiny_model(), cfg, ToySource(), out_dir=tmp_path, metrics_fn=_scores([5.0, 1.0])).fit()
    resumed = Trainer(tiny_model(), cfg.replace(steps=10), ToySource(), out_dir=tmp_path,
                      metrics_fn=_scores([2.0] * 10), resume=True)
    summary = resumed.fit()
    assert summary["best"] == {"metric": "score", "value": 5.0, "step": 1}  # 2.0 after resume is not better
    assert read_trainer_state(tmp_path / "best")["step"] == 1
    assert summary["stopped_early"] and summary["steps"] == 4  # bad evals at steps 2 (before), 3, 4


def test_best_eval_loss_is_the_minimum(tmp_path):
    from attnlab.training import Trainer

    it = iter([3.0, 1.0, 2.0])
    trainer = Trainer(tiny_model(), _cfg(steps=3, eval_every=1), ToySource(), out_dir=tmp_path,
                      metrics_fn=lambda m: {"loss": next(it)})
    summary = trainer.fit()
    assert summary["best_eval_loss"] == 1.0 and summary["final_eval_loss"] == 2.0


def test_gradients_are_clipped_before_the_optimizer_step(tmp_path):
    from attnlab.training import Trainer

    trainer = Trainer(tiny_model(), _cfg(steps=3, grad_clip=1e-3), ToySource(), out_dir=tmp_path)
    norms = []
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):
        grads = [p.grad.detach().flatten() for p in trainer.model.parameters() if p.grad is not None]
        norms.append(torch.cat(grads).norm().item())
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    trainer.fit()
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["grad_norm"] > 1e-2 for r in logged if "grad_norm" in r)  # clipping was needed
    assert len(norms) == 3 and all(n <= 1e-3 * (1 + 1e-4) for n in norms)


def test_evaluation_does_not_move_the_training_random_streams(tmp_path):
    from attnlab.training import Trainer

    def sampling_metric(model):
        return {"x": float(torch.rand(())) + float(np.random.rand()) + __import__("random").random()}

    quiet = Trainer(tiny_model(dropout=0.3), _cfg(steps=4, eval_every=4), ToySource(), out_dir=tmp_path / "a",
                    metrics_fn=sampling_metric)
    quiet.fit()
    after_quiet = sampling_metric(None)  # the streams as the run left them
    busy = Trainer(tiny_model(dropout=0.3), _cfg(steps=4, eval_every=1), ToySource(), out_dir=tmp_path / "b",
                   metrics_fn=sampling_metric)
    busy.fit()
    for k, v in quiet.model.state_dict().items():
        assert torch.equal(busy.model.state_dict()[k], v), k
    # Each step reseeds torch, so the weights alone could not show evaluations drawing from the streams: the last
    # evaluation's draws and the streams after the run do (each evaluation drew from where the last one had left).
    assert busy._totals.last_eval["x"] == quiet._totals.last_eval["x"]
    assert sampling_metric(None) == after_quiet


def test_each_step_draws_its_own_dropout_masks(monkeypatch, tmp_path):
    # Every step reseeded to step 0's streams would have dropped the same units at every step, and each resume and
    # process count would have agreed with it (found by the stop-39 mutation audit).
    from attnlab.training import Trainer
    from attnlab.training import trainer as trainer_module

    seeded = []
    real = trainer_module.seed_step
    monkeypatch.setattr(trainer_module, "seed_step", lambda seed, rank, step: (seeded.append(step),
                                                                               real(seed, rank, step)))
    masks = []
    model = tiny_model(dropout=0.5)
    model.register_forward_hook(lambda module, args, out: masks.append(torch.rand(8).tolist()))
    Trainer(model, _cfg(steps=4), ToySource(), out_dir=tmp_path).fit()
    assert seeded == [0, 1, 2, 3]
    assert len({tuple(m) for m in masks}) == len(masks) == 4  # the draws of each step's forward pass differ


def test_no_weight_decay_hook_excludes_named_parameters():
    from attnlab.training import param_groups

    model = tiny_model(tie=False)
    model.no_weight_decay = lambda: {"head.weight"}
    decay, no_decay = param_groups(model, 0.1)
    assert decay["params"] == [] and any(p is model.head.weight for p in no_decay["params"])


def test_auto_device_prefers_cuda_and_bf16_follows_the_gpu(monkeypatch):
    from attnlab.training import device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device.select_device("auto") == torch.device("cuda")
    monkeypatch.setattr(device, "_cuda_bf16", lambda d: False)
    monkeypatch.setattr(device, "_cuda_bf16_runs", lambda: False)
    assert device.resolve_precision("auto", "cuda") is None
    with pytest.raises(ConfigError, match="does not support bf16"):
        device.resolve_precision("bf16", "cuda")
    monkeypatch.setattr(device, "_cuda_bf16", lambda d: True)
    assert device.resolve_precision("auto", "cuda") is torch.bfloat16


def test_a_numbered_gpu_becomes_the_current_one(monkeypatch):
    """train.device = "cuda:1" in one process: torch's calls that name no GPU (streams, memory stats) use GPU 1."""
    from attnlab.training import distributed

    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert distributed.init_distributed("cuda:1")[1] == torch.device("cuda", 1)
    assert current == [torch.device("cuda", 1)]
    distributed.init_distributed("cuda")  # no number: torch's current GPU stays
    assert len(current) == 1


@pytest.mark.parametrize("supported", [True, False])
def test_cuda_bf16_asks_the_gpu_and_a_failing_query_means_fp32(monkeypatch, supported):
    from attnlab.training import device

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: supported)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    assert device._cuda_bf16(torch.device("cuda")) is supported

    def old_driver(*args, **kwargs):
        raise RuntimeError("CUDA driver version is insufficient")

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", old_driver)
    assert device._cuda_bf16(torch.device("cuda")) is False


@pytest.mark.parametrize("capability", [(7, 0), (7, 5), (8, 0), (9, 0)])
def test_auto_bf16_only_on_gpus_that_compute_it_natively(monkeypatch, capability):
    """torch.cuda.is_bf16_supported() also says yes on V100s and T4s, which emulate bf16 (slower than fp32): "auto"
    stays fp32 there, and a forced "bf16" runs with a warning, as on a CPU without bf16 instructions. The
    capability asked for is that of the run's GPU ("cuda:1"), not the current one."""
    import warnings

    from attnlab.training import device

    asked = []
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # what torch says on any GPU
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: asked.append(d) or capability)
    native = capability >= (8, 0)
    assert device.resolve_precision("auto", "cuda:1") == (torch.bfloat16 if native else None)
    assert asked == [torch.device("cuda:1")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert device.resolve_precision("bf16", "cuda") is torch.bfloat16
    assert [w.category for w in caught] == ([] if native else [device.SlowPrecisionWarning])


def _trained():
    from attnlab.training import TrainerConfig, build_optimizer

    model = tiny_model()
    optimizer = build_optimizer(model, TrainerConfig(), torch.device("cpu"))
    model(**ToySource().batch(0)).loss.backward()
    optimizer.step()
    return model, optimizer


def test_checkpoint_with_an_extra_weight_is_refused_in_one_line(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    from attnlab.training import load_checkpoint_into, save_checkpoint

    model, _ = _trained()
    folder = save_checkpoint(tmp_path / "c", model)
    path = folder / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    save_file({**tensors, "extra.weight": torch.zeros(2)}, str(path), metadata=meta)
    with pytest.raises(CheckpointError, match="has weight 'extra.weight', which the model does not have") as e:
        load_checkpoint_into(folder, tiny_model())
    assert "\n" not in str(e.value)


def test_optimizer_state_of_other_groups_or_shapes_is_refused(tmp_path):
    from attnlab.training import load_checkpoint_into, save_checkpoint

    model, optimizer = _trained()  # groups: [head.weight] decayed, 4 others not
    folder = save_checkpoint(tmp_path / "c", model, optimizer)
    m = tiny_model()
    regrouped = torch.optim.AdamW([{"params": []}, {"params": list(m.parameters())}])  # sizes [0, 5]
    with pytest.raises(CheckpointError, match=r"groups the optimizer's 5 parameters for weight decay as \[1, 4\]"):
        load_checkpoint_into(folder, m, regrouped)
    m = tiny_model()
    others = [m.embed.weight, m.head.weight, m.norm.bias, m.head.bias]
    shuffled = torch.optim.AdamW([{"params": [m.norm.weight]}, {"params": others}])  # sizes [1, 4]
    with pytest.raises(CheckpointError, match=r"optimizer state 0\.\w+ has shape \(13, 8\)"):
        load_checkpoint_into(folder, m, shuffled)


def test_check_table_reports_double_counted_and_uncovered_parameters():
    from attnlab.analysis.params import check_table, count_parameters
    from attnlab.models.registry import build_model
    from attnlab.models.transformer import TransformerConfig

    config = TransformerConfig(src_vocab_size=50, tgt_vocab_size=50, d_model=16, n_heads=4, d_ff=24,
                               n_encoder_layers=2, n_decoder_layers=3, dropout=0.0, max_len=12)
    table = count_parameters(config)
    k = table.row("encoder", "self-attention K")
    wrong = dataclasses.replace(k, modules=("encoder.layers.*.self_attn.scores.q_proj",))  # same count
    table.rows = [wrong if r is k else r for r in table.rows]
    problems = check_table(table, build_model(config))
    assert any("also counted in" in p for p in problems)
    assert any(p.startswith("parameters in no row") and "k_proj" in p for p in problems)


@pytest.mark.parametrize("setting, needle", [
    ('train.steps="abc"', "train.steps: expected an integer"),
    ("train.steps=true", "train.steps: expected an integer"),
    ("train.lr=true", "train.lr: expected a number"),
    ("train.schedule=3", "train.schedule: expected a string"),
    ("train.progress=1", "train.progress: expected true or false"),
])
def test_wrongly_typed_setting_is_refused(setting, needle):
    from attnlab.training.recipe import load_run_config

    with pytest.raises(ConfigError, match=needle):  # checked without training anything
        load_run_config(None, [setting])


def test_wrongly_typed_setting_on_the_command_line_is_one_line_exit_2(capsys):
    code, _, err = run_cli(capsys, "train", "--set", 'train.steps="abc"')
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "train.steps: expected an integer" in lines[0], err
