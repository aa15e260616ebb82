"""`attnlab params`, third audit: the table is refused exactly where build_model refuses the model (attention
options, the causal target stack of a seq2seq model), counting errors name the config file, a preset name is not
hidden by a folder, a run config or a missing path gets its own one line, and the note on Vaswani et al.'s counts
does not present a fraction of a row as whole."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from cli_helpers import one_line_error, run_cli
from torch import nn

from attnlab.analysis.params import REFERENCES, check_table, count_parameters, params_command
from attnlab.errors import ConfigError
from attnlab.models.registry import build_model, config_from_dict, config_to_dict, get_preset

FAMILIES = {
    "gpt": dict(family="gpt", vocab_size=50, block_size=8, d_model=16, n_heads=4, n_layers=2, d_ff=24),
    "encoder": dict(family="encoder", vocab_size=50, max_len=8, d_model=16, n_heads=4, n_layers=2, d_ff=24),
    "bert": dict(family="bert", vocab_size=50, max_len=8, d_model=16, n_heads=4, n_layers=1, d_ff=24),
    "seq2seq": dict(family="seq2seq", src_vocab_size=50, tgt_vocab_size=50, max_len=8, d_model=16, n_heads=4,
                    d_ff=24, n_encoder_layers=1, n_decoder_layers=2),
}


def outcome(fn, *args):
    """("ok", fn(*args)) or ("refused", the ConfigError's message)."""
    try:
        return "ok", fn(*args)
    except ConfigError as e:
        return "refused", str(e)


def make(family: str, **settings):
    """outcome() of making the config of a small model of `family` with `settings`."""
    return outcome(lambda: config_from_dict({**FAMILIES[family], **settings})[1])


def same_outcome(config) -> None:
    """count_parameters refuses `config` exactly when build_model does, with its message; else it is exact."""
    built, counted = outcome(build_model, config), outcome(count_parameters, config)
    assert built[0] == counted[0], (built, counted)
    if built[0] == "refused":
        assert counted[1] == built[1]
    else:
        assert check_table(counted[1], built[1]) == []


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def write_run(folder, config) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config_to_dict(config)), encoding="utf-8")


# --------------------------------------------------------------------------------------------------
# The invariant: count_parameters refuses a config exactly when build_model does, with the same message
# --------------------------------------------------------------------------------------------------

VARIANT_CASES = [
    ("dot", {}), ("dot", {"temperature": 2.0}),
    ("bilinear", {}), ("bilinear", {"freeze": True}),
    ("synthesizer-dense", {}), ("synthesizer-dense", {"freeze": False}),
    ("synthesizer-random", {}), ("synthesizer-random", {"freeze": True}), ("synthesizer-random", {"freeze": "yes"}),
    ("synthesizer-random", {"freeze": 1}), ("synthesizer-random", {"frezze": True}),
]
SEQ2SEQ_POSITION_CASES = [
    ("t5-bias", {"num_buckets": 8, "max_distance": 3}),  # enough for the source, too few for the causal target
    ("t5-bias", {"num_buckets": 8, "max_distance": 5}),
    ("t5-bias", {"num_buckets": 3}),  # enough buckets for the causal target only
    ("t5-bias", {"num_buckets": 4, "max_distance": 2}),
    ("t5-bias", {}),
    ("relative", {"max_distance": 0}), ("relative", {"max_distance": 2}),
    ("learned", {}), ("sinusoidal", {"base": 1}), ("sinusoidal", {}), ("rotary", {}),
]


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("variant, options", VARIANT_CASES)
def test_count_refuses_attention_options_exactly_when_build_model_does(family, variant, options):
    made = make(family, attention=variant, attention_options=options)
    if made[0] == "ok":  # else the config itself refused them, as every command does
        same_outcome(made[1])


@pytest.mark.parametrize("position, options", SEQ2SEQ_POSITION_CASES)
def test_count_refuses_seq2seq_positions_exactly_when_build_model_does(position, options):
    made = make("seq2seq", position=position, position_options=options)
    if made[0] == "ok":
        same_outcome(made[1])


def test_the_invariant_cases_include_refusals_that_only_building_finds():
    # Without these the two tests above could pass with nothing refused after the config was made.
    refused = set()
    for variant, options in VARIANT_CASES:
        made = make("gpt", attention=variant, attention_options=options)
        if made[0] == "ok" and outcome(build_model, made[1])[0] == "refused":
            refused.add((variant, tuple(options)))
    assert {("dot", ("temperature",)), ("synthesizer-random", ("frezze",)),
            ("synthesizer-random", ("freeze",))} <= refused
    refused = set()
    for position, options in SEQ2SEQ_POSITION_CASES:
        made = make("seq2seq", position=position, position_options=options)
        if made[0] == "ok" and outcome(build_model, made[1])[0] == "refused":
            refused.add((position, tuple(options.items())))
    assert ("t5-bias", (("num_buckets", 8), ("max_distance", 3))) in refused
    assert ("t5-bias", (("num_buckets", 3),)) in refused  # the source stack's refusal, found before too


