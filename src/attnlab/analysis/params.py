"""Exact parameter accounting, per component, with the closed-form formula of every row.

`count_parameters(config)` works from the config alone (no weights are made, so `transformer-big` costs
nothing; each attention variant and position scheme is built on the meta device, as the model builds it,
so that a config `build_model` refuses gets the same ConfigError instead of a table): each model family
contributes its rows through a small function registered under the family's name in `FAMILY_ACCOUNTS`;
attention variants and position schemes contribute theirs through `VARIANT_ROWS` and `POSITION_ROWS`.
A formula is written once, in the config's symbols (`4·(d² + d)`, `V·d`), and the count beside it is
that formula evaluated, so the text and the number cannot disagree. `check_table(table, model)` compares
every row with the modules it names in a built model, and the table's total with
`sum(p.numel() for p in model.parameters())`.

Conventions: a matrix shared by several modules (tied embeddings) is one row, counted once, with a
note; frozen parameters count (as `model.parameters()` counts them); buffers (sinusoid tables, masks)
are not parameters.
"""

from __future__ import annotations

import ast
import inspect
import json
import operator
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from attnlab.config import Config
from attnlab.errors import ConfigError, one_line
from attnlab.registry import Registry

# --------------------------------------------------------------------------------------------------
# Formulas: written for people (`d² + d`, `h·n²`), evaluated exactly
# --------------------------------------------------------------------------------------------------

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow,
        ast.FloorDiv: operator.floordiv}


def _to_python(formula: str) -> str:
    return formula.replace("·", "*").replace("×", "*").replace("²", "**2").replace("³", "**3")


def formula_symbols(formula: str) -> list[str]:
    """The symbol names a formula uses, in order of first appearance."""
    names: list[str] = []
    for node in ast.walk(ast.parse(_to_python(formula), mode="eval")):
        if isinstance(node, ast.Name) and node.id not in names:
            names.append(node.id)
    return names


def evaluate_formula(formula: str, symbols: Mapping[str, int]) -> int:
    """Evaluate a formula such as `4·(d² + d)` with integer symbol values (+, -, ·, ², parentheses)."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in symbols:
                raise ValueError(f"formula {formula!r} uses {node.id!r}, which has no value")
            return int(symbols[node.id])
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"formula {formula!r}: unsupported expression {ast.dump(node)}")

    return ev(ast.parse(_to_python(formula), mode="eval"))


def _linear(n_in: str, n_out: str, bias: bool) -> str:
    """Formula of nn.Linear(n_in, n_out): `d² + d`, `d·d_ff + d_ff`..."""
    weight = f"{n_in}²" if n_in == n_out else f"{n_in}·{n_out}"
    return f"{weight} + {n_out}" if bias else weight


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamRow:
    """One component: `repeat` identical instances of `per_instance` parameters each.

    `formula` is None only for a component with no registered closed form (counted from a built
    module instead). `modules` are the dotted paths, in the built model, of the modules or parameters
    that make up one instance; `*` stands for the layer index.
    """

    group: str
    component: str
    formula: str | None
    per_instance: int
    repeat: int = 1
    repeat_symbol: str | None = None
    note: str = ""
    modules: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.per_instance * self.repeat


@dataclass(frozen=True)
class Symbol:
    name: str
    value: int
    meaning: str


@dataclass(frozen=True)
class Reference:
    """A published parameter count to print beside ours."""

    source: str
    value: int
    shown: str  # as the source writes it, e.g. "65M"
    explain: Callable[[ParamTable], str] | None = None


@dataclass
class ParamTable:
    """Rows per component, the symbols their formulas use, the assumptions, and a reference if known."""

    model: str
    family: str
    rows: list[ParamRow]
    symbols: dict[str, Symbol]
    assumptions: list[str]
    reference: Reference | None = None

    @property
    def total(self) -> int:
        return sum(r.total for r in self.rows)

    def row(self, group: str, component: str) -> ParamRow:
        for r in self.rows:
            if r.group == group and r.component == component:
                return r
        raise KeyError(f"no row {group!r} / {component!r}")

    def groups(self) -> dict[str, list[ParamRow]]:
        out: dict[str, list[ParamRow]] = {}
        for r in self.rows:
            out.setdefault(r.group, []).append(r)
        return out

    def reference_line(self) -> str | None:
        ref = self.reference
        if ref is None:
            return None
        line = f"paper ({ref.source}): {ref.shown}; ours: {_short(self.total)} ({self.total:,})"
        if ref.explain is not None:
            line += f". {ref.explain(self)}"
        return line

    def to_dict(self) -> dict[str, Any]:
        ref = None
        if self.reference is not None:
            ref = {"source": self.reference.source, "value": self.reference.value,
                   "shown": self.reference.shown, "difference": self.total - self.reference.value,
                   "explanation": self.reference.explain(self) if self.reference.explain else None}
        return {
            "model": self.model,
            "family": self.family,
            "symbols": {s.name: {"value": s.value, "meaning": s.meaning} for s in self.symbols.values()},
            "rows": [{"group": r.group, "component": r.component, "repeat": r.repeat,
                      "repeat_symbol": r.repeat_symbol, "formula": r.formula,
                      "per_instance": r.per_instance, "total": r.total, "note": r.note,
                      "modules": list(r.modules)} for r in self.rows],
            "total": self.total,
            "assumptions": list(self.assumptions),
            "reference": ref,
        }

    def render(self) -> str:
        """The table as aligned plain text (no colour, no terminal codes)."""
        total = self.total or 1
        head = ("component", "×", "formula", "per instance", "total", "%", "note")
        lines: list[tuple[str, ...]] = []
        for group, rows in self.groups().items():
            sub = sum(r.total for r in rows)
            lines.append((group, "", "", "", f"{sub:,}", f"{100 * sub / total:.1f}", ""))
            for r in rows:
                lines.append((f"  {r.component}", str(r.repeat), r.formula or "(no closed form)",
                              f"{r.per_instance:,}", f"{r.total:,}", f"{100 * r.total / total:.1f}", r.note))
        lines.append(("total", "", "", "", f"{self.total:,}", "100.0", _short(self.total)))
        widths = [max(len(x[i]) for x in [head, *lines]) for i in range(len(head) - 1)]
        right = {1, 3, 4, 5}

        def fmt(cells: tuple[str, ...]) -> str:
            parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
            return ("  ".join(parts) + "  " + cells[-1]).rstrip()

        out = [f"{self.model} ({self.family})", ""]
        used = self._used_symbols()
        if used:
            w = max(len(f"{s.name} = {s.value}") for s in used)
            out += [f"  {f'{s.name} = {s.value}'.ljust(w)}  {s.meaning}" for s in used] + [""]
        out.append(fmt(head))
        out.append("-" * len(fmt(head)))
        out += [fmt(x) for x in lines[:-1]]
        out.append("-" * len(fmt(head)))
        out.append(fmt(lines[-1]))
        ref = self.reference_line()
        if ref:
            out += ["", ref]
        out += ["", "assumptions:"] + [f"  - {a}" for a in self.assumptions]
        return "\n".join(out)

    def _used_symbols(self) -> list[Symbol]:
        names: set[str] = set()
        for r in self.rows:
            if r.formula:
                names.update(formula_symbols(r.formula))
            if r.repeat_symbol:
                names.add(r.repeat_symbol)
        return [s for n, s in self.symbols.items() if n in names]


def _short(n: int) -> str:
    """A count with one decimal of its unit, the unit chosen after rounding: 999,960 is 1.0M, not 1000.0k."""
    if n < 1000:
        return str(n)
    for unit, size in (("k", 10**3), ("M", 10**6), ("B", 10**9)):
        text = f"{n / size:.1f}"
        if float(text) < 1000:
            return text + unit
    return f"{n / 10**12:.1f}T"


class TableBuilder:
    """What a family's accounting function writes into: symbols, rows, assumptions."""

    def __init__(self) -> None:
        self.symbols: dict[str, Symbol] = {}
        self.rows: list[ParamRow] = []
        self.assumptions: list[str] = []

    def symbol(self, name: str, value: int, meaning: str) -> str:
        self.symbols[name] = Symbol(name, int(value), meaning)
        return name

    def value(self, name: str) -> int:
        return self.symbols[name].value

    def row(self, group: str, component: str, formula: str | None, *, repeat: int | str = 1,
            note: str = "", modules: Iterable[str] = (), count: int | None = None) -> None:
        """Add a row; its count is `formula` evaluated (or `count` when there is no formula)."""
        per = evaluate_formula(formula, {k: s.value for k, s in self.symbols.items()}) \
            if formula is not None else count
        if per is None:
            raise ValueError(f"row {component!r} needs a formula or a count")
        rep_symbol = repeat if isinstance(repeat, str) else None
        rep = self.value(repeat) if isinstance(repeat, str) else repeat
        if rep == 0:
            return
        self.rows.append(ParamRow(group, component, formula, per, rep, rep_symbol, note, tuple(modules)))

    def assume(self, text: str) -> None:
        self.assumptions.append(text)


