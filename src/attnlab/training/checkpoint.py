"""Checkpoints: one folder of safetensors and JSON files, written atomically, never pickled.

A checkpoint folder holds

- ``model.safetensors``: the model's state dict. A tensor shared by several names (tied embedding and
  output weights) is stored once; the header's metadata maps the other names to it ("aliases"), and
  records a classifier's class names ("labels") and the kind and vocabulary digest of the tokenizer saved
  beside the weights ("tokenizer"), so that one copied in from another run is refused.
- ``config.json``: the model config, ``{"family": ..., **fields}``, enough to rebuild the model.
- ``tokenizer.json``: the tokenizer, when the run has one.
- ``optimizer.safetensors``: every optimizer state tensor, named ``<param index>.<name>``, with the
  parameter groups (hyperparameters) and any non-tensor state as JSON in the header's metadata.
- ``trainer_state.json``: step, best eval metric, RNG states, data position, trainer config, world
  size and the caller's extra state.

Atomic writes: everything goes into a hidden sibling folder ``.NAME.tmp`` whose files are fsynced;
then the current folder is renamed to ``.NAME.old``, the new one renamed into place, and the old one
removed. A crash at any point leaves a complete checkpoint: either ``NAME`` itself, or (when the crash
fell between the two renames) ``.NAME.old``, which the loaders fall back to.

Loading reads only JSON and safetensors: nothing is unpickled, so a checkpoint from anywhere is safe
to open.
"""

from __future__ import annotations

import base64
import contextvars
import hashlib
import itertools
import json
import os
import random
import re
import shutil
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from attnlab.errors import AttnlabError, CheckpointError, ConfigError, a_name, one_line
from attnlab.files import check_readable, fsync_path, ordinary_permissions
from attnlab.training.device import _mps_available, select_device
from attnlab.training.distributed import unwrap

T = TypeVar("T")

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
FORMAT_VERSION = 1
# Keys of an optimizer's param groups that describe the implementation on this machine (fused kernel,
# foreach...) rather than the training state; loading keeps the current optimizer's values.
_IMPLEMENTATION_KEYS = ("fused", "foreach", "capturable", "differentiable", "amsgrad", "maximize")
# The state AdamW keeps for every parameter it has updated (max_exp_avg_sq too with amsgrad).
_ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")
# Hyperparameters the optimizer being loaded into keeps: a run resumed with another train.weight_decay, betas or
# eps (warned about as a change) trains with the new values, as it does with a new lr (set every step).
_SETTING_KEYS = ("lr", "weight_decay", "betas", "eps")


class ModelMismatch(CheckpointError):
    """The checkpoint holds another model (family, weight names or shapes) than the one it is loaded into.
    `problem` is the message without its `fix`, for a caller that gives its own (a resume: another setting)."""

    def __init__(self, problem: str, fix: str = ""):
        super().__init__(f"{problem}; {fix}" if fix else problem)
        self.problem = problem


# ----------------------------------------------------------------------------------------------------
# Small file helpers


def _write_json(path: Path, data: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing; the checkpoint is incomplete, "
                              "use another one")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    # ValueError: not JSON, not UTF-8, or a number of more than 4,300 digits; RecursionError: nested too deep
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{path} is corrupt ({one_line(e)}); use another checkpoint") from None