# --------------------------------------------------------------------------------------------------
# 1. Attention options: the variant is built (on the meta device) as the model builds it
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family, variant, options, message", [
    ("gpt", "synthesizer-random", {"freeze": "yes"}, "option 'freeze' must be true or false, got 'yes'"),
    ("gpt", "synthesizer-random", {"frezze": True}, "has no option 'frezze'; its options: freeze"),
    ("bert", "dot", {"temperature": 2.0}, "attention 'dot' has no option 'temperature'"),
    ("seq2seq", "bilinear", {"freeze": True}, "attention 'bilinear' has no option 'freeze'"),
])
def test_attention_options_a_model_refuses_get_no_table(tmp_path, capsys, family, variant, options, message):
    config = config_from_dict({**FAMILIES[family], "attention": variant, "attention_options": options})[1]
    with pytest.raises(ConfigError, match=message):
        count_parameters(config)
    write_run(tmp_path / "run", config)
    line = one_line_error(capsys, "params", str(tmp_path / "run"))
    assert line.startswith(f"attnlab: error: {tmp_path / 'run' / 'config.json'}: ") and message in line


def test_a_frozen_random_synthesizer_is_still_counted_and_noted():
    config = config_from_dict({**FAMILIES["gpt"], "attention": "synthesizer-random",
                               "attention_options": {"freeze": True}})[1]
    table, model = count_parameters(config), build_model(config)
    assert check_table(table, model) == []
    assert "frozen (not trained), still a parameter" in table.row("blocks", "masked self-attention R (n×n per head)"
                                                                  ).note


def test_the_variant_is_checked_without_allocating_its_parameters(monkeypatch):
    # A random synthesizer over 100,000 positions is 8·10^10 parameters (320 GB): the check builds on the meta device.
    import attnlab.modules.variants as variants

    devices = []
    real = variants.build_variant
    monkeypatch.setattr(variants, "build_variant",
                        lambda *a, **k: (m := real(*a, **k), devices.extend(p.device.type for p in m.parameters()))[0])
    config = config_from_dict({**FAMILIES["gpt"], "attention": "synthesizer-random"})[1]
    assert count_parameters(config).total == n_params(build_model(config))
    assert devices.count("meta") == 1 and devices.count("cpu") == 2  # the check's one, then the model's 2 layers
    devices.clear()
    config = config_from_dict({**FAMILIES["gpt"], "block_size": 100_000, "attention": "synthesizer-random"})[1]
    assert count_parameters(config).total > 8 * 10**10 and devices == ["meta"]


def test_a_variant_without_accounting_is_counted_from_its_meta_instance(monkeypatch):
    from attnlab.modules.variants import VARIANTS, DotScores

    class Extra(DotScores):  # dot scores plus `extra` learned scalars
        def __init__(self, *, d_model: int, n_heads: int, kv_dim: int | None = None, bias: bool = True,
                     block_size: int | None = None, extra: int = 3):
            super().__init__(d_model=d_model, n_heads=n_heads, kv_dim=kv_dim, bias=bias, block_size=block_size)
            self.extra = nn.Parameter(torch.zeros(extra))

    monkeypatch.setitem(VARIANTS._items, "test-extra", Extra)
    for family in FAMILIES:
        config = config_from_dict({**FAMILIES[family], "attention": "test-extra", "attention_options": {"extra": 5}})[1]
        table, model = count_parameters(config), build_model(config)
        assert table.total == n_params(model) and check_table(table, model) == []
        assert all(p.device.type == "cpu" for p in model.parameters())
        typo = config.replace(attention_options={"extar": 5})
        with pytest.raises(ConfigError, match="has no option 'extar'"):
            count_parameters(typo)


# --------------------------------------------------------------------------------------------------
# 2. Seq2seq positions: the target stack is causal
# --------------------------------------------------------------------------------------------------


def test_seq2seq_t5_bias_too_short_for_the_causal_target_is_refused(tmp_path, capsys):
    config = config_from_dict({**FAMILIES["seq2seq"], "position": "t5-bias",
                               "position_options": {"num_buckets": 8, "max_distance": 3}})[1]
    with pytest.raises(ConfigError, match="max_distance must be larger than the 4 exact distances of num_buckets = 8"):
        count_parameters(config)
    write_run(tmp_path / "run", config)
    assert "the 4 exact distances" in one_line_error(capsys, "params", str(tmp_path / "run"))


