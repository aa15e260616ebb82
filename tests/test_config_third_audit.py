"""Config loading: what a third audit of the config files and `--set` found."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from attnlab.errors import CheckpointError, ConfigError
from attnlab.training.recipe import load_run_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("overrides", [["model.family=gpt", "model.preset=gpt-char-tiny"],
                                       ["model.preset=gpt-char-tiny", "model.family=gpt"]])
def test_a_preset_given_before_the_family_is_kept(overrides):
    # Given first, the user's preset was dropped by model.family (meant to drop only the default run's preset),
    # and the family's defaults, 360 times the parameters, were trained without a word.
    assert load_run_config(None, overrides).model == {"family": "gpt", "preset": "gpt-char-tiny"}


def test_the_default_runs_preset_gives_way_to_a_family():
    assert load_run_config(None, ["model.family=bert", "data.task=mlm"]).model == {"family": "bert"}
    assert "preset" in load_run_config(None, []).model
    # its own family keeps it, as configs/gpt-pydoc.toml (the default run written out) does: the family's
    # defaults (3.7 M parameters against 0.4 M) had been trained into the same folder (stop-41 audit)
    default, written_out = (load_run_config(path, ["model.family=gpt", "model.n_layers=2"])
                            for path in (None, CONFIGS / "gpt-pydoc.toml"))
    assert default.model == written_out.model == {"preset": "gpt-char-small", "family": "gpt", "n_layers": 2}


@pytest.mark.parametrize("text, line", [
    ("train:\n  steps: 10\nmodel:\n  preset: gpt-char-tiny\ntrain:\n  seed: 3\n",
     "(line 5, column 1): 'train' is given twice (first on line 1); keep one"),
    ("train:\n  steps: 10\n  steps: 20\n", "(line 3, column 3): 'steps' is given twice (first on line 2)"),
    ("train: {steps: 10, steps: 20}\n", "(line 1, column 20): 'steps' is given twice (first on line 1)"),
])
def test_a_yaml_key_given_twice_is_refused(tmp_path, text, line):
    # PyYAML keeps the last: the first train section was dropped, where the same file in TOML is refused.
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match="invalid YAML " + line.replace("(", r"\(").replace(")", r"\)")):
        load_run_config(path)


def test_a_yaml_merge_may_still_be_overridden(tmp_path):
    path = tmp_path / "run.yaml"
    text = "model:\n  preset: gpt-char-tiny\ntrain:\n  <<: {steps: 10, lr: 0.001}\n  steps: 20\n"
    path.write_text(text, encoding="utf-8")
    train = load_run_config(path).train
    assert (train.steps, train.lr) == (20, 0.001)


@pytest.mark.parametrize("key, hint", [("init_form", "model.init_from"), ("presett", "model.preset"),
                                       ("familly", "model.family")])
def test_a_misspelt_model_key_is_matched_to_the_tables_own_keys(key, hint):
    with pytest.raises(ConfigError, match=rf"unknown setting model\.{key} \(did you mean {hint}\?\); known "
                                          r"settings: family, preset, init_from, "):
        load_run_config(None, [f"model.{key}=x"])


def test_a_val_fraction_beside_an_eval_file_is_named(tmp_path):
    held_out = tmp_path / "eval.txt"
    held_out.write_text("some text\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="data.val_fraction = 0.5 does nothing with data.eval_path given"):
        load_run_config(None, ["data.val_fraction=0.5", f"data.eval_path='{held_out}'"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_run_config(None, [f"data.eval_path='{held_out}'"])  # the default fraction is not a setting given


@pytest.mark.parametrize("overrides", [
    ["model.attention=bilinear", "model.position=rotary"],  # the default run's GPT preset
    ["model.family=encoder", "data.task=classification", "data.path=x.tsv", "model.attention=synthesizer-dense",
     "model.position=relative"],
])
def test_an_attention_that_cannot_take_the_position_is_refused_with_the_config(overrides):
    # It was refused when the model was built, after the data was read and a tokenizer trained (seconds on a large
    # corpus, with the data's warnings printed before the one line that mattered).
    with pytest.raises(ConfigError, match=r"^model\.position '(rotary|relative)' .* use it with attention 'dot'"):
        load_run_config(None, overrides)


def test_a_compatible_pair_and_values_of_the_wrong_kind_pass_to_the_model_config():
    assert load_run_config(None, ["model.attention=bilinear", "model.position=alibi"]).model["position"] == "alibi"
    load_run_config(None, ["model.attention=5"])  # named by the model's config when built, as before


def test_none_unsets_an_optional_number_a_config_file_set(tmp_path):
    # TOML has no null, so a config file's train.decay_steps or data.block_size could not be taken back.
    path = tmp_path / "run.toml"
    path.write_text("[model]\npreset = \"gpt-char-tiny\"\n[data]\nblock_size = 16\n[train]\ndecay_steps = 50\n"
                    "micro_batch_size = 4\n", encoding="utf-8")
    run = load_run_config(path, ["train.decay_steps=none", "train.micro_batch_size=NULL", "data.block_size=none"])
    assert (run.train.decay_steps, run.train.micro_batch_size, run.data.block_size) == (None, None, None)
    assert load_run_config(None, ["data.path=none"]).data.path == "none"  # text: a file may have that name
    with pytest.raises(ConfigError, match="train.steps: expected an integer, got 'none'"):
        load_run_config(None, ["train.steps=none"])  # not optional


def test_an_options_table_error_names_its_setting_once():
    with pytest.raises(ConfigError, match=r"^model\.attention_options sets 'd_model'"):
        load_run_config(None, ["model.attention_options={d_model = 8}"])


def test_none_for_an_encoders_causal_under_init_from_keeps_the_pretrained_mask(tmp_path):
    # `--set model.causal=none` slipped past model_config's test for an unset mask as the string "none": the
    # classifier of a causal encoder LM was fine-tuned bidirectionally.
    from attnlab.training.recipe import model_config, train_run

    run = tmp_path / "enc"
    train_run(load_run_config(None, ["model.preset=encoder-tiny", "train.steps=1", "train.batch_size=2",
                                     "data.block_size=16", "train.progress=false", "train.device=cpu",
                                     "train.precision=fp32", "train.eval_every=0", f"train.out_dir='{run}'"]))
    classify = ["data.task=classification", "data.path=x.tsv", f"model.init_from='{run}'"]
    for extra in ([], ["model.causal=none"]):
        config = model_config(load_run_config(None, classify + extra).model, head="classification", n_classes=2)
        assert config.is_causal


def test_none_for_an_encoders_causal_keeps_the_mask_of_a_pretrained_classifier(tmp_path):
    # The kept mask was read from the saved head (an LM's: causal), not from the saved config: a causal classifier
    # was fine-tuned bidirectionally, and with T5 bias positions causal=none then got round the refusal that
    # causal=false met; a bidirectional T5 classifier refused causal=none itself (stop-39 encoder audit).
    from attnlab.training.recipe import model_config, train_run

    data = tmp_path / "train.tsv"
    data.write_text("sentence\tlabel\n" + "good film\t1\nbad film\t0\n" * 4, encoding="utf-8")
    base = ["model.preset=encoder-tiny", "data.task=classification", f"data.path='{data}'", "train.steps=1",
            "train.batch_size=2", "train.progress=false", "train.device=cpu", "train.precision=fp32",
            "train.eval_every=0"]
    for causal in (True, False):
        run = tmp_path / f"cls_{causal}"
        train_run(load_run_config(None, [*base, "model.position=t5-bias", f"model.causal={str(causal).lower()}",
                                         f"train.out_dir='{run}'"]))
        again = ["data.task=classification", f"data.path='{data}'", f"model.init_from='{run}'", "model.causal=none"]
        config = model_config(load_run_config(None, again).model, head="classification", n_classes=2)
        assert config.is_causal is causal
    lm = ["data.task=lm", f"model.init_from='{tmp_path / 'cls_True'}'", "model.causal=none"]
    assert model_config(load_run_config(None, lm).model, head="lm").is_causal


def test_a_leading_tilde_in_a_path_setting_is_the_home_folder(tmp_path, monkeypatch):
    # A config file sees no shell (nor does --set key=~/x, which a shell leaves as it is): the run went into a folder
    # named '~' in the working one, and its printed path then named the home folder's (stop-41 config audit).
    monkeypatch.setenv("HOME", str(tmp_path))
    run = load_run_config(None, ["train.out_dir=~/runs/x", "data.path=~/text.txt", "data.eval_path=~/dev.txt"])
    assert run.train.out_dir == str(tmp_path / "runs" / "x")
    assert (run.data.path, run.data.eval_path) == (str(tmp_path / "text.txt"), str(tmp_path / "dev.txt"))
    config = tmp_path / "run.yaml"
    config.write_text("model:\n  preset: gpt-char-tiny\ntrain:\n  out_dir: ~/runs/y\n", encoding="utf-8")
    assert load_run_config(config).train.out_dir == str(tmp_path / "runs" / "y")
    assert load_run_config(None, ["train.out_dir=runs/~x"]).train.out_dir == "runs/~x"  # only a leading one
    with pytest.raises(CheckpointError) as info:  # model.init_from too: its refusal names the home folder's path
        load_run_config(None, ["model.init_from=~/no-run"])
    assert str(tmp_path / "no-run") in str(info.value)


@pytest.mark.parametrize("raw, value", [(".5", 0.5), ("5.", 5.0), ("1.e-3", 0.001), ("010", 10), ("-.5e2", -50.0)])
def test_set_reads_the_numbers_a_yaml_config_reads(raw, value):
    # TOML refuses them, and --set had passed them on as text: "train.lr: expected a number, got '.5'", where
    # `lr: .5` in a YAML config reads (stop-41 config audit). Other text stays text.
    from attnlab.training.recipe import parse_value

    assert parse_value(raw) == value and type(parse_value(raw)) is type(value)
    assert load_run_config(None, [f"train.lr={raw.lstrip('-')}"]).train.lr == abs(value)
    assert [parse_value(text) for text in ("rotary", "a: b", "[x", "yes", "- a")] == \
        ["rotary", "a: b", "[x", "yes", "- a"]
