"""A training run described by one config file: `[model]`, `[data]` and `[train]` tables.

    [model]
    family = "gpt"             # or start from a preset: preset = "gpt-char-small"
    d_model = 128
    position = "rotary"

    [data]
    task = "lm"                # lm | classification | translation | mlm
    path = "my_text.txt"       # omitted: the embedded corpus (Python's own pydoc help texts)
    tokenizer = "char"

    [train]
    steps = 2000
    out_dir = "runs/gpt-char"

`attnlab train CONFIG --set model.position=alibi --set train.lr=1e-3` loads, overrides, validates
(unknown keys and bad values fail with one line naming the allowed ones), prepares the data, builds
the model sized to the tokenizer, and hands everything to the one `Trainer`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import itertools
import json
import math
import os
import re
import shutil
import socket
import sys
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.config import Config, check_choice, check_positive, is_unset
from attnlab.errors import AttnlabError, CheckpointError, ConfigError, DataError, UnknownToken, a_name, one_line
from attnlab.files import LOCK_FILE, expand_home, folder_lock, make_folder, write_text_atomic
from attnlab.training.logging import RUN_FILE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TASKS = ("lm", "classification", "translation", "mlm")
TASK_FAMILIES = {"lm": ("gpt", "encoder"), "classification": ("encoder", "bert"), "translation": ("seq2seq",),
                 "mlm": ("bert",)}
TOKENIZER_KINDS = ("char", "word", "bpe", "wordpiece")


BUCKETED_TASKS = ("translation", "classification", "mlm")  # tasks of padded batches, which can be sorted by length
SORTED_BY_DEFAULT = ("translation", "classification")  # and those sorted unless told not to (see DataConfig)


@dataclass
class DataConfig(Config):
    """Where the data comes from and how it becomes batches.

    Attributes:
        task: lm (next-token prediction), classification, translation, or mlm (BERT pre-training: masked
            LM on sentence pairs, with next-sentence prediction where the model has that head).
        path: lm and mlm: a UTF-8 text file (default: the embedded pydoc corpus; for mlm, documents
            separated by blank lines, one sentence per line); classification: the training TSV/CSV/JSONL
            file.
        eval_path: held-out file (lm, mlm: default the last `val_fraction` of the text or documents;
            classification: required for evaluation).
        src_path, tgt_path, eval_src_path, eval_tgt_path: translation: one sentence per line.
        text_column, label_column: classification columns (names, or 0-based indices as strings).
        tokenizer: char | word | bpe | wordpiece, trained on the training text.
        vocab_size: tokenizer vocabulary (needed for bpe/wordpiece; default: every char/word).
        block_size: lm window length (default: the model's block_size).
        max_length: longest classification/translation sequence, or mlm sentence pair.
        val_fraction: lm, mlm: share of the text kept for validation when no eval_path is given.
        mask_prob: mlm: share of the tokens masked (of those, 80 % become the mask token, 10 % a random
            token, 10 % stay).
        bucket_by_length: translation, classification and mlm: batch examples of similar (source) length
            together, as Vaswani et al. 2017 did (5.1: "batched together by approximate sequence length"), so a
            batch holds little padding (Multi30k, batches of 64: 96 % of the source tokens real, against 46 % in
            random batches; SST-2, batches of 32: 95 % against 29 %; the sentence pairs of
            configs/bert-mlm.toml 98 % against 52 %); evaluation then batches the held-out examples sorted by
            length. false: uniformly random batches, evaluation in file order. Default (unset): on for
            translation and classification, off for mlm (on configs/bert-mlm.toml sorted pairs made 1,000 steps
            87 → 62 s on 2 cores but ended at a higher loss, 4.98 → 5.08, only a little lower than random batches
            reach in the same time); lm reads full windows, with nothing to pad.
    """

    task: str = "lm"
    path: str | None = None
    eval_path: str | None = None
    src_path: str | None = None
    tgt_path: str | None = None
    eval_src_path: str | None = None
    eval_tgt_path: str | None = None
    text_column: str | None = None
    label_column: str | None = None
    tokenizer: str = "char"
    vocab_size: int | None = None
    block_size: int | None = None
    max_length: int = 128
    val_fraction: float = 0.1
    mask_prob: float = 0.15
    bucket_by_length: bool | None = None

    @property
    def batches_by_length(self) -> bool:
        """Whether the training batches are sorted by length (`bucket_by_length`, unset = the task's default)."""
        return self.bucket_by_length if self.bucket_by_length is not None else self.task in SORTED_BY_DEFAULT

    @property
    def eval_settings(self) -> str:
        """The settings that give this task's run an evaluation, as a warning of a run without one names them."""
        return {"classification": "data.eval_path",
                "translation": "data.eval_src_path and data.eval_tgt_path"}.get(self.task,
                                                                              "data.eval_path (or data.val_fraction)")

    # The settings each task reads (besides task): another one set is refused by `check_task_reads`, not ignored.
    TASK_READS = {
        "lm": ("path", "eval_path", "tokenizer", "vocab_size", "block_size", "val_fraction"),
        "mlm": ("path", "eval_path", "tokenizer", "vocab_size", "max_length", "val_fraction", "mask_prob",
                "bucket_by_length"),
        "classification": ("path", "eval_path", "text_column", "label_column", "tokenizer", "vocab_size",
                           "max_length", "bucket_by_length"),
        "translation": ("src_path", "tgt_path", "eval_src_path", "eval_tgt_path", "tokenizer", "vocab_size",
                        "max_length", "bucket_by_length"),
    }

    def check_task_reads(self) -> None:
        """Refuse a setting this task does not read (data.eval_path on a translation run trained with no
        evaluation, silently) and a blank file name (data.path = "" trained on the embedded texts)."""
        reads = self.TASK_READS[self.task]
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "task" or value == f.default:
                continue
            if f.name not in reads:
                raise ConfigError(f"data.{f.name} is not read by data.task = '{self.task}' (it reads "
                                  f"{', '.join('data.' + r for r in reads)}); drop it, or set data.task")
        if self.eval_path is not None and self.val_fraction != DataConfig.val_fraction:
            warnings.warn(f"data.val_fraction = {self.val_fraction} does nothing with data.eval_path given: the run "
                          "trains on the whole of data.path and evaluates on that file; drop one of them",
                          stacklevel=3)
        for name in ("path", "src_path", "tgt_path"):  # a blank evaluation file is none (__post_init__)
            value = getattr(self, name)
            if isinstance(value, str) and not value.strip():
                raise ConfigError(f"data.{name} is empty; give a file name"
                                  + (", or leave it out for the embedded pydoc texts" if name == "path"
                                     and self.task in ("lm", "mlm") else ""))

    def __post_init__(self):
        # --set data.eval_path="": drop a config's file; the columns, back to those the header or layout gives
        for name in ("eval_path", "eval_src_path", "eval_tgt_path", "text_column", "label_column"):
            value = getattr(self, name)
            if isinstance(value, str) and not value.strip():
                setattr(self, name, None)
        check_choice("data.task", self.task, TASKS)
        check_choice("data.tokenizer", self.tokenizer, TOKENIZER_KINDS)
        check_positive("data.max_length", self.max_length)
        for name in ("vocab_size", "block_size"):  # None: sized by the text, the model
            if getattr(self, name) is not None:
                check_positive(f"data.{name}", getattr(self, name))
        for name in ("max_length", "block_size"):  # the models' lengths derive from them (translation: + 2)
            value = getattr(self, name)
            if value is not None and value > MAX_LENGTH:
                raise ConfigError(f"data.{name} = {value:,} is beyond any sequence a model takes; give at most "
                                  f"{MAX_LENGTH:,}")
        if self.vocab_size is not None and self.vocab_size > MAX_VOCAB:
            # HF tokenizers' trainers reserve memory by it: 10**9 aborted the process in Rust (no Python error).
            raise ConfigError(f"data.vocab_size = {self.vocab_size:,} is beyond any tokenizer's needs; give at most "
                              f"{MAX_VOCAB:,} (GPT-2 has 50,257 tokens, BERT 30,522)")
        if not 0 <= self.val_fraction < 1:
            raise ConfigError(f"data.val_fraction must be in [0, 1), got {self.val_fraction}")
        if not 0 < self.mask_prob <= 1:
            raise ConfigError(f"data.mask_prob must be in (0, 1], got {self.mask_prob}")
        if self.task == "translation" and not (self.src_path and self.tgt_path):
            raise ConfigError("data.task = 'translation' needs data.src_path and data.tgt_path")
        if bool(self.eval_src_path) != bool(self.eval_tgt_path):
            given, missing = "eval_src_path", "eval_tgt_path"
            if not self.eval_src_path:
                given, missing = missing, given
            raise ConfigError(f"data.{given} is set without data.{missing}; evaluating translation needs both "
                              f"(source sentences and their references): set data.{missing} or drop data.{given}")
        if self.text_column is not None and self.text_column == self.label_column:
            raise ConfigError(f"data.text_column and data.label_column are both {self.text_column!r}, so the labels "
                              "would be read as the text; set data.text_column to the column of the texts")
        if self.bucket_by_length is not None and self.task not in BUCKETED_TASKS:
            raise ConfigError(f"data.bucket_by_length applies to data.task = 'translation', 'classification' or "
                              f"'mlm' (this run's task is '{self.task}'); drop the setting")
        if self.task == "classification" and not self.path:
            raise ConfigError("data.task = 'classification' needs data.path (a TSV, CSV or JSONL file)")
        # The least length that holds the task's special tokens and one token of text.
        least = {"mlm": (5, "[CLS] A [SEP] B [SEP]"), "translation": (2, "bos or eos and one token")}.get(self.task)
        if least is not None and self.max_length < least[0]:
            raise ConfigError(f"data.max_length = {self.max_length} is too short for data.task = '{self.task}' "
                              f"({least[1]} needs {least[0]}); raise it (the default is 128)")


@dataclass
class RunConfig:
    model: dict[str, Any]
    data: DataConfig
    train: Any  # TrainerConfig
    # train.eval_every is the default run's (no config file, no --set of it), not the user's: dropped where the run
    # holds nothing out, rather than warned of as a setting that does nothing
    default_eval_every: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"model": dict(self.model), "data": self.data.to_dict(), "train": self.train.to_dict()}


SECTIONS = ("model", "data", "train")


def parse_override(item: str) -> tuple[list[str], Any]:
    """`section.key=value` -> (["section", "key"], value); the value is read as TOML, else a string. An entry of an
    options table, `model.position_options.num_buckets=8`, -> (["model", "position_options", "num_buckets"], 8):
    it changes that entry, keeping the table's others (a whole table, `model.position_options={...}`, replaces
    it)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set model.position=rotary")
    key, raw = item.split("=", 1)
    path = key.strip().split(".")
    if len(path) == 3 and all(path) and path[1].endswith("_options"):
        return path, parse_value(raw)
    if len(path) > 2 and all(path) and path[1].endswith("_options"):  # a table's entry holds no table
        raise ConfigError(f"--set {item!r}: an options table holds single values; set one entry with "
                          f"--set {path[0]}.{path[1]}.NAME=VALUE")
    if len(path) != 2 or not all(path):
        raise ConfigError(f"--set {item!r}: the key must be section.name with section one of "
                          f"{', '.join(SECTIONS)}, e.g. train.lr=3e-4")
    return path, parse_value(raw)


def parse_value(raw: str) -> Any:
    """A command-line value read as TOML (numbers, booleans, lists, quoted strings), else as a number where a
    YAML config reads one that TOML does not (.5, 5., 1.e-3, 010), else the raw string; spaces around it are
    dropped (`--set "model.position= rotary"`)."""
    raw = raw.strip()
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):  # RecursionError: nested thousands deep
        return _yaml_number(raw)
    except ValueError as e:  # valid TOML that Python will not read: an integer of more than 4,300 digits
        raise ConfigError(f"value {raw[:12]}...: {one_line(e)}; give a smaller number") from None


def _yaml_number(raw: str) -> Any:
    """`raw` as the number or boolean a YAML config reads in it (`--set train.lr=.5` had been refused as
    "expected a number, got '.5'", where `lr: .5` in a YAML file reads; `True` likewise), else `raw` itself."""
    import yaml

    try:
        value = yaml.load(raw, Loader=_yaml_loader())  # a safe loader (see _yaml_loader)
    except (yaml.YAMLError, RecursionError, ValueError):
        return raw
    return value if isinstance(value, (int, float)) else raw  # a bool is an int


YAML_SUFFIXES = (".yaml", ".yml")


def _empty_options(section: Any) -> Any:
    """A YAML section with its options tables written with nothing under them (`position_options:`) as empty."""
    if not isinstance(section, dict):
        return section
    return {k: {} if v is None and isinstance(k, str) and k.endswith("_options") else v for k, v in section.items()}


@functools.lru_cache(maxsize=1)
def _yaml_loader() -> type:
    """PyYAML's safe loader reading plain values as YAML 1.2's core schema does, with TOML's digit separators.

    PyYAML follows YAML 1.1, which reads 3e-4 and 5e5 as strings (it wants a dot and a signed exponent,
    3.0e-4), 010 as octal 8, 1:30 as 90 (base 60), yes/no/on/off as booleans and 2024-01-05 as a date. Here
    3e-4 is a float, 010 is 10, 1_000 is 1000 (as in TOML), 0o17, 0x1F and 0b11 are octal, hexadecimal and
    binary, only true/false (True, TRUE, ...) are booleans, and the rest is text, which the settings' types then
    accept or refuse in one line."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    # The class-level table is shared with SafeLoader: a copy without its YAML 1.1 number, boolean and date rules.
    yaml_11 = {f"tag:yaml.org,2002:{name}" for name in ("int", "float", "bool", "timestamp")}
    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in rules if tag not in yaml_11]
        for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:int",
        re.compile(r"^(?:[-+]?[0-9](?:_?[0-9])*|0o[0-7](?:_?[0-7])*|0x[0-9a-fA-F](?:_?[0-9a-fA-F])*"
                   r"|0b[01](?:_?[01])*)$"),
        list("-+0123456789"))
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+
                      |[-+]?(?:[0-9][0-9_]*)\.[0-9_]*
                      |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
                      |[-+]?\.(?:inf|Inf|INF)
                      |\.(?:nan|NaN|NAN))$""", re.X),
        list("-+0123456789."))

    def integer(loader, node) -> int:
        text = loader.construct_scalar(node).replace("_", "")
        if text.startswith(("0o", "0x", "0b")):
            return int(text[2:], {"o": 8, "x": 16, "b": 2}[text[1]])
        return int(text, 10)  # "010" is ten

    Loader.add_constructor("tag:yaml.org,2002:int", integer)

    def unique_keys(loader, node, deep: bool = False) -> dict:
        # PyYAML keeps the last of a repeated key: a second `train:` section replaced the first without a word,
        # where TOML refuses the file. Keys a merge (<<) brings in may still be overridden, as YAML says.
        first: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=True)
            try:
                earlier = first.setdefault(key, key_node)
            except TypeError:  # a list or mapping as a key: refused later with the names that are not text
                continue
            if earlier is not key_node:  # on another line, or in one flow mapping: {steps: 10, steps: 20}
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice (first on line {earlier.start_mark.line + 1}); keep one",
                    key_node.start_mark)
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    Loader.construct_mapping = unique_keys
    return Loader


def _check_yaml_names(p: Path, raw: dict) -> None:
    """Every name in a YAML config is text, as in TOML (YAML reads `1:`, `true:` or `null:` as other types)."""
    stack: list[tuple[str, Any]] = [("", raw)]
    seen: set[int] = set()  # YAML aliases can make a list or mapping hold itself
    while stack:
        where, value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            if isinstance(value, dict) and not isinstance(key, str):
                raise ConfigError(f"{p}: the name {key!r} under {where or 'the top level'} is not text; "
                                  "write a setting's name (in quotes if it reads as a number, true, false or null)")
            stack.append((f"{where}.{key}" if where else str(key), item))


def _read_config_file(p: Path) -> Any:
    """A config file's contents: YAML for a .yaml or .yml file (PyYAML's safe loader: plain data, no objects),
    else TOML."""
    try:
        text = p.read_text(encoding="utf-8-sig")  # a byte-order mark (Notepad) is not TOML
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text; save the config as UTF-8") from None
    if p.suffix.lower() in YAML_SUFFIXES:
        import yaml

        try:
            raw = yaml.load(text, Loader=_yaml_loader())
        except ValueError as e:  # a value its resolvers took for a number and could not read as one
            raise ConfigError(f"{p}: invalid YAML: {one_line(e)}; quote the value") from None
        except RecursionError:  # sequences or mappings nested thousands deep
            raise ConfigError(f"{p}: invalid YAML: values nested too deeply to read; fix the file") from None
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"{p}: invalid YAML{at}: {problem}") from None
        if raw is None:
            return {}
        if not isinstance(raw, dict) or not all(isinstance(k, str) for k in raw):
            raise ConfigError(f"{p}: a YAML config is a mapping of sections (model:, data:, train:) to their "
                              "settings, as the TOML files in configs/ are tables")
        _check_yaml_names(p, raw)
        # "data:" with nothing under it: no settings; so is "position_options:" (an options table) in a section.
        return {k: {} if v is None else _empty_options(v) for k, v in raw.items()}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        if p.suffix.lower() == ".json":
            raise ConfigError(f"{p}: config files are TOML or YAML (.json is not read); write it as "
                              "[section] tables of key = value lines, as in configs/") from None
        raise ConfigError(f"{p}: invalid TOML: {e}") from None
    except ValueError as e:  # an integer of more than 4,300 digits
        raise ConfigError(f"{p}: invalid TOML: {one_line(e)}; fix the file") from None
    except RecursionError:  # arrays or tables nested thousands deep
        raise ConfigError(f"{p}: invalid TOML: values nested too deeply to read; fix the file") from None


def load_run_config(path: str | Path | None = None, overrides: list[str] | None = None, *,
                    resume: bool = False) -> RunConfig:
    """Read a TOML or YAML config (None: the built-in default run), apply `--set` overrides, validate.
    `resume`: the run will resume from its checkpoint, which then stands for model.init_from's folder."""
    from attnlab.training.trainer import TrainerConfig

    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"config file {str(p)!r} is a folder; give the path of a .toml or .yaml file "
                              "(see configs/ for examples)")
        if not p.exists():  # a pipe (<(...)) is read as a file: a config is read once
            raise ConfigError(f"config file {str(p)!r} not found; give the path of a .toml or .yaml file "
                              "(see configs/ for examples)")
        raw = _read_config_file(p)
        if not raw:
            raise ConfigError(f"config file {str(p)!r} is empty (no settings); write its [model], [data] and "
                              "[train] tables (see configs/ for examples), or run `attnlab train` without a "
                              "config for the default run")
        for section, table in raw.items():
            if section not in SECTIONS and not isinstance(table, dict):  # `steps = 2` above every table header
                from attnlab.training.trainer import TrainerConfig

                owner = next((name for name, cls in (("train", TrainerConfig), ("data", DataConfig))
                              if section in cls.field_names()), None)
                header = "'{}:' line, indented" if p.suffix.lower() in YAML_SUFFIXES else "[{}] header"
                where = f"under the {header.format(owner)}" if owner is not None else \
                    f"under the {header.format('...')} of its section ({', '.join(SECTIONS)})"
                raise ConfigError(f"{p}: the setting {section!r} is outside any section; write it {where}")
            if section in SECTIONS and not isinstance(table, dict):
                form = f"a '{section}:' line with one indented 'key: value' line per setting below it" \
                    if p.suffix.lower() in YAML_SUFFIXES else \
                    f"a [{section}] header with one key = value line per setting below it"
                raise ConfigError(f"{p}: {section} = {table!r} is not a table of settings; write {form}")
    else:
        raw = default_run()
    parsed = [parse_override(item) for item in overrides or []]
    if any(section == "model" and key == "init_from" for (section, key, *_), _ in parsed):
        raw["model"] = {}  # the architecture is the pretrained run's: only --set model.* values change it
    families = [value for (section, key, *_), value in parsed if section == "model" and key == "family"]
    if path is None and families and "preset" in raw["model"]:
        # The default run's GPT preset gives way to another family asked for (before the overrides: popped with
        # each model.family, it dropped a preset an earlier --set had given, and the family's defaults were
        # trained). Its own family keeps it, as configs/gpt-pydoc.toml (the default run written out) does.
        from attnlab.models.registry import get_preset

        if families[-1] != get_preset(raw["model"]["preset"])[0]:
            raw["model"].pop("preset")
    for (section, key, *entry), value in parsed:
        table = raw.setdefault(section, {})
        if entry:  # one entry of an options table, the file's others kept; =none drops it (the scheme's default)
            options = table.get(key)
            if options is not None and not isinstance(options, dict):
                raise ConfigError(f"--set {section}.{key}.{entry[0]}: {section}.{key} = {options!r} is not a table "
                                  f"of options; write it as one ({section}.{key} = {{{entry[0]} = ...}})")
            table[key] = {**(options or {}), entry[0]: value}
            if is_unset(value):
                del table[key][entry[0]]
        else:
            table[key] = value
    for section in raw:
        if section not in SECTIONS:
            close = difflib.get_close_matches(section, SECTIONS, n=1)
            hint = f" (did you mean [{close[0]}]?)" if close else ""
            raise ConfigError(f"unknown config section [{section}]{hint}; sections: {', '.join(SECTIONS)}")
    model = dict(raw.get("model", {}))
    if not {"family", "preset", "init_from"} & set(model):
        model["family"] = "gpt"
    data_table = dict(raw.get("data", {}))
    for key in ("text_column", "label_column"):  # a column number, given unquoted (--set data.label_column=1)
        if isinstance(data_table.get(key), int) and not isinstance(data_table[key], bool):
            data_table[key] = str(data_table[key])
    if "path" in data_table and data_table["path"] is None:  # YAML's `path:` with nothing after it: a file name left
        data_table["path"] = ""  # out, not the embedded corpus asked for (that is the key left out): refused as empty
    # A config file sees no shell: ~ there (or in --set key=~/x, which a shell leaves as it is) is the home folder,
    # not a folder named '~' in the working one.
    train_table = dict(raw.get("train", {}))
    for table, keys in ((data_table, DATA_FILE_SETTINGS), (model, ("init_from",)), (train_table, ("out_dir",))):
        table.update({key: expand_home(table[key]) for key in keys if key in table})
    data = DataConfig.from_dict(data_table, where="data")
    data.check_task_reads()  # here, not in __post_init__: a saved run's [data] is read back by `evaluate` as it was
    train = TrainerConfig.from_dict(train_table, where="train")
    if train.out_dir is None:  # a config file without train.out_dir: a folder named after the file
        if not Path(path).is_file():  # <(...): /dev/fd/63, the same name for every pipe
            raise ConfigError(f"config file {str(path)!r} is not a regular file (a pipe), so it names no run folder; "
                              "set train.out_dir in it or with --set train.out_dir=...")
        train = train.replace(out_dir=str(Path("runs") / Path(path).stem))
    resolved = _resumed_init_from(model, train.out_dir) if resume else model
    entries = {key for (section, key, *entry), _ in parsed if entry and section == "model"}
    if entries and "init_from" in resolved:
        # One entry of an options table beside init_from changes that of the pretrained run, whose other entries
        # stay (init_from leaves the file's [model] table out): the whole table restated, or refused as a change.
        saved = _init_from_config(resolved["init_from"])
        model.update({key: {**saved[key], **model[key]} for key in entries
                      if isinstance(saved.get(key), dict) and isinstance(model.get(key), dict)})
        last = {(key, entry[0]): value for (section, key, *entry), value in parsed if entry and section == "model"}
        for (key, name), value in last.items():  # =none drops the pretrained run's entry too: a change, refused
            if is_unset(value) and isinstance(model.get(key), dict):
                model[key].pop(name, None)
        resolved = _resumed_init_from(model, train.out_dir) if resume else model
    family = _validate_model_keys(resolved)
    _check_attention_with_position(resolved, family)
    if family not in TASK_FAMILIES[data.task]:
        families = " or ".join(TASK_FAMILIES[data.task])
        fix = "change model.family or model.preset"
        if "init_from" in model:
            fix = f"model.init_from names a {family} run: give it the run folder of a model of family {families}"
        raise ConfigError(f"data.task {data.task!r} needs a model of family {families}, not {family!r}; {fix}")
    return RunConfig(model=model, data=data, train=train,
                     default_eval_every=path is None and not any(key == ["train", "eval_every"] for key, _ in parsed))