# --------------------------------------------------------------------------------------------------
# Attention variants: the query/key side of one attention layer
# --------------------------------------------------------------------------------------------------

# A part: (label, formula or None, attribute path under the attention module, note).
Part = tuple[str, str | None, str, str]
VariantRows = Callable[..., list[Part]]
VARIANT_ROWS: Registry[VariantRows] = Registry("attention variant (parameter accounting)")


@VARIANT_ROWS.register("dot")
def _dot_rows(*, bias: bool, kv: str, options: dict) -> list[Part]:
    return [("Q", _linear("d", "d", bias), "scores.q_proj", ""),
            ("K", _linear(kv, "d", bias), "scores.k_proj", "")]


@VARIANT_ROWS.register("bilinear")
def _bilinear_rows(*, bias: bool, kv: str, options: dict) -> list[Part]:
    width = "d²" if kv == "d" else f"d·{kv}"
    parts: list[Part] = [("merged W_QK (per head)", f"h·{width}", "scores.weight",
                          "one d×d matrix per head replaces W_Q and W_K")]
    if bias:
        parts.append(("key bias u (per head)", f"h·{kv}", "scores.key_bias", ""))
    return parts


@VARIANT_ROWS.register("synthesizer-dense")
def _dense_synth_rows(*, bias: bool, kv: str, options: dict) -> list[Part]:
    return [("W1, b1" if bias else "W1", _linear("d", "d", bias), "scores.w1", ""),
            ("W2 (to n positions)", "d_h·n", "scores.w2", "shared by the heads"),
            ("b2", "n", "scores.b2", "")]


@VARIANT_ROWS.register("synthesizer-random")
def _random_synth_rows(*, bias: bool, kv: str, options: dict) -> list[Part]:
    note = "frozen (not trained), still a parameter" if options.get("freeze") else ""
    return [("R (n×n per head)", "h·n²", "scores.table", note)]


def _at(path: str | None, attr: str = "") -> list[str]:
    """Module path list for a row: none when the family's module layout is not known."""
    if path is None:
        return []
    return [f"{path}.{attr}" if attr else path]


def _sub(path: str | None, attr: str) -> str | None:
    return None if path is None else f"{path}.{attr}"


