"""Defects a second audit of the training engine found: each test failed before its fix."""

from __future__ import annotations

import json
import os
import signal
import warnings

import pytest
import torch
from cli_helpers import one_line_error
from training_helpers import ToySource, bert_nsp_run, tiny_model, token_accuracy_counts

from attnlab.training import Trainer, TrainerConfig, TrainingDiverged, TrainingInterrupted, read_trainer_state


@pytest.fixture(autouse=True)
def _ctrl_c_raises():
    """Python's own SIGINT handler for each test: a runner started in the background (`&`, nohup) ignores SIGINT,
    and the tests that send themselves a Ctrl-C would then see nothing happen."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _config(**changes) -> TrainerConfig:
    settings = dict(steps=4, batch_size=8, lr=1e-2, warmup_steps=1, precision="fp32", device="cpu", progress=False,
                    log_every=1)
    settings.update(changes)
    return TrainerConfig(**settings)


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _records(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


def _nan_loss_at_step(step: int):
    """A tiny model whose training loss becomes NaN at its `step`-th forward pass (no evaluation runs before)."""
    model = tiny_model()
    forward, calls = model.forward, {"n": 0}

    def forward_with_nan(input_ids, labels=None, attention_mask=None):
        out = forward(input_ids, labels=labels, attention_mask=attention_mask)
        calls["n"] += 1
        if calls["n"] == step:
            out.loss = out.loss * float("nan")
        return out

    model.forward = forward_with_nan
    return model


def _ctrl_c_in_optimizer_step(step: int):
    """An `interrupt` for a trainer: SIGINT from inside its `step`-th optimizer step, after the update (a step
    post-hook runs inside optimizer.step())."""
    def install(trainer: Trainer) -> None:
        calls = {"n": 0}

        def ctrl_c(optimizer, args, kwargs):
            calls["n"] += 1
            if calls["n"] == step:
                os.kill(os.getpid(), signal.SIGINT)

        trainer.optimizer.register_step_post_hook(ctrl_c)

    return install


def test_a_nan_loss_stops_training_at_its_step_and_keeps_the_last_checkpoint(tmp_path):
    # Checked at log steps only, the run trained on to step 10 and saved NaN weights over the step-4 checkpoint at
    # step 8 (a resume then failed on them), reporting step 10.
    model = _nan_loss_at_step(5)
    with pytest.raises(TrainingDiverged, match="at step 5;.*last checkpoint was kept"):
        Trainer(model, _config(steps=20, log_every=10, save_every=4), ToySource(), out_dir=tmp_path).fit()
    assert read_trainer_state(tmp_path / "checkpoint")["step"] == 4
    resumed = Trainer(tiny_model(), _config(steps=20, log_every=10, save_every=4), ToySource(), out_dir=tmp_path,
                      resume=True)
    assert resumed.fit()["steps"] == 20


def test_weights_that_are_not_finite_are_never_saved(tmp_path):
    # A finite loss with an update that breaks the weights (the next loss would show it): the save comes first.
    trainer = Trainer(tiny_model(), _config(steps=6, save_every=2), ToySource(), out_dir=tmp_path)
    steps = {"n": 0}

    def break_at_step_4(optimizer, args, kwargs):
        steps["n"] += 1
        if steps["n"] == 4:
            with torch.no_grad():
                next(trainer.model.parameters()).fill_(float("inf"))

    trainer.optimizer.register_step_post_hook(break_at_step_4)
    with pytest.raises(TrainingDiverged, match="weights became NaN or inf by step 4"):
        trainer.fit()
    assert read_trainer_state(tmp_path / "checkpoint")["step"] == 2


def test_a_resume_trains_with_the_optimizer_settings_it_is_given(tmp_path):
    # The saved parameter groups overrode them: warned "changed settings (weight_decay, betas, eps)" and trained
    # with the old ones (while a new lr did apply).
    Trainer(tiny_model(), _config(steps=2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8), ToySource(),
            out_dir=tmp_path).fit()
    with pytest.warns(UserWarning, match="weight_decay, betas, eps"):
        trainer = Trainer(tiny_model(), _config(steps=4, weight_decay=0.5, betas=(0.8, 0.9), eps=1e-6, decay_steps=4),
                          ToySource(), out_dir=tmp_path, resume=True)
        trainer.fit()
    decayed, plain = trainer.optimizer.param_groups
    assert (decayed["weight_decay"], plain["weight_decay"]) == (0.5, 0.0)
    assert all(g["betas"] == (0.8, 0.9) and g["eps"] == 1e-6 for g in trainer.optimizer.param_groups)


def test_more_steps_on_resume_warn_that_the_decay_moves(tmp_path):
    Trainer(tiny_model(), _config(steps=4), ToySource(), out_dir=tmp_path).fit()
    with pytest.warns(UserWarning, match=r"train.steps 4 → 8 moves the end of the cosine decay.*"
                                         r"train.decay_steps=4"):
        Trainer(tiny_model(), _config(steps=8), ToySource(), out_dir=tmp_path, resume=True).fit()
    with warnings.catch_warnings():  # the way the warning gives: the schedule kept, no warning
        warnings.simplefilter("error")
        other = tmp_path / "kept"
        Trainer(tiny_model(), _config(steps=4, decay_steps=4), ToySource(), out_dir=other).fit()
        Trainer(tiny_model(), _config(steps=8, decay_steps=4), ToySource(), out_dir=other, resume=True).fit()
    lrs = [r["lr"] for r in _records(other) if "lr" in r]
    assert lrs[4:] == [pytest.approx(1e-3)] * 4  # at the floor (min_lr_ratio 0.1) from step 4 on


def test_another_best_metric_on_resume_starts_tracking_again(tmp_path):
    # Perplexity (~15) was compared with the saved best loss (~2.7): never better, so early stopping ended the run
    # while perplexity improved at every evaluation, and best/ kept the step chosen by loss.
    kw = dict(eval_every=1, log_every=1)
    Trainer(tiny_model(), _config(steps=3, **kw), ToySource(), eval_source=ToySource(),
            eval_counts=token_accuracy_counts, out_dir=tmp_path).fit()
    with pytest.warns(UserWarning, match="best_metric 'loss' \\(min\\) → 'perplexity' \\(min\\)"):
        summary = Trainer(tiny_model(), _config(steps=8, best_metric="perplexity", early_stopping_patience=3, **kw),
                          ToySource(), eval_source=ToySource(), eval_counts=token_accuracy_counts, out_dir=tmp_path,
                          resume=True).fit()
    perplexities = [r["eval_perplexity"] for r in _records(tmp_path) if "eval_perplexity" in r]
    assert perplexities == sorted(perplexities, reverse=True)  # improving at every evaluation here
    assert not summary["stopped_early"] and summary["best"]["metric"] == "perplexity"
    assert read_trainer_state(tmp_path / "best")["step"] == 8


def test_ctrl_c_during_the_optimizer_step_still_resumes_exactly(tmp_path):
    # The signal arrived after the weights were updated but before the step was counted: the checkpoint held the
    # update of a step it called undone, and the resume applied it twice.
    reference = Trainer(tiny_model(), _config(), ToySource(), out_dir=tmp_path / "ref")
    reference.fit()
    trainer = Trainer(tiny_model(), _config(), ToySource(), out_dir=tmp_path / "run")
    _ctrl_c_in_optimizer_step(2)(trainer)
    with pytest.raises(TrainingInterrupted, match="at step 2 of 4"):
        trainer.fit()
    resumed = Trainer(tiny_model(), _config(), ToySource(), out_dir=tmp_path / "run", resume=True)
    resumed.fit()
    a, b = _weights(reference.model), _weights(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is given back


def test_a_second_ctrl_c_during_the_interrupt_save_keeps_the_checkpoint(tmp_path):
    # Ctrl-C pressed twice: the second KeyboardInterrupt landed inside the save of the first, which it cut short,
    # so the steps since the last checkpoint were lost (here: no checkpoint at all).
    trainer = Trainer(tiny_model(), _config(), ToySource(), out_dir=tmp_path / "run")
    _ctrl_c_in_optimizer_step(2)(trainer)
    save = trainer._save

    def save_pressed_again(folder, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # before the first file is written
        return save(folder, **kwargs)

    trainer._save = save_pressed_again
    try:
        with pytest.raises(TrainingInterrupted, match="at step 2 of 4"):
            trainer.fit()
    except KeyboardInterrupt:
        pytest.fail("the second Ctrl-C escaped the interrupt's save")
    assert read_trainer_state(tmp_path / "run" / "checkpoint")["step"] == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are given back
    resumed = Trainer(tiny_model(), _config(), ToySource(), out_dir=tmp_path / "run", resume=True)
    assert resumed.fit()["steps"] == 4


def test_a_full_disk_during_a_save_is_one_line(capsys, tmp_path, monkeypatch):
    # safetensors reports the failed write as its own SafetensorError: a 61-line traceback and exit code 1.
    from attnlab.training import checkpoint

    def full(*args, **kwargs):
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint, "save_file", full)
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, "train", "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=1",
                          "--set", "train.device=cpu", "--set", "train.out_dir=run", "--set", "train.progress=false",
                          "--set", "train.warmup_steps=0")
    assert "No space left on device" in line and "free some space" in line
    assert not (tmp_path / "run" / "checkpoint").exists() and not list((tmp_path / "run").glob(".checkpoint*"))


def test_bilinear_attentions_key_bias_is_not_decayed():
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.training.optim import param_groups

    model = GPT(GPTConfig(vocab_size=11, block_size=8, d_model=16, n_heads=2, n_layers=1, attention="bilinear"))
    decayed = {id(p) for p in param_groups(model, 0.1)[0]["params"]}
    names = [name for name, p in model.named_parameters() if id(p) in decayed]
    assert names and not any(name.endswith("bias") for name in names)
    assert any(name.endswith("key_bias") for name, _ in model.named_parameters())


def test_the_logged_loss_of_micro_batches_is_the_batch_loss_for_loss_terms(tmp_path):
    # BERT's loss is two means (masked tokens, sentence pairs): weighting the micro-batches' sums by the masked
    # tokens alone logged 3.673568 for a batch whose loss is 3.673989.
    logged = {}
    for micro in (None, 2):
        model, config, source = bert_nsp_run()
        Trainer(model, config.replace(micro_batch_size=micro, steps=1), source, out_dir=tmp_path / str(micro)).fit()
        logged[micro] = _records(tmp_path / str(micro))[0]["loss"]
    model, _, source = bert_nsp_run()
    with torch.no_grad():
        true = model.train()(**source.batch(0)).loss.item()
    assert logged[None] == pytest.approx(true, abs=1e-6) and logged[2] == pytest.approx(true, abs=1e-6)


def test_a_lone_loss_record_is_drawn(tmp_path):
    import matplotlib.image

    Trainer(tiny_model(), _config(steps=1), ToySource(), out_dir=tmp_path).fit()
    rgb = (matplotlib.image.imread(tmp_path / "loss.png")[..., :3] * 255).astype(int)
    blue = (abs(rgb[..., 0] - 31) < 30) & (abs(rgb[..., 1] - 119) < 30) & (abs(rgb[..., 2] - 180) < 30)
    legend_only = 300  # the legend's short line: the point adds its own pixels
    assert int(blue.sum()) > 30 and int(blue.sum()) < legend_only


def test_resuming_an_early_stopped_run_logs_each_step_once(tmp_path):
    # The early stop saved the window of steps not yet logged, then logged them: resumed with a larger patience,
    # they were logged again, and their tokens counted twice.
    constant = lambda model: {"const": 1.0}  # noqa: E731
    kw = dict(steps=12, eval_every=1, log_every=4, best_metric="const", best_mode="min")
    first = Trainer(tiny_model(), _config(early_stopping_patience=2, **kw), ToySource(), metrics_fn=constant,
                    out_dir=tmp_path).fit()
    assert first["stopped_early"] and first["steps"] == 3
    assert read_trainer_state(tmp_path / "checkpoint")["log_window"] is None  # steps 1-3 are in the step-3 record
    Trainer(tiny_model(), _config(early_stopping_patience=100, **kw), ToySource(), metrics_fn=constant,
            out_dir=tmp_path, resume=True).fit()
    assert [r["step"] for r in _records(tmp_path) if "loss" in r] == [3, 4, 8, 12]


def test_a_resume_with_another_micro_batch_size_is_warned_about(tmp_path):
    Trainer(tiny_model(), _config(steps=2, decay_steps=4), ToySource(), out_dir=tmp_path).fit()
    with pytest.warns(UserWarning, match=r"changed settings \(micro_batch_size\)"):
        Trainer(tiny_model(), _config(steps=4, decay_steps=4, micro_batch_size=4), ToySource(), out_dir=tmp_path,
                resume=True).fit()


def test_a_resumed_runs_summary_gives_the_rate_of_its_own_steps(tmp_path, monkeypatch):
    # wall_time_s covered the resumed call only and tokens_per_s the whole run: one divided by the other lied.
    Trainer(tiny_model(), _config(steps=2, decay_steps=4), ToySource(), out_dir=tmp_path).fit()
    trainer = Trainer(tiny_model(), _config(steps=4, decay_steps=4), ToySource(), out_dir=tmp_path, resume=True)
    before = read_trainer_state(tmp_path / "checkpoint")
    summary = trainer.fit()
    after = read_trainer_state(tmp_path / "checkpoint")
    tokens = after["tokens_seen"] - before["tokens_seen"]
    seconds = after["train_seconds"] - before["train_seconds"]
    assert summary["start_step"] == 2 and summary["tokens_per_s"] == pytest.approx(tokens / seconds)


@pytest.mark.parametrize("interrupted_step", [2, 4])
def test_ctrl_c_during_the_optimizer_step_keeps_the_steps_records(tmp_path, interrupted_step):
    # Deferred only around the update and its count, the interrupt then came before the step's records: a resume
    # logged no loss for it, counted none of its tokens and, at an evaluation step, never evaluated it.
    reference = _interrupted_and_resumed(tmp_path, "reference", dict(eval_every=2), None)
    resumed = _interrupted_and_resumed(tmp_path, "resumed", dict(eval_every=2),
                                       _ctrl_c_in_optimizer_step(interrupted_step))
    for key in ("final_eval", "best"):
        assert resumed[0][key] == reference[0][key]
    assert reference[1] and resumed[1] == reference[1]
    assert resumed[2]["tokens_seen"] == reference[2]["tokens_seen"]


def test_resuming_with_the_old_schedule_written_out_is_not_a_change(tmp_path):
    # The longer-run warning advises --set train.decay_steps=<old steps>; doing so warned "changed settings".
    Trainer(tiny_model(), _config(steps=4), ToySource(), out_dir=tmp_path).fit()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Trainer(tiny_model(), _config(steps=8, decay_steps=4), ToySource(), out_dir=tmp_path, resume=True).fit()


def test_optimizer_state_grouped_by_another_decay_rule_is_named_so(tmp_path):
    # A bilinear run saved before its key bias left the decayed group: "the checkpoint belongs to another model".
    from attnlab.errors import CheckpointError
    from attnlab.training.checkpoint import load_checkpoint_into, save_checkpoint

    model = tiny_model()
    params = list(model.parameters())
    old = torch.optim.AdamW([{"params": params[:2]}, {"params": params[2:]}])
    model(**ToySource().batch(0)).loss.backward()
    old.step()
    save_checkpoint(tmp_path / "checkpoint", model, old)
    new = torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:]}])
    with pytest.raises(CheckpointError, match="groups the optimizer's .* parameters for weight decay as .*start a new "
                                              "run from its weights with --set model.init_from"):
        load_checkpoint_into(tmp_path / "checkpoint", model, new)


def _interrupted_and_resumed(tmp_path, name: str, settings: dict, interrupt) -> tuple[dict, list[dict], dict]:
    """(summary, metrics records, saved state) of a run stopped by `interrupt(trainer)` and resumed."""
    def trainer(resume: bool = False) -> Trainer:
        return Trainer(tiny_model(), _config(**settings), ToySource(), eval_source=ToySource(),
                       eval_counts=token_accuracy_counts, out_dir=tmp_path / name, resume=resume)

    first = trainer()
    if interrupt is not None:
        interrupt(first)
    try:
        summary = first.fit()
    except TrainingInterrupted:
        summary = trainer(resume=True).fit()
    records = [{k: v for k, v in r.items() if k not in ("elapsed", "tokens_per_s")} for r in _records(tmp_path / name)]
    return summary, records, read_trainer_state(tmp_path / name / "checkpoint")


def test_ctrl_c_while_an_evaluation_is_shown_does_not_count_it_twice(tmp_path, monkeypatch):
    # Recorded (metrics line, best/, early-stopping count) but saved as still owed: the resume evaluated the step
    # again and counted it a second time towards early stopping, stopping a step early.
    import attnlab.training.trainer as trainer_module

    settings = dict(steps=12, eval_every=1, log_every=4, early_stopping_patience=2, lr=0.3)
    reference = _interrupted_and_resumed(tmp_path, "reference", settings, None)
    shown = trainer_module.Progress.write
    once = {"done": False}

    def write(self, text):
        shown(self, text)
        if text.startswith("step 6: eval") and not once["done"]:
            once["done"] = True
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(trainer_module.Progress, "write", write)
    resumed = _interrupted_and_resumed(tmp_path, "resumed", settings, None)
    assert once["done"] and resumed[0]["steps"] == reference[0]["steps"] and resumed[1] == reference[1]
    assert resumed[2]["evals_without_improvement"] == reference[2]["evals_without_improvement"]


def test_an_early_stop_on_resume_logs_before_it_saves_with_the_steps_rate(tmp_path):
    # The resumed evaluation that stopped the run saved the unlogged steps in the checkpoint, then logged them with
    # train.lr (no step had set the rate yet) instead of the last step's rate.
    settings = dict(steps=12, eval_every=1, log_every=4, early_stopping_patience=2, lr=0.3)
    reference = _interrupted_and_resumed(tmp_path, "reference", settings, None)
    resumed = _interrupted_and_resumed(tmp_path, "resumed", settings, _ctrl_c_in_optimizer_step(7))
    assert reference[0]["stopped_early"] and reference[0]["steps"] == 7
    assert resumed[1] == reference[1] and resumed[2]["log_window"] is None


def test_a_run_resumed_at_its_end_reports_its_last_losses(tmp_path):
    # A resume that trains no step reported final_train_loss None (the last loss was not saved).
    reference = _interrupted_and_resumed(tmp_path, "reference", dict(eval_every=2), None)
    resumed = _interrupted_and_resumed(tmp_path, "resumed", dict(eval_every=2), _ctrl_c_in_optimizer_step(4))
    for key in ("final_train_loss", "final_eval", "best"):
        assert resumed[0][key] == reference[0][key] and reference[0][key] is not None


def test_a_resume_with_compile_switched_is_warned_about(tmp_path):
    # train.compile joined the settings a resume warns about: a compiled and an eager run do not give the same
    # numbers. The state is edited as a compiled run would have saved it (compiling on this CPU takes minutes).
    Trainer(tiny_model(), _config(steps=2, decay_steps=4), ToySource(), out_dir=tmp_path).fit()
    state_file = tmp_path / "checkpoint" / "trainer_state.json"
    state = json.loads(state_file.read_text(encoding="utf-8"))
    assert state["trainer_config"]["compile"] is False
    state["trainer_config"]["compile"] = True
    state_file.write_text(json.dumps(state), encoding="utf-8")
    with pytest.warns(UserWarning, match=r"changed settings \(compile\)"):
        Trainer(tiny_model(), _config(steps=4, decay_steps=4), ToySource(), out_dir=tmp_path, resume=True).fit()


def test_training_outside_the_main_thread(tmp_path):
    # Handlers can be set in the main thread only (signal.signal raises ValueError elsewhere): the deferral of
    # Ctrl-C around the optimizer step must step aside there, not stop a notebook's or a server's worker thread.
    import threading

    result, errors = {}, []

    def train():
        try:
            result.update(Trainer(tiny_model(), _config(), ToySource(), out_dir=tmp_path).fit())
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    worker = threading.Thread(target=train)
    worker.start()
    worker.join()
    assert not errors and result["steps"] == 4


def test_a_handler_installed_outside_python_is_left_alone(tmp_path, monkeypatch):
    # signal.getsignal gives None for a handler a C library installed: it cannot be put back (signal.signal(.., None)
    # is a TypeError), so the step runs undeferred and the handler stays.
    real = signal.getsignal
    before = real(signal.SIGTERM)
    monkeypatch.setattr(signal, "getsignal", lambda signum: None if signum == signal.SIGTERM else real(signum))
    summary = Trainer(tiny_model(), _config(), ToySource(), out_dir=tmp_path).fit()
    assert summary["steps"] == 4 and real(signal.SIGTERM) is before
    assert real(signal.SIGINT) is signal.default_int_handler


def test_another_best_mode_on_resume_starts_tracking_again(tmp_path):
    # The same metric in the other direction: the saved best (the lowest loss) means nothing to a max run.
    kw = dict(eval_every=1, log_every=1, decay_steps=4)
    Trainer(tiny_model(), _config(steps=2, **kw), ToySource(), eval_source=ToySource(),
            eval_counts=token_accuracy_counts, out_dir=tmp_path).fit()
    with pytest.warns(UserWarning, match=r"best_metric 'loss' \(min\) → 'loss' \(max\): best/ and early stopping "
                                         r"start again"):
        summary = Trainer(tiny_model(), _config(steps=4, best_mode="max", **kw), ToySource(),
                          eval_source=ToySource(), eval_counts=token_accuracy_counts, out_dir=tmp_path,
                          resume=True).fit()
    assert summary["best"]["step"] >= 3  # chosen among the resumed run's evaluations


def test_a_diverged_run_draws_its_curve(tmp_path):
    # The curve up to the last log record is where it went wrong: it was drawn only at the end or on Ctrl-C.
    model = _nan_loss_at_step(3)
    with pytest.raises(TrainingDiverged, match="at step 3"):
        Trainer(model, _config(steps=20), ToySource(), out_dir=tmp_path).fit()
    assert (tmp_path / "loss.png").is_file()


def test_resuming_a_finished_run_reports_its_last_evaluation(tmp_path):
    # A resume that trains no step must report the saved last loss and evaluation (final_eval came back {}).
    def trainer(resume: bool = False) -> Trainer:
        return Trainer(tiny_model(), _config(eval_every=2), ToySource(), eval_source=ToySource(),
                       eval_counts=token_accuracy_counts, out_dir=tmp_path, resume=resume)

    first = trainer().fit()
    again = trainer(resume=True).fit()
    assert again["steps"] == first["steps"] == 4 and again["start_step"] == 4
    for key in ("final_train_loss", "final_eval", "best"):
        assert again[key] == first[key] and first[key]