def _check_attention_with_position(model: dict[str, Any], family: str) -> None:
    """The attention variant and position scheme the run will build, checked as a pair now: one that cannot work
    was refused when the model was built, after the data was read and a tokenizer trained (seconds on a large
    corpus, and warnings about the data before the one line that matters). Values of the wrong kind are left to
    the model's config, which names them."""
    from attnlab.models.registry import FAMILIES, get_preset
    from attnlab.modules.positions import POSITIONS, check_compatible
    from attnlab.modules.variants import VARIANTS

    if "init_from" in model:
        base = _init_from_config(model["init_from"])
    elif "preset" in model:
        base = get_preset(model["preset"])[1].to_dict()
    else:
        base = {f.name: f.default for f in dataclasses.fields(FAMILIES.get(family).config_cls)
                if f.default is not dataclasses.MISSING}
    values = {**base, **model}
    attention, position = values.get("attention"), values.get("position")
    options = [values.get("attention_options"), values.get("position_options")]
    if attention in VARIANTS and position in POSITIONS and all(o is None or isinstance(o, dict) for o in options):
        try:
            check_compatible(attention, position, *options)
        except ConfigError as e:  # an options table's message names its setting already
            raise ConfigError(str(e) if str(e).startswith("model.") else f"model.{e}") from None