def _attention_rows(b: TableBuilder, *, group: str, what: str, path: str | None, repeat: int | str,
                    variant: str, options: dict, bias: bool, kv: str = "d", note: str = "") -> None:
    """Rows of one MultiHeadAttention: the variant's query/key side, then V and the output O.

    `options` are those the model gives this layer's variant (none for cross-attention, as DecoderLayer builds it).
    """
    import torch

    from attnlab.modules.variants import build_variant

    # The variant's own checks of its options (a misspelt option, a "yes" for freeze...): built with the arguments
    # MultiHeadAttention gives it, on the meta device (no memory), so a model build_model refuses has no table.
    block = b.value("n") if "n" in b.symbols else None
    with torch.device("meta"):
        built = build_variant(variant, d_model=b.value("d"), n_heads=b.value("h"), kv_dim=b.value(kv),
                              bias=bias, block_size=block, **options)
    if variant in VARIANT_ROWS:
        parts = VARIANT_ROWS.get(variant)(bias=bias, kv=kv, options=options)
    else:  # a variant registered without accounting: count the built instance
        b.row(group, f"{what} {variant} scores", None, repeat=repeat, modules=_at(path, "scores"),
              note="no closed form registered: counted from the module",
              count=sum(p.numel() for p in built.parameters()))
        parts = []
    for i, (label, formula, attr, part_note) in enumerate(parts):
        b.row(group, f"{what} {label}", formula, repeat=repeat, modules=_at(path, attr),
              note="; ".join(x for x in (part_note, note if i == 0 else "") if x))
    b.row(group, f"{what} V", _linear(kv, "d", bias), repeat=repeat, modules=_at(path, "v_proj"))
    b.row(group, f"{what} O (output)", _linear("d", "d", bias), repeat=repeat, modules=_at(path, "out_proj"))


