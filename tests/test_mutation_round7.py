"""Tests for the mutants that survived the seventh mutation audit: each pins one behaviour its mutant changed."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli, train_in_process
from cli_helpers import toml_str as _q
from training_helpers import ToySource, tiny_model

from attnlab.errors import ConfigError

CPU = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu"]


def _train(*argv: str) -> None:
    """`attnlab train` for one step, no evaluation but the last, on the CPU, in this process."""
    train_in_process("--set", "train.steps=1", "--set", "train.warmup_steps=1", "--set", "train.eval_every=0",
                     *CPU, *argv)


def _json_file(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _scale_weights(weights: Path, factor: float, *names: str) -> None:
    """Multiply the tensors `names` of a safetensors file by `factor`, keeping its metadata (the run's tokenizer
    fingerprint and model header): finite weights that give a huge loss."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(weights), framework="pt") as f:
        tensors = {key: f.get_tensor(key) * (factor if key in names else 1.0) for key in f.keys()}
        metadata = dict(f.metadata() or {})
    assert set(names) <= set(tensors), sorted(tensors)
    save_file(tensors, str(weights), metadata=metadata)


@pytest.fixture(scope="module")
def seeded_run(tmp_path_factory):
    """A tiny char GPT trained for one step with train.seed = 3."""
    folder = tmp_path_factory.mktemp("seeded")
    text = folder / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 20, encoding="utf-8")
    _train("--set", f"data.path={_q(text)}", "--set", "model.preset=gpt-char-tiny", "--set", "model.block_size=16",
           "--set", "train.batch_size=4", "--set", "train.seed=3", "--set", f"train.out_dir={_q(folder / 'run')}")
    return folder / "run"


@pytest.fixture
def run_copy(tmp_path, seeded_run):
    run = tmp_path / "run"
    shutil.copytree(seeded_run, run)
    return run


# ------------------------------------------------------------------------------------------------
# load_run: the run's seed and its tokenizer
# ------------------------------------------------------------------------------------------------


def test_a_checkpoint_without_its_seed_takes_the_seed_of_run_json(run_copy):
    # mut7 S1, S3: a trainer state with its data settings but no seed (written before the seed was kept) still
    # reads run.json for the seed: it is not taken as 0, nor run.json passed over because the data were there
    from attnlab.inference.runs import load_run

    state_file = run_copy / "checkpoint" / "trainer_state.json"
    state = _json_file(state_file)
    assert state["extra_state"]["data"] and state["trainer_config"]["seed"] == 3
    del state["trainer_config"]["seed"]
    state_file.write_text(json.dumps(state), encoding="utf-8")
    assert load_run(run_copy, "cpu").seed == 3


def test_the_checkpoints_seed_wins_over_run_json(run_copy):
    # mut7 S2: run.json read for data settings the checkpoint lacks does not replace the checkpoint's own seed
    # (run.json may be that of a run that replaced this one and failed before its first save)
    from attnlab.inference.runs import load_run

    state_file = run_copy / "checkpoint" / "trainer_state.json"
    state = _json_file(state_file)
    state["extra_state"].pop("data")
    state_file.write_text(json.dumps(state), encoding="utf-8")
    run = _json_file(run_copy / "run.json")
    run["train"]["seed"] = 5
    (run_copy / "run.json").write_text(json.dumps(run), encoding="utf-8")
    assert load_run(run_copy, "cpu").seed == 3