def _resumed_init_from(model: dict[str, Any], out_dir: str) -> dict[str, Any]:
    """`model` with model.init_from naming the checkpoint in `out_dir` that a resumed run continues (when
    there is one; without, resuming is refused later with its own message)."""
    if "init_from" not in model:
        return model
    from attnlab.training.trainer import Trainer

    try:
        return {**model, "init_from": str(Trainer.checkpoint_to_resume(out_dir))}
    except CheckpointError:
        return model


def default_run() -> dict[str, Any]:
    """`attnlab train` with no config: a small char GPT on the embedded pydoc corpus, minutes on a CPU."""
    return {
        "model": {"preset": "gpt-char-small"},
        "data": {"task": "lm", "tokenizer": "char"},
        "train": {"steps": 1000, "batch_size": 32, "lr": 1e-3, "warmup_steps": 50, "eval_every": 200,
                  "out_dir": "runs/gpt-pydoc"},
    }


def _validate_model_keys(model: dict[str, Any]) -> str:
    """Check the [model] table's keys against the family's config fields (values are checked when built)."""
    from attnlab.models.registry import FAMILIES, _load_families, get_preset

    _load_families()
    family = model.get("family")
    if "init_from" in model:
        if "preset" in model:
            raise ConfigError("model.init_from and model.preset both give the architecture; keep one")
        saved = _init_from_config(model["init_from"])["family"]
        if family is not None and family != saved:
            raise ConfigError(f"model.init_from holds {a_name(saved)} model, not {family!r}; drop model.family")
        family = saved
    if "preset" in model:
        preset_family, _ = get_preset(model["preset"])
        if family is not None and family != preset_family:
            raise ConfigError(f"model.preset {model['preset']!r} is {a_name(preset_family)} model, "
                              f"not {family!r}; drop model.family or pick another preset")
        family = preset_family
    cls = FAMILIES.get(family).config_cls
    # The table's own keys are candidates too: model.init_form was taken for model.norm, model.presett for nothing.
    names = ["family", "preset", "init_from", *cls.field_names()]
    for key in model:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean model.{close[0]}?)" if close else ""
            raise ConfigError(f"unknown setting model.{key}{hint}; known settings: {', '.join(names)}")
    return family


def _init_from_config(path: str) -> dict[str, Any]:
    """The model config of the run model.init_from names; its errors say which setting named the folder."""
    from attnlab.training.checkpoint import read_config

    if not isinstance(path, str):  # TOML read a folder named 42, or a list, as what it looks like
        raise ConfigError(f"model.init_from: expected a string (a run folder), got {path!r}; write it in double "
                          "quotes (on the command line: --set model.init_from='\"...\"')")
    if not path.strip():  # not the working folder, as the path "" would be
        raise ConfigError("model.init_from is empty; give the folder of the pretrained run, or leave the setting "
                          "out to train from scratch")
    try:
        return read_config(path)
    except CheckpointError as e:
        raise CheckpointError(f"model.init_from: {e}") from None


MAX_VOCAB = 1 << 24  # the largest data.vocab_size taken
MAX_LENGTH = 1 << 30  # the longest data.max_length and data.block_size taken

# What the data and the task decide, in the words of a refusal of another value set in [model].
_IMPOSED = {"vocab_size": "the tokenizer has {} tokens (data.vocab_size sizes it)",
            "src_vocab_size": "the tokenizer has {} tokens (data.vocab_size sizes it)",
            "tgt_vocab_size": "the tokenizer has {} tokens (data.vocab_size sizes it)",
            "n_classes": "the training data has {} labels",
            "head": "this data.task trains the {!r} head", "heads": "this data.task trains the {!r} heads",
            "pad_id": "the tokenizer's pad id is {}", "bos_id": "the tokenizer's bos id is {}",
            "eos_id": "the tokenizer's eos id is {}"}


def model_config(model: dict[str, Any], **derived: Any) -> Config:
    """Build the model config: the preset (if any), then the table's values, then `derived` values
    the data imposes (vocabulary size...). Those the data decides (`_IMPOSED`: vocabulary sizes, special ids,
    the number of classes, the head) may be written in the table only with the same value: another one trained
    a model that failed at its first step (a head for another task, ids outside the vocabulary) or that
    `evaluate` and `generate` then refused (more embeddings than tokens); other derived values (max_len) give
    way to the table's."""
    from attnlab.models.registry import FAMILIES, get_preset

    imposed = dict(derived)  # every value the data decides, checked against [model] (init_from sets fewer)
    table = dict(model)
    preset = table.pop("preset", None)
    init_from = table.pop("init_from", None)
    if init_from is not None:
        saved = _init_from_config(init_from)
        _check_init_from_changes(table, saved)
        values = {**saved, **table}
        family = values.pop("family")
        heads = table.get("heads", derived.get("heads", saved.get("heads")))
        if family == "bert" and saved.get("pooler") is False and "pooler" not in table \
                and (heads, table.get("nsp", saved.get("nsp"))) != (saved.get("heads"), saved.get("nsp")):
            # A head that now reads the pooled [CLS] state brings a new pooler, as a new head starts fresh (a BERT
            # converted without one, HF's BertForMaskedLM, was refused for a classifier, told to leave it unset).
            values["pooler"] = None
        elif family == "bert" and "pooler" not in table and values.get("pooler") is None \
                and FAMILIES.get(family).config_cls.from_dict({k: v for k, v in saved.items() if k != "family"},
                                                              where="model.init_from").has_pooler:
            # The trained pooler stays where the new heads read none (masked LM on, NSP off): left unset, the pooler
            # went with the NSP head, and a classifier made later from this run started one afresh.
            values["pooler"] = True
        if family == "encoder" and values.get("pad_id") is None and derived.get("pad_id") is not None:
            # A language model's config leaves pad_id unset (its windows hold no padding); the classifier made from
            # it pads its batches, and reads the tokenizer's pad as padding without an attention_mask, as one
            # trained from scratch does (it read them as tokens).
            values["pad_id"] = derived["pad_id"]
        if family == "encoder" and is_unset(values.get("causal")):  # None, or --set model.causal=none
            # Keep the mask the encoder was trained with (its features differ without it), as with_head does: its
            # config's causal, or where that was left unset, its head's (a causal classifier became bidirectional).
            values["causal"] = _trained_causal(saved)
        # The pretrained weights fix the architecture: only what the task decides (the head) may change. The rest
        # is still checked against a value given in [model] (the special ids of the pretrained run's tokenizer,
        # which its config may leave unset: an LM's).
        derived = {k: v for k, v in derived.items() if k in INIT_FROM_DERIVED}
    elif preset is not None:
        family, base = get_preset(preset)
        table.pop("family", None)
        values = {**base.to_dict(), **table}
    else:
        family = table.pop("family")
        values = dict(table)
    cls = FAMILIES.get(family).config_cls
    names = set(cls.field_names())
    for key, value in imposed.items():
        if key in names and key in model and key in _IMPOSED and model[key] != value:
            raise ConfigError(f"model.{key} = {model[key]!r}, but {_IMPOSED[key].format(value)}; drop model.{key}")
    values.update({key: value for key, value in derived.items() if key in names and key not in model})
    return cls.from_dict(values, where="model")


# ------------------------------------------------------------------------------------------------
# Preparing a run
# ------------------------------------------------------------------------------------------------

# A BERT with a segment table of one row (HF type_vocab_size 1), converted: exact, but it cannot read pairs.
SINGLE_SEGMENT = "{what} a BERT of one segment (type_vocab_size 1, weights that cannot grow a second), but {reads} " \
                 "sentence pairs of two segments (0 for A, 1 for B)"

INIT_FROM_DERIVED = ("head", "heads", "n_classes")  # task-imposed model settings that init_from allows


def _trained_causal(saved: dict[str, Any]) -> bool:
    """Whether the model of a saved config attends causally, as the model resolves its mask (an encoder's unset
    causal: by its head)."""
    from attnlab.models.registry import config_from_dict

    _, config = config_from_dict(saved)
    return bool(getattr(config, "is_causal", config.causal))


def _check_init_from_changes(table: dict[str, Any], saved: dict[str, Any]) -> None:
    """Refuse a [model] setting given beside model.init_from that changes what the pretrained weights compute:
    the heads, the mask and what any checkpoint may load into (`LOADABLE_CHANGES`: dropout, a computed position
    scheme's context length) may change, not the rest. n_heads, the activation, the norm's epsilon or the pad id
    were taken silently (logits off by up to 1.5 before the first step; a pad id on [CLS] left a run that its own
    tokenizer then did not fit), and a position scheme or segment table switched off dropped those pretrained
    weights without a word."""
    from attnlab.training.checkpoint import LOADABLE_CHANGES

    # The context length may change where positions are computed (sinusoidal, rotary, ALiBi...), not where they are
    # weights of one row a position (learned positions, Synthesizer attention): those were refused later anyway.
    bound = saved.get("position") == "learned" or str(saved.get("attention", "")).startswith("synthesizer")
    lengths = {"block_size", "max_len"} if bound else set()
    may_change = sorted(({*INIT_FROM_CHANGES, *LOADABLE_CHANGES} - lengths) & set(saved))
    if saved.get("position") == "t5-bias" and "causal" in saved and not is_unset(table.get("causal")):
        # T5's buckets are laid out for one mask (a causal model spends them all on the past): under another, the
        # pretrained table's rows are read for other distances, which no other scheme does.
        trained = _trained_causal(saved)
        if bool(table["causal"]) != trained:
            raise ConfigError(f"model.causal = {table['causal']!r}, but the model in model.init_from has T5 bias "
                              f"buckets learned under causal = {trained}, which another mask reads for other "
                              f"distances; drop model.causal")
    if table.get("final_norm") is not None and saved.get("final_norm") is None and "norm" in saved:
        # left to its default, resolved by the norm's placement (the encoder's and the Transformer's rule): compared
        # as trained, not refused later for a weight the checkpoint lacks or holds
        saved = {**saved, "final_norm": saved["norm"] == "pre"}
    for key, value in table.items():
        # saved None: the setting was left to its default, resolved by the model (d_ff: 4 × d_model); a value that
        # differs from it gives weights of other shapes, refused when they are loaded
        if (key in LOADABLE_CHANGES and key not in lengths) or key in INIT_FROM_CHANGES or key not in saved \
                or value is None or saved[key] is None:
            continue
        if json.dumps(value, sort_keys=True) != json.dumps(saved[key], sort_keys=True):
            positions = f" (its {saved[key]} positions are weights: set the data's length within them)" \
                if key in lengths else ""
            raise ConfigError(f"model.{key} = {value!r}, but the model in model.init_from was trained with "
                              f"{saved[key]!r}, which its weights keep{positions}; drop model.{key} (beside "
                              f"init_from only these may change: {', '.join(may_change)})")


# Settings beside model.init_from that choose the heads and the mask the body is fine-tuned with.
INIT_FROM_CHANGES = ("head", "heads", "n_classes", "pooling", "pooler", "nsp", "causal")
# Weights of each family's output heads: re-initialised when a run starts from a model with another head.
HEAD_PREFIXES = {"encoder": ("head.",), "bert": ("classifier.", "mlm.", "nsp."), "gpt": ("lm_head.",),
                 "seq2seq": ("lm_head.",)}
OPTIONAL_PREFIXES = {"bert": ("pooler.",)}  # taken from the checkpoint when it has them, else new