def test_a_position_without_accounting_counts_each_stack_with_its_own_causal_flag(monkeypatch):
    from attnlab.modules.positions import POSITIONS, PositionScheme

    class CausalWidth(PositionScheme):  # one more column in a causal stack
        adds_to_embeddings = True

        def __init__(self, *, d_model: int, max_len: int, causal: bool, width: int = 2):
            super().__init__()
            self.table = nn.Parameter(torch.zeros(max_len, width + (1 if causal else 0)))

    monkeypatch.setitem(POSITIONS._items, "test-causal-width", CausalWidth)
    config = config_from_dict({**FAMILIES["seq2seq"], "position": "test-causal-width"})[1]
    table, model = count_parameters(config), build_model(config)
    assert table.row("embeddings", "source positions (test-causal-width)").total == 8 * 2
    assert table.row("embeddings", "target positions (test-causal-width)").total == 8 * 3
    assert table.total == n_params(model) and check_table(table, model) == []


def test_a_position_without_accounting_is_counted_on_the_meta_device(monkeypatch):
    """Counting built such a scheme for real, a table of max_len rows in memory, where everything else is counted
    from its formula or from a meta-device module."""
    from attnlab.modules.positions import POSITIONS, PositionScheme

    devices = []

    class Table(PositionScheme):
        adds_to_embeddings = True

        def __init__(self, *, d_model: int, max_len: int, causal: bool):
            super().__init__()
            self.table = nn.Parameter(torch.zeros(max_len, d_model))
            devices.append(self.table.device.type)

    monkeypatch.setitem(POSITIONS._items, "test-table", Table)
    table = count_parameters(config_from_dict({**FAMILIES["gpt"], "position": "test-table"})[1])
    assert table.row("embeddings", "positions (test-table)").total > 0
    assert set(devices) == {"meta"}


def test_short_totals_pick_their_unit_after_rounding():
    from attnlab.analysis.params import _short

    assert [_short(n) for n in (999, 1_000, 999_949, 999_999, 124_439_808, 999_960_000, 2 * 10**12)] == \
        ["999", "1.0k", "999.9k", "1.0M", "124.4M", "1.0B", "2.0T"]  # 999,999 was "1000.0k"


# --------------------------------------------------------------------------------------------------
# 3. A preset name is the preset; ./NAME is the folder; `list` and --list
# --------------------------------------------------------------------------------------------------


def tiny_gpt():
    return config_from_dict(FAMILIES["gpt"])[1]


def test_an_empty_folder_named_as_a_preset_does_not_hide_it(tmp_path, monkeypatch, capsys, recwarn):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt-char-tiny").mkdir()
    code, out, err = run_cli(capsys, "params", "gpt-char-tiny")
    assert code == 0 and err == "" and len(recwarn) == 0, err  # it said: no config.json there
    assert out.startswith("gpt-char-tiny (gpt)")
    assert f"{count_parameters(get_preset('gpt-char-tiny')[1]).total:,}" in out
    assert "no config.json there" in one_line_error(capsys, "params", "./gpt-char-tiny")


def test_a_run_folder_named_as_a_preset_is_reached_as_dot_slash_and_the_preset_warns(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / "transformer-base" / "checkpoint", tiny_gpt())
    shadowed = ("transformer-base is a preset and also a folder here holding a model; this is the preset's count: "
                "give ./transformer-base for the folder's")
    with pytest.warns(UserWarning, match=f"^{re.escape(shadowed)}$"):  # on stderr, as one line, under the CLI
        code, out, _ = run_cli(capsys, "params", "transformer-base", "--json")
    assert code == 0
    assert json.loads(out)["total"] == 63_082_496  # the preset, and the JSON on stdout stays clean
    code, out, _ = run_cli(capsys, "params", "./transformer-base", "--json")
    assert code == 0
    assert json.loads(out)["total"] == n_params(build_model(tiny_gpt()))
    assert json.loads(out)["model"] == "./transformer-base"  # as typed: "transformer-base" read as the preset's
    code, out, _ = run_cli(capsys, "params", "./transformer-base")
    assert code == 0 and out.startswith("./transformer-base (gpt)\n"), out  # (stop-44 README audit)


def test_list_lists_the_presets_and_dot_slash_list_counts_a_folder_named_list(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / "list", tiny_gpt())
    with pytest.warns(UserWarning, match="list lists the presets, and is also a folder here holding a model: give "
                                         "./list to count the folder's"):
        code, out, _ = run_cli(capsys, "params", "list")
    assert code == 0 and "transformer-base" in out
    code, out, err = run_cli(capsys, "params", "./list", "--json")
    assert code == 0 and json.loads(out)["total"] == n_params(build_model(tiny_gpt()))


@pytest.mark.parametrize("name", ["gpt-char-tiny", "list", "runs/x"])
def test_a_name_with_list_is_refused_in_one_line(capsys, name):
    line = one_line_error(capsys, "params", name, "--list")
    assert line == (f"attnlab: error: give a model name or --list, not both: drop --list to count {name}, or {name} "
                    "to list every preset")
    with pytest.raises(ConfigError, match="not both"):
        params_command(name, list_all=True)