def _read_safetensors(path: Path, *, shapes: bool = False) -> tuple[dict[str, Any], dict[str, str]]:
    """The tensors of a checkpoint's safetensors file (or with `shapes`, only their shapes, read from the header)
    and its metadata."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing; the checkpoint is incomplete, "
                              "use another one")
    check_readable(path)  # an OSError is the system's to report (permission denied), not "corrupt"
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = dict(f.metadata() or {})
            if shapes:
                return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}, metadata
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except Exception as e:  # safetensors raises its own SafetensorError (and OSError for I/O)
        raise CheckpointError(f"{path} is corrupt or not a safetensors file ({one_line(e)}); "
                              "use another checkpoint") from None
    for key, t in tensors.items():  # float8 and the like: valid safetensors, but no model here computes in them
        if (t.is_floating_point() and t.dtype not in _WEIGHT_FLOATS) or t.is_complex():
            raise CheckpointError(f"{path}: tensor {key!r} is {str(t.dtype).removeprefix('torch.')}, a type attnlab "
                                  "does not load (its weights are float32, float64, float16 or bfloat16); use "
                                  "another checkpoint")
    return tensors, metadata


_WEIGHT_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _metadata_json(metadata: dict[str, str], key: str, path: Path, default: Any) -> Any:
    if key not in metadata:
        return default
    try:
        return json.loads(metadata[key])
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{path}: header entry {key!r} is corrupt ({one_line(e)}); "
                              "use another checkpoint") from None


def _metadata_object(metadata: dict[str, str], key: str, path: Path, *, strings: bool = False) -> dict[str, Any]:
    """A header entry that must be a JSON object (of strings, with `strings`); {} when absent."""
    value = _metadata_json(metadata, key, path, {})
    if not isinstance(value, dict) or (strings and not all(isinstance(v, str) for v in value.values())):
        what = "an object of strings" if strings else "an object"
        raise CheckpointError(f"{path}: header entry {key!r} is not {what}; use another checkpoint")
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


# ----------------------------------------------------------------------------------------------------
# Folder layout and atomic replacement


def _sibling(folder: Path, suffix: str) -> Path:
    if not folder.name:  # ".", "" or "/": named by where it is (a run folder given as ".", from inside it)
        folder = Path(os.path.abspath(folder))
    return folder.parent / f".{folder.name}.{suffix}"


def _through_link(folder: Path) -> Path:
    """Where a checkpoint folder given as a symbolic link (to another disk) is: saved and removed there, with its
    `.tmp` and `.old` siblings beside it, the link kept (renamed itself, it had broken every later save)."""
    if not folder.is_symlink():
        return folder
    try:
        return folder.resolve()
    except (RuntimeError, OSError):  # a loop: RuntimeError before Python 3.13, OSError (ELOOP) since
        raise CheckpointError(f"{folder} is a symbolic link that leads back to itself (a loop); point it at a "
                              "checkpoint folder, or remove it") from None


def _complete(folder: Path) -> bool:
    return (folder / MODEL_FILE).is_file()


def _resolve(folder: Path) -> Path | None:
    """`folder` if it holds a checkpoint, else its `.old` sibling left by a crash between two renames."""
    if _complete(folder):
        return folder
    old = _sibling(_through_link(folder), "old")  # as `checkpoint_in_place` finds it
    if not folder.exists() and _complete(old):
        return old
    # A save that put its new folder in place while we looked (between the two renames, `folder` was missing and
    # then there; or `.old` already being removed): looked at again, not taken for no checkpoint (best/ was).
    return folder if _complete(folder) else None


def _save_marks(path: Path) -> tuple[tuple[Any, ...], bool]:
    """What a save of a checkpoint in `path` (a run folder or a checkpoint folder) changes, to tell whether one ran
    while a reader looked: the identity of each candidate folder and of its `.tmp` and `.old` siblings; and whether
    a sibling is there (a save under way, or one a kill cut short)."""
    marks: list[Any] = []
    siblings = False
    for folder in (path, path / "checkpoint", path / "best"):
        for candidate in (folder, _sibling(folder, "tmp"), _sibling(folder, "old")):
            try:
                stat = os.stat(candidate)
            except (OSError, ValueError):
                marks.append(None)
                continue
            marks.append((stat.st_ino, stat.st_mtime_ns))
            siblings = siblings or candidate != folder
    return tuple(marks), siblings


_SETTLING = contextvars.ContextVar("attnlab_settling", default=False)
SETTLE_TRIES, SETTLE_WAIT_S = 5, 0.05


def read_settled(read: Callable[[], T], path: str | os.PathLike[str]) -> T:
    """`read()` of a checkpoint in `path`, read again after a short wait where it failed while a training run was
    saving there: a save puts its new folder in place by two renames, and a reader that looked between them, or at
    a folder then removed, was told the checkpoint was missing, incomplete or corrupt. An error with no save
    under way (nothing changed in `path`, no `.tmp`/`.old` folder there) is raised at once. Calls inside one
    another read again once, at the outermost."""
    if _SETTLING.get():
        return read()
    token = _SETTLING.set(True)
    try:
        path = Path(path)
        for _ in range(SETTLE_TRIES - 1):
            before, _ = _save_marks(path)
            try:
                return read()
            except (AttnlabError, OSError):
                after, saving = _save_marks(path)
                if before == after and not saving:
                    raise
            time.sleep(SETTLE_WAIT_S)
        return read()
    finally:
        _SETTLING.reset(token)


def _checkpoint_of(path: Path) -> Path | None:
    """The checkpoint folder `path` itself is, or holds as ``checkpoint/`` (else ``best/``); None when none."""
    for candidate in (path, path / "checkpoint", path / "best"):
        found = _resolve(candidate)
        if found is not None:
            return found
    return None


def find_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The checkpoint folder for `path`: `path` itself, else `path/checkpoint`, else `path/best` (with a warning
    that says so: a run whose checkpoint/ is gone). A checkpoint/ that is there but holds no checkpoint (its weights
    removed, empty, a file) is refused, naming best/.

    Raises:
        CheckpointError: the path does not exist or holds no checkpoint.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        if path.name == "checkpoint" and _resolve(path.parent / "best") is not None:  # a run's, as load_run asks
            raise _no_latest(path)
        raise CheckpointError(f"{path} is a file; give a run folder (a training run's train.out_dir) or a "
                              "checkpoint folder in it")
    # A run's latest checkpoint that lost its weights (they are written before the folder is put in place), given
    # as the run or as itself, or a checkpoint/ that is a file or holds nothing: taking best/ instead, as
    # model.init_from did, started from older weights unsaid. (A folder named checkpoint without a config.json is
    # no checkpoint: a run folder of that name, say.)
    latest = path if path.name == "checkpoint" and (path / "config.json").is_file() else path / "checkpoint"
    if not _complete(path) and latest.exists() and _resolve(latest) is None and (
            not latest.is_dir() or (latest / "config.json").is_file() or _checkpoint_of(latest) is None):
        raise _no_latest(latest)  # (a run folder named checkpoint, inside: offered by name below)
    found = _checkpoint_of(path)
    if found is not None:
        if found.parent == path and found.name in ("best", ".best.old"):
            if found not in _SAID_BEST:  # once per process: model.init_from reads the run six times
                _SAID_BEST.add(found)
                warnings.warn(f"{path} has no checkpoint/ (its latest weights): using its best/ checkpoint "
                              f"(step {_saved_step(found)})", stacklevel=2)
        return found
    if not path.exists():
        raise CheckpointError(f"checkpoint folder {path} does not exist; "
                              "give a run folder or a checkpoint folder")
    runs = runs_inside(path)
    if runs:
        raise CheckpointError(f"{path} holds no model itself but the runs {runs}; give one of them")
    if (path / "run.json").is_file():  # an `attnlab train` run folder (its RUN_FILE) stopped before its first save
        raise CheckpointError(f"{path} is a run that saved no checkpoint (it stopped before its first save); train "
                              "it again, or give another run folder")
    if path.name == "checkpoint" and _resolve(path.parent / "best") is not None:  # a run's, as load_run asks
        raise _no_latest(path)
    inside = "" if path.name in ("checkpoint", "best") else " (nor in its checkpoint/ or best/ folder)"
    raise CheckpointError(f"no {MODEL_FILE} in {path}{inside}; give a checkpoint folder written by attnlab")


_SAID_BEST: set[Path] = set()  # the best/ folders `find_checkpoint` said it read for their run's checkpoint/


def _no_latest(latest: Path) -> CheckpointError:
    """The refusal of a run's checkpoint/ that is there but holds no checkpoint (a file, its weights removed, or
    nothing), naming the run's best/ where it has one, else the fix."""
    if not latest.is_dir():
        what, fix = "is a file, not a checkpoint folder", "remove or rename it"
    elif (latest / "config.json").is_file():
        what, fix = f"has no {MODEL_FILE} (removed since it was saved)", "restore the file, or train the run again"
    else:
        what, fix = "holds no checkpoint", "restore it, or train the run again"
    best = _resolve(latest.parent / "best")
    advice = fix if best is None else f"the run's best checkpoint is {best}: give that folder (generate and " \
                                      "evaluate: --best)"
    return CheckpointError(f"{latest} {what}; {advice}")