def _tokenizer(run: RunConfig, texts: Any, saved: Path | None, **options: Any):
    """The tokenizer of the pretrained run named by model.init_from (its vocabulary is the weights'), the
    one saved in the checkpoint a run resumes from (`saved`), else one trained on `texts` as the [data]
    table says, the same in every process of a distributed run."""
    from attnlab.data.tokenizers import load_tokenizer, train_tokenizer
    from attnlab.training.checkpoint import (
        check_tokenizer_fits,
        check_weights_fit_config,
        find_checkpoint,
        read_config,
    )

    folder = find_checkpoint(run.model["init_from"]) if "init_from" in run.model else saved
    if folder is not None:  # the pretrained run's, or the resumed checkpoint's: its weights' own
        tokenizer = load_tokenizer(folder)
        check_weights_fit_config(folder)  # first: a config or weights file of another run is not the tokenizer's fault
        check_tokenizer_fits(read_config(folder), tokenizer, folder)
        # Settings of another tokenizer beside init_from are said to be unused, not passed over in silence: run.json
        # records them as given (a config file's [data] table), where they read as the run's tokenizer.
        d = run.data
        given = [f"data.tokenizer = {d.tokenizer!r}"] if d.tokenizer not in (DataConfig.tokenizer, tokenizer.kind) \
            else []
        if d.vocab_size not in (None, tokenizer.vocab_size):
            given.append(f"data.vocab_size = {d.vocab_size}")
        if "init_from" in run.model and saved is None and given:
            warnings.warn(f"{' and '.join(given)} {'are' if len(given) > 1 else 'is'} not used: the run keeps the "
                          f"tokenizer of model.init_from, its weights' vocabulary ({tokenizer.kind}, "
                          f"{tokenizer.vocab_size:,} tokens)", stacklevel=2)
        return tokenizer
    tokenizer = _from_first_process(train_tokenizer(run.data.tokenizer, texts, run.data.vocab_size, **options),
                                    run.train.device)
    asked = run.data.vocab_size
    # A size is a bound (every word of a small text, or merges until none is left): far below it, say so (run.json
    # keeps the size asked for, config.json the one reached).
    if asked is not None and tokenizer.vocab_size < asked / 2:
        warnings.warn(f"data.vocab_size = {asked:,} is far more than the text gives: the {tokenizer.kind} vocabulary "
                      f"has {tokenizer.vocab_size:,} tokens, and the model is sized to them", stacklevel=2)
    return tokenizer


def _from_first_process(tokenizer, device: str):
    """Under torchrun, the first process's tokenizer for every process. HF's WordPiece trainer assigns ids
    in hash-map order, so two processes trained on the same text can get different vocabularies
    (huggingface/tokenizers#1794); the ranks of one run must share one."""
    from attnlab.data.tokenizers import tokenizer_from_dict
    from attnlab.training.distributed import all_gather_bytes, env_world, init_distributed

    if env_world().size <= 1:
        return tokenizer
    init_distributed(device)
    first = all_gather_bytes(json.dumps(tokenizer.to_dict()).encode("utf-8"))[0]
    return tokenizer_from_dict(json.loads(first))


def _fit_data_fix(run: RunConfig, setting: str, limit: int, model_setting: str) -> str:
    """How data longer than the model's positions is fitted to them: a pretrained model's (model.init_from) keep their
    length, which may be weights, so only the data gives way (raising the model's was advised, then refused)."""
    if "init_from" in run.model:
        return f"set {setting} to at most {limit}"
    return f"lower {setting} or raise {model_setting}"


def _build(run: RunConfig, config: Config, *, labels: list[str] | None = None):
    """The model for `config`, with the weights of model.init_from where it names a pretrained run. A
    classifier (`labels`, the class names in output order) keeps the pretrained head only for the same classes."""
    from attnlab.models.registry import build_model

    model = build_model(config)
    # The longest sequence the model takes (None: unbounded, as computed positions are, whatever the config's
    # max_len: a pretrained model's were refused for data longer than its run's had been).
    limit = getattr(model, "max_len", None)
    if run.data.task != "lm" and limit is not None and run.data.max_length > limit:  # lm: data.block_size, below
        # Refused now: the first batch of a long text would fail once the run folder had been replaced.
        raise ConfigError(f"data.max_length {run.data.max_length} is longer than the model's {limit} positions; "
                          f"{_fit_data_fix(run, 'data.max_length', limit, 'model.max_len')}")
    if "init_from" in run.model:
        from attnlab.training.checkpoint import class_names

        # The pretrained head is kept for the same classes in the same order. A classifier that keeps no class names
        # (converted, or copied without its trainer state) is matched as `evaluate` matches it: label i is output i,
        # so only labels that are the numbers 0 to n-1 keep its head (any two names were mapped onto its outputs).
        names = class_names(run.model["init_from"])
        same = labels == names if names is not None else labels == [str(i) for i in range(len(labels or []))]
        other_classes = labels is not None and not same
        if other_classes and names is not None and set(names) != set(labels):  # a trained classifier's head goes
            warnings.warn(f"model.init_from {run.model['init_from']} is a classifier of other classes than the "
                          f"data's ({_class_change(names, labels)}): its classification head is not kept and starts "
                          "afresh; give data with its classes to keep it", stacklevel=3)
        init_from_pretrained(model, run.model["init_from"], new_heads=other_classes)
        _warn_untrained_positions(run, limit)
    return model


def _warn_untrained_positions(run: RunConfig, limit: int | None) -> None:
    """Say where a model started from a pretrained run reads positions that run never trained: a bounded model
    (learned positions) given longer sequences than the pretrained run's windows (its data.block_size, or
    data.max_length), whose positions past them start from their initial values (generate says so of a prompt)."""
    if limit is None:  # computed positions: none is learnt
        return
    extra = _saved_extra_state(run.model["init_from"])
    saved = extra.get("data") if extra is not None else None
    if not isinstance(saved, dict):
        return
    trained = saved.get("block_size") if saved.get("task", "lm") == "lm" else saved.get("max_length")
    setting = "block_size" if run.data.task == "lm" else "max_length"
    given = getattr(run.data, setting)
    length = limit if given is None else min(given, limit)  # None: the model's whole length
    if type(trained) is int and 0 < trained < length:
        warnings.warn(f"data.{setting} {length} is longer than the windows of {trained} tokens model.init_from "
                      f"{run.model['init_from']} trained on: its learned positions past {trained} were never "
                      f"trained and start from their initial values; set data.{setting} to at most {trained} to "
                      "fine-tune on trained positions only", stacklevel=4)


def init_from_pretrained(model, path: str | Path, *, new_heads: bool = False) -> dict[str, list[str]]:
    """Copy into `model` the weights of the checkpoint at `path` (a run or checkpoint folder of the same
    family). The body must all be there; each head module (and BERT's pooler) is taken whole when the model
    keeps the same kind of head and the checkpoint has it with the same shapes, else it starts fresh (the
    pretrain-then-finetune step); `new_heads` starts every head fresh (a classifier for other classes).
    Returns {"loaded": names, "new": names}.

    Raises:
        CheckpointError: another family, a body weight missing or of another shape, or body weights of the
            checkpoint the model lacks (a setting beside init_from that leaves part of the body out).
    """
    import torch

    from attnlab.models.registry import config_to_dict
    from attnlab.training.checkpoint import find_checkpoint, load_model

    folder = find_checkpoint(path)
    pretrained = load_model(folder, "cpu")
    family = config_to_dict(model.config)["family"]
    saved_family = config_to_dict(pretrained.config)["family"]
    if saved_family != family:
        raise CheckpointError(f"{folder} holds {a_name(saved_family)} model; this run trains {a_name(family)} one")
    saved, ours = pretrained.state_dict(), model.state_dict()
    heads = HEAD_PREFIXES.get(family, ())
    modules = heads + OPTIONAL_PREFIXES.get(family, ())
    # Another kind of head ("lm" -> "classification", pre-training heads -> classifier): every head is new.
    head_kind = [getattr(c, name, None) for c in (model.config, pretrained.config) for name in ("head", "heads")]
    head_changed = new_heads or head_kind[:2] != head_kind[2:]

    def fits(module: str) -> bool:  # a head module is taken whole from the checkpoint, or not at all
        keys = [k for k in ours if k.startswith(module)]
        return all(k in saved and saved[k].shape == ours[k].shape for k in keys)

    loaded, new = {}, []
    for key, value in ours.items():
        module = next((m for m in modules if key.startswith(m)), None)
        if module is not None and ((head_changed and module in heads) or not fits(module)):
            new.append(key)
        elif key not in saved or saved[key].shape != value.shape:
            what = "lacks it" if key not in saved else f"has {tuple(saved[key].shape)}, not {tuple(value.shape)}"
            raise CheckpointError(f"{folder} does not fit this model: weight {key!r}: the checkpoint {what}; "
                                  "start from a run of the same architecture")
        else:
            loaded[key] = saved[key]
    # A setting beside init_from that leaves out part of the body (model.final_norm = false under pre-norm, biases
    # off) had dropped those pretrained weights without a word: the body computed something else from the start.
    dropped = sorted(k for k in saved if k not in ours and not k.startswith(modules))
    if dropped:
        raise CheckpointError(f"{folder} has weights this model lacks ({', '.join(dropped[:4])}"
                              f"{', ...' if len(dropped) > 4 else ''}): a model.* setting given beside init_from "
                              "leaves out part of the pretrained model; drop it")
    with torch.no_grad():
        model.load_state_dict(loaded, strict=False)
    return {"loaded": list(loaded), "new": new}


@dataclass
class Prepared:
    model: Any
    tokenizer: Any
    train_source: Any
    eval_source: Any
    eval_counts: Any = None  # per-batch counts for the trainer's evaluation pass (accuracies)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    # How examples were laid out where an older run did it otherwise (recorded in the checkpoint's trainer state
    # beside its data settings, read back by resume and evaluation): {"classification_sep": bool}.
    layout: dict[str, Any] = dataclasses.field(default_factory=dict)


# A language model's token files in its run's data/ (each with its sidecar), written by `_prepare_lm`.
TOKEN_FILES = ("train.bin", "val.bin")

# The data settings that name files.
DATA_FILE_SETTINGS = ("path", "eval_path", "src_path", "tgt_path", "eval_src_path", "eval_tgt_path")


def prepare(run: RunConfig, *, tokenizer_from: str | Path | None = None) -> Prepared:
    """Tokenize the data, build the sources and the model (sized to the tokenizer). The model's initial
    weights are a function of train.seed: the same seed, the same run, in any process. `tokenizer_from`
    (a checkpoint folder) gives the tokenizer instead of training one: a resumed run keeps its vocabulary."""
    from attnlab.training.trainer import seed_everything

    for key in DATA_FILE_SETTINGS:
        value = getattr(run.data, key)
        if value and not Path(value).exists():  # named by its setting (the file's other checks come later)
            # A relative path is taken from the folder the command runs in, not the config file's: say which.
            where = "" if Path(value).is_absolute() else f" in {Path.cwd()} (where relative paths are taken from)"
            unset = f", or leave it unset with --set data.{key}='\"\"'" if value.lower() in ("none", "null") else ""
            raise DataError(f"data file '{value}' (data.{key}) does not exist{where}; check the path, or give the "
                            f"file with --set data.{key}=FILE{unset}")
    seed_everything(run.train.seed)
    saved = Path(tokenizer_from) if tokenizer_from is not None else None
    if saved is not None and "init_from" in run.model:
        # Resuming a run started from a pretrained one: its own checkpoint holds the architecture, vocabulary and
        # weights it trains on, whatever became of the pretrained folder since (retrained, moved, deleted).
        run = dataclasses.replace(run, model={**run.model, "init_from": str(saved)})
    prepared = {"lm": _prepare_lm, "classification": _prepare_classification,
                "translation": _prepare_translation, "mlm": _prepare_mlm}[run.data.task](run, saved)
    if saved is None:  # said when the run starts, not again on each resume
        _warn_order_blind(prepared.model.config, prepared.tokenizer)
    return prepared


