"""Tests for the mutants that survived the sixth mutation audit: each pins one behaviour its mutant changed."""

from __future__ import annotations

import ctypes
import json
import os
import random
import warnings
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from cli_helpers import run_cli
from cli_helpers import toml_str as _q
from training_helpers import ToySource, tiny_model

from attnlab.errors import ConfigError, DataError, Terminated
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.training import Trainer, TrainerConfig, TrainingInterrupted

CPU = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu"]


def _config(**changes) -> TrainerConfig:
    settings = dict(steps=3, batch_size=8, lr=1e-2, warmup_steps=1, precision="fp32", device="cpu", progress=False,
                    log_every=1)
    settings.update(changes)
    return TrainerConfig(**settings)


def _state(run) -> dict:
    return json.loads((run / "checkpoint" / "trainer_state.json").read_text(encoding="utf-8"))


def _tiny_gpt(**changes) -> GPT:
    torch.manual_seed(0)
    settings = dict(vocab_size=20, block_size=16, d_model=16, n_heads=2, n_layers=1)
    settings.update(changes)
    return GPT(GPTConfig(**settings)).eval()


def _warned(caught, text: str) -> list[str]:
    return [str(w.message) for w in caught if text in str(w.message)]


# ------------------------------------------------------------------------------------------------
# The trainer
# ------------------------------------------------------------------------------------------------


def test_one_process_sigterm_before_the_first_save_still_saves(tmp_path):
    # mut6 T9: a one-process SIGTERM before the run's first save saves its checkpoint over the run it replaces
    run = tmp_path / "run"
    Trainer(tiny_model(), _config(steps=3), ToySource(), out_dir=run).fit()

    class StoppedAtTwo(ToySource):
        def batch(self, step):
            if step == 2:
                raise Terminated
            return super().batch(step)

    with pytest.raises(TrainingInterrupted, match="checkpoint saved in"):
        Trainer(tiny_model(seed=1), _config(steps=6), StoppedAtTwo(seed=1), out_dir=run).fit()
    assert _state(run)["step"] == 2


def test_resuming_a_finished_run_does_not_save_again(tmp_path, monkeypatch):
    # mut6 T3: a resume of a finished run trains no step and writes no checkpoint
    run = tmp_path / "run"
    Trainer(tiny_model(), _config(steps=2), ToySource(), out_dir=run).fit()
    saves = []
    real = Trainer.save
    monkeypatch.setattr(Trainer, "save", lambda self, *a, **k: (saves.append(self.step), real(self, *a, **k))[1])
    before = (run / "checkpoint" / "trainer_state.json").read_bytes()
    summary = Trainer(tiny_model(), _config(steps=2), ToySource(), out_dir=run, resume=True).fit()
    assert summary["start_step"] == 2 and saves == []
    assert (run / "checkpoint" / "trainer_state.json").read_bytes() == before


class _DrawingSource(ToySource):
    """Draws from Python's global generator for each batch (as a user's source may); Ctrl-C after the draw of
    step `stop_at`, once."""

    def __init__(self, stop_at=None):
        super().__init__()
        self.stop_at = stop_at
        self.draws: dict[int, float] = {}

    def batch(self, step):
        self.draws[step] = random.random()
        if step == self.stop_at:
            self.stop_at = None
            raise KeyboardInterrupt
        return super().batch(step)


def test_a_step_interrupted_midway_is_redone_with_the_generators_of_its_start(tmp_path):
    # mut6 T4: Ctrl-C inside a step saves the random generators as they were at the step's start, so the resumed
    # step draws what the uninterrupted run drew
    full = _DrawingSource()
    Trainer(tiny_model(), _config(steps=3), full, out_dir=tmp_path / "full").fit()
    with pytest.raises(TrainingInterrupted):
        Trainer(tiny_model(), _config(steps=3), _DrawingSource(stop_at=1), out_dir=tmp_path / "cut").fit()
    resumed = _DrawingSource()
    Trainer(tiny_model(), _config(steps=3), resumed, out_dir=tmp_path / "cut", resume=True).fit()
    assert resumed.draws == {1: full.draws[1], 2: full.draws[2]}