def _layer_symbols(b: TableBuilder, spec: Any) -> None:
    """d, d_ff, h, d_h and (when set) n from a LayerSpec."""
    b.symbol("d", spec.d_model, "model width (d_model)")
    b.symbol("d_ff", spec.d_ff, "feed-forward width")
    b.symbol("h", spec.n_heads, "attention heads")
    b.symbol("d_h", spec.d_model // spec.n_heads, "head width d/h")
    if spec.block_size is not None:
        b.symbol("n", spec.block_size, "longest sequence (max_len / block_size)")


def _ff_formula(bias: bool) -> str:
    return "2·d·d_ff + d_ff + d" if bias else "2·d·d_ff"


def _encoder_layer_rows(b: TableBuilder, spec: Any, *, group: str, path: str | None, repeat: int | str,
                        causal: bool = False) -> None:
    """Rows of an attnlab EncoderLayer (self-attention, feed-forward, two LayerNorms)."""
    what = "masked self-attention" if causal else "self-attention"
    _attention_rows(b, group=group, what=what, path=_sub(path, "self_attn"), repeat=repeat,
                    variant=spec.attention, options=dict(spec.attention_options), bias=spec.bias)
    b.row(group, "feed-forward (W1, b1, W2, b2)" if spec.bias else "feed-forward (W1, W2)",
          _ff_formula(spec.bias), repeat=repeat, modules=_at(path, "ff"))
    b.row(group, "2 LayerNorms (γ, β)", "2·(2·d)", repeat=repeat,
          modules=_at(path, "attn_block.norm") + _at(path, "ff_block.norm"))


def _decoder_layer_rows(b: TableBuilder, spec: Any, *, group: str, path: str | None,
                        repeat: int | str) -> None:
    """Rows of an attnlab DecoderLayer (masked self-attention, cross-attention, feed-forward, 3 norms)."""
    from attnlab.modules.variants import VARIANTS

    _attention_rows(b, group=group, what="masked self-attention", path=_sub(path, "self_attn"),
                    repeat=repeat, variant=spec.attention, options=dict(spec.attention_options),
                    bias=spec.bias)
    supported = spec.attention in VARIANTS and VARIANTS.get(spec.attention).supports_cross
    cross = spec.attention if supported else "dot"
    note = "" if supported else f"dot scores: {spec.attention} cannot attend to another sequence"
    _attention_rows(b, group=group, what="cross-attention", path=_sub(path, "cross_attn"), repeat=repeat,
                    variant=cross, options={}, bias=spec.bias, note=note)
    b.row(group, "feed-forward (W1, b1, W2, b2)" if spec.bias else "feed-forward (W1, W2)",
          _ff_formula(spec.bias), repeat=repeat, modules=_at(path, "ff"))
    b.row(group, "3 LayerNorms (γ, β)", "3·(2·d)", repeat=repeat,
          modules=_at(path, "self_block.norm") + _at(path, "cross_block.norm") + _at(path, "ff_block.norm"))


# --------------------------------------------------------------------------------------------------
# Position schemes
# --------------------------------------------------------------------------------------------------

PositionRows = Callable[[TableBuilder, dict], list[Part]]
POSITION_ROWS: Registry[PositionRows] = Registry("position scheme (parameter accounting)")
_FIXED_POSITIONS = {
    "none": "no position information",
    "sinusoidal": "fixed sinusoids added to the embeddings: a buffer, not a parameter",
    "rotary": "fixed rotations of queries and keys: no parameters",
    "alibi": "fixed linear score penalties: no parameters",
}
for _name, _note in _FIXED_POSITIONS.items():
    POSITION_ROWS.add(_name, lambda b, options, _note=_note: [("", "0", "", _note)])


@POSITION_ROWS.register("learned")
def _learned_rows(b: TableBuilder, options: dict) -> list[Part]:
    return [("", "n·d", "embedding", "one learned vector per absolute position")]


@POSITION_ROWS.register("relative")
def _shaw_rows(b: TableBuilder, options: dict) -> list[Part]:
    b.symbol("K", options["max_distance"], "relative positions: largest distance kept (max_distance)")
    return [("", "(2·K + 1)·d_h", "embedding", "Shaw relative keys; shared by the heads and layers")]


@POSITION_ROWS.register("t5-bias")
def _t5_rows(b: TableBuilder, options: dict) -> list[Part]:
    b.symbol("n_b", options["num_buckets"], "relative-position buckets (num_buckets)")
    return [("", "n_b·h", "embedding", "one scalar per bucket and head; shared by the layers")]


def _position_options(name: str, options: dict) -> dict:
    """The scheme's options with its constructor's defaults filled in."""
    from attnlab.modules.positions import POSITIONS

    sig = inspect.signature(POSITIONS.get(name).__init__)
    out = {k: p.default for k, p in sig.parameters.items() if p.default is not inspect.Parameter.empty}
    out.update(options)
    return out


def _position_rows(b: TableBuilder, name: str, options: dict, stacks: list[tuple[str, str | None, bool]], *,
                   build_args: dict) -> None:
    """Rows of the model's position scheme(s); `stacks` are (label, module path, causal) of each instance, which
    the model builds with `build_args` and its own causal flag (a seq2seq target stack is causal, its source not)."""
    import torch

    from attnlab.modules.positions import build_position

    # The scheme's own checks of its options (a negative max_distance, too few buckets for a causal stack...), for
    # every stack: no table of counts for a model that could not be built. One position: sinusoidal and rotary
    # tables are computed on the CPU even under meta.
    with torch.device("meta"):
        for _, _, causal in stacks:
            build_position(name, **{**build_args, "max_len": 1, "causal": causal}, **options)
    group = "embeddings"
    if name in POSITION_ROWS:
        parts = POSITION_ROWS.get(name)(b, _position_options(name, options))
        if all(formula == "0" for _, formula, _, _ in parts):
            b.row(group, f"positions ({name})", "0", note=parts[0][3])
            return
        for label, path, _ in stacks:
            for part, formula, attr, note in parts:
                b.row(group, " ".join(x for x in (f"{label} positions ({name})".strip(), part) if x), formula,
                      note=note, modules=_at(path, attr))
        return
    for label, path, causal in stacks:
        with torch.device("meta"):  # its parameters' sizes only: a table of max_len rows is not allocated
            built = build_position(name, **{**build_args, "causal": causal}, **options)
        b.row(group, f"{label} positions ({name})".strip(), None, modules=_at(path),
              note="no closed form registered: counted from the module",
              count=sum(p.numel() for p in built.parameters()))


def _position_assumption(b: TableBuilder, name: str, tables: str = "") -> str:
    if name in _FIXED_POSITIONS:
        return f"positions: {name}, {_FIXED_POSITIONS[name]}"
    notes = [r.note for r in b.rows if r.group == "embeddings" and f"({name})" in r.component]
    detail = f", {notes[0]}" if notes and notes[0] else ""
    return f"positions: {name}{detail}" + (f"; {tables}" if tables and len(notes) > 1 else "")


def _norm_assumption(norm: str, final_norm: bool, where: str = "the stack") -> str:
    if norm == "post":
        final = f"and a final LayerNorm after {where}" if final_norm \
            else "no final LayerNorm (a post-norm layer already ends in one)"
        return f"norms: post-norm, a LayerNorm after each sublayer; {final}"
    final = f"a final LayerNorm after {where}" if final_norm else "no final LayerNorm"
    return f"norms: pre-norm, a LayerNorm before each sublayer; {final}"


def _attention_assumption(spec: Any) -> str:
    text = {
        "dot": "separate Q, K, V and output projections per layer",
        "bilinear": "per head one merged d×d matrix W_QK in place of W_Q and W_K, plus V and output",
        "synthesizer-dense": "scores from the query token (W1, W2, b2), plus V and output projections",
        "synthesizer-random": "a learned n×n score table per head, plus V and output projections",
    }.get(spec.attention, "its own query/key parameters, plus V and output projections")
    return f"attention: {spec.attention}: {text}"


def _bias_assumption(bias: bool) -> str:
    return ("biases on every attention and feed-forward projection; every LayerNorm has a gain and a bias"
            if bias else "no biases on attention and feed-forward projections; "
                         "LayerNorms keep their gain and bias")


# --------------------------------------------------------------------------------------------------
# Model families
# --------------------------------------------------------------------------------------------------

FamilyRows = Callable[[Any, TableBuilder], None]
FAMILY_ACCOUNTS: Registry[FamilyRows] = Registry("model family (parameter accounting)")


@FAMILY_ACCOUNTS.register("seq2seq")
def _seq2seq(c: Any, b: TableBuilder) -> None:
    """The encoder-decoder Transformer (attnlab.models.transformer)."""
    spec = c.layer_spec()
    _layer_symbols(b, spec)
    b.symbol("N_enc", c.n_encoder_layers, "encoder layers")
    b.symbol("N_dec", c.n_decoder_layers, "decoder layers")
    if c.share_embeddings:
        v_src = v_tgt = b.symbol("V", c.src_vocab_size, "vocabulary, shared by source and target")
    else:
        v_src = b.symbol("V_src", c.src_vocab_size, "source vocabulary")
        v_tgt = b.symbol("V_tgt", c.tgt_vocab_size, "target vocabulary")

    # Embeddings: one matrix per distinct nn.Parameter; sharing noted where it happens.
    if c.share_embeddings:
        shared_by = "source and target embeddings" + (" and the output projection" if c.tie_output else "")
        b.row("embeddings", "token embedding (shared)", f"{v_src}·d", modules=["src_embed.token"],
              note=f"one matrix: {shared_by}; counted once")
    else:
        b.row("embeddings", "source token embedding", f"{v_src}·d", modules=["src_embed.token"])
        b.row("embeddings", "target token embedding" + (" (tied)" if c.tie_output else ""), f"{v_tgt}·d",
              modules=["tgt_embed.token"],
              note="also the output projection; counted once" if c.tie_output else "")
    _position_rows(b, c.position, dict(c.position_options),
                   [("source", "src_position", False), ("target", "tgt_position", True)],
                   build_args=dict(d_model=c.d_model, n_heads=c.n_heads, max_len=c.max_len))

    _encoder_layer_rows(b, spec, group="encoder", path="encoder.layers.*", repeat="N_enc")
    if c.has_final_norm:
        b.row("encoder", "final LayerNorm", "2·d", modules=["encoder.norm"])
    _decoder_layer_rows(b, spec, group="decoder", path="decoder.layers.*", repeat="N_dec")
    if c.has_final_norm:
        b.row("decoder", "final LayerNorm", "2·d", modules=["decoder.norm"])

    if c.tie_output:
        b.row("output", "pre-softmax projection (tied)", "0",
              note="the target token embedding matrix: counted in embeddings")
        if c.output_bias:
            b.row("output", "output bias", v_tgt, modules=["lm_head.bias"])
    else:
        b.row("output", "pre-softmax projection", _linear("d", v_tgt, c.output_bias), modules=["lm_head"])

    # Assumptions, in the order a reader checks them against the paper.
    if c.share_embeddings:
        b.assume(f"vocabulary: V = {c.src_vocab_size:,}, one vocabulary shared by source and target")
    else:
        b.assume(f"vocabulary: V_src = {c.src_vocab_size:,} and V_tgt = {c.tgt_vocab_size:,} "
                 "(separate vocabularies)")
    tied = {(True, True): "source embedding = target embedding = pre-softmax projection: one matrix, "
                          "counted once",
            (True, False): "source and target embeddings are one matrix (counted once); the pre-softmax "
                           "projection has its own",
            (False, True): "separate source and target embeddings; the pre-softmax projection is the "
                           "target embedding (counted once)",
            (False, False): "nothing shared: source embedding, target embedding and pre-softmax "
                            "projection are three matrices"}
    b.assume(f"sharing: {tied[(c.share_embeddings, c.tie_output)]}")
    b.assume(f"biases: {_bias_assumption(c.bias)}; "
             f"{'a' if c.output_bias else 'no'} bias on the pre-softmax projection")
    b.assume(_norm_assumption(c.norm, c.has_final_norm, "each stack"))
    b.assume(_attention_assumption(spec))
    b.assume(_position_assumption(b, c.position, "one for the source and one for the target"))


@FAMILY_ACCOUNTS.register("gpt")
def _gpt(c: Any, b: TableBuilder) -> None:
    """Decoder-only GPT (attnlab.models.gpt): pre-norm causal blocks, final LayerNorm, tied LM head."""
    spec = c.layer_spec()
    _layer_symbols(b, spec)
    b.symbol("N", c.n_layers, "layers")
    b.symbol("V", c.vocab_size, "vocabulary")
    tied = c.tie_embeddings
    final_norm = c.norm == "pre"  # as GPT builds its stack
    b.row("embeddings", "token embedding" + (" (tied)" if tied else ""), "V·d", modules=["embed.token"],
          note="also the LM head; counted once" if tied else "")
    _position_rows(b, c.position, dict(c.position_options), [("", "position", True)],
                   build_args=dict(d_model=c.d_model, n_heads=c.n_heads, max_len=c.block_size))
    _encoder_layer_rows(b, spec, group="blocks", path="blocks.layers.*", repeat="N", causal=True)
    if final_norm:
        b.row("blocks", "final LayerNorm", "2·d", modules=["blocks.norm"])
    if tied:
        b.row("head", "LM head (tied)", "0", note="the token embedding matrix: counted in embeddings")
    else:
        b.row("head", "LM head", _linear("d", "V", False), modules=["lm_head"])
    b.assume(f"vocabulary: V = {c.vocab_size:,}; context n = {c.block_size:,}")
    b.assume("sharing: " + ("the LM head is the token embedding matrix (counted once)" if tied
                            else "the LM head has its own matrix"))
    b.assume(f"biases: {_bias_assumption(c.bias)}; no bias on the LM head")
    b.assume(_norm_assumption(c.norm, final_norm))
    b.assume(_attention_assumption(spec) + f"; d_ff = {c.ff_width:,}")
    b.assume(_position_assumption(b, c.position))


@FAMILY_ACCOUNTS.register("encoder")
def _encoder(c: Any, b: TableBuilder) -> None:
    """Encoder-only model with an LM or a classification head (attnlab.models.encoder)."""
    spec = c.layer_spec()
    _layer_symbols(b, spec)
    b.symbol("N", c.n_layers, "layers")
    b.symbol("V", c.vocab_size, "vocabulary")
    b.row("embeddings", "token embedding", "V·d", modules=["embed.token"])
    _position_rows(b, c.position, dict(c.position_options), [("", "position", c.is_causal)],
                   build_args=dict(d_model=c.d_model, n_heads=c.n_heads, max_len=c.max_len))
    _encoder_layer_rows(b, spec, group="encoder", path="encoder.layers.*", repeat="N", causal=c.is_causal)
    if c.has_final_norm:
        b.row("encoder", "final LayerNorm", "2·d", modules=["encoder.norm"])
    if c.head == "lm":
        b.row("head", "LM head (Linear d → V)", _linear("d", "V", True), modules=["head.proj"],
              note="its own matrix, not tied to the embedding")
        b.assume(f"head: language model, Linear({c.d_model}, {c.vocab_size}) with a bias, not tied")
    else:
        b.symbol("C", c.n_classes, "classes")
        b.row("head", f"classifier (Linear d → C, {c.pooling} pooling)", _linear("d", "C", True),
              modules=["head.proj"])
        b.assume(f"head: classification, {c.pooling} pooling then Linear({c.d_model}, {c.n_classes}) "
                 "with a bias")
    b.assume(f"vocabulary: V = {c.vocab_size:,}")
    b.assume(f"biases: {_bias_assumption(c.bias)}")
    b.assume(_norm_assumption(c.norm, c.has_final_norm))
    b.assume(_attention_assumption(spec) + ("; causal mask" if c.is_causal else ""))
    b.assume(_position_assumption(b, c.position))


@FAMILY_ACCOUNTS.register("bert")
def _bert(c: Any, b: TableBuilder) -> None:
    """BERT (attnlab.models.bert): token + position + segment embeddings and a LayerNorm, post-norm
    layers, then the pooler and the heads that `heads` selects."""
    spec = c.layer_spec()
    _layer_symbols(b, spec)
    b.symbol("N", c.n_layers, "layers")
    b.symbol("V", c.vocab_size, "vocabulary (WordPiece)")
    mlm = c.heads == "pretraining"
    tied = mlm and c.tie_output
    b.row("embeddings", "token embedding" + (" (tied)" if tied else ""), "V·d", modules=["embeddings.token"],
          note="also the MLM decoder; counted once" if tied else "")
    _position_rows(b, c.position, dict(c.position_options), [("", "embeddings.position", c.causal)],
                   build_args=dict(d_model=c.d_model, n_heads=c.n_heads, max_len=c.max_len))
    if c.type_vocab_size:
        b.symbol("n_seg", c.type_vocab_size, "segment types (type_vocab_size)")
        b.row("embeddings", "segment embedding", "n_seg·d", modules=["embeddings.segment"])
    b.row("embeddings", "embedding LayerNorm", "2·d", modules=["embeddings.norm"])
    _encoder_layer_rows(b, spec, group="encoder", path="encoder.layers.*", repeat="N", causal=c.causal)
    if c.has_pooler:
        b.row("heads", "pooler (Linear d → d, tanh)", _linear("d", "d", True), modules=["pooler.dense"])
    if mlm:
        b.row("heads", "MLM transform (Linear d → d)", _linear("d", "d", True), modules=["mlm.dense"])
        b.row("heads", "MLM LayerNorm", "2·d", modules=["mlm.norm"])
        if tied:
            b.row("heads", "MLM decoder bias", "V", modules=["mlm.decoder.bias"],
                  note="the decoder's weight is the token embedding: counted in embeddings")
        else:
            b.row("heads", "MLM decoder (Linear d → V)", _linear("d", "V", True), modules=["mlm.decoder"])
        if c.nsp:
            b.row("heads", "NSP classifier (Linear d → 2)", "d·2 + 2", modules=["nsp"])
    if c.heads == "classification":
        b.symbol("C", c.n_classes, "classes")
        b.row("heads", "classifier (Linear d → C)", _linear("d", "C", True), modules=["classifier"])
    segments = f"{c.type_vocab_size} segment types" if c.type_vocab_size else "no segment embeddings"
    b.assume(f"vocabulary: V = {c.vocab_size:,}; {segments}")
    heads = {"pretraining": "masked-LM head" + (" and next-sentence head" if c.nsp else ""),
             "classification": f"a {c.n_classes}-class classifier on the pooled [CLS] state",
             "none": "none (the encoder's hidden states)"}[c.heads]
    b.assume(f"heads: {heads}" + ("; pooler present" if c.has_pooler else "; no pooler"))
    if mlm:
        b.assume("sharing: " + ("the MLM decoder is the token embedding matrix (counted once), with its own "
                                "bias" if tied else "the MLM decoder has its own matrix"))
    b.assume(f"biases: {_bias_assumption(spec.bias)}")
    b.assume("norms: post-norm layers, a LayerNorm after the embeddings, no final LayerNorm")
    b.assume(_attention_assumption(spec) + ("; causal mask (left-to-right ablation)" if c.causal else ""))
    b.assume(_position_assumption(b, c.position))


def _counted_rows(config: Config, b: TableBuilder) -> None:
    """Fallback for a family with no accounting function: one row per top-level module of a built model."""
    from attnlab.models.registry import build_model

    groups: dict[str, list[tuple[str, nn.Parameter]]] = {}
    for name, p in build_model(config).named_parameters():  # a tied parameter appears once
        groups.setdefault(name.split(".")[0], []).append((name, p))
    for top, params in groups.items():
        b.row("modules", top, None, modules=[n for n, _ in params], count=sum(p.numel() for _, p in params),
              note="no closed form registered for this family: counted from the built model")
    b.assume("counted from a built model: register an accounting function in FAMILY_ACCOUNTS for formulas")


# --------------------------------------------------------------------------------------------------
# Published figures
# --------------------------------------------------------------------------------------------------


_VASWANI = ("transformer-base", "transformer-big")  # Table 3 gives both counts, rounded to millions


def _implied_v(table: ParamTable, ref: int) -> float:
    """The vocabulary that would make `table` count `ref` (V + gap / d: not a whole number in general)."""
    return table.symbols["V"].value + (ref - table.total) / table.symbols["d"].value


def _implied_vocabulary(table: ParamTable, ref: int) -> str:
    """Explain a gap to a published count of a Transformer whose one vocabulary matrix is counted once.

    Vaswani et al. round both models' counts (65M, 213M); read as exact, each implies its own vocabulary, and the
    two differ by more than the rounding allows (±0.5M is about ±977 rows at d = 512, ±488 at d = 1024), so the
    note gives both: the gap is not the vocabulary alone.
    """
    from attnlab.models.registry import get_preset

    if "V" not in table.symbols or "d" not in table.symbols:
        return ""
    v, d = table.symbols["V"].value, table.symbols["d"].value
    gap = ref - table.total
    implied = {n: _implied_v(count_parameters(get_preset(n)[1]), REFERENCES[n].value) for n in _VASWANI}
    each = "; ".join(f"{REFERENCES[n].shown}: V ≈ {implied[n]:,.0f}" for n in _VASWANI)
    own = _implied_v(table, ref)
    return (f"The paper states its shared BPE vocabulary as 'about 37000 tokens' and rounds; we assume "
            f"V = {v:,} exactly, one matrix for both embeddings and the pre-softmax projection. The gap "
            f"({gap:+,}) is ≈ {abs(gap) / d:,.1f} embedding rows of width {d}, as if V ≈ {own:,.0f}; but the "
            f"paper's counts are rounded to millions and, even allowing for that, imply different vocabularies "
            f"({each}), so the gap is not V alone")


_GPT2_NOTE = ("OpenAI's released GPT-2 small has 124,439,808 parameters, as ours; its gpt-2 repository "
              "later relabelled the model 124M, correcting the paper's count")


def _bert_note(table: ParamTable) -> str:
    heads = sum(r.total for r in table.rows if r.group == "heads" and not r.component.startswith("pooler"))
    return (f"The paper rounds: without the pretraining heads (MLM transform, LayerNorm and bias; NSP: "
            f"{heads:,}) our count is {table.total - heads:,}, the size of HF BertModel; both round to 110M")


REFERENCES: dict[str, Reference] = {
    "gpt2-small": Reference("Radford et al. 2019, Table 2", 117_000_000, "117M", lambda t: _GPT2_NOTE),
    "bert-base": Reference("Devlin et al. 2019", 110_000_000, "110M", _bert_note),
    "transformer-base": Reference("Vaswani et al. 2017, Table 3", 65_000_000, "65M",
                                  lambda t: _implied_vocabulary(t, 65_000_000)),
    "transformer-big": Reference("Vaswani et al. 2017, Table 3", 213_000_000, "213M",
                                 lambda t: _implied_vocabulary(t, 213_000_000)),
}


def _reference_for(config: Config) -> Reference | None:
    """A published figure applies only when the config is exactly the preset it was published for."""
    from attnlab.models.registry import get_preset, preset_names

    names = preset_names()
    for name, ref in REFERENCES.items():
        if name in names and get_preset(name)[1] == config:
            return ref
    return None


# --------------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------------


def count_parameters(config: Config, *, name: str | None = None) -> ParamTable:
    """Exact parameter accounting of the model `config` describes, without building it.

    Args:
        config: a model config of any registered family.
        name: what to call the model in the table (default: the family name).

    Returns:
        A ParamTable whose `total` equals `sum(p.numel() for p in build_model(config).parameters())`.
        A family with no registered accounting function is counted from a built model instead.
    """
    from attnlab.models.registry import family_of

    family = family_of(config)
    b = TableBuilder()
    if family in FAMILY_ACCOUNTS:
        FAMILY_ACCOUNTS.get(family)(config, b)
    else:
        _counted_rows(config, b)
    b.assume("counted: every nn.Parameter once (frozen ones too, as model.parameters() does); "
             "buffers such as sinusoid tables and masks are not parameters")
    return ParamTable(model=name or family, family=family, rows=b.rows, symbols=b.symbols,
                      assumptions=b.assumptions, reference=_reference_for(config))


def _expand(path: str, index: int) -> str:
    return path.replace("*", str(index))


def _lookup(model: nn.Module, path: str) -> list[nn.Parameter]:
    try:
        return list(model.get_submodule(path).parameters())
    except AttributeError:
        return [model.get_parameter(path)]


def check_table(table: ParamTable, model: nn.Module) -> list[str]:
    """Compare a table with a built model; return the disagreements (an empty list when it is exact).

    Checks the total against `model.parameters()` and, for rows that name modules: each instance's
    parameter count equals the row's formula, and the rows cover every parameter exactly once.
    """
    problems = []
    actual = sum(p.numel() for p in model.parameters())
    if table.total != actual:
        problems.append(f"total: table {table.total:,} != model {actual:,}")
    if not all(r.modules or r.per_instance == 0 for r in table.rows):
        return problems  # rows without module paths: the total is all that can be checked
    covered: dict[int, str] = {}
    for r in table.rows:
        for i in range(r.repeat if any("*" in m for m in r.modules) else 1):
            try:
                params = [p for m in r.modules for p in _lookup(model, _expand(m, i))]
            except AttributeError as e:
                problems.append(f"{r.group} / {r.component}: {e}")
                continue
            got = sum(p.numel() for p in params)
            if got != r.per_instance:
                problems.append(f"{r.group} / {r.component} [{i}]: formula {r.formula} = {r.per_instance:,}"
                                f" but the module has {got:,}")
            for p in params:
                if id(p) in covered:
                    problems.append(f"{r.group} / {r.component}: parameter also counted in {covered[id(p)]}")
                covered[id(p)] = f"{r.group} / {r.component}"
    missing = [n for n, p in model.named_parameters() if id(p) not in covered]
    if missing:
        problems.append(f"parameters in no row: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    return problems


RUN_CONFIG_SUFFIXES = (".toml", ".yaml", ".yml")  # `attnlab train` configs: no model without their data


def _model_file(folder: Path) -> Path | None:
    """The config.json of a checkpoint folder, or of a run folder holding checkpoint/ (or best/), or the `.old` copy
    a crash between a save's two renames left in their place (which generate and evaluate read); None if none."""
    from attnlab.training.checkpoint import checkpoint_in_place

    folders = (folder, checkpoint_in_place(folder / "checkpoint"), checkpoint_in_place(folder / "best"))
    return next((f / "config.json" for f in folders if (f / "config.json").is_file()), None)


def _holds_model(name: str) -> bool:
    """Whether `name`, read as a path, is a folder holding a model (one params could count as `./NAME`)."""
    return Path(name).is_dir() and _model_file(Path(name)) is not None


def load_config(name: str) -> tuple[str, Config]:
    """A preset name, or a run folder (or its config.json) -> (display name, config).

    A name without a folder separator that is a preset's is the preset, also where a folder of that name is in the
    working directory (a warning says so when the folder holds a model): `./NAME` names the folder.

    Raises:
        ConfigError: unknown preset (the message lists them), a path that does not exist, a run config (TOML or
            YAML: its vocabulary comes from the data), or a folder without a usable config.json.
    """
    display, config, _ = _load(name)
    return display, config


def _load(name: str) -> tuple[str, Config, Path | None]:
    """`load_config`, and the file the config came from (None for a preset)."""
    from attnlab.models.registry import config_from_dict, get_preset, preset_names
    from attnlab.training.checkpoint import hf_config_message, runs_inside

    presets = ", ".join(preset_names())
    if not name.strip():  # Path("") is the working directory
        raise ConfigError(f"the model name is empty; give a preset name ({presets}) or a run folder")
    path = Path(name)
    bare = not re.search(r"[/\\]", name)
    if bare and name in preset_names():
        if _holds_model(name):
            warnings.warn(f"{name} is a preset and also a folder here holding a model; this is the preset's count: "
                          f"give ./{name} for the folder's", stacklevel=3)
        return name, get_preset(name)[1], None
    suffix = path.suffix.lower()
    if path.is_dir() or suffix in (".json", *RUN_CONFIG_SUFFIXES) or not bare:
        if not path.exists():
            raise ConfigError(f"{name} does not exist: no config.json to read; give a preset name ({presets}) or a "
                              "run folder")
        if path.is_file() and suffix in RUN_CONFIG_SUFFIXES:
            raise ConfigError(f"{name} is a run config: params takes a preset name (attnlab params --list) or a "
                              f"trained run folder, not a run config (the data decide its vocabulary); "
                              f"`attnlab train {name}` writes the run folder (its train.out_dir)")
        file = path
        if path.is_dir():  # a checkpoint folder, or a run folder holding checkpoint/ (or best/)
            file = _model_file(path) or path / "config.json"
        if not file.is_file() and path.is_dir() and (runs := runs_inside(path)):
            raise ConfigError(f"{name} holds no model itself but the runs {runs}; give one of them")
        if not file.is_file():
            raise ConfigError(f"{name}: no config.json there; give a preset name ({presets}) or a run folder")
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as e:  # ValueError: not UTF-8 or JSON, a 4,300-digit number
            raise ConfigError(f"{file}: not a readable JSON config ({one_line(e)}); give a run or checkpoint folder "
                              "written by attnlab, or a preset name (attnlab params --list)") from None
        if isinstance(data, dict) and "family" not in data and isinstance(data.get("model"), dict):
            # A run's description (run.json: {"model": ..., "data": ..., "train": ...}) keeps the [model] table as
            # written, without what the data decided (a table naming its family was counted with the default
            # vocabulary of 65); a {"model": <a whole model config>} file gives the model itself.
            describes_run = file.name == "run.json" or "data" in data or "family" not in data["model"]
            if describes_run:
                raise ConfigError(f"{file} describes a run, not a model; give its run folder "
                                  f"({str(file.parent)!r}): the checkpoint's config.json is the trained model's")
            data = data["model"]
        hf = hf_config_message(file, data, "count that")
        if hf is not None:
            raise ConfigError(hf)
        if not isinstance(data, dict) or "family" not in data:  # e.g. a tokenizer.json or trainer_state.json
            raise ConfigError(f"{file} is not a model config (a JSON object with a 'family' key, as a checkpoint's "
                              "config.json); give a run or checkpoint folder written by attnlab, or a preset name "
                              "(attnlab params --list)")
        try:
            config = config_from_dict(data)[1]
        except ConfigError as e:  # name the file, as generate and evaluate do: the setting is in it
            raise ConfigError(f"{file}: {e}") from None
        if file.name == "config.json" and (file.parent / "model.safetensors").is_file():
            from attnlab.training.checkpoint import check_weights_fit_config

            # the count is of the weights the folder holds: a config.json of another run is refused, not counted
            check_weights_fit_config(file.parent)
        return name, config, file  # as typed: ./gpt-char-tiny, a folder, not the preset of that name
    try:
        return name, get_preset(name)[1], None
    except ConfigError as e:
        raise ConfigError(f"{e} (or give a run folder containing config.json)") from None


def preset_counts() -> list[tuple[str, str, int | None]]:
    """(preset, family, total parameters) for every preset; None where the accounting failed."""
    from attnlab.models.registry import family_of, get_preset, preset_names

    out = []
    for name in preset_names():
        _, config = get_preset(name)
        family = family_of(config)
        try:
            total = count_parameters(config, name=name).total if family in FAMILY_ACCOUNTS else None
        except (AttributeError, KeyError, TypeError, ValueError):
            total = None  # an accounting function out of step with its family's config
        out.append((name, family, total))
    return out


def params_command(name: str | None, as_json: bool = False, list_all: bool = False) -> None:
    """`attnlab params NAME`: print the parameter table of a preset or a run folder.

    Args:
        name: a preset name, a run or checkpoint folder (or its config.json); None or `list`: as `list_all`. A
            name without a `/` that is a preset's, or `list`, means that even where a folder of that name is in the
            working directory (a warning says so when the folder holds a model): `./NAME` names the folder. A run
            config (.toml, .yaml, .yml) is refused: its vocabulary comes from the data; give the run folder
            `attnlab train` writes from it.
        as_json: print one JSON object (rows, total, symbols, assumptions, reference) instead.
        list_all: print every preset with its family and parameter count; refused with a name.

    Raises:
        ConfigError: unknown preset, a path that does not exist, an unreadable config, a setting the model refuses
            (naming the config file), or a name with `list_all` (the CLI prints it as one line, exit 2).
    """
    if list_all and name is not None:
        raise ConfigError(f"give a model name or --list, not both: drop --list to count {name}, or {name} to list "
                          "every preset")
    if list_all or name in (None, "list"):
        if name == "list" and _holds_model(name):
            warnings.warn("list lists the presets, and is also a folder here holding a model: give ./list to count "
                          "the folder's", stacklevel=2)
        presets = preset_counts()
        if as_json:
            print(json.dumps([{"name": n, "family": f, "total": t} for n, f, t in presets], indent=2))
            return
        w = max((len(n) for n, _, _ in presets), default=0)
        wf = max((len(f) for _, f, _ in presets), default=0)
        for n, f, t in presets:
            count = f"{t:>13,}  {_short(t)}" if t is not None else f"{'?':>13}"
            print(f"{n.ljust(w)}  {f.ljust(wf)}  {count}")
        return
    display, config, file = _load(name)
    try:
        table = count_parameters(config, name=display)
    except ConfigError as e:  # a setting only building refuses (max_distance 0, an odd width...): it is in the file
        if file is None:
            raise
        raise ConfigError(f"{file}: {e}") from None
    # JSON escapes its non-ASCII characters (the formulas' · and ×): valid in any output encoding.
    print(json.dumps(table.to_dict(), indent=2) if as_json else table.render())