def _warn_order_blind(config: Config, tokenizer=None) -> None:
    """Say where a model cannot tell a sequence from its reverse: ALiBi's penalty reads the distance |i - j| alone
    when a stack is bidirectional, so dot or bilinear attention (a Synthesizer's scores are indexed by position)
    maps a reversed input to its reversed outputs, and what reads them without positions sees the same input: a
    seq2seq model's decoder (cross-attention), an encoder's mean pooling, a bidirectional LM's next token. A
    classifier's texts that start with the tokenizer's cls token are anchored by it (each token's distance to it
    is its position), so a classifier is said only where `tokenizer` has none."""
    from attnlab.models.registry import family_of

    if getattr(config, "position", None) != "alibi" or getattr(config, "attention", None) not in ("dot", "bilinear"):
        return
    family = family_of(config)
    if family == "seq2seq":
        where = "the encoder of a seq2seq model, whose decoder reads it by cross-attention, without positions"
    elif family == "encoder" and not config.is_causal and config.head == "lm":
        where = "a bidirectional encoder LM"
    elif family == "encoder" and not config.is_causal and config.pooling == "mean" and getattr(
            tokenizer, "cls_id", None) is None:
        where = "a bidirectional encoder classifier pooling the mean of texts without a cls token"
    else:
        return
    warnings.warn(f"model.position = 'alibi' is symmetric in {where}: the model cannot tell a sequence from its "
                  "reverse ('dog bites man' from 'man bites dog'); use rotary, t5-bias or relative positions",
                  stacklevel=3)


def _prepare_lm(run: RunConfig, saved: Path | None) -> Prepared:
    from attnlab.data.corpus import TokenFile, sidecar_path
    from attnlab.data.sources import CausalLMSource

    d, t = run.data, run.train
    train_part, eval_part = _lm_text_parts(d)
    specials = {"pad": None, "unk": None, "mask": None, "cls": None, "sep": None, "bos": None, "eos": None} \
        if d.tokenizer == "char" else None
    options = {"specials": specials} if specials is not None else {}
    # A char tokenizer also reads the held-out text, so that every character there can be encoded.
    texts = _Reread(train_part, eval_part if d.tokenizer == "char" else None)
    tokenizer = _tokenizer(run, texts, saved, **options)
    if d.tokenizer == "char" and saved is None and tokenizer.token_to_id("\r") is not None:
        warnings.warn("the text holds carriage returns ('\\r', as in Windows line ends): the character model learns "
                      "them as characters of their own, so each line end costs two tokens and text with plain line "
                      "ends reads unlike its training; convert the file (e.g. dos2unix FILE) to train on plain line "
                      "ends", stacklevel=2)
    pad_id = run.model.get("pad_id")
    if pad_id is not None and pad_id != tokenizer.pad_id:  # an encoder's: ids it hides from attention as padding
        has = f"'s pad id is {tokenizer.pad_id}" if tokenizer.pad_id is not None else " has no pad token"
        raise ConfigError(f"model.pad_id = {pad_id!r}, but the tokenizer{has} (a language model's windows hold no "
                          "padding, and the model would hide every token of that id); drop model.pad_id")
    config = model_config(run.model, vocab_size=tokenizer.vocab_size, head="lm")
    if not getattr(config, "is_causal", True):
        raise ConfigError("data.task = 'lm' trains next-token prediction, which needs causal attention, but "
                          "this encoder is bidirectional (model.causal = false, or model.init_from names a "
                          "classifier); set model.causal = true")
    block = lm_window(d.block_size, config)
    model = _build(run, config)
    limit = getattr(model, "max_len", None)
    if limit is not None and block > limit:
        fix = _fit_data_fix(run, "data.block_size", limit, "the model's block_size")
        raise ConfigError(f"data.block_size {block} is longer than the model's {limit} positions; {fix}")
    if saved is not None and (Path(t.out_dir) / "data").is_dir():  # a resume: the checkpoint must fit first
        from attnlab.training.trainer import Trainer

        Trainer.check_resumable(saved, model, t.steps)
    # The token files are written into a folder of their own inside data/ (one per process: torchrun's ranks each
    # write theirs; inside, so that the move stays on one disk where data/ links to another) and moved into data/
    # once every check has passed: a run refused for its data (a held-out file shorter than a window, a character
    # outside the vocabulary) had rewritten a finished run's data/, or left one where no run was.
    data_dir = Path(t.out_dir) / "data"
    for name in TOKEN_FILES:  # train.out_dir naming a folder of the user's, with a data/ of another tool's
        if (data_dir / name).exists() and not _our_token_file(data_dir / name):
            raise ConfigError(f"train.out_dir: {str(data_dir / name)!r} is not a token file an attnlab run wrote "
                              f"(no {name}.json of ours beside it), and this run writes its own there; move it, or "
                              "choose another train.out_dir")
    made = not data_dir.exists()
    staging = data_dir / f".partial.{_HOST}.{os.getpid()}"
    _clear_dead_staging(data_dir)
    shutil.rmtree(staging, ignore_errors=True)  # a killed run's, whose process number this one has
    make_folder(staging, "train.out_dir")
    done = False
    try:
        n_train, n_val = _encode_lm_parts(run, saved, tokenizer, texts, train_part, eval_part, block, staging)
        if saved is None:  # a resumed run was told at its start
            _warn_special_tokens_in_lm_text(staging, tokenizer, d)
        for name in TOKEN_FILES:
            for path in (staging / name, sidecar_path(staging / name)):
                if path.exists():
                    os.replace(path, data_dir / path.name)
                else:  # nothing held out: no token file of an earlier run's held-out text left to mislead
                    (data_dir / path.name).unlink(missing_ok=True)
        done = True
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if made and not done:
            try:
                data_dir.rmdir()
            except OSError:  # another process of the run wrote into it
                pass
    train_source = CausalLMSource(TokenFile(data_dir / "train.bin"), block, t.batch_size, seed=t.seed)
    eval_source = CausalLMSource(TokenFile(data_dir / "val.bin"), block, t.batch_size, seed=t.seed) \
        if n_val is not None else None
    return Prepared(model, tokenizer, train_source, eval_source, info={"train_tokens": n_train, "block_size": block})


def _warn_special_tokens_in_lm_text(folder: Path, tokenizer, d: DataConfig) -> None:
    """Say which special tokens a language model's text spells ("<eos>", "<pad>": prose about NLP, markup, code),
    which the tokenizer reads as those tokens: generation stops at an eos and leaves the others out of what it
    prints, so the model's text is not the text it learnt. Counted in the token files `folder` holds, in chunks
    (a corpus larger than memory stays so); unk is left out (the word tokenizer's unknown words)."""
    import numpy as np

    from attnlab.data.corpus import TokenFile

    specials = np.array(sorted(set(tokenizer.special_ids) - {tokenizer.unk_id}), dtype=np.int64)
    if not len(specials):
        return
    counts = np.zeros(len(specials), dtype=np.int64)
    for name in TOKEN_FILES:
        if not (folder / name).exists():
            continue
        ids = TokenFile(folder / name).ids
        for start in range(0, len(ids), 1 << 24):
            chunk = np.asarray(ids[start:start + (1 << 24)], dtype=np.int64)
            found = chunk[np.isin(chunk, specials)]
            counts += (found[:, None] == specials[None, :]).sum(axis=0)
    if counts.any():
        spelt = ", ".join(f"{tokenizer.id_to_token(int(i))!r} {n:,} time{'s' if n > 1 else ''}"
                          for i, n in zip(specials, counts) if n)
        files = " and ".join(dict.fromkeys(str(p) for p in (d.path, d.eval_path) if p)) or "the pydoc texts"
        # An eos between documents is the separator it is meant as (GPT-2's corpora, attnlab convert's docs).
        eos_seen = tokenizer.eos_id is not None and bool(counts[specials == tokenizer.eos_id].sum())
        between = " (an end-of-sentence token between documents is meant as one: leave those)" if eos_seen else ""
        warnings.warn(f"the text of {files} spells special tokens, which the {tokenizer.kind} tokenizer reads as "
                      f"those tokens ({spelt}): generation stops at an end-of-sentence token and leaves the others "
                      f"out of the text it prints; respell them where they are text{between}", stacklevel=3)


# This machine's name in the staging folders: the ranks of a run over several machines can share a run folder on
# a network disk, and a process number says nothing about another machine's processes.
_HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"


def _clear_dead_staging(data_dir: Path) -> None:
    """Remove the staging folders (data/.partial.<host>.<pid>) of this machine's processes that no longer run: a run
    killed while encoding (SIGKILL) left its partial token files there, a corpus's worth of disk, for good. Only
    where a process can be asked whether it lives without touching it (POSIX); the live ones are the other ranks of
    this torchrun run, writing theirs. Another machine's folders are left alone."""
    if os.name != "posix" or not data_dir.is_dir():
        return
    for folder in data_dir.glob(f".partial.{_HOST}.*"):
        pid = folder.name.removeprefix(f".partial.{_HOST}.")
        if not (pid.isascii() and pid.isdigit()) or int(pid) == os.getpid():  # "²" is a digit int() refuses
            continue
        try:
            os.kill(int(pid), 0)  # signal 0: nothing is sent, only whether the process exists
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (PermissionError, OverflowError, OSError):  # another user's process, or no such number
            continue


def _encode_lm_parts(run: RunConfig, saved: Path | None, tokenizer, texts, train_part, eval_part, block: int,
                     folder: Path) -> tuple[int, int | None]:
    """Write the training text's token file (and the held-out text's, where it fills a window) into `folder`, or
    refuse the data; returns their token counts (None: nothing held out)."""
    from attnlab.data.corpus import NO_TOKENS_FIX, NoTokens, TextStream, build_token_file

    d = run.data

    def encode(part: Callable[[], Iterable[str]], name: str, path: str | None) -> int:
        with _naming_unknown_tokens(run, saved, tokenizer, path, texts):  # the blocks of one text: one text's ids
            try:
                return len(build_token_file(TextStream(part()), tokenizer, folder / name))  # closed again at once
            except NoTokens:  # named by the token file it was to fill, not the user's
                if name == "val.bin" and not d.eval_path:  # the tail of data.path: too short to score, as below
                    return 0
                setting = "data.eval_path" if name == "val.bin" else "data.path"
                raise DataError(f"{path or 'the pydoc texts'} ({setting}): {NO_TOKENS_FIX}") from None

    def too_short(n: int, held: bool) -> DataError:
        # Where part of the text is held out, the part trained on is what fell short (the text may not be).
        what = f"the part of the text trained on (data.val_fraction = {d.val_fraction} of it held out)" \
            if held else "the training text"
        fix = "lower data.val_fraction, give a longer text" if held else "give a longer text"
        return DataError(f"{what} has {n} tokens, fewer than one window of {block + 1}; {fix} or a smaller "
                         "data.block_size")

    n_train = encode(train_part, "train.bin", d.path)
    if not eval_part or d.eval_path:
        if n_train < block + 1:
            raise too_short(n_train, held=False)
        if not eval_part:
            return n_train, None
    n_val = encode(eval_part, "val.bin", d.eval_path or d.path)
    if n_val >= block + 1:  # one window of block + 1 tokens is enough to score
        if n_train < block + 1:
            raise too_short(n_train, held=True)
        return n_train, n_val
    if d.eval_path:  # a file given for evaluation must not be dropped without a word
        raise DataError(f"the evaluation text ({d.eval_path}) has {n_val} tokens, fewer than one "
                        f"window of {block + 1}; give a longer data.eval_path or a smaller data.block_size")
    # Too short to score: trained on instead, as when no line starts in the tail (checked before the part trained
    # on: a text that fills a window only with its tail was refused, told to lower val_fraction).
    for path in (folder / "val.bin", folder / "val.bin.json"):
        path.unlink(missing_ok=True)
    n_train = encode(lambda: itertools.chain(train_part(), eval_part()), "train.bin", d.path)  # cut at a line start
    if n_train < block + 1:
        raise too_short(n_train, held=False)
    warnings.warn(f"nothing held out for evaluation: the last data.val_fraction = {d.val_fraction} of "
                  f"{d.path or 'the pydoc texts'} has {n_val} tokens, fewer than one window of "
                  f"{block + 1}, so the whole text is trained on; raise data.val_fraction or give "
                  "data.eval_path", stacklevel=4)
    return n_train, None


def lm_window(block_size: int | None, config: Any) -> int:
    """The window a language model trains on, and `evaluate` scores it in: data.block_size when set, else the
    model's own length (GPT's block_size, the encoder's max_len)."""
    return block_size or getattr(config, "block_size", None) or getattr(config, "max_len", None) or 128


