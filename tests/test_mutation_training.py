"""Tests that kill mutants the rest of the suite let through: BERT's pair truncation for every length pair,
AdamW against a hand-written update (betas, eps, decay groups), the schedules' floor for lr != 1, the trainer
using the learning rate of the step it trains, patience counted from the last improvement, evaluation in
eval mode, a run's Python and numpy streams seeded by its seed, the logged training loss as a mean over
targets, and the best evaluation loss surviving a resume."""

from __future__ import annotations

import copy
import json
import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from training_helpers import ToySource, tiny_model


def _cfg(**changes):
    from attnlab.training import TrainerConfig

    settings = dict(steps=4, batch_size=8, lr=1e-2, warmup_steps=1, precision="fp32", device="cpu",
                    progress=False, log_every=1)
    settings.update(changes)
    return TrainerConfig(**settings)


def _records(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------------
# Data


@pytest.mark.parametrize("max_length", [8, 9, 12, 13])
def test_nsp_truncation_matches_bert_for_every_length_pair(max_length):
    """Every (len A, len B) against BERT's truncate_seq_pair loop, odd and even budgets: the shortcut
    must take the "shorter one fits in half" branch when the shorter has exactly budget // 2 tokens."""
    from attnlab.data.sources import NSPPairs
    from attnlab.data.tokenizers import WordTokenizer

    docs = [[f"doc {d} sentence {s}" for s in range(3)] for d in range(3)]
    tok = WordTokenizer.train([" ".join(s) for s in docs])
    pairs = NSPPairs(docs, tok, max_length=max_length)
    budget = max_length - 3
    for la in range(2 * budget + 2):
        for lb in range(2 * budget + 2):
            a, b = list(range(100, 100 + la)), list(range(200, 200 + lb))
            ta, tb = list(a), list(b)
            while len(ta) + len(tb) > budget:
                (ta if len(ta) > len(tb) else tb).pop()
            ids, types = pairs.encode_pair(a, b)
            assert ids == [tok.cls_id, *ta, tok.sep_id, *tb, tok.sep_id], (la, lb)
            assert types == [0] * (len(ta) + 2) + [1] * (len(tb) + 1), (la, lb)


def test_mlm_evaluation_masks_do_not_depend_on_the_batch_size():
    """Like BertSource's: the evaluation loss of an MLMSource must not change with the evaluation batch size
    (the trainer evaluates in micro-batches, `attnlab evaluate` takes --batch-size)."""
    from attnlab.data.sources import MaskSpec, MLMSource

    tokens = np.random.default_rng(0).integers(2, 60, size=400)
    source = MLMSource(tokens, block_size=8, batch_size=4, masking=MaskSpec(mask_id=1, vocab_size=60,
                                                                             special_ids=(0, 1)), seed=0)
    runs = [{k: torch.cat([b[k] for b in source.iter_batches(size)]) for k in ("input_ids", "labels")}
            for size in (1, 4, 7, 50)]
    assert runs[0]["labels"].shape == (50, 8)
    for other in runs[1:]:
        assert torch.equal(other["input_ids"], runs[0]["input_ids"])
        assert torch.equal(other["labels"], runs[0]["labels"])
    picked = runs[0]["labels"] != -100
    assert torch.equal(runs[0]["labels"][picked], torch.as_tensor(tokens[:400]).reshape(50, 8)[picked])
    assert (picked.sum(1) >= 1).all() and len({tuple(r) for r in picked.tolist()}) > 10  # rows differ


def test_a_string_corpus_is_cut_into_blocks_at_line_ends():
    from attnlab.data.corpus import _blocks

    text = "a\nbb\nccc\ndddddddd\ne"
    blocks = list(_blocks(text, 5))
    assert "".join(blocks) == text
    # Cut before a line end (where every tokenizer ends a token); a line longer than a block is cut inside.
    assert blocks == ["a\nbb", "\nccc", "\ndddd", "dddd", "\ne"]


@pytest.mark.parametrize("n_people", [7, 13, 18])
def test_world_split_rounds_the_evaluation_share(n_people):
    from attnlab.data.world import make_world

    train, dev = make_world(n_people, seed=1).split(0.2)
    assert len(dev) == round(0.2 * n_people) and len(train) + len(dev) == n_people


def test_phase_warmup_ends_before_the_last_step():
    """A phase shorter than the warmup still reaches the peak lr one step before its end."""
    from attnlab.experiments.knowledge import SCALES, _phase_config

    full = SCALES["full"]  # warmup of 512·20 tokens = 40 steps of 2 × 128 characters
    cfg = _phase_config(full, batch=2, lr=1e-3, epochs=1, n_examples=10, n_corpus=10, seed=0, device="cpu",
                        progress=False)
    assert cfg["steps"] == 5 and cfg["warmup_steps"] == 4


# ------------------------------------------------------------------------------------------------
# Optimizer and schedules


def test_adamw_steps_match_a_hand_written_adamw():
    """build_optimizer must use the configured betas, eps and weight decay, and decay only head.weight (the
    tiny LM's one non-embedding matrix)."""
    from attnlab.training import TrainerConfig, build_optimizer

    lr, (b1, b2), eps, wd = 0.05, (0.5, 0.7), 0.3, 0.2
    model = tiny_model(tie=False)
    cfg = TrainerConfig(lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    optimizer = build_optimizer(model, cfg, torch.device("cpu"))
    ref = {n: p.detach().double().clone() for n, p in model.named_parameters()}
    m = {n: torch.zeros_like(p) for n, p in ref.items()}
    v = {n: torch.zeros_like(p) for n, p in ref.items()}
    gen = torch.Generator().manual_seed(3)
    for t in range(1, 4):
        grads = {n: torch.randn(p.shape, generator=gen, dtype=torch.float64) for n, p in ref.items()}
        for n, p in model.named_parameters():
            p.grad = grads[n].float()
        optimizer.step()
        for n, p in ref.items():
            g = grads[n]
            if n == "head.weight":
                p.mul_(1 - lr * wd)
            m[n] = b1 * m[n] + (1 - b1) * g
            v[n] = b2 * v[n] + (1 - b2) * g * g
            p.sub_(lr * (m[n] / (1 - b1**t)) / ((v[n] / (1 - b2**t)).sqrt() + eps))
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach().double(), ref[n], rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_schedules_decay_to_min_lr_ratio_times_lr(schedule):
    """The floor is min_lr_ratio·lr, not min_lr_ratio (which test values with lr = 1 cannot tell apart)."""
    from attnlab.training import TrainerConfig, lr_at

    cfg = TrainerConfig(steps=20, lr=3e-3, warmup_steps=4, min_lr_ratio=0.2, schedule=schedule)
    floor = 0.2 * 3e-3
    assert lr_at(3, cfg) == pytest.approx(3e-3)
    assert lr_at(12, cfg) == pytest.approx((3e-3 + floor) / 2)  # half way, for both shapes
    assert lr_at(20, cfg) == pytest.approx(floor)
    assert lr_at(1000, cfg) == pytest.approx(floor)


def test_the_trainer_uses_the_learning_rate_of_the_step_it_trains(tmp_path):
    from attnlab.training import Trainer

    cfg = _cfg(steps=4, lr=0.5, warmup_steps=2, schedule="cosine", min_lr_ratio=0.0)
    trainer = Trainer(tiny_model(), cfg, ToySource(), out_dir=tmp_path)
    seen = []
    step = trainer.optimizer.step

    def recording_step(*args, **kwargs):
        seen.append([g["lr"] for g in trainer.optimizer.param_groups])
        return step(*args, **kwargs)

    trainer.optimizer.step = recording_step
    trainer.fit()
    # warmup 0.5·1/2, 0.5·2/2; then the cosine from 0.5 to 0 over steps 2..4: progress 0, 1/2
    expected = [0.25, 0.5, 0.5, 0.25]
    assert [groups[0] for groups in seen] == pytest.approx(expected)
    assert all(len(set(groups)) == 1 for groups in seen)
    assert [r["lr"] for r in _records(tmp_path) if "lr" in r] == pytest.approx(expected)


# ------------------------------------------------------------------------------------------------
# Evaluation, early stopping, logging, resume


def test_patience_counts_evaluations_since_the_last_improvement(tmp_path):
    from attnlab.training import Trainer

    values = iter([1.0, 2.0, 0.5, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0])
    cfg = _cfg(steps=10, eval_every=1, early_stopping_patience=2, best_metric="score", best_mode="min")
    summary = Trainer(tiny_model(), cfg, ToySource(), out_dir=tmp_path,
                      metrics_fn=lambda model: {"score": next(values)}).fit()
    # bad at 2, better at 3 (the count starts again), bad at 4 and 5: stop after step 5
    assert summary["stopped_early"] and summary["steps"] == 5
    assert summary["best"] == {"metric": "score", "value": 0.5, "step": 3}


def test_a_nan_evaluation_is_never_the_best(tmp_path):
    """A first evaluation of NaN must not become the best value: nothing compares better than NaN."""
    from attnlab.training import Trainer

    values = iter([math.nan, 2.0, 1.0])
    cfg = _cfg(steps=3, eval_every=1, best_metric="score", best_mode="min")
    summary = Trainer(tiny_model(), cfg, ToySource(), out_dir=tmp_path,
                      metrics_fn=lambda model: {"score": next(values)}).fit()
    assert summary["best"] == {"metric": "score", "value": 1.0, "step": 3}


def test_a_run_stopped_early_logs_its_last_training_steps(tmp_path):
    from attnlab.training import Trainer

    values = iter([1.0, 2.0])
    cfg = _cfg(steps=10, log_every=5, eval_every=1, early_stopping_patience=1, best_metric="score",
               best_mode="min")
    summary = Trainer(tiny_model(), cfg, ToySource(), out_dir=tmp_path,
                      metrics_fn=lambda model: {"score": next(values)}).fit()
    assert summary["stopped_early"] and summary["steps"] == 2
    train_records = [r for r in _records(tmp_path) if "loss" in r]
    assert [r["step"] for r in train_records] == [2]
    assert summary["final_train_loss"] == train_records[0]["loss"]


def test_evaluation_runs_the_model_in_eval_mode(tmp_path):
    """With dropout, the evaluation loss must be the deterministic eval-mode loss over the whole split."""
    from attnlab.training import Trainer

    model = tiny_model(dropout=0.5)
    reference = copy.deepcopy(model).eval()
    modes = []

    def metric(m):
        modes.append(m.training)
        return {}

    trainer = Trainer(model, _cfg(), ToySource(), eval_source=ToySource(), out_dir=tmp_path, metrics_fn=metric)
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in ToySource().iter_batches(8):
            labels = batch["labels"].reshape(-1)
            logits = reference(batch["input_ids"]).logits
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels, ignore_index=-100,
                                     reduction="sum").item()
            count += int((labels != -100).sum())
    metrics = trainer.evaluate()
    assert metrics["loss"] == pytest.approx(total / count, rel=1e-6)
    assert metrics["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-6)
    assert modes == [False] and model.training  # the metrics function sees eval mode; training mode after


def test_a_run_seeds_pythons_and_numpys_global_generators(tmp_path):
    """A metrics function that samples sees the streams `seed` starts, whatever ran before the run."""
    from attnlab.training import Trainer

    seen = []

    def sampling(model):
        seen.append((random.random(), float(np.random.rand())))
        return {"x": 0.0}

    random.seed(12345)
    np.random.seed(12345)
    Trainer(tiny_model(), _cfg(steps=1, seed=7), ToySource(), out_dir=tmp_path, metrics_fn=sampling).fit()
    assert seen == [(random.Random(7).random(), float(np.random.RandomState(7).rand()))]


def test_logged_training_loss_is_the_mean_over_all_targets(tmp_path):
    """metrics.jsonl's loss over a log window of two steps with micro-batches of 2 rows: the cross-entropy
    summed over every target of both global batches over their number (lr is tiny so the weights of the
    second step are those of the first to within 1e-8)."""
    from attnlab.training import Trainer

    model = tiny_model()
    reference = copy.deepcopy(model)
    cfg = _cfg(steps=2, log_every=2, micro_batch_size=2, lr=1e-9, warmup_steps=0, grad_clip=0.0,
               weight_decay=0.0, schedule="constant")
    Trainer(model, cfg, ToySource(), out_dir=tmp_path).fit()
    total, count = 0.0, 0
    with torch.no_grad():
        for step in range(2):
            batch = ToySource().batch(step)
            labels = batch["labels"].reshape(-1)
            logits = reference(batch["input_ids"]).logits
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels, ignore_index=-100,
                                     reduction="sum").item()
            count += int((labels != -100).sum())
    logged = [r for r in _records(tmp_path) if "loss" in r]
    assert len(logged) == 1 and logged[0]["step"] == 2
    assert logged[0]["loss"] == pytest.approx(total / count, rel=1e-5)


def test_resume_keeps_the_best_evaluation_loss(tmp_path):
    from attnlab.training import Trainer

    first = iter([1.0, 2.0])
    cfg = _cfg(steps=2, eval_every=1, save_every=1)
    Trainer(tiny_model(), cfg, ToySource(), out_dir=tmp_path, metrics_fn=lambda m: {"loss": next(first)}).fit()
    later = iter([3.0, 4.0])
    summary = Trainer(tiny_model(), cfg.replace(steps=4), ToySource(), out_dir=tmp_path, resume=True,
                      metrics_fn=lambda m: {"loss": next(later)}).fit()
    assert summary["start_step"] == 2 and summary["final_eval_loss"] == 4.0
    assert summary["best_eval_loss"] == 1.0