def _saved_step(folder: Path) -> str:
    """The step a checkpoint was saved at, as text ("?" where its trainer state cannot be read)."""
    try:
        return str(read_trainer_state(folder)["step"])
    except (CheckpointError, KeyError, TypeError):
        return "?"


def runs_inside(path: Path) -> str:
    """The run folders directly inside `path`, listed for a message ("" when none): an experiment's folder
    (`attnlab run knowledge` writes one run per phase) is not a run itself."""
    runs = sorted(str(sub) for sub in path.iterdir() if sub.is_dir() and not _save_sibling(sub)
                  and _written_by_attnlab(_checkpoint_of(sub)))
    return ", ".join(runs[:6]) + (", ..." if len(runs) > 6 else "")


def _save_sibling(folder: Path) -> bool:
    """Whether `folder` is a save's hidden `.NAME.tmp` (a save a kill cut short) or `.NAME.old` (found through NAME):
    not a run to offer, though it may hold a config and weights."""
    return folder.name.startswith(".") and folder.name.endswith((".tmp", ".old"))


def _written_by_attnlab(folder: Path | None) -> bool:
    """Whether a checkpoint folder's config.json is attnlab's (it names the model family): an HF `save_pretrained`
    folder (config.json and model.safetensors too) was offered as a run to pick, and then refused."""
    if folder is None:
        return False
    try:
        read_config(folder)  # a complete checkpoint folder: found as itself
    except (CheckpointError, OSError):
        return False
    return True


def _swap_into_place(new: Path, folder: Path) -> None:
    old = _sibling(folder, "old")
    if folder.exists():
        if old.exists():  # left by an earlier crash after the swap; `folder` is the good copy
            shutil.rmtree(old)
        os.rename(folder, old)
    os.rename(new, folder)
    fsync_path(folder.parent)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


def checkpoint_in_place(folder: str | os.PathLike[str]) -> Path:
    """`folder`, or where it is missing the `.old` copy a crash between two renames left in its place (complete
    or not: either may not exist)."""
    folder = Path(folder)
    return folder if folder.exists() else _sibling(_through_link(folder), "old")


def checkpoint_present(folder: str | os.PathLike[str]) -> bool:
    """Whether a checkpoint folder is there (complete or not), or the `.old` copy a crash between two renames
    left in its place."""
    return checkpoint_in_place(folder).exists()


def remove_checkpoint(folder: str | os.PathLike[str]) -> None:
    """Delete a checkpoint folder and the `.old` copy a crash between two renames may have left beside it."""
    folder = _through_link(Path(folder))
    for path in (folder, _sibling(folder, "old")):
        if path.exists():
            shutil.rmtree(path)
    fsync_path(folder.parent)


# ----------------------------------------------------------------------------------------------------
# Model weights


