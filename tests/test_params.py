"""Parameter accounting: every table's total equals `model.parameters()` of the built model, every row's
formula equals the modules it names, and the `attnlab params` command prints and exits as documented."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.analysis.params import (
    POSITION_ROWS,
    VARIANT_ROWS,
    check_table,
    count_parameters,
    evaluate_formula,
    formula_symbols,
    params_command,
)
from attnlab.cli import app, main
from attnlab.errors import ConfigError
from attnlab.models.registry import build_model, config_to_dict, get_preset, preset_names
from attnlab.models.transformer import TransformerConfig
from attnlab.modules.positions import POSITIONS
from attnlab.modules.variants import VARIANTS, variant_parameter_count


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # torch yields a tied parameter once


def numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


TINY = dict(src_vocab_size=50, tgt_vocab_size=50, d_model=16, n_heads=4, d_ff=24, n_encoder_layers=2,
            n_decoder_layers=3, dropout=0.0, max_len=12)


def tiny(**changes) -> TransformerConfig:
    return TransformerConfig(**{**TINY, **changes})


# --------------------------------------------------------------------------------------------------
# transformer-base: built once for the whole module (63M parameters)
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base():
    _, config = get_preset("transformer-base")
    return config, build_model(config)


def test_transformer_base_total_equals_built_model(base):
    config, model = base
    table = count_parameters(config, name="transformer-base")
    assert table.total == 63_082_496 == n_params(model)
    assert check_table(table, model) == []


def test_transformer_base_rows_match_modules(base):
    config, model = base
    table = count_parameters(config)
    enc, dec = model.encoder.layers[0], model.decoder.layers[0]
    q = table.row("encoder", "self-attention Q")
    assert (q.formula, q.repeat, q.per_instance) == ("d² + d", 6, numel(enc.self_attn.scores.q_proj))
    assert table.row("encoder", "self-attention V").per_instance == numel(enc.self_attn.v_proj)
    assert table.row("encoder", "self-attention O (output)").per_instance == numel(enc.self_attn.out_proj)
    assert table.row("decoder", "cross-attention K").per_instance == numel(dec.cross_attn.scores.k_proj)
    ff = table.row("decoder", "feed-forward (W1, b1, W2, b2)")
    assert ff.per_instance == numel(dec.ff) == 2_099_712
    emb = table.row("embeddings", "token embedding (shared)")
    assert (emb.formula, emb.total) == ("V·d", 37000 * 512)
    assert model.lm_head.weight is model.src_embed.token.weight is model.tgt_embed.token.weight
    assert "counted once" in emb.note
    assert table.row("output", "pre-softmax projection (tied)").total == 0


def test_transformer_base_reference_and_assumptions():
    _, config = get_preset("transformer-base")
    table = count_parameters(config)
    assert table.reference is not None and table.reference.shown == "65M"
    line = table.reference_line()
    assert "Vaswani et al. 2017, Table 3" in line and "V = 37,000" in line
    text = " ".join(table.assumptions)
    for word in ("vocabulary", "sharing", "biases", "final LayerNorm", "sinusoidal"):
        assert word in text
    # A config that differs from the preset is not compared with the paper.
    assert count_parameters(config.replace(d_ff=1024)).reference is None


# --------------------------------------------------------------------------------------------------
# Small configs of every kind, built and compared row by row
# --------------------------------------------------------------------------------------------------

CASES = {
    "default": {},
    "bilinear": dict(attention="bilinear"),
    "bilinear-no-bias": dict(attention="bilinear", bias=False),
    "synthesizer-dense": dict(attention="synthesizer-dense"),
    "synthesizer-random": dict(attention="synthesizer-random"),
    "synthesizer-random-frozen": dict(attention="synthesizer-random", attention_options={"freeze": True}),
    "learned": dict(position="learned"),
    "relative": dict(position="relative", position_options={"max_distance": 3}),
    "t5-bias": dict(position="t5-bias", position_options={"num_buckets": 8, "max_distance": 16}),
    "rotary": dict(position="rotary"),
    "alibi": dict(position="alibi"),
    "pre-norm-final-norm": dict(norm="pre"),
    "pre-norm-no-final-norm": dict(norm="pre", final_norm=False),
    "post-norm-final-norm": dict(final_norm=True),
    "untied-output": dict(tie_output=False),
    "tied-output-bias": dict(output_bias=True),
    "untied-output-bias": dict(tie_output=False, output_bias=True),
    "separate-vocabularies": dict(share_embeddings=False, src_vocab_size=40),
    "separate-vocabularies-untied": dict(share_embeddings=False, tie_output=False, src_vocab_size=40),
    "no-bias": dict(bias=False),
    "no-encoder-layers": dict(n_encoder_layers=0),
}


@pytest.mark.parametrize("case", CASES)
def test_seq2seq_table_equals_built_model(case):
    config = tiny(**CASES[case])
    table = count_parameters(config)
    model = build_model(config)
    assert table.total == n_params(model)
    assert check_table(table, model) == []


def test_variant_rows_match_their_modules():
    layer = lambda m: m.encoder.layers[1].self_attn.scores  # noqa: E731
    model = build_model(tiny(attention="bilinear"))
    table = count_parameters(tiny(attention="bilinear"))
    merged = table.row("encoder", "self-attention merged W_QK (per head)")
    assert merged.formula == "h·d²" and merged.per_instance == layer(model).weight.numel() == 4 * 16 * 16
    assert table.row("encoder", "self-attention key bias u (per head)").per_instance == 4 * 16

    model = build_model(tiny(attention="synthesizer-random"))
    table = count_parameters(tiny(attention="synthesizer-random"))
    r = table.row("encoder", "self-attention R (n×n per head)")
    assert r.formula == "h·n²" and r.per_instance == layer(model).table.numel() == 4 * 12 * 12
    # Synthesizer scores cannot attend to another sequence: the decoder's cross-attention is `dot`.
    assert table.row("decoder", "cross-attention Q").per_instance == numel(model.decoder.layers[0].cross_attn
                                                                           .scores.q_proj)

    model = build_model(tiny(attention="synthesizer-dense"))
    table = count_parameters(tiny(attention="synthesizer-dense"))
    assert table.row("encoder", "self-attention W2 (to n positions)").per_instance == layer(model).w2.numel()


def test_position_rows_match_their_modules():
    config = tiny(position="relative", position_options={"max_distance": 3})
    model, table = build_model(config), count_parameters(config)
    row = table.row("embeddings", "source positions (relative)")
    assert row.formula == "(2·K + 1)·d_h" and row.per_instance == numel(model.src_position) == 7 * 4
    config = tiny(position="t5-bias")
    model, table = build_model(config), count_parameters(config)
    assert table.row("embeddings", "target positions (t5-bias)").per_instance == numel(model.tgt_position)
    config = tiny(position="learned")
    model, table = build_model(config), count_parameters(config)
    assert table.row("embeddings", "source positions (learned)").per_instance == numel(model.src_position)


@pytest.mark.parametrize("variant", sorted(VARIANT_ROWS.names()))
@pytest.mark.parametrize("bias", [True, False])
def test_variant_rows_agree_with_variant_parameter_count(variant, bias):
    config = tiny(attention=variant, bias=bias)
    table = count_parameters(config)
    qk = [r for r in table.rows if r.group == "encoder" and r.component.startswith("self-attention")
          and not r.component.endswith((" V", "(output)"))]
    expected = variant_parameter_count(variant, 16, 4, bias=bias, block_size=12)
    assert sum(r.per_instance for r in qk) == expected


def test_every_registered_variant_and_position_has_accounting():
    missing = [v for v in VARIANTS.names() if v not in VARIANT_ROWS]
    missing += [p for p in POSITIONS.names() if p not in POSITION_ROWS]
    assert not missing, f"add their rows in attnlab.analysis.params: {missing}"


def test_check_table_reports_disagreements():
    problems = check_table(count_parameters(tiny()), build_model(tiny(d_ff=32)))
    assert any(p.startswith("total") for p in problems)
    assert any("feed-forward" in p for p in problems)


# --------------------------------------------------------------------------------------------------
# Other families and every small preset
# --------------------------------------------------------------------------------------------------


def _small_presets() -> list[str]:
    return [n for n in preset_names() if count_parameters(get_preset(n)[1]).total < 2_000_000]


@pytest.mark.parametrize("name", _small_presets())
def test_small_presets_equal_built_models(name):
    _, config = get_preset(name)
    table = count_parameters(config, name=name)
    model = build_model(config)
    assert table.total == n_params(model)
    assert check_table(table, model) == []


def test_tutorial_encoder_counts():
    pytest.importorskip("attnlab.models.encoder")
    assert count_parameters(get_preset("tutorial-lm")[1]).total == 1_008_100
    assert count_parameters(get_preset("tutorial-cls")[1]).total == 988_402


FAMILY_CASES = [
    ("gpt-char-tiny", dict(tie_embeddings=False)),
    ("gpt-char-tiny", dict(norm="post", position="rotary", bias=False)),
    ("gpt-char-tiny", dict(attention="synthesizer-dense")),
    ("encoder-tiny", dict(head="classification", n_classes=3, norm="pre")),
    ("encoder-tiny", dict(position="learned", final_norm=True)),
    ("bert-tiny", dict(nsp=False)),
    ("bert-tiny", dict(tie_output=False, type_vocab_size=0)),
    ("bert-tiny", dict(heads="classification", n_classes=3)),
    ("bert-tiny", dict(heads="none")),
]


@pytest.mark.parametrize("preset, changes", FAMILY_CASES)
def test_other_families_equal_built_models(preset, changes):
    if preset not in preset_names():
        pytest.skip(f"preset {preset} not available")
    config = get_preset(preset)[1].replace(**changes)
    table = count_parameters(config)
    model = build_model(config)
    assert table.total == n_params(model)
    assert check_table(table, model) == []


# --------------------------------------------------------------------------------------------------
# Formulas
# --------------------------------------------------------------------------------------------------


def test_evaluate_formula():
    assert evaluate_formula("4·(d² + d)", {"d": 512}) == 1_050_624
    assert evaluate_formula("(2·K + 1)·d_h", {"K": 16, "d_h": 64}) == 33 * 64
    assert evaluate_formula("h·n²", {"h": 8, "n": 10}) == 800
    assert formula_symbols("2·d·d_ff + d_ff + d") == ["d", "d_ff"]
    with pytest.raises(ValueError, match="no value"):
        evaluate_formula("V·d", {"d": 1})
    with pytest.raises(ValueError, match="unsupported"):
        evaluate_formula("d / 2", {"d": 4})


def test_formulas_are_in_the_tables_symbols():
    table = count_parameters(tiny(attention="synthesizer-dense", position="t5-bias"))
    values = {k: s.value for k, s in table.symbols.items()}
    for row in table.rows:
        assert row.formula is not None
        assert evaluate_formula(row.formula, values) == row.per_instance
    text = table.render()
    for name in ("d", "d_ff", "h", "d_h", "n", "n_b", "N_enc", "N_dec", "V"):
        assert f"{name} = {values[name]}" in text


# --------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------


def _argv(*args: str) -> list[str]:
    """`params ARGS`, or just ARGS while `params` is the app's only command (typer then runs it bare)."""
    import typer.main

    return ["params", *args] if hasattr(typer.main.get_command(app), "commands") else list(args)