def _unknown_token_error(run: RunConfig, saved: Path | None, tokenizer, texts: Iterable[str], e: UnknownToken,
                         path: str | None) -> AttnlabError:
    """The error for a language model's text (the file `path`, None: the pydoc corpus) holding a token that
    its vocabulary (a char tokenizer's, without unk) lacks: data.vocab_size too small for a new vocabulary,
    else the character missing from the vocabulary of the run started from or resumed."""
    d = run.data
    if "init_from" not in run.model and saved is None and d.tokenizer == "char" and d.vocab_size is not None:
        n = len(set().union(*map(set, texts)))
        return ConfigError(f"data.vocab_size={d.vocab_size} keeps {tokenizer.vocab_size} of the text's {n} "
                           "characters; raise it or leave it unset")
    line = _first_line_with(path, e.token) if path else None
    where = "the pydoc corpus" if not path else f"{path}: line {line}" if line else path
    if "init_from" in run.model:
        whose, fix = "the vocabulary of the run in model.init_from", "start from a run trained on text that has it"
    elif saved is not None:
        whose, fix = "the resumed run's vocabulary", "train a new run on this text (without --resume)"
    else:
        whose, fix = "the vocabulary", "train the tokenizer on text that has it"
    fix = f"remove it from the text or {fix}" if path else "set data.path to the text the run was trained on"
    return DataError(f"{where}: {e.token!r} is not in {whose}, which has no unk token; {fix}")


@contextlib.contextmanager
def _naming_unknown_tokens(run: RunConfig, saved: Path | None, tokenizer, path: str | None,
                           texts: Iterable[str] = ()):
    """Turn a token the vocabulary lacks (a char vocabulary without unk) into `_unknown_token_error`'s message
    about the file `path` read inside the block (`texts`: a new vocabulary's training text, see there)."""
    try:
        yield
    except UnknownToken as e:
        raise _unknown_token_error(run, saved, tokenizer, texts, e, path) from None


def _first_line_with(path: str, token: str) -> int | None:
    """The number of the first line of the file at `path` that holds `token` (None where none does)."""
    from attnlab.data.text_files import iter_text_blocks

    line = 1
    for block in iter_text_blocks(path):
        at = block.find(token)
        if at >= 0:
            return line + block.count("\n", 0, at)
        line += block.count("\n")
    return None


class _Reread:
    """The texts of some parts, read afresh from the start each time it is iterated (a WordPiece tokenizer
    reads its texts twice), one block at a time."""

    def __init__(self, *parts: Callable[[], Iterable[str]] | None):
        self.parts = [part for part in parts if part is not None]

    def __iter__(self):
        return itertools.chain.from_iterable(part() for part in self.parts)


def _lm_text_parts(d: DataConfig) -> tuple[Callable[[], Iterable[str]], Callable[[], Iterable[str]] | None]:
    """The training and held-out text as functions giving it in blocks, read from disk a block at a time
    each time they are called (a corpus larger than memory streams through the tokenizer and into the token
    files): data.eval_path, or the last data.val_fraction of the training text cut at a line start."""
    from attnlab.data.corpus import pydoc_corpus
    from attnlab.data.text_files import check_text, iter_text_blocks, line_split_offset

    path = check_text(d.path) if d.path else None
    text = pydoc_corpus() if path is None else ""  # the embedded corpus: 400 KB, in memory

    def whole() -> Iterable[str]:
        return [text] if path is None else iter_text_blocks(path)

    if d.eval_path:  # trained on whole, evaluated on the file (the pydoc texts' tail had been scored instead)
        eval_path = check_text(d.eval_path)
        return whole, (lambda: iter_text_blocks(eval_path))
    if path is None:  # cut at a line start, as a file is
        cut = int(len(text) * (1 - d.val_fraction))
        if 0 < cut < len(text):
            line_end = text.find("\n", cut)
            cut = line_end + 1 if line_end >= 0 else cut
        if d.val_fraction > 0 and cut >= len(text):  # as for a file: said, not a run without evaluations
            warnings.warn(f"nothing held out for evaluation: no line of the pydoc texts starts within their last "
                          f"data.val_fraction = {d.val_fraction} (the held-out part begins at a line start); raise "
                          "data.val_fraction, or give data.eval_path", stacklevel=2)
        return (lambda: [text[:cut]]), ((lambda: [text[cut:]]) if cut < len(text) else None)
    if d.val_fraction == 0:
        return whole, None
    cut = line_split_offset(path, 1 - d.val_fraction)
    if cut == 0:
        raise DataError(f"the training text ({d.path}) is too short to hold out data.val_fraction = "
                        f"{d.val_fraction} of it for evaluation; give a longer text")
    if cut >= path.stat().st_size:  # no line starts in the last val_fraction of the text (a line or two)
        warnings.warn(f"nothing held out for evaluation: no line of {d.path} starts within its last "
                      f"data.val_fraction = {d.val_fraction} (the held-out part begins at a line start); give "
                      "data.eval_path, or a text of more lines", stacklevel=2)
        return whole, None
    if not any(block.strip() for block in iter_text_blocks(path, start=cut)):  # e.g. trailing blank lines
        warnings.warn(f"nothing held out for evaluation: the last data.val_fraction = {d.val_fraction} of {d.path} "
                      "holds only whitespace; give data.eval_path, or raise data.val_fraction", stacklevel=2)
        return whole, None
    return (lambda: iter_text_blocks(path, stop=cut)), (lambda: iter_text_blocks(path, start=cut))


def parse_column(c: str | None) -> str | int | None:
    """A column given in a config: a name, or a 0-based index written as ASCII digits ("²" is a digit to
    str.isdigit, which int() refused with a traceback: it is a name)."""
    return int(c) if isinstance(c, str) and c.isascii() and c.isdigit() else c


def _prepare_classification(run: RunConfig, saved: Path | None) -> Prepared:
    from attnlab.data.sources import ClassificationSource, classification_ends
    from attnlab.data.text_files import read_classification_file

    d, t = run.data, run.train
    train_data = read_classification_file(d.path, parse_column(d.text_column), parse_column(d.label_column))
    if len(train_data.label_names) < 2:
        raise DataError(f"data file '{d.path}': every example has the label {train_data.label_names[0]!r}; "
                        "a classifier needs examples of at least two classes")
    n_labels, n_examples = len(train_data.label_names), len(train_data)
    if n_examples >= 20 and n_labels >= 0.9 * n_examples:  # a column of texts or ids read as the labels
        warnings.warn(f"data file '{d.path}' has {n_labels} different labels in {n_examples} examples (e.g. "
                      f"{train_data.label_names[0]!r}): is data.label_column the column of the labels? Name it (and "
                      "data.text_column) to be sure", stacklevel=2)
    # Resuming, the classifier's outputs stand for the checkpoint's classes, in its order; from init_from, for its.
    order = _pretrained_class_order(saved if saved is not None else run.model.get("init_from"),
                                    train_data.label_names, resumed_with=d.path if saved is not None else None)
    tokenizer = _tokenizer(run, train_data.texts, saved)
    _warn_special_text(train_data.texts, tokenizer, d.path, effect=_SPECIAL_IN_TEXT, numbers=train_data.line_numbers)
    # [CLS] text [SEP], as BERT was pre-trained and HF encodes one text; a resumed run keeps its checkpoint's layout.
    sep = _saved_classification_sep(saved) if saved is not None else True
    prefix, suffix = classification_ends(tokenizer, sep=sep)
    with _naming_unknown_tokens(run, saved, tokenizer, d.path):
        train_source = ClassificationSource(train_data, tokenizer, t.batch_size, max_length=d.max_length,
                                            seed=t.seed, label_names=order, prefix_ids=prefix, suffix_ids=suffix,
                                            bucket_by_length=d.batches_by_length)
    eval_source = None
    if d.eval_path:
        eval_data = read_classification_file(d.eval_path, parse_column(d.text_column),
                                             parse_column(d.label_column), training=False)
        _warn_special_text(eval_data.texts, tokenizer, d.eval_path, effect=_SPECIAL_IN_TEXT,
                           numbers=eval_data.line_numbers)
        with _naming_unknown_tokens(run, saved, tokenizer, d.eval_path):
            eval_source = ClassificationSource(eval_data, tokenizer, t.batch_size, max_length=d.max_length,
                                               seed=t.seed, label_names=train_source.label_names,
                                               prefix_ids=prefix, suffix_ids=suffix,
                                               bucket_by_length=d.batches_by_length)
    config = model_config(run.model, vocab_size=tokenizer.vocab_size, n_classes=train_source.num_labels,
                          max_len=max(d.max_length, 8), head="classification", heads="classification",
                          pad_id=_classifier_pad_id(run, tokenizer, saved))
    model = _build(run, config, labels=train_source.label_names)
    return Prepared(model, tokenizer, train_source, eval_source, classification_counts,
                    info={"labels": train_source.label_names}, layout={"classification_sep": bool(suffix)})


def _saved_classification_sep(checkpoint: Path) -> bool:
    """Whether the classifier of `checkpoint` was trained on `[CLS] text [SEP]`: recorded since 2026-12-06; runs
    before that ended their texts without [SEP]."""
    extra = _saved_extra_state(checkpoint)
    return extra is None or extra.get("classification_sep") is True


def _saved_extra_state(path: str | Path) -> dict[str, Any] | None:
    """The `extra_state` of the trainer state of the checkpoint at `path` (a run or checkpoint folder; {} where it
    has none), or None where it cannot be read: the trainer refuses such a state with its own message, and a
    converted model has none."""
    from attnlab.training.checkpoint import read_trainer_state

    try:
        return read_trainer_state(path).get("extra_state") or {}
    except AttnlabError:
        return None


def _pretrained_class_order(pretrained: str | Path | None, labels: list[str], *,
                            resumed_with: str | None = None) -> list[str] | None:
    """The class order of the classifier in `pretrained` (the run resumed, or model.init_from's) where it holds the
    data's classes in another order: its outputs keep standing for its classes (a converted HF classifier lists
    them as its id2label does: entailment, neutral, contradiction), so its head is kept, not started afresh. None:
    the data's own order (sorted).

    Raises:
        ConfigError: resuming (`resumed_with`, the data file) a checkpoint trained on other classes.
    """
    from attnlab.training.checkpoint import class_names

    names = class_names(pretrained) if pretrained is not None else None
    same = names is not None and len(names) == len(labels) and set(names) == set(labels)
    if resumed_with is not None and names is not None and not same:
        raise ConfigError(f"--resume: {resumed_with} has other classes than the run was trained on "
                          f"({_class_change(names, list(labels))}); resume with the run's data file, or start "
                          "without --resume (or in another train.out_dir)")
    return names if same and names != list(labels) else None


def _class_change(trained: list[str], given: list[str]) -> str:
    """How a data file's classes differ from those a classifier was trained on: "'10' missing, 'x' new"."""
    def few(names: list[str]) -> str:
        return ", ".join(map(repr, names[:5])) + (f" and {len(names) - 5} more" if len(names) > 5 else "")

    missing, new = [c for c in trained if c not in given], [c for c in given if c not in trained]
    return ", ".join([*([f"{few(missing)} missing"] if missing else []), *([f"{few(new)} new"] if new else [])])


def _classifier_pad_id(run: RunConfig, tokenizer, saved: Path | None) -> int | None:
    """The pad id a classifier's config is given: the tokenizer's (0 where it has none, from scratch); from a
    pretrained run, only a pad the tokenizer has (a char LM's may have none), which `model_config` gives an encoder
    whose config leaves it unset (a language model's); resumed, none: the checkpoint's config holds the run's."""
    if "init_from" not in run.model:
        return tokenizer.pad_id or 0
    return tokenizer.pad_id if saved is None else None


def _prepare_translation(run: RunConfig, saved: Path | None) -> Prepared:
    from attnlab.data.sources import ParallelTextSource, check_aligned
    from attnlab.data.text_files import read_lines

    d, t = run.data, run.train
    src_lines, tgt_lines = read_lines(d.src_path), read_lines(d.tgt_path)
    # Files of different lengths are refused before the tokenizer is trained on them (minutes on a large corpus).
    check_aligned(src_lines, tgt_lines, d.src_path, d.tgt_path)
    if d.eval_src_path:
        check_aligned(read_lines(d.eval_src_path), read_lines(d.eval_tgt_path), d.eval_src_path, d.eval_tgt_path)
    # One tokenizer for both sides, so the paper's shared embeddings apply.
    tokenizer = _tokenizer(run, src_lines + tgt_lines, saved)
    for lines, path in ((src_lines, d.src_path), (tgt_lines, d.tgt_path)):
        _warn_special_text(lines, tokenizer, path)
    # The paths, not the lines read above, so that an error (files of different lengths) names the files.
    train_source = ParallelTextSource(d.src_path, d.tgt_path, tokenizer, tokenizer, t.batch_size,
                                      max_src_length=d.max_length, max_tgt_length=d.max_length, seed=t.seed,
                                      bucket_by_length=d.batches_by_length)
    eval_source = None
    if d.eval_src_path:  # and d.eval_tgt_path: DataConfig requires both or neither
        eval_source = ParallelTextSource(d.eval_src_path, d.eval_tgt_path, tokenizer, tokenizer, t.batch_size,
                                         max_src_length=d.max_length, max_tgt_length=d.max_length,
                                         seed=t.seed, bucket_by_length=d.batches_by_length)
    config = model_config(run.model, src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size,
                          pad_id=tokenizer.pad_id or 0, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
                          max_len=max(d.max_length + 2, 16))
    return Prepared(_build(run, config), tokenizer, train_source, eval_source)