# --------------------------------------------------------------------------------------------------
# 4. Errors only counting finds name the config file
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("changes, message", [
    (dict(position="relative", position_options={"max_distance": 0}), "relative positions: max_distance (the "
                                                                      "farthest distance told apart) must be at "
                                                                      "least 1, got 0"),
    (dict(d_model=15, n_heads=3, position="sinusoidal"), "sinusoidal positions need an even width, got 15"),
    (dict(d_model=15, n_heads=3, position="rotary"), "rotary positions need an even head width, got 5"),
])
def test_a_setting_only_building_refuses_names_the_config_file(tmp_path, capsys, changes, message):
    config = config_from_dict({**FAMILIES["gpt"], **changes})[1]  # the config itself takes it
    write_run(tmp_path / "run" / "checkpoint", config)
    line = one_line_error(capsys, "params", str(tmp_path / "run"))
    assert line == f"attnlab: error: {tmp_path / 'run' / 'checkpoint' / 'config.json'}: {message}"


def test_a_preset_refused_while_counting_is_not_given_a_file_name(monkeypatch):
    import attnlab.analysis.params as params

    def refuse(config, *, name=None):
        raise ConfigError("refused")

    monkeypatch.setattr(params, "count_parameters", refuse)
    with pytest.raises(ConfigError, match="^refused$"):
        params_command("gpt-char-tiny")


# --------------------------------------------------------------------------------------------------
# 5. A missing path; a run config (TOML, YAML)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["runs/no-such-run", "no-such.json", "no-such.toml", "no-such.yaml"])
def test_a_missing_path_says_it_does_not_exist(tmp_path, monkeypatch, capsys, name):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(capsys, "params", name)
    assert line.startswith(f"attnlab: error: {name} does not exist") and "gpt-char-tiny" in line


@pytest.mark.parametrize("file", ["gpt.toml", "gpt.yaml", "gpt.YML"])
def test_a_run_config_is_refused_with_the_way_to_a_run_folder(tmp_path, monkeypatch, capsys, file):
    monkeypatch.chdir(tmp_path)
    text = '[model]\npreset = "gpt-char-tiny"\n' if file.endswith(".toml") else "model:\n  preset: gpt-char-tiny\n"
    (tmp_path / file).write_text(text, encoding="utf-8")
    line = one_line_error(capsys, "params", file)
    assert line == (f"attnlab: error: {file} is a run config: params takes a preset name (attnlab params --list) or "
                    f"a trained run folder, not a run config (the data decide its vocabulary); `attnlab train {file}` "
                    "writes the run folder (its train.out_dir)")


def test_the_shipped_run_configs_are_refused_as_run_configs(capsys):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for config in sorted((root / "configs").glob("*.toml")):
        line = one_line_error(capsys, "params", str(config))
        assert "is a run config" in line and "not a readable JSON config" not in line


# --------------------------------------------------------------------------------------------------
# 6. Vaswani et al.'s rounded counts
# --------------------------------------------------------------------------------------------------


def test_the_vaswani_note_gives_fractional_rows_and_both_implied_vocabularies():
    base = count_parameters(get_preset("transformer-base")[1], name="transformer-base").reference_line()
    big = count_parameters(get_preset("transformer-big")[1], name="transformer-big").reference_line()
    assert "The gap (+1,917,504) is ≈ 3,745.1 embedding rows of width 512, as if V ≈ 40,745" in base
    assert "The gap (-1,245,376) is ≈ 1,216.2 embedding rows of width 1024, as if V ≈ 35,784" in big
    both = ("the paper's counts are rounded to millions and, even allowing for that, imply different vocabularies "
            "(65M: V ≈ 40,745; 213M: V ≈ 35,784), so the gap is not V alone")
    assert base.endswith(both) and big.endswith(both)
    assert "3,745 embedding rows" not in base and "i.e. V" not in base


def test_no_one_vocabulary_gives_both_rounded_counts():
    """What "even allowing for that" claims: the vocabularies 65M ± 0.5M and 213M ± 0.5M allow do not overlap."""
    ranges = []
    for name in ("transformer-base", "transformer-big"):
        table = count_parameters(get_preset(name)[1])
        v, d, ref = table.symbols["V"].value, table.symbols["d"].value, REFERENCES[name].value
        ranges.append((v + (ref - 500_000 - table.total) / d, v + (ref + 500_000 - table.total) / d))
        assert not math.isclose(v + (ref - table.total) / d, round(v + (ref - table.total) / d))  # not whole rows
    (lo_base, hi_base), (lo_big, hi_big) = ranges
    assert hi_big < lo_base