def test_params_command_prints_table(capsys):
    params_command("transformer-base")
    out = capsys.readouterr().out
    assert "63,082,496" in out and "V·d" in out and "d² + d" in out
    assert "paper (Vaswani et al. 2017, Table 3): 65M" in out
    assert "V = 37000" in out and "assumptions:" in out
    assert "\x1b" not in out  # no terminal colour codes
    header = next(line for line in out.splitlines() if line.startswith("component"))
    total = next(line for line in out.splitlines() if line.startswith("total"))
    assert header.index("total") + len("total") == total.index("63,082,496") + len("63,082,496")


def test_params_command_json(capsys):
    params_command("seq2seq-tiny", as_json=True)
    data = json.loads(capsys.readouterr().out)
    assert data["total"] == sum(r["total"] for r in data["rows"]) == n_params(build_model(get_preset(
        "seq2seq-tiny")[1]))
    assert data["reference"] is None and data["assumptions"]
    params_command("transformer-base", as_json=True)
    data = json.loads(capsys.readouterr().out)
    assert data["total"] == 63_082_496
    assert data["reference"]["value"] == 65_000_000
    assert data["reference"]["difference"] == 63_082_496 - 65_000_000


def test_params_command_run_folder(tmp_path, capsys):
    config = tiny(position="learned")
    (tmp_path / "config.json").write_text(json.dumps(config_to_dict(config)))
    params_command(str(tmp_path), as_json=True)
    assert json.loads(capsys.readouterr().out)["total"] == n_params(build_model(config))
    nested = tmp_path / "nested"
    nested.mkdir()
    (nested / "config.json").write_text(json.dumps({"model": config_to_dict(config), "train": {}}))
    params_command(str(nested), as_json=True)
    assert json.loads(capsys.readouterr().out)["total"] == n_params(build_model(config))
    with pytest.raises(ConfigError, match="no config.json"):
        params_command(str(tmp_path / "missing/"))