def _warn_special_text(lines: list[str], tokenizer, path: str, *, unit: str = "line",
                       effect: str = "an end-of-sentence token inside a target teaches the model to stop there",
                       numbers: Sequence[int] | None = None) -> None:
    """Say where texts spell a special token ("<eos>", "[SEP]") that the tokenizer reads as that token, which then
    acts as one: an eos in the middle of a target taught the model to stop there, a pad became a training label
    (translation); a [SEP] split a text, a [PAD] was read as a blank token whose embedding never trains (attended
    to, as HF does too), a [MASK] never predicted (BERT, classification). `unit` names what `lines` holds,
    numbered from 1 in the message, or by `numbers` (the file's line of each text)."""
    names = {tokenizer.id_to_token(i): i for i in tokenizer.special_ids}
    read_as = []  # (number, the special spelt): where the encoding holds that special's id (not an unk of it)
    for n, line in zip(numbers if numbers is not None else itertools.count(1), lines):
        spelt = [name for name in names if name and name in line]
        if spelt:
            ids = set(tokenizer.encode(line))
            name = next((name for name in spelt if names[name] in ids), None)
            if name is not None:
                read_as.append((n, name))
    if read_as:
        n, name = read_as[0]
        warnings.warn(f"{len(read_as)} {unit}(s) of {path} spell a special token, which the {tokenizer.kind} "
                      f"tokenizer reads as that token ({unit} {n}: {name!r}; {effect}); respell it where it is text",
                      stacklevel=3)


# What a special token spelt in a text does where a model reads one text or a pair of them (BERT, classification).
_SPECIAL_IN_TEXT = "a separator inside a text splits it, a pad is read as a blank token whose embedding never trains"


def _prepare_mlm(run: RunConfig, saved: Path | None) -> Prepared:
    from attnlab.data.corpus import pydoc_corpus
    from attnlab.data.text_files import held_out_documents, read_text, split_documents

    d, t = run.data, run.train
    documents = split_documents(read_text(d.path), d.path) if d.path else split_documents(pydoc_corpus())
    if not any(len(doc) > 1 for doc in documents):  # before holding any out: no pairs at all is the problem
        raise DataError(f"{d.path or 'the pydoc texts'}: no document has two sentences, so there are no sentence "
                        "pairs; write one sentence per line, with blank lines only between documents")
    nsp = _predicts_next_sentence(run)
    if nsp and len(documents) < 2:  # before holding any out: the held-out warning would be moot
        raise DataError(f"{d.path or 'the pydoc texts'} (data.path) is one document (no blank line between its "
                        "sentences), but next-sentence prediction draws random next sentences from other documents; "
                        "separate the documents with blank lines, or train the masked LM alone with --set "
                        "model.nsp=false")
    if d.eval_path:
        eval_documents = split_documents(read_text(d.eval_path), d.eval_path)
    else:
        # Random next sentences need two held-out documents.
        documents, eval_documents = held_out_documents(documents, d.val_fraction, min_documents=2 if nsp else 1)
        if not eval_documents and d.val_fraction > 0:
            where = d.path or "the pydoc texts"
            warnings.warn(f"nothing held out for evaluation: {where} has {len(documents)} document(s), too few to "
                          f"keep data.val_fraction = {d.val_fraction} apart with sentence pairs on both sides; "
                          "give data.eval_path, or more documents separated by blank lines", stacklevel=2)
    tokenizer = _tokenizer(run, [line for doc in documents for line in doc], saved)
    texts = [(documents, d.path or "the pydoc texts"), (eval_documents, d.eval_path)] if d.eval_path else \
        [(documents + eval_documents, d.path or "the pydoc texts")]  # the held-out part, in the file's order
    for docs, where in texts:
        _warn_special_text([line for doc in docs for line in doc], tokenizer, where, unit="sentence",
                           effect=_SPECIAL_IN_TEXT)
    config = model_config(run.model, vocab_size=tokenizer.vocab_size, max_len=max(d.max_length, 8),
                          pad_id=tokenizer.pad_id or 0, heads="pretraining")
    if config.type_vocab_size == 1:  # 0 is the "no segment embeddings" ablation: segments are then not read
        if "init_from" in run.model:  # its table of one segment is weights: the setting cannot change
            raise ConfigError(SINGLE_SEGMENT.format(what="model.init_from holds", reads="pre-training reads") + "; "
                              "fine-tune it on a task of one text (data.task = \"classification\") instead")
        raise ConfigError("model.type_vocab_size = 1, but the sentence pairs have two segments (0 for A, 1 for B); "
                          "set it to 2, or to 0 for no segment embeddings")
    model = _build(run, config)  # before the pairs: a model too short for data.max_length is refused first
    try:
        train_source = sentence_pair_source(documents, tokenizer, config, d, t.batch_size, t.seed)
    except DataError as e:  # e.g. no token of the file the tokenizer can hold (continued pre-training)
        raise DataError(f"{d.path or 'the pydoc texts'} (data.path): {e}") from None
    eval_source = None
    if eval_documents:
        try:
            eval_source = sentence_pair_source(eval_documents, tokenizer, config, d, t.batch_size, t.seed)
        except DataError as e:  # not the training file's fault: name the file evaluated
            where = f"{d.eval_path} (data.eval_path)" if d.eval_path else \
                f"the held-out part of {d.path or 'the pydoc texts'}"
            raise DataError(f"{where}: {e}") from None
    return Prepared(model, tokenizer, train_source, eval_source, pretraining_counts,
                    info={"documents": len(documents), "sentence_pairs": len(train_source.pairs)})


def _predicts_next_sentence(run: RunConfig) -> bool:
    """Whether the BERT of an mlm run has the next-sentence head. Read before the vocabulary is trained, so
    from a model config built with a placeholder vocabulary size."""
    # A size no id of the config (pad_id) can reach: a given size is checked later, with the tokenizer's, not here.
    placeholder = {} if "vocab_size" in run.model else {"vocab_size": 2**62}
    return bool(model_config(run.model, **placeholder).nsp)


def sentence_pair_source(documents, tokenizer, config, data: DataConfig, batch_size: int, seed: int):
    """BERT pre-training batches of `documents` (lists of sentences): `[CLS] A [SEP] B [SEP]` masked 80/10/10,
    B a random sentence of another document half the time when the model predicts the next sentence, else
    always A's successor (the "no NSP" ablation sees the same pairs without the task)."""
    from attnlab.data.sources import BertSource, MaskSpec, NSPPairs

    pairs = NSPPairs(documents, tokenizer, max_length=data.max_length,
                     random_next_prob=0.5 if config.nsp else 0.0)
    return BertSource(pairs, batch_size, MaskSpec.from_tokenizer(tokenizer, mask_prob=data.mask_prob), seed=seed,
                      bucket_by_length=data.batches_by_length)


def classification_counts(batch, out) -> dict[str, tuple]:
    """Per-batch counts of a classifier's accuracy (%), for `Trainer(eval_counts=...)`."""
    labels = batch["labels"]
    scored = labels != -100  # the loss's ignore index: such rows count neither way
    return {"accuracy": (100.0 * (out.logits.argmax(-1)[scored] == labels[scored]).sum(), scored.sum())}


def pretraining_counts(batch, out) -> dict[str, tuple]:
    """Per-batch counts of the masked-token accuracy (%) and, with an NSP head, of next-sentence
    prediction, for `Trainer(eval_counts=...)`."""
    labels = batch["labels"]
    picked = labels != -100
    counts = {"mlm_accuracy": (100.0 * (out.logits.argmax(-1)[picked] == labels[picked]).sum(), picked.sum())}
    if "nsp_logits" in out.extra:
        next_label = batch["next_sentence_label"]
        counts["nsp_accuracy"] = (100.0 * (out.extra["nsp_logits"].argmax(-1) == next_label).sum(),
                                  next_label.numel())
    return counts


def evaluate_batches(model, batches, counts=None) -> tuple[dict[str, float], dict[str, float]]:
    """One pass of `model` (in eval mode, without gradients) over `batches`: the mean loss per target
    ("loss"), the mean masked-LM loss where the model reports one ("mlm_loss": BERT's loss adds NSP), and
    each metric of `counts(batch, output) -> {name: (total, count)}` (as for `Trainer(eval_counts=...)`)
    as total / count. Returns (those values, their sizes: "targets" and each metric's count)."""
    import torch

    from attnlab.inference.generate import eval_mode
    from attnlab.training.trainer import evaluation_sums, loss_from_sums

    with eval_mode(model), torch.no_grad():
        sums, counted = evaluation_sums(lambda batch: model(**batch), batches, next(model.parameters()).device,
                                        counts)
    loss, counted = loss_from_sums(sums, counted)
    _, targets, mlm_sum = sums.tolist()
    values = {"loss": loss, "mlm_loss": mlm_sum / targets if targets else math.nan}
    sizes = {"targets": targets}
    for name, (total, count) in counted.items():
        values[name], sizes[name] = float(total) / max(float(count), 1), float(count)
    return values, sizes


def pretraining_accuracy(model, source) -> dict[str, float]:
    """The masked-token and (with an NSP head) next-sentence accuracy (%) over a source's evaluation
    batches."""
    values, _ = evaluate_batches(model, source.iter_batches(), pretraining_counts)
    return {k: v for k, v in values.items() if k.endswith("_accuracy")}