def test_warmup_as_long_as_the_run_is_not_warned_of(tmp_path):
    # mut6 T6: warmup_steps == steps reaches train.lr at the last step: no warning; one more step is warned of
    for warmup, warned in ((3, 0), (4, 1)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            Trainer(tiny_model(), _config(steps=3, warmup_steps=warmup), ToySource(),
                    out_dir=tmp_path / str(warmup)).fit()
        assert len(_warned(caught, "is larger than train.steps")) == warned, warmup


def test_an_inert_setting_is_warned_of_at_the_start_not_on_resume(tmp_path):
    # mut6 T2: the warning that early_stopping_patience cannot stop a run is given when it starts, not on resume
    run = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(tiny_model(), _config(steps=2, early_stopping_patience=2), ToySource(), out_dir=run).fit()
    assert len(_warned(caught, "early_stopping_patience")) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(tiny_model(), _config(steps=3, early_stopping_patience=2), ToySource(), out_dir=run,
                resume=True).fit()
    assert _warned(caught, "early_stopping_patience") == []


# ------------------------------------------------------------------------------------------------
# Run configs and --set values
# ------------------------------------------------------------------------------------------------


def test_a_set_integer_too_long_for_python_is_refused_in_one_line():
    # mut6 P7: a value YAML reads as an integer of over 4,300 digits (not TOML, for its leading 0) is a ConfigError
    from attnlab.training.recipe import load_run_config, parse_value

    raw = "0" + "1" * 5000
    assert parse_value(raw) == raw
    with pytest.raises(ConfigError, match="train.steps"):
        load_run_config(None, ["train.steps=" + raw])


def test_the_last_model_family_given_decides_whether_the_default_preset_stays():
    # mut6 P2: model.family=encoder then model.family=gpt: the default run's GPT preset is kept
    from attnlab.training.recipe import load_run_config

    default = load_run_config(None, []).model
    run = load_run_config(None, ["model.family=encoder", "model.family=gpt"])
    assert run.model == {"preset": default["preset"], "family": "gpt"}


def test_a_tilde_user_path_is_that_users_home(tmp_path):
    # mut6 P6: train.out_dir=~USER/runs/x is USER's home folder's runs/x
    from attnlab.training.recipe import load_run_config

    pwd = pytest.importorskip("pwd")  # (POSIX only)
    try:
        me = pwd.getpwuid(os.getuid())
    except KeyError:
        pytest.skip("this user has no entry in the password database")
    run = load_run_config(None, [f"train.out_dir=~{me.pw_name}/runs/x"])
    assert run.train.out_dir == os.path.join(me.pw_dir, "runs", "x")


def test_a_capitalised_true_is_the_boolean_a_yaml_config_reads_and_yes_is_not():
    # mut6 P1 had pinned --set train.progress=True as refused; since stop 47 --set reads it as a YAML config does
    # (`progress: True`), and YAML 1.1's yes/on stay text, refused for a boolean setting.
    from attnlab.training.recipe import load_run_config, parse_value

    assert parse_value("True") is True and parse_value("TRUE") is True and parse_value("False") is False
    assert load_run_config(None, ["train.progress=True"]).train.progress is True
    with pytest.raises(ConfigError, match="train.progress: expected true or false, got 'yes'"):
        load_run_config(None, ["train.progress=yes"])


def test_the_carriage_return_warning_is_not_repeated_on_resume(tmp_path, capsys):
    # mut6 P5: the character model's '\r' warning comes when its tokenizer is trained, not again on a resume
    data = tmp_path / "crlf.txt"
    data.write_bytes(("line one of the text\r\nline two of the text\r\n" * 60).encode("utf-8"))
    argv = ["train", "--set", f"data.path={_q(data)}", "--set", "model.preset=gpt-char-tiny", "--set",
            "model.block_size=16", "--set", "train.batch_size=4", "--set", "train.eval_every=0", "--set",
            "train.warmup_steps=1", "--set", f"train.out_dir={_q(tmp_path / 'run')}", *CPU]
    for steps, resume, warned in ((1, [], 1), (2, ["--resume"], 0)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            code, _, err = run_cli(capsys, *argv, "--set", f"train.steps={steps}", *resume)
        assert code == 0, err
        assert len(_warned(caught, "carriage returns")) == warned, resume


# ------------------------------------------------------------------------------------------------
# Models, modules and registries
# ------------------------------------------------------------------------------------------------


def test_gpt_config_refuses_a_feed_forward_width_below_one():
    # mut6 G10: d_ff of 0 or less is a ConfigError when the config is made
    for d_ff in (0, -8):
        with pytest.raises(ConfigError, match="d_ff must be positive"):
            GPTConfig(vocab_size=20, block_size=8, d_model=8, n_heads=2, n_layers=1, d_ff=d_ff)


def test_given_positions_win_over_packed_document_positions():
    # mut6 G3: with document_ids and positions both given, the GPT reads the given positions
    model = _tiny_gpt()
    ids = torch.randint(0, 20, (1, 6))
    docs = torch.zeros(1, 6, dtype=torch.long)  # one document: the packed mask is the causal one
    positions = torch.arange(6)[None] + 5
    with torch.no_grad():
        packed = model(ids, document_ids=docs, positions=positions).logits
        given = model(ids, positions=positions).logits
        default = model(ids).logits
    assert torch.allclose(packed, given)
    assert not torch.allclose(packed, default)


def test_dropout_under_torch_compile_is_torchs_own(monkeypatch):
    # mut6 D5: while torch.compile traces, attnlab's dropout runs F.dropout (the same masks from the same seed)
    from attnlab.modules.dropout import DROPOUT_MIN_ELEMENTS, dropout

    x = torch.ones(DROPOUT_MIN_ELEMENTS * 2)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    torch.manual_seed(3)
    ours = dropout(x, 0.1, True)
    torch.manual_seed(3)
    assert torch.equal(ours, F.dropout(x, 0.1, training=True))


def test_an_integer_option_refuses_a_boolean():
    # mut6 R3: position option max_distance = true is refused (a bool is no integer)
    with pytest.raises(ConfigError, match="'max_distance' must be an integer, got True"):
        _tiny_gpt(position="relative", position_options={"max_distance": True})


def test_a_name_registered_twice_is_refused():
    # mut6 R5: a registry refuses a second object under a name it has
    from attnlab.registry import Registry

    things = Registry("thing")
    things.add("a", 1)
    with pytest.raises(ValueError, match="thing 'a' is registered twice"):
        things.add("a", 2)
    assert things.get("a") == 1


def test_a_family_of_a_subclassed_config_is_its_own(monkeypatch):
    # mut6 R4: a config class subclassing GPTConfig, registered as its own family, is that family, not gpt
    from attnlab.models.registry import FAMILIES, Family, build_model, family_of

    @dataclass
    class MyConfig(GPTConfig):
        pass

    class MyGPT(GPT):
        pass

    monkeypatch.setitem(FAMILIES._items, "mut6-my-gpt", Family("mut6-my-gpt", MyConfig, MyGPT))
    config = MyConfig(vocab_size=20, block_size=8, d_model=8, n_heads=2, n_layers=1)
    assert family_of(config) == "mut6-my-gpt"
    assert type(build_model(config)) is MyGPT


# ------------------------------------------------------------------------------------------------
# The C allocator
# ------------------------------------------------------------------------------------------------


def _fake_glibc(monkeypatch, refuse_above: int | None = None) -> list[tuple[int, int]]:
    """ctypes.CDLL gives a stand-in glibc whose mallopt records its calls (and refuses an mmap threshold above
    `refuse_above`); no allocator setting of the user's in the environment. The list of calls, which fills."""
    calls = []

    class Mallopt:
        argtypes = restype = None

        def __call__(self, param, value):
            calls.append((param, value))
            return 0 if param == -3 and refuse_above is not None and value > refuse_above else 1

    class Libc:
        gnu_get_libc_version = object()
        mallopt = Mallopt()

    for name in list(os.environ):
        if name.startswith("MALLOC_") or name in ("GLIBC_TUNABLES", "LD_PRELOAD", "ATTNLAB_MALLOC"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: Libc())
    return calls


def test_a_glibc_capping_the_mmap_threshold_gets_the_32_mib_one(monkeypatch):
    # mut6 A1: where glibc refuses the 1 GiB mmap threshold (older ones cap it at 32 MiB), 32 MiB is set
    from attnlab.allocator import keep_freed_memory

    calls = _fake_glibc(monkeypatch, refuse_above=32 << 20)
    assert keep_freed_memory() is True
    assert [value for param, value in calls if param == -3] == [1 << 30, 32 << 20]


def test_attnlab_malloc_system_is_read_in_any_case(monkeypatch):
    # mut6 A3: ATTNLAB_MALLOC=System keeps glibc's defaults, as =system does
    from attnlab.allocator import keep_freed_memory

    calls = _fake_glibc(monkeypatch)
    monkeypatch.setenv("ATTNLAB_MALLOC", "System")
    assert keep_freed_memory() is False and calls == []


# ------------------------------------------------------------------------------------------------
# The knowledge experiment's answers
# ------------------------------------------------------------------------------------------------


def _never_ending_answerer():
    """A tiny GPT (block 48) that never writes the mask that ends an answer, and its vocabulary."""
    from attnlab.data.knowledge import KnowledgeVocab

    vocab = KnowledgeVocab.from_texts("Where was Ada born? abcdefghijklmnopqrstuvwxyz")
    model = _tiny_gpt(vocab_size=vocab.vocab_size, block_size=48)
    with torch.no_grad():
        model.lm_head.weight[vocab.mask_id] = -1.0
    return model, vocab


def test_an_answer_is_at_most_longest_characters():
    # mut6 K2: answer_questions(longest=5) stops an answer that does not end at 5 characters
    from attnlab.experiments.knowledge import answer_questions

    model, vocab = _never_ending_answerer()
    (answer,) = answer_questions(model, vocab, ["Where was Ada born?"], longest=5)
    assert len(answer) == 5


def test_a_question_filling_the_whole_block_is_refused():
    # mut6 K3: a question whose prompt leaves no room in the block for an answer is a DataError
    from attnlab.experiments.knowledge import answer_questions

    model, vocab = _never_ending_answerer()
    question = "Where was " + "a" * 31 + " born?"  # with the mask, 48 characters: the whole block
    with pytest.raises(DataError, match="fills the whole block of 48 characters"):
        answer_questions(model, vocab, [question])