def test_params_command_list(capsys):
    params_command(None, list_all=True)
    out = capsys.readouterr().out
    assert "transformer-base" in out and "63,082,496" in out
    assert len(out.splitlines()) == len(preset_names())


def test_cli_table_and_json(capsys):
    main(_argv("seq2seq-tiny"))
    assert "seq2seq-tiny (seq2seq)" in capsys.readouterr().out
    main(_argv("seq2seq-tiny", "--json"))
    expected = count_parameters(get_preset("seq2seq-tiny")[1]).total
    assert json.loads(capsys.readouterr().out)["total"] == expected
    main(_argv("--list"))
    assert "seq2seq-tiny" in capsys.readouterr().out


def test_cli_unknown_preset_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(_argv("transformer-bas"))
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and "\n" not in err
    assert err.startswith("attnlab: error: unknown preset 'transformer-bas'")
    assert "transformer-base" in err and "seq2seq-tiny" in err


def test_family_without_accounting_is_counted_from_the_model(monkeypatch):
    from attnlab.analysis.params import FAMILY_ACCOUNTS

    monkeypatch.delitem(FAMILY_ACCOUNTS._items, "seq2seq")
    config = tiny(tie_output=True)
    table = count_parameters(config)
    assert all(r.formula is None for r in table.rows)
    model = build_model(config)
    assert table.total == n_params(model)
    assert check_table(table, model) == []
    assert "(no closed form)" in table.render()


@pytest.mark.parametrize("preset", ["gpt-char-small", "bert-tiny"])
def test_component_names_have_no_stray_spaces(preset, capsys):
    # A model of one stack of positions (no "source"/"target" label) printed "   positions (learned)" and gave
    # " positions (learned)" in --json.
    main(["params", preset, "--json"])
    rows = json.loads(capsys.readouterr().out)["rows"]
    names = [row["component"] for row in rows]
    assert "positions (learned)" in names and all(name == name.strip() for name in names)