def train_run(run: RunConfig, *, resume: bool = False) -> dict[str, Any]:
    """Prepare and train; writes the run folder (checkpoints, metrics.jsonl, loss.png, run.json)."""
    from attnlab.training.checkpoint import checkpoint_present
    from attnlab.training.distributed import barrier, env_world
    from attnlab.training.trainer import BEST_DIR, CHECKPOINT_DIR, Trainer

    out = Path(run.train.out_dir)
    # The metrics the task's evaluation reports (the loss, the perplexity of token predictions, the accuracies of
    # its eval counts): a misspelt train.best_metric is refused now, not at the first evaluation.
    evaluated = {"lm": ["perplexity"], "translation": ["perplexity"], "classification": ["accuracy"],
                 "mlm": ["perplexity", "mlm_accuracy"]}[run.data.task]
    # resumed: the run's own checkpoint stands for model.init_from's folder (retrained or deleted since, say)
    if run.data.task == "mlm" and _predicts_next_sentence(
            dataclasses.replace(run, model=_resumed_init_from(run.model, str(out))) if resume else run):
        evaluated.append("nsp_accuracy")
    if run.train.best_metric not in ("loss", *evaluated):
        raise ConfigError(f"train.best_metric {run.train.best_metric!r} is not a metric that data.task = "
                          f"{run.data.task!r} evaluates; choose one of: loss, {', '.join(evaluated)}")
    _check_checkpoint_folders(out)  # before the lock, whose file would go into a checkpoint folder given as out_dir
    # Before the lock, and so before the folder is made: the device, the batch split and, under torchrun, the
    # process group. Rank 0 refusing the folder then leaves the group at once, and the other processes, held at
    # the barrier below until it holds the folder, stop with it (they waited in torchrun's rendezvous for a rank 0
    # that never came, until torchrun killed them).
    _check_device(run.train)
    # One run at a time in a folder (two interleaved their checkpoints and logs); the folder is made here, and
    # removed again if a bad setting refuses the run before anything is written (only rank 0 writes under torchrun).
    with folder_lock(out, "train.out_dir", enabled=env_world().is_main):
        barrier()
        # Checked before anything is written into the folder. A resumed run keeps the vocabulary its weights
        # were trained with (retraining a tokenizer can give another: see _from_first_process).
        tokenizer_from = Trainer.checkpoint_to_resume(out) if resume else None
        if tokenizer_from is not None:
            _check_resumed_family(run, tokenizer_from)
        # (checkpoint_present: a crash between a save's two renames left the run's checkpoint as .checkpoint.old)
        replacing = not resume and any(checkpoint_present(out / name) for name in (CHECKPOINT_DIR, BEST_DIR))
        # Preparing builds the model config, so a bad setting is refused before anything is written or the warning
        # below is given (only a language model's token files go into the folder, after that check).
        prep = prepare(run, tokenizer_from=tokenizer_from)
        if prep.eval_source is None and run.default_eval_every and run.train.eval_every:
            # the default run's evaluation every 200 steps, in a run turned into one with nothing held out (another
            # task, val_fraction 0, a text too short to spare its tail)
            run = dataclasses.replace(run, train=run.train.replace(eval_every=0))
        make_folder(out, "train.out_dir")
        if replacing:
            warnings.warn(f"{out} already holds a trained run; training from scratch replaces it (--resume "
                          "continues it instead)", stacklevel=2)
            if run.data.task != "lm" and env_world().is_main:  # a language model's token files, which no task reads
                _remove_token_files(out / "data")
        description = run.to_dict()
        if tokenizer_from is not None:
            description["model"] = _resumed_model_record(_recorded_model(out), description["model"])
        if "labels" in prep.info:  # the class names, in the order of the classifier's outputs
            description["labels"] = list(prep.info["labels"])
        description.update(prep.layout)  # a checkpoint that lost its trainer state is scored from run.json
        # The data settings and class names go into every checkpoint too: generate and evaluate read them there,
        # so a checkpoint is never scored with the labels of a run that replaced its run.json and then failed.
        data_state = {"data": run.data.to_dict(), "batches_by_length": run.data.batches_by_length,
                      "data_files": _data_file_stamps(run.data), **_label_state(prep.info), **prep.layout}
        trainer = Trainer(prep.model, run.train, prep.train_source, eval_source=prep.eval_source,
                          tokenizer=prep.tokenizer, out_dir=out, eval_counts=prep.eval_counts,
                          extra_state=data_state)
        trainer.eval_settings = run.data.eval_settings

        def describe() -> None:  # once a resumed checkpoint has proved to fit: a failed resume leaves run.json
            if tokenizer_from is not None and trainer.finished:  # trains nothing: run.json keeps what the run was
                return
            if tokenizer_from is not None:
                _warn_changed_data(tokenizer_from, data_state["data"], run.data.batches_by_length,
                                   data_state["data_files"])
            trainer.extra_state.update(data_state)  # resumed: this session's settings, as run.json says
            write_text_atomic(out / RUN_FILE, json.dumps(description, indent=2))

        summary = trainer.fit(resume=resume, on_start=describe)
        return {**summary, **prep.info}


def _resumed_model_record(previous: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The [model] table run.json records for a resumed run, from the one it recorded and the one this command
    gives. A resume continues the run's checkpoint, whatever the command names to start from: a fine-tune goes on
    from its own start (a model.* setting it was started with and the command leaves out is the checkpoint's), so
    the record keeps its init_from, however the command spells it or whichever preset it names instead; a run
    started otherwise (from a preset) records no init_from it never started from, beside its preset."""
    if "init_from" in previous:
        named, started = given.get("init_from"), previous["init_from"]
        if isinstance(named, str) and isinstance(started, str) and _other_folder(named, started):
            warnings.warn(f"model.init_from {named} is not the run this one started from ({started}, in its "
                          "run.json): a resume continues the run's own checkpoint and does not read it", stacklevel=3)
        dropped = ("init_from", "preset")
    elif previous and "init_from" in given:
        dropped = ("init_from",)
    else:
        return given
    return {**previous, **{key: value for key, value in given.items() if key not in dropped}}


def _other_folder(named: str, started: str) -> bool:
    """Whether `named` is surely not the folder `started` names: it is missing where that is there, or both are
    there and are two folders. run.json keeps init_from as it was given, relative to the folder the run started
    in, so from another one `started` may not be found: then nothing is said."""
    def found(path: str) -> Path | None:
        try:
            folder = Path(path).expanduser()
            return folder if folder.exists() else None
        except (OSError, RuntimeError, ValueError):  # a home folder that cannot be found, a NUL byte
            return None

    a, b = found(named), found(started)
    if b is None:
        return False
    try:
        return a is None or not os.path.samefile(a, b)
    except OSError:
        return False


def _recorded_model(out: Path) -> dict[str, Any]:
    """The [model] table the run.json in `out` records ({} where there is none, or it cannot be read)."""
    try:
        model = json.loads((out / RUN_FILE).read_text(encoding="utf-8")).get("model")
    except (OSError, ValueError, AttributeError, RecursionError):
        return {}
    return model if isinstance(model, dict) else {}


def _check_checkpoint_folders(out: Path) -> None:
    """Refuse a train.out_dir whose checkpoint/ or best/ is not attnlab's (a file, such as the `checkpoint` file
    TensorFlow writes, or a folder holding files a checkpoint never does: another tool's): every save replaces
    them, and they were deleted (or a file, hidden as .checkpoint.old, failed the run at its next save). And one
    that is itself a checkpoint folder (a run's checkpoint/): the run's next save would delete a run made there."""
    from attnlab.training.checkpoint import CONFIG_FILE, MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, TOKENIZER_FILE
    from attnlab.training.trainer import BEST_DIR, CHECKPOINT_DIR

    if (out / CONFIG_FILE).is_file() and (out / MODEL_FILE).is_file():
        raise ConfigError(f"train.out_dir: {str(out)!r} is a checkpoint folder (a model's weights and config); "
                          "give the run folder that holds it to --resume it, or another folder")
    # (and the lock file of a run made inside a checkpoint folder, before that was refused)
    ours = {CONFIG_FILE, MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, TOKENIZER_FILE, LOCK_FILE}
    for name in (CHECKPOINT_DIR, BEST_DIR):
        path = out / name
        if not path.exists():
            continue
        foreign = None if path.is_dir() else "a file"
        if foreign is None:
            others = sorted(entry.name for entry in path.iterdir() if entry.name not in ours)
            foreign = f"it holds {others[0]!r}" if others else None
        if foreign is not None:
            raise ConfigError(f"train.out_dir: {str(path)!r} is not a checkpoint an attnlab run wrote ({foreign}), "
                              f"and each save of this run replaces it; move it, or choose another train.out_dir")


def _our_token_file(path: Path) -> bool:
    """Whether `path` is a token file that attnlab wrote: its sidecar (`build_token_file`'s) lies beside it."""
    from attnlab.data.corpus import SIDECAR_FORMAT, sidecar_path

    try:
        return json.loads(sidecar_path(path).read_text(encoding="utf-8")).get("format") == SIDECAR_FORMAT
    except (OSError, ValueError, AttributeError):  # none, unreadable, not JSON, not an object
        return False


def _remove_token_files(data_dir: Path) -> None:
    """The token files of an earlier language model in `data_dir` (a corpus's worth of disk), for a run of another
    task that replaces it (they were left beside it, unread); the user's own files there stay."""
    from attnlab.data.corpus import sidecar_path

    for name in TOKEN_FILES:
        if _our_token_file(data_dir / name):
            for path in (data_dir / name, sidecar_path(data_dir / name)):
                path.unlink(missing_ok=True)
    try:
        data_dir.rmdir()
    except OSError:  # not there, not empty, or a link to another disk: left as it is
        pass


def _check_device(train: Any) -> None:
    """Refuse a device or precision this machine lacks, or a batch the processes cannot share, before preparing the
    data, which writes a language model's token files into the folder: a run refused by the trainer (no GPU here,
    a batch of 7 for 2 processes) had replaced a finished run's data/."""
    from attnlab.training.device import resolve_precision
    from attnlab.training.distributed import init_distributed
    from attnlab.training.trainer import check_batch_split

    world, device = init_distributed(train.device)
    check_batch_split(train, world.size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the trainer gives them, once
        resolve_precision(train.precision, device, setting="train.precision")


def _check_resumed_family(run: RunConfig, checkpoint: Path) -> None:
    """Refuse to resume a checkpoint of another model family, before its tokenizer meets this config's data (a
    GPT's char vocabulary given BERT's sentence pairs was refused for lacking [CLS], a setting no one could fix)."""
    from attnlab.training.checkpoint import read_config

    if "init_from" in run.model:  # resuming, the run's own checkpoint stands for the pretrained folder
        return
    try:
        saved = read_config(checkpoint).get("family")
    except AttnlabError:  # an unreadable config: resuming reports it in its own words
        return
    family = _validate_model_keys(run.model)
    if saved != family:
        raise ConfigError(f"cannot resume: {checkpoint} holds {a_name(saved)} model, and this config trains "
                          f"{a_name(family)} one; resume with the config the run was trained with, or train into "
                          "another train.out_dir")


def _data_file_stamps(data: DataConfig) -> dict[str, str]:
    """A stamp of each data file a run reads ({setting: stamp}): its size and a hash of its first and last
    megabyte, so that a resume notices a file rewritten at the same path without reading a large corpus whole."""
    import hashlib

    stamps = {}
    for key in DATA_FILE_SETTINGS:
        value = getattr(data, key)
        if not value or not Path(value).is_file():
            continue
        path = Path(value)
        size = path.stat().st_size
        digest = hashlib.sha256(str(size).encode())
        with open(path, "rb") as f:
            digest.update(f.read(1 << 20))
            if size > 1 << 20:
                f.seek(max(1 << 20, size - (1 << 20)))
                digest.update(f.read())
        stamps[key] = f"{size}:{digest.hexdigest()[:16]}"
    return stamps


def _warn_changed_data(checkpoint: Path, data: dict[str, Any], by_length: bool,
                       data_files: dict[str, str] | None = None) -> None:
    """Warn of data settings a resumed run changes (the trainer warns of its own): another text, block size or
    masking makes other batches than the uninterrupted run's, and a tokenizer setting is the checkpoint's.
    `by_length`: whether this run sorts its batches by length."""
    extra = _saved_extra_state(checkpoint)
    saved = extra.get("data") if extra is not None else None
    if not isinstance(saved, dict):  # unreadable, or a checkpoint of a run that did not record them
        return
    changed = [key for key in data if key in saved and key != "bucket_by_length"
               and json.dumps(saved[key]) != json.dumps(data[key])]
    if _saved_batches_by_length(extra) != by_length:  # compared as what the runs did
        changed.append("bucket_by_length")
    stamps, now = extra.get("data_files"), data_files or {}
    stamps = stamps if isinstance(stamps, dict) else {}
    moved = [key for key in changed if key in stamps and stamps[key] == now.get(key)]  # another path, same contents
    kept = [key for key in changed if key in _TOKENIZER_SETTINGS]
    other = [key for key in changed if key not in _TOKENIZER_SETTINGS and key not in moved]
    rewritten = [key for key in now if key in stamps and key not in changed and stamps[key] != now[key]]
    if rewritten:
        names = ", ".join("data." + key for key in rewritten)
        warnings.warn(f"resuming on data files that changed since the checkpoint ({names}: the same path, other "
                      "contents): the run will not reproduce an uninterrupted one", stacklevel=2)
    if other:
        warnings.warn(f"resuming with changed data settings ({', '.join('data.' + k for k in other)}): the run "
                      "will not reproduce an uninterrupted one", stacklevel=2)
    if kept:
        warnings.warn(f"resuming keeps the checkpoint's tokenizer: {', '.join('data.' + k for k in kept)} "
                      "changed, and has no effect", stacklevel=2)


_TOKENIZER_SETTINGS = ("tokenizer", "vocab_size")  # a resumed run reads its saved tokenizer instead


def _saved_batches_by_length(extra: dict[str, Any]) -> bool:
    """Whether the run of a checkpoint (its trainer state's `extra_state`) sorted its batches by length. Recorded
    since mlm pairs are sorted too; before that, unset meant yes for translation and classification only, and a
    checkpoint from before the setting existed (2026-11-25) did not sort."""
    if isinstance(extra.get("batches_by_length"), bool):
        return extra["batches_by_length"]
    data = extra.get("data") or {}
    if "bucket_by_length" not in data:
        return False
    return data["bucket_by_length"] is not False and data.get("task") in ("translation", "classification")


def _label_state(info: dict[str, Any]) -> dict[str, Any]:
    """A classifier's class names for the checkpoint itself, so a checkpoint folder without its run.json
    still scores a file with the labels in training order."""
    return {"labels": list(info["labels"])} if "labels" in info else {}