def test_a_checkpoint_without_a_specials_digest_still_loads(run_copy):
    # mut7 C3: a checkpoint whose tokenizer fingerprint has no specials_sha256 (written before 2026-12-07) loads
    # with its own tokenizer; only a digest it has is compared
    from safetensors import safe_open
    from safetensors.torch import save_file

    from attnlab.inference.runs import load_run

    weights = run_copy / "checkpoint" / "model.safetensors"
    with safe_open(str(weights), framework="pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
        metadata = dict(f.metadata() or {})
    entry = json.loads(metadata["tokenizer"])
    del entry["specials_sha256"]
    metadata["tokenizer"] = json.dumps(entry)
    save_file(tensors, str(weights), metadata=metadata)
    assert load_run(run_copy, "cpu").family == "gpt"


# ------------------------------------------------------------------------------------------------
# Perplexity past a loss of 700
# ------------------------------------------------------------------------------------------------


def test_perplexity_is_infinite_just_past_a_loss_of_700():
    # mut7 L1: the bound is 700 (as documented), not float64's own limit near 709.78
    from attnlab.training.logging import perplexity

    assert perplexity(700.0) == math.exp(700.0)
    assert perplexity(705.0) == math.inf


def test_training_evaluation_of_a_loss_past_700_has_an_infinite_perplexity(tmp_path):
    # mut7 T6: Trainer.evaluate gives perplexity inf (null in metrics.jsonl) for a token loss above 700, not
    # exp(700), a finite 1.01e304 that is no perplexity. The norm's gain scaled up: finite weights, huge loss.
    from attnlab.training import Trainer, TrainerConfig

    model = tiny_model()
    with torch.no_grad():
        model.norm.weight.mul_(5000.0)
    config = TrainerConfig(steps=1, batch_size=8, lr=1e-4, warmup_steps=1, precision="fp32", device="cpu",
                           progress=False)
    trainer = Trainer(model, config, ToySource(), eval_source=ToySource(), out_dir=tmp_path / "run")
    trainer.fit()
    metrics = trainer.evaluate()
    assert metrics["loss"] > 700 and metrics["perplexity"] == math.inf, metrics
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    (last,) = [r for r in logged if "eval_loss" in r]
    assert last["eval_loss"] > 700 and last["eval_perplexity"] is None, last


def test_evaluate_of_a_bert_pretraining_past_700_gives_a_null_perplexity(capsys, tmp_path):
    # mut7 S5: `attnlab evaluate --json` of a masked-LM run whose mlm_loss is above 700 says "perplexity": null,
    # as a language model's does, not exp(700). The masked-LM head's norm scaled up: finite weights, huge loss.
    docs = tmp_path / "docs.txt"
    docs.write_text("\n\n".join("\n".join(f"the {place} line about topic{d} is here" for place in
                                          ("first", "second", "third")) for d in range(6)) + "\n", encoding="utf-8")
    out = tmp_path / "bert"
    _train(str(Path(__file__).resolve().parents[1] / "configs" / "bert-mlm.toml"),
           "--set", f"data.path={_q(docs)}", "--set", "data.tokenizer=word", "--set", "data.vocab_size=24",
           "--set", "data.max_length=16", "--set", "data.val_fraction=0.25", "--set", "model.d_model=16",
           "--set", "model.d_ff=16", "--set", "model.n_layers=1", "--set", "model.n_heads=2",
           "--set", "train.batch_size=4", "--set", f"train.out_dir={_q(out)}")
    _scale_weights(out / "checkpoint" / "model.safetensors", 1e5, "mlm.norm.weight", "mlm.norm.bias")
    code, stdout, err = run_cli(capsys, "evaluate", str(out), "--data", str(docs), "--json", "--device", "cpu")
    assert code == 0, err
    metrics = json.loads(stdout)
    assert metrics["mlm_loss"] > 700 and metrics["perplexity"] is None, metrics


# ------------------------------------------------------------------------------------------------
# Run configs, run folders and their files
# ------------------------------------------------------------------------------------------------


def test_translation_paths_expand_the_home_folder(tmp_path, monkeypatch):
    # mut7 R9: ~ in data.src_path, tgt_path, eval_src_path and eval_tgt_path is the home folder, as in data.path
    from attnlab.training.recipe import load_run_config

    monkeypatch.setenv("HOME", str(tmp_path))
    d = load_run_config(None, ["data.task=translation", "model.family=seq2seq", "data.src_path=~/a.src",
                               "data.tgt_path=~/a.tgt", "data.eval_src_path=~/b.src",
                               "data.eval_tgt_path=~/b.tgt"]).data
    assert (d.src_path, d.tgt_path, d.eval_src_path, d.eval_tgt_path) == tuple(
        str(tmp_path / name) for name in ("a.src", "a.tgt", "b.src", "b.tgt"))


def test_a_vocabulary_under_half_the_size_asked_for_is_warned_of():
    # mut7 R14: a tokenizer that reaches less than half of data.vocab_size is said (not only one under a tenth),
    # and one that reaches half of it is not
    from attnlab.training.recipe import _tokenizer, load_run_config

    text = ["the quick brown fox jumps over the lazy dog"] * 4  # 28 characters, and the specials
    for asked, warned in ((100, 1), (40, 0)):
        run = load_run_config(None, ["data.tokenizer=char", f"data.vocab_size={asked}", "train.device=cpu"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tokenizer = _tokenizer(run, text, None)
        assert 20 <= tokenizer.vocab_size <= 40, tokenizer.vocab_size
        said = [str(w.message) for w in caught if "is far more than the text gives" in str(w.message)]
        assert len(said) == warned, (asked, said)


def test_a_folder_with_a_config_json_or_weights_alone_is_no_checkpoint_folder(tmp_path):
    # mut7 R2: train.out_dir is refused as a checkpoint folder only when it holds both config.json and weights: a
    # project's own config.json (or a stray weights file) is no checkpoint
    from attnlab.training.recipe import _check_checkpoint_folders

    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    _check_checkpoint_folders(tmp_path)
    (tmp_path / "config.json").unlink()
    (tmp_path / "model.safetensors").write_bytes(b"x")
    _check_checkpoint_folders(tmp_path)
    (tmp_path / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ConfigError, match="is a checkpoint folder"):
        _check_checkpoint_folders(tmp_path)


def test_a_checkpoint_holding_a_lock_file_is_ours(tmp_path):
    # mut7 R3: checkpoint/ holding the lock file of a run once made inside it is still attnlab's, not another tool's
    from attnlab.files import LOCK_FILE
    from attnlab.training.recipe import _check_checkpoint_folders

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    for name in ("config.json", "model.safetensors", LOCK_FILE):
        (checkpoint / name).write_text("{}", encoding="utf-8")
    _check_checkpoint_folders(tmp_path)


@pytest.mark.parametrize("sidecar", ["[1, 2]", "3", '"text"'])
def test_a_sidecar_that_is_no_json_object_is_not_ours(tmp_path, sidecar):
    # mut7 R5: a token file beside a sidecar holding JSON other than an object is not attnlab's (no AttributeError)
    from attnlab.data.corpus import sidecar_path
    from attnlab.training.recipe import _our_token_file

    path = tmp_path / "train.bin"
    path.write_bytes(b"\x00" * 8)
    sidecar_path(path).write_text(sidecar, encoding="utf-8")
    assert _our_token_file(path) is False


def test_a_relative_dot_inside_a_held_folder_is_refused(tmp_path, monkeypatch):
    # mut7 F2: folder_lock(".") run from inside a folder another run holds is refused: '.' has no parent of its
    # own, so the folders above it are those of its absolute path
    from attnlab.files import folder_lock

    outer = tmp_path / "held"
    (outer / "phase").mkdir(parents=True)
    with folder_lock(outer, "--out"):
        monkeypatch.chdir(outer / "phase")
        with pytest.raises(ConfigError, match=r"'\.' is inside '.*held', which another attnlab run is writing into"):
            with folder_lock(Path("."), "train.out_dir"):
                pass


def test_a_link_to_an_existing_folder_is_not_called_dangling(tmp_path):
    # mut7 F8: a folder that cannot be made under a link to a folder that exists is not blamed on that link
    from attnlab.files import make_folder

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "afile").write_text("x", encoding="utf-8")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ConfigError) as info:
        make_folder(tmp_path / "link" / "afile" / "run", "train.out_dir")
    assert "is a link to" not in str(info.value), info.value


def test_a_dangling_link_above_the_folder_is_named(tmp_path):
    # mut7 F9: a dangling link among the parents of a folder to make is named, not only one at the folder itself
    from attnlab.files import make_folder

    (tmp_path / "out").symlink_to(tmp_path / "unmounted")
    with pytest.raises(ConfigError, match=r"'.*out' is a link to '.*unmounted', which does not exist"):
        make_folder(tmp_path / "out" / "run", "train.out_dir")


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------


def _family_models():
    from attnlab.models.bert import BertConfig, BertModel
    from attnlab.models.encoder import EncoderConfig, EncoderModel
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.models.transformer import Seq2SeqTransformer, TransformerConfig

    return {"gpt": (GPT, GPTConfig, dict(vocab_size=11, n_layers=1, block_size=8)),
            "encoder": (EncoderModel, EncoderConfig, dict(vocab_size=11, n_layers=1, max_len=8)),
            "bert": (BertModel, BertConfig, dict(vocab_size=11, n_layers=1, max_len=8)),
            "seq2seq": (Seq2SeqTransformer, TransformerConfig, dict(src_vocab_size=11, tgt_vocab_size=11,
                                                                    n_encoder_layers=1, n_decoder_layers=1,
                                                                    max_len=8))}


@pytest.mark.parametrize("family", ["gpt", "encoder", "bert", "seq2seq"])
def test_a_config_changed_in_place_after_the_model_is_made_does_not_change_it(family):
    # mut7 M7: each model keeps a deep copy of its config: a position_options dict changed in place afterwards
    # is not the model's (a shallow copy shared it)
    model_class, config_class, sizes = _family_models()[family]
    config = config_class(**sizes, d_model=16, n_heads=2, d_ff=32, position="rotary",
                          position_options={"base": 10000.0})
    model = model_class(config)
    config.position_options["base"] = 500.0
    assert model.config.position_options == {"base": 10000.0}