def _identity(t: torch.Tensor) -> tuple:
    """Names with equal identities are one tensor (tied weights): the same memory, seen the same way."""
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _unique_tensors(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Each distinct tensor once (on the CPU, contiguous, owning its storage), and alias -> stored name."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    storages: set[int] = set()
    for name, t in state.items():
        key = _identity(t)
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        out = t.detach().to("cpu").contiguous()
        if out.untyped_storage().data_ptr() in storages or out.untyped_storage().nbytes() != out.nbytes:
            out = out.clone()  # a view into a bigger or already-stored buffer: safetensors wants its own copy
        storages.add(out.untyped_storage().data_ptr())
        tensors[name] = out
    return tensors, aliases


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(map(str, t.shape)) + ")"


def _load_model_state(folder: Path, model: nn.Module, tensors: dict[str, torch.Tensor] | None = None) -> None:
    """Load the weights file into `model`; `tensors`: those `_checked_tensors` already read for its shapes."""
    expected = model.state_dict()
    if tensors is None:
        tensors = _checked_tensors(folder, expected)
    _check_shared_weights(folder / MODEL_FILE, expected, tensors)
    model.load_state_dict(tensors, strict=True)


def _checked_tensors(folder: Path, expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights file's tensors (aliases resolved) by name, refused unless they are all finite and have the
    names, shapes and kinds of the state dict `expected` (a model's, or its skeleton's on the meta device)."""
    path = folder / MODEL_FILE
    tensors, metadata = _read_safetensors(path)
    for key, t in tensors.items():  # each stored tensor once (aliases share them): one pass over the weights
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{path}: weight {key!r} contains NaN or inf (a diverged run?); use another "
                                  "checkpoint, e.g. best/")
    _resolve_aliases(tensors, metadata, path)
    key = _first_difference({k: t.shape for k, t in tensors.items()}, {k: t.shape for k, t in expected.items()})
    if key is not None:
        if key not in tensors:
            raise ModelMismatch(f"{path} has no weight {key!r}, which the model needs; "
                                "the checkpoint belongs to another model")
        if key not in expected:
            raise ModelMismatch(f"{path} has weight {key!r}, which the model does not have; "
                                "the checkpoint belongs to another model")
        raise ModelMismatch(f"{path}: weight {key!r} has shape {_shape(tensors[key])} in the checkpoint but "
                            f"{_shape(expected[key])} in the model; the checkpoint belongs to another model config")
    for key, t in expected.items():
        if tensors[key].is_floating_point() != t.is_floating_point():  # integers cast to weights, or back
            raise ModelMismatch(f"{path}: weight {key!r} is {str(tensors[key].dtype).removeprefix('torch.')} in "
                                f"the checkpoint but {str(t.dtype).removeprefix('torch.')} in the model; the file "
                                "was not written by attnlab for this model", "use another checkpoint")
    return tensors


def _resolve_aliases(values: dict[str, Any], metadata: dict[str, str], path: Path) -> None:
    """Add the names the weights file stores once under another name (tied weights), from its header."""
    for alias, target in _metadata_object(metadata, "aliases", path, strings=True).items():
        if target not in values:
            raise CheckpointError(f"{path}: alias {alias!r} points to missing tensor {target!r}; "
                                  "use another checkpoint")
        values[alias] = values[target]


def _first_difference(held: dict[str, Any], expected: dict[str, Any]) -> str | None:
    """The first name whose shape differs between the weights held and those expected: expected names in order
    (missing or of another shape), then names held that are not expected; None when they agree."""
    differing = (key for key in expected if key not in held or tuple(held[key]) != tuple(expected[key]))
    return next(itertools.chain(differing, (key for key in held if key not in expected)), None)


def _check_shared_weights(path: Path, expected: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor]) -> None:
    """Names the model shares (tied embeddings and output layer) must hold one weight in the checkpoint too:
    loading two different ones into one parameter would keep the second and silently give another model (a
    config edited to tie what the run trained untied)."""
    if any(t.is_meta for t in expected.values()):  # no storage to tell shared weights apart (every pointer is 0)
        return
    groups: dict[tuple, list[str]] = {}
    for key, t in expected.items():
        if t.numel():
            groups.setdefault(_identity(t), []).append(key)
    for keys in groups.values():
        first = tensors[keys[0]]
        for other in keys[1:]:
            if tensors[other] is not first and not torch.equal(tensors[other], first):
                raise ModelMismatch(f"{path}: weights {keys[0]!r} and {other!r} are one tensor in the model (tied) "
                                    "but differ in the checkpoint, which was saved untied",
                                    "load it with the config it was saved with (tie_embeddings / tie_output / "
                                    "share_embeddings as there)")


# Model settings that leave the function of the weights alone (regularisation, initialisation, which rows the
# training loss scores): a checkpoint loads into a model that differs in them.
# The longest sequence (block_size, max_len) may change too: where positions are weights, their shapes differ and
# the weights are refused anyway; sinusoidal, rotary or ALiBi positions extend to a longer context.
LOADABLE_CHANGES = ("dropout", "attention_dropout", "ff_dropout", "classifier_dropout", "init_std",
                    "initializer_range", "label_smoothing", "lm_logits", "mlm_logits", "block_size", "max_len")


def _check_same_function(folder: Path, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Weights of the same shapes can belong to another model: sinusoidal positions loaded into an ALiBi model,
    another activation or norm placement (a resume with `--set model.position=alibi` trained on silently)."""
    changed = [key for key in current if key in saved and key not in LOADABLE_CHANGES
               and json.dumps(saved[key], sort_keys=True) != json.dumps(current[key], sort_keys=True)]
    if changed:
        shown = ", ".join(f"{key} {saved[key]!r} → {current[key]!r}" for key in changed[:3])
        raise ModelMismatch(f"{folder} holds a model with other settings ({shown}{', ...' if len(changed) > 3 else ''}"
                            ")", "load it into a model built from its config.json")


def _model_config(model: nn.Module) -> dict[str, Any]:
    from attnlab.models.registry import config_to_dict

    config = getattr(model, "config", None)
    if config is None:
        raise ConfigError(f"{type(model).__name__} has no .config; attnlab models keep their config "
                          "dataclass in .config so checkpoints can rebuild them")
    return config_to_dict(config)


def not_rebuilt_from_config(model: nn.Module) -> str | None:
    """Why `load_model` (and with it `attnlab generate` and `evaluate`) will not give `model` back from its
    checkpoints, which rebuild the model from its config alone: weights other than those of the model the config
    builds (a subclass with modules of its own, a module added to an instance), or another class (a subclass
    that changes what the model computes); None where the config rebuilds the model."""
    from attnlab.models.registry import build_model

    model = unwrap(model)
    with torch.device("meta"):
        built = build_model(model.config)
    held = {key: t.shape for key, t in model.state_dict().items()}
    key = _first_difference(held, {key: t.shape for key, t in built.state_dict().items()})
    if key is not None:
        return (f"its weights are not those of the {type(built).__name__} its config builds (weight {key!r}), so "
                "load_model, `attnlab generate` and `attnlab evaluate` will refuse its checkpoints")
    if type(built) is not type(model):
        return (f"load_model, `attnlab generate` and `attnlab evaluate` rebuild its checkpoints as a "
                f"{type(built).__name__}, without what {type(model).__name__} changes")
    return None


# ----------------------------------------------------------------------------------------------------
# Optimizer state


def _optimizer_payload(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for index, values in state["state"].items():
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{name}"] = value.detach().to("cpu").contiguous().clone()
            else:
                scalars[f"{index}.{name}"] = _jsonable(value)
    metadata = {
        "format_version": str(FORMAT_VERSION),
        "optimizer": type(optimizer).__name__,
        "param_groups": json.dumps(_jsonable(state["param_groups"])),
        "scalars": json.dumps(scalars),
    }
    return tensors, metadata


def _load_optimizer_state(folder: Path, optimizer: torch.optim.Optimizer) -> None:
    path = folder / OPTIMIZER_FILE
    tensors, metadata = _read_safetensors(path)
    # safetensors maps the file and `load_state_dict` keeps tensors of the right dtype and device as they are: the
    # moments would stay mapped onto the checkpoint for the whole run, which Windows then refuses to replace or
    # remove at the next save. Copies own their memory. (Weights are copied into the model anyway.)
    tensors = {key: t.clone() for key, t in tensors.items()}
    groups = _metadata_json(metadata, "param_groups", path, None)
    scalars = _metadata_object(metadata, "scalars", path)
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise CheckpointError(f"{path} has no parameter groups in its header; use another checkpoint")
    if not all(isinstance(g.get("params", []), list) for g in groups):
        raise CheckpointError(f"{path}: a parameter group's 'params' in its header is not a list; the file is "
                              "damaged, use another checkpoint")
    current = optimizer.param_groups
    saved_sizes = [len(g.get("params", [])) for g in groups]
    sizes = [len(g["params"]) for g in current]
    if saved_sizes != sizes:
        if sum(saved_sizes) == sum(sizes):  # the same parameters, grouped for weight decay by another rule
            raise CheckpointError(f"{path} groups the optimizer's {sum(sizes)} parameters for weight decay as "
                                  f"{saved_sizes}, this optimizer as {sizes} (the rule changed since it was saved: "
                                  "bilinear attention's key bias is no longer decayed); its optimizer state cannot be "
                                  "resumed: start a new run from its weights with --set model.init_from=<run folder> "
                                  "(and without model.preset)")
        raise CheckpointError(f"{path} holds optimizer state for parameter groups of sizes {saved_sizes} "
                              f"but the optimizer has {sizes}; the checkpoint belongs to another model")
    params = [p for g in current for p in g["params"]]
    state: dict[int, dict[str, Any]] = defaultdict(dict)
    try:
        for key, value in [*tensors.items(), *scalars.items()]:
            index, name = key.split(".", 1)
            state[int(index)][name] = value
    except ValueError:
        raise CheckpointError(f"{path}: unexpected entry {key!r}; use another checkpoint") from None
    required = _ADAM_STATE if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) else ()
    if required and any(g.get("amsgrad") for g in current):
        required += ("max_exp_avg_sq",)
    for index, values in state.items():
        if not 0 <= index < len(params):
            raise CheckpointError(f"{path}: state for parameter {index} but the optimizer has {len(params)}; "
                                  "the checkpoint belongs to another model")
        for name, value in values.items():
            if isinstance(value, torch.Tensor) and value.ndim > 0 and value.shape != params[index].shape:
                raise CheckpointError(f"{path}: optimizer state {index}.{name} has shape {_shape(value)} "
                                      f"but its parameter has {_shape(params[index])}; the checkpoint "
                                      "belongs to another model")
    for index, values in state.items():  # after the checks that name another model
        missing = [name for name in required if name not in values]
        if missing:  # torch's step would fail on it with a KeyError
            raise CheckpointError(f"{path}: the optimizer state of parameter {index} lacks {missing[0]!r}; the file "
                                  "is damaged, use another checkpoint")
    offset = 0
    for saved, group in zip(groups, current):
        # The state is keyed by each parameter's position (checked above), so the groups' ids are those positions;
        # torch maps state to parameters through them, and an id edited in the header moved state silently.
        saved["params"] = list(range(offset, offset + len(group["params"])))
        offset += len(group["params"])
        for key in (*_IMPLEMENTATION_KEYS, *_SETTING_KEYS):
            if key in group:
                saved[key] = group[key]
        if "betas" in saved:
            saved["betas"] = tuple(saved["betas"])
    optimizer.load_state_dict({"state": dict(state), "param_groups": groups})


# ----------------------------------------------------------------------------------------------------
# RNG states, encoded as JSON


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def capture_rng() -> dict[str, Any]:
    """The RNG states of Python's `random`, numpy's global generator and torch (CPU, CUDA, MPS), as JSON."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    if _mps_available():
        state["mps"] = _b64(torch.mps.get_rng_state())
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set the RNG states captured by `capture_rng`.

    Raises:
        CheckpointError: a malformed state.
    """
    try:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
        torch.set_rng_state(_unb64(state["torch"]))
        if "cuda" in state and torch.cuda.is_available():
            saved = [_unb64(s) for s in state["cuda"]]
            if len(saved) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(saved)
            # Else which saved state belongs to which GPU is unknown: they are left as they are. Training does not
            # draw from them: the trainer seeds every generator at each step (`seed_step`), so a resumed run's
            # dropout is the uninterrupted run's on any number of GPUs.
        if "mps" in state and _mps_available():
            torch.mps.set_rng_state(_unb64(state["mps"]))
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"the RNG states in the checkpoint are malformed ({one_line(e)}); "
                              "use another checkpoint") from None


# ----------------------------------------------------------------------------------------------------
# Public API


def save_checkpoint(folder: str | os.PathLike[str], model: nn.Module,
                    optimizer: torch.optim.Optimizer | None = None,
                    trainer_state: dict[str, Any] | None = None, tokenizer: Any = None) -> Path:
    """Write a checkpoint folder atomically (see the module docstring) and return its path.

    Args:
        folder: the checkpoint folder, e.g. ``runs/x/checkpoint``; replaced if it exists.
        model: the model (DDP and torch.compile wrappers are looked through); it must have a `.config`.
        optimizer: also saved when given, for resuming.
        trainer_state: a JSON-serialisable dict written to ``trainer_state.json``.
        tokenizer: an object with ``save(path)``, written to ``tokenizer.json``.
    """
    given = folder = Path(folder)
    model = unwrap(model)
    config = _model_config(model)
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder = _through_link(folder)
    tmp = _sibling(folder, "tmp")
    if tmp.exists():  # left by a crash during an earlier save
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        tensors, aliases = _unique_tensors(model.state_dict())
        metadata = {"format_version": str(FORMAT_VERSION), "aliases": json.dumps(aliases)}
        labels = ((trainer_state or {}).get("extra_state") or {}).get("labels")
        if labels:  # a classifier's class names travel with its weights (trainer_state.json may be left behind)
            metadata["labels"] = json.dumps(list(labels))
        if tokenizer is not None and hasattr(tokenizer, "kind") and hasattr(tokenizer, "vocab"):
            metadata["tokenizer"] = json.dumps(tokenizer_fingerprint(tokenizer))
        save_file(tensors, str(tmp / MODEL_FILE), metadata=metadata)
        ordinary_permissions(tmp / MODEL_FILE)
        fsync_path(tmp / MODEL_FILE)
        _write_json(tmp / CONFIG_FILE, config)
        if tokenizer is not None:
            tokenizer.save(tmp / TOKENIZER_FILE)
            fsync_path(tmp / TOKENIZER_FILE)
        if optimizer is not None:
            opt_tensors, opt_metadata = _optimizer_payload(optimizer)
            save_file(opt_tensors, str(tmp / OPTIMIZER_FILE), metadata=opt_metadata)
            ordinary_permissions(tmp / OPTIMIZER_FILE)
            fsync_path(tmp / OPTIMIZER_FILE)
        if trainer_state is not None:
            _write_json(tmp / STATE_FILE, {"format_version": FORMAT_VERSION, **trainer_state})
        fsync_path(tmp)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        failure = _as_os_error(e, folder)
        if failure is not None:
            raise failure from None
        raise
    _swap_into_place(tmp, folder)
    return given


def _as_os_error(e: BaseException, folder: Path) -> OSError | None:
    """safetensors and tokenizers report a failed write (a full disk) as their own exceptions with the system's
    "(os error N)" in the message: as an OSError, the command line gives it one line, as it does for Python's own
    writes. None for anything else."""
    if isinstance(e, OSError):
        return None
    found = re.search(r"\(os error (\d+)\)", str(e))
    if found is None:
        return None
    code = int(found.group(1))
    return OSError(code, os.strerror(code), str(folder))


def hf_config_message(file: Path, config: Any, then: str) -> str | None:
    """What to say of a config.json (`file`, read as `config`) that is a Hugging Face transformers model's, given
    where an attnlab run's belongs (`then`: what to do with the converted run); None for any other config."""
    if not isinstance(config, dict) or "family" in config or not isinstance(config.get("model_type"), str):
        return None
    return (f"{file} is a Hugging Face model's (model_type {config['model_type']!r}), not an attnlab run's; make a run "
            f"folder of a BERT or GPT-2 one with `attnlab convert HF_FOLDER RUN_FOLDER` and {then}")


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The model config dict (``{"family": ...}``) of the checkpoint at `path` (run or checkpoint folder)."""
    folder = find_checkpoint(path)
    config = _read_json(folder / CONFIG_FILE)
    hf = hf_config_message(folder / CONFIG_FILE, config, "give that")
    if hf is not None:
        raise CheckpointError(hf)
    if not isinstance(config, dict) or "family" not in config:
        raise CheckpointError(f"{folder / CONFIG_FILE} has no model family; use another checkpoint")
    return config


def _weights_entry(folder: Path, key: str) -> Any:
    """The JSON entry `key` of the weights file's metadata; None where it has none or it cannot be read."""
    try:
        with safe_open(str(folder / MODEL_FILE), framework="pt") as f:
            raw = (f.metadata() or {}).get(key)
        return json.loads(raw) if raw else None
    except Exception:  # a damaged header is load_model's to report; here it only means no entry
        return None


def saved_labels(path: str | os.PathLike[str]) -> list[str] | None:
    """The class names a classifier's weights file carries (None: none, or an unreadable entry)."""
    labels = _weights_entry(find_checkpoint(path), "labels")
    return [str(x) for x in labels] if isinstance(labels, list) and labels else None


def tokenizer_fingerprint(tokenizer: Any) -> dict[str, str]:
    """What the weights file records of the tokenizer saved beside it: its kind, a digest of its vocabulary in id
    order (two tokenizers of one size and kind can still give the same ids to other tokens), and one of which token
    plays which special part (an edited file with no pad, or mask and unk swapped, kept the vocabulary)."""
    def digest(value: Any) -> str:
        return hashlib.sha256(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")).hexdigest()

    fingerprint = {"type": str(tokenizer.kind), "vocab_sha256": digest(tokenizer.vocab())}
    specials = getattr(tokenizer, "specials", None)
    if specials is not None:
        fingerprint["specials_sha256"] = digest(specials.to_dict())
    return fingerprint


def class_names(path: str | os.PathLike[str]) -> list[str] | None:
    """The class names a classifier checkpoint was trained with, in output order: trainer_state.json's, else
    the weights file's own copy (a checkpoint copied without its trainer state). None: neither has them."""
    try:
        extra = read_trainer_state(path).get("extra_state")
    except CheckpointError:  # no or unreadable trainer state
        extra = None
    labels = extra.get("labels") if isinstance(extra, dict) else None
    if isinstance(labels, list) and labels:
        return [str(x) for x in labels]
    try:
        return saved_labels(path)
    except CheckpointError:  # no checkpoint there at all
        return None


def check_tokenizer_fits(config: Any, tokenizer: Any, folder: str | os.PathLike[str]) -> None:
    """Refuse the tokenizer.json of `folder` where it cannot be the one its weights were trained with: another
    vocabulary size than the embeddings' (`config`: a model config or its dict), pad, bos or eos tokens at
    other ids than the config's, or another kind or vocabulary than the weights file records (a tokenizer
    copied from another run of the same size).

    Raises:
        CheckpointError: naming the file and the difference.
    """
    def get(name: str) -> Any:
        return config.get(name) if isinstance(config, dict) else getattr(config, name, None)

    file = Path(folder) / TOKENIZER_FILE
    for name in ("vocab_size", "src_vocab_size", "tgt_vocab_size"):
        embeddings = get(name)
        if embeddings is not None and embeddings != tokenizer.vocab_size:
            raise CheckpointError(f"{file} does not belong to these weights ({tokenizer.vocab_size} tokens, "
                                  f"{embeddings} embeddings); use the run's own tokenizer.json")
    for name in ("pad_id", "bos_id", "eos_id"):
        want, have = get(name), getattr(tokenizer, name, None)
        if want is not None and have is not None and want != have:
            raise CheckpointError(f"{file} does not belong to these weights (its {name[:-3]} token is id {have}, "
                                  f"the model's is {want}); use the run's own tokenizer.json")
    saved = _weights_entry(Path(folder), "tokenizer")  # written since 2026-12-06; older checkpoints have none
    if not isinstance(saved, dict) or not hasattr(tokenizer, "kind") or not hasattr(tokenizer, "vocab"):
        return
    have = tokenizer_fingerprint(tokenizer)
    if saved.get("type") != have["type"]:
        raise CheckpointError(f"{file} does not belong to these weights (a {have['type']} tokenizer; they were "
                              f"trained with a {saved.get('type')} one); use the run's own tokenizer.json")
    if saved.get("vocab_sha256") != have["vocab_sha256"]:
        raise CheckpointError(f"{file} does not belong to these weights (its {tokenizer.vocab_size} tokens are "
                              "not the vocabulary they were trained with); use the run's own tokenizer.json")
    if "specials_sha256" in saved and saved["specials_sha256"] != have.get("specials_sha256"):  # since 2026-12-07
        raise CheckpointError(f"{file} does not belong to these weights (its special tokens, "
                              f"{_specials_said(tokenizer)}, are not the ones they were trained with); use the run's "
                              "own tokenizer.json")


def _specials_said(tokenizer: Any) -> str:
    specials = getattr(tokenizer, "specials", None)
    named = [f"{name} {token!r}" for name, token in specials.items()] if specials is not None else []
    return ", ".join(named) or "none"


def read_trainer_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The contents of the checkpoint's ``trainer_state.json``."""
    folder = find_checkpoint(path)
    state = _read_json(folder / STATE_FILE)
    if not isinstance(state, dict):
        raise CheckpointError(f"{folder / STATE_FILE} is not a JSON object; use another checkpoint")
    return state


def load_model(path: str | os.PathLike[str], device: str | torch.device = "cpu") -> nn.Module:
    """Rebuild the model saved at `path` and load its weights; returned in eval mode on `device`, in fp32
    whatever dtype the weights were saved in (`model.to(torch.bfloat16)` for half-precision weights).

    Args:
        path: a checkpoint folder, or a run folder (its ``checkpoint/``, else its ``best/``).
        device: a torch device, or a name `select_device` takes ("auto", "cpu", "cuda", "cuda:N", "mps").

    Raises:
        CheckpointError: missing folder or file, corrupt file, or an unknown model family.
        ConfigError: a device name that is not one, or a device this machine does not have.
    """
    if isinstance(device, str):  # checked first: "auto" failed in torch's words, after the whole model was loaded
        device = select_device(device)

    def load() -> nn.Module:
        folder = find_checkpoint(path)
        # The weights are checked against the model's skeleton first: a config.json whose sizes were damaged
        # (block_size 10**12) is refused by its weights' shapes, before gigabytes are allocated.
        tensors = _checked_tensors(folder, _skeleton(folder).state_dict())
        model = _build_saved(folder, read_config(folder))
        _load_model_state(folder, model, tensors)
        return model

    return read_settled(load, path).to(device).eval()  # a run that is training saves as it is read


def check_weights_fit_config(path: str | os.PathLike[str]) -> None:
    """Refuse a checkpoint whose config.json does not describe its weights file (one of them replaced by another
    run's), by the weights' names and shapes, read from the file's header alone: nothing is loaded. For the
    callers that read the checkpoint's tokenizer before its weights (resume, model.init_from), which would blame
    the tokenizer for the difference.

    Raises:
        CheckpointError: naming both files and the first weight that differs.
    """
    folder = find_checkpoint(path)
    expected = {key: tuple(t.shape) for key, t in _skeleton(folder).state_dict().items()}
    file = folder / MODEL_FILE
    shapes, metadata = _read_safetensors(file, shapes=True)
    _resolve_aliases(shapes, metadata, file)
    differ = _first_difference(shapes, expected)
    if differ is not None:
        held = "no such weight" if differ not in shapes else f"shape {list(shapes[differ])}"
        described = "no such weight" if differ not in expected else f"shape {list(expected[differ])}"
        raise CheckpointError(f"{file} and {folder / CONFIG_FILE} are not of one model (weight {differ!r}: "
                              f"{held} in the weights, {described} in the config); one of them was replaced by "
                              "another run's: restore the run's own files")


def _skeleton(folder: Path) -> nn.Module:
    """The model the checkpoint's config.json describes, built on the meta device (shapes, no memory)."""
    config = read_config(folder)
    with torch.device("meta"):
        return _build_saved(folder, config)


def _build_saved(folder: Path, config: dict[str, Any]) -> nn.Module:
    """The model `config` (the folder's config.json) describes, untrained, on torch's default device."""
    from attnlab.models.registry import build_model

    try:
        return build_model(config)
    except ConfigError as e:
        raise CheckpointError(f"{folder / CONFIG_FILE}: {e}") from None
    except (MemoryError, RuntimeError) as e:  # tables computed on the CPU even for the skeleton (sinusoidal, rotary)
        if not isinstance(e, MemoryError) and "can't allocate memory" not in str(e):
            raise
        length, width = config.get("block_size", config.get("max_len")), config.get("d_model")
        raise CheckpointError(f"{folder / CONFIG_FILE} describes a model too large for this machine's memory "
                              f"(sequences of {length} tokens, {width} wide); if the file was edited, restore the "
                              "run's own config.json") from None


def load_checkpoint_into(path: str | os.PathLike[str], model: nn.Module,
                         optimizer: torch.optim.Optimizer | None = None) -> dict[str, Any]:
    """Load the checkpoint at `path` into an existing model (and optimizer); return its trainer state
    (an empty dict when the checkpoint has none).

    Raises:
        CheckpointError: missing/corrupt files.
        ModelMismatch: a checkpoint of another model family or shape (the message names the first
            mismatching weight and both shapes).
    """
    folder = find_checkpoint(path)
    model = unwrap(model)
    saved_family = read_config(folder)["family"]
    family = _model_config(model)["family"]
    if saved_family != family:
        raise ModelMismatch(f"{folder} holds {a_name(saved_family)} model but the model is {family!r}",
                            "give a checkpoint of the same model family")
    _check_same_function(folder, read_config(folder), _model_config(model))
    _load_model_state(folder, model)
    if optimizer is not None:
        _load_optimizer_state(folder, optimizer)
    return read_trainer_state(folder) if (folder / STATE_FILE).exists() else {}
