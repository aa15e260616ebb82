"""`attnlab run knowledge`: does pretraining give a model knowledge that fine-tuning can make it access?

The experiment of Stanford CS224n 2021, assignment 5. A character-level GPT is

1. pretrained with span corruption on biographies (one per line: "Jane Doe. Jane Doe is a painter born
   in Lyon ...", see `attnlab.data.knowledge.SpanCorruptionSource`), then
2. fine-tuned on ``Where was X born?<TAB>place`` pairs (loss on the answer only), and
3. asked about *other* people, whose birthplaces it can only know from the pretraining corpus.

Each variant is a row of the results table: ``none`` fine-tunes from scratch (no pretraining); an
attention variant (``dot``, ``synthesizer-dense``, ...), a position scheme (``rotary``, ``alibi``, ...)
or a combination (``synthesizer-dense+rotary``) is pretrained then fine-tuned. Answering "London" for
everyone, and answering the most common training birthplace, are the baselines.

Without files the data is a synthetic world (`attnlab.data.world`): people split so that the evaluation
people appear only in the pretraining corpus. With ``corpus``/``train``/``eval`` files it reads the
assignment's formats; ``scale="full"`` then reproduces the assignment's settings (its learning rate held at
10 % past the decay horizon, where the assignment's uncapped cosine rises again late in pretraining).
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import re
import shutil
import time
import unicodedata
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnlab.config import Config, check_positive, finite_number
from attnlab.data.world import WORLD_MARK, make_world, write_files
from attnlab.errors import AttnlabError, CheckpointError, ConfigError, DataError
from attnlab.files import atomic_path, folder_lock, write_text_atomic

# The course notes' figures (CS224n 2021 a5 reference solution, dev set of 500 questions).
NOTES = {"none": 1.2, "dot": 22.2, "synthesizer-dense": 23.8, "london": 5.0}
ASSIGNMENT_VOCAB = 256  # distinct characters of the assignment's wiki.txt, pad and mask included
DEFAULT_VARIANTS = ("none", "dot", "synthesizer-dense")

DATA_SOURCES = {"synthetic": "synthetic data", "files": "data from files"}  # how the output names data.source


@dataclass
class KnowledgeScale(Config):
    """Every setting of one scale of the experiment.

    Attributes:
        n_people: people in the synthetic world (ignored with a user corpus).
        eval_fraction: share of the synthetic people kept for evaluation.
        n_layers, n_heads, d_model, block_size, dropout: the character GPT (learned positions).
        pretrain_epochs: pretraining draws this many times the corpus's number of documents as corrupted samples,
            in full batches (an epoch's last batch is topped up from the start of its shuffle, so the samples come
            from somewhat fewer shuffles of the corpus, and a document is seen about, not exactly, this many times).
        pretrain_batch, pretrain_lr: pretraining batch size and peak learning rate.
        finetune_batch, finetune_lr: fine-tuning batch size and peak learning rate.
        finetune_epochs_scratch: fine-tuning epochs without pretraining (counted as pretrain_epochs is).
        finetune_epochs_pretrained: fine-tuning epochs after pretraining.
        warmup_tokens: linear warmup length, in block-size windows × batch (the assignment counts tokens).
        decay_epochs: the cosine reaches 10% of the peak after this many passes over the *pretraining
            corpus* worth of tokens (the assignment's 200·len(corpus)·block_size), then stays there;
            None = at the end of each phase.
        weight_decay: AdamW weight decay on matrices.
        precision: "auto" (bf16 where supported), "bf16" or "fp32".
    """

    n_people: int = 400
    eval_fraction: float = 0.25
    n_layers: int = 4
    n_heads: int = 8
    d_model: int = 256
    block_size: int = 128
    dropout: float = 0.1
    pretrain_epochs: float = 650.0
    pretrain_batch: int = 128
    pretrain_lr: float = 6e-3
    finetune_batch: int = 256
    finetune_lr: float = 6e-4
    finetune_epochs_scratch: float = 75.0
    finetune_epochs_pretrained: float = 10.0
    warmup_tokens: int = 512 * 20
    decay_epochs: float | None = 200.0
    weight_decay: float = 0.1
    precision: str = "auto"

    def __post_init__(self):
        for name in ("n_people", "n_layers", "n_heads", "d_model", "block_size", "pretrain_epochs",
                     "pretrain_batch", "pretrain_lr", "finetune_batch", "finetune_lr",
                     "finetune_epochs_scratch", "finetune_epochs_pretrained"):
            check_positive(name, getattr(self, name))
        check_positive("warmup_tokens", self.warmup_tokens, allow_zero=True)
        check_positive("weight_decay", self.weight_decay, allow_zero=True)
        if self.decay_epochs is not None:
            check_positive("decay_epochs", self.decay_epochs)
        if not 0 < self.eval_fraction < 1:
            raise ConfigError(f"eval_fraction must be between 0 and 1, got {self.eval_fraction}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")


SCALES: dict[str, KnowledgeScale] = {
    # Minutes on a 2-core CPU: a narrow model, a small world seen many times (knowledge needs hundreds of
    # passes to be stored), small batches with a hot learning rate, no dropout or weight decay.
    "quick": KnowledgeScale(
        n_people=200, eval_fraction=0.5, n_layers=4, n_heads=4, d_model=128, block_size=128, dropout=0.0,
        pretrain_epochs=300, pretrain_batch=32, pretrain_lr=3e-3, finetune_batch=32, finetune_lr=5e-4,
        finetune_epochs_scratch=40, finetune_epochs_pretrained=10, warmup_tokens=128 * 32 * 5,
        decay_epochs=None, weight_decay=0.0),
    # Under an hour: the assignment's model (4 layers, 8 heads, 256 wide) on a bigger world.
    "standard": KnowledgeScale(
        n_people=500, eval_fraction=0.3, n_layers=4, n_heads=8, d_model=256, block_size=128, dropout=0.0,
        pretrain_epochs=350, pretrain_batch=32, pretrain_lr=2e-3, finetune_batch=32, finetune_lr=5e-4,
        finetune_epochs_scratch=40, finetune_epochs_pretrained=10, warmup_tokens=128 * 32 * 5,
        decay_epochs=None, weight_decay=0.0),
    # The assignment's settings (hours on a CPU; meant for its wiki.txt and birth_places files). Its minGPT clips
    # a cosine at 10 % (reached near epoch 159 of the 200 to the horizon; ours reaches 10 % at the horizon) and
    # does not cap the progress, so its rate rises again from epoch 241, where this one stays at 10 %.
    "full": KnowledgeScale(n_people=2500, eval_fraction=0.2),
}


def scale_label(scale: str, changed: dict[str, Any] | None) -> str:
    """"quick", or "quick with n_people=40, pretrain_epochs=16" where --set changed the scale's settings: the
    table and its header then say that its figures are not the scale's."""
    if not changed:
        return scale
    return f"{scale} with " + ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                        for k, v in changed.items())


def changed_settings(scale: str, settings: KnowledgeScale) -> dict[str, Any]:
    """The settings that differ from the scale's own, in the order the scale lists them."""
    base, now = SCALES[scale].to_dict(), settings.to_dict()
    return {k: v for k, v in now.items() if base.get(k) != v}


def scale_settings(scale: str, overrides: dict[str, Any] | None = None) -> KnowledgeScale:
    if scale not in SCALES:
        raise ConfigError(f"unknown scale {scale!r}; choose one of: {', '.join(SCALES)}")
    base = SCALES[scale]
    return KnowledgeScale.from_dict({**base.to_dict(), **(overrides or {})})  # named as --set gives them


# ------------------------------------------------------------------------------------------------
# Variants
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    name: str
    pretrain: bool
    attention: str = "dot"
    position: str = "learned"

    @property
    def label(self) -> str:
        return "no pretraining" if not self.pretrain else f"{self.name} (pretrained)"


def parse_variants(spec: str | list[str] | tuple[str, ...] | None) -> list[Variant]:
    """Variants from names: "none" (no pretraining), an attention variant, a position scheme, or
    "attention+position". Unknown names fail with the lists of known ones."""
    from attnlab.modules.positions import POSITIONS, check_compatible
    from attnlab.modules.variants import VARIANTS

    names = list(DEFAULT_VARIANTS) if spec is None else (
        [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec))
    names = [n for n in names if n]
    if not names:
        raise ConfigError("no variants given; e.g. --variants none,dot,synthesizer-dense")
    out: list[Variant] = []
    for name in names:
        if name in ("none", "scratch"):
            out.append(Variant("none", pretrain=False))
            continue
        attention, position = "dot", "learned"
        given: dict[str, str] = {}
        name = "+".join(part.strip() for part in name.split("+"))  # "dot + rotary" as "dot+rotary"
        for part in name.split("+"):
            kind = "attention variant" if part in VARIANTS.names() else \
                "position scheme" if part in POSITIONS.names() else None
            if kind is not None and given.get(kind) == part:
                raise ConfigError(f"variant {name!r} names the {kind} {part} twice; name it once")
            if kind is not None and kind in given:
                # Position schemes as rows of their own go after an attention variant ("none" alone is the row
                # without pretraining, "dot+none" the one without positions).
                rows = f"{given[kind]},{part}" if kind == "attention variant" else f"dot+{given[kind]},dot+{part}"
                raise ConfigError(f"variant {name!r} names two {kind}s ({given[kind]} and {part}); a row has one "
                                  f"of each: give them as separate rows, e.g. --variants {rows}")
            if kind is not None:
                given[kind] = part
            if kind == "attention variant":
                attention = part
            elif kind == "position scheme":
                position = part
            else:
                raise ConfigError(f"unknown variant {part!r}; use 'none', an attention variant "
                                  f"({', '.join(VARIANTS.names())}) or a position scheme "
                                  f"({', '.join(POSITIONS.names())}), joined by '+' to combine")
        check_compatible(attention, position)
        out.append(Variant(name, pretrain=True, attention=attention, position=position))
    # One row per model, whatever its spelling: "dot", "learned" and "dot+learned" are the same one, which was
    # trained and reported once per spelling.
    seen: set[tuple] = set()
    return [v for v in out if not ((key := (v.pretrain, v.attention, v.position) if v.pretrain else (False,)) in seen
                                   or seen.add(key))]


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------


@dataclass
class KnowledgeData:
    corpus: list[str]
    train: list[tuple[str, str]]
    dev: list[tuple[str, str]]
    predict: list[str] = field(default_factory=list)
    # The line of its file each evaluation and --predict question came from (from 1; blank lines skipped),
    # so the predictions files can say which input line each row answers.
    dev_lines: list[int] = field(default_factory=list)
    predict_lines: list[int] = field(default_factory=list)
    source: str = "synthetic"
    files: dict[str, str] = field(default_factory=dict)
    # The synthetic world's files by name (`World.files`), written into data/ once the run's checks have passed.
    world_files: dict[str, str] | None = None
    # How errors about the fine-tuning pairs name them: the --train file, or the generated world (whose
    # data/train.tsv is not written until the run is accepted, and may hold an earlier run's world until then).
    train_name: str = "fine-tuning pairs"


def load_data(out: Path, settings: KnowledgeScale, *, corpus: str | None, train: str | None,
              eval_path: str | None, predict: str | None, seed: int) -> KnowledgeData:
    """The user's files, or a synthetic world to be written to ``out/data`` (so the run can be inspected) from
    ``data.world_files`` once everything is checked: a refused run leaves an earlier run's data alone."""
    from attnlab.data.knowledge import read_corpus, read_qa_file, read_qa_lines

    given = {"--corpus": corpus, "--train": train, "--eval": eval_path}
    if any(given.values()) and not all(given.values()):
        missing = ", ".join(k for k, v in given.items() if not v)
        raise ConfigError(f"the real-data path needs --corpus, --train and --eval together; missing {missing}")
    if corpus:
        docs = read_corpus(corpus)
        train_pairs = read_qa_file(train, block_size=settings.block_size)
        dev_rows = read_qa_lines(eval_path, block_size=settings.block_size)
        dev_pairs = [(q, a) for _, q, a in dev_rows]
        data = KnowledgeData(docs, train_pairs, dev_pairs, dev_lines=[n for n, _, _ in dev_rows],
                             source="files", files={"corpus": str(corpus), "train": str(train),
                                                    "eval": str(eval_path)}, train_name=str(train))
        _warn_repeated_questions(data, str(eval_path), str(train))
    else:
        world = make_world(settings.n_people, seed)
        train_pairs, dev_pairs = world.split(settings.eval_fraction, seed)
        name = f"the synthetic world (--seed {seed}, n_people={settings.n_people})"
        _check_world_fits(name, train_pairs, dev_pairs, settings.block_size)
        data = KnowledgeData(world.corpus_lines(), train_pairs, dev_pairs, source="synthetic",
                             dev_lines=list(range(1, len(dev_pairs) + 1)),  # data/dev.tsv: a pair a line
                             # keyed as the files given by flags are (dev.tsv is the --eval file)
                             files={"eval" if k == "dev" else k: str(v) for k, v in world.paths(out / "data").items()},
                             world_files=world.files(settings.eval_fraction, seed),
                             train_name=f"{name}, fine-tuning")
    if predict:
        rows = read_qa_lines(predict, require_answers=False, block_size=settings.block_size)
        data.predict, data.predict_lines = [q for _, q, _ in rows], [n for n, _, _ in rows]
        data.files["predict"] = str(predict)
    return data


def _check_world_fits(name: str, train: list[tuple[str, str]], dev: list[tuple[str, str]], block_size: int) -> None:
    """Refuse a generated world whose pairs do not fit the block, before anything is trained: a fine-tuning pair
    would fail its phase, and an evaluation question would fail (or its answer be cut short and scored wrong)
    only after every phase had trained. The files' pairs get the same check as they are read."""
    from attnlab.data.knowledge import _check_fits

    # question ⁇ answer ⁇ is len(q) + len(a) + 2 characters, and the block holds block_size + 1 of them.
    need = max(len(q) + len(a) + 1 for q, a in [*train, *dev])
    fix = f"a generated question cannot be shortened; raise block_size to {need} or more (--set block_size={need})"
    for kind, pairs in (("fine-tuning", train), ("evaluation", dev)):
        for i, (question, answer) in enumerate(pairs, start=1):
            _check_fits(question, answer, block_size, f"{name}, {kind} pair {i}", fix=fix)


def _warn_repeated_questions(data: KnowledgeData, eval_name: str, train_name: str) -> None:
    """Warn when evaluation questions are also fine-tuning questions: the model was trained on their answers,
    so their accuracy measures what fine-tuning taught, not access to what pretraining gave."""
    seen = {q for q, _ in data.train}
    repeated = [n for n, (q, _) in zip(data.dev_lines, data.dev) if q in seen]
    if repeated:
        where = ", ".join(map(str, repeated[:5])) + (", ..." if len(repeated) > 5 else "")
        warnings.warn(f"{len(repeated)} of the {len(data.dev)} questions of {eval_name} (lines {where}) are also "
                      f"fine-tuning questions in {train_name}: their accuracy measures what fine-tuning taught, "
                      "not knowledge access; evaluate on questions about other people", stacklevel=3)


# ------------------------------------------------------------------------------------------------
# Models and phases
# ------------------------------------------------------------------------------------------------


def model_config(settings: KnowledgeScale, vocab_size: int, variant: Variant):
    from attnlab.models.gpt import GPTConfig

    # The assignment's minGPT: untied output layer without bias, GELU, pre-norm, learned positions.
    return GPTConfig(vocab_size=vocab_size, block_size=settings.block_size, d_model=settings.d_model,
                     n_heads=settings.n_heads, n_layers=settings.n_layers, dropout=settings.dropout,
                     attention_dropout=settings.dropout, activation="gelu", attention=variant.attention,
                     position=variant.position, tie_embeddings=False)


def parameter_count(settings: KnowledgeScale, vocab_size: int, variant: Variant) -> int:
    from attnlab.models.gpt import GPT

    with torch.device("meta"):
        model = GPT(model_config(settings, vocab_size, variant))
    return sum(p.numel() for p in model.parameters())


def _phase_config(settings: KnowledgeScale, *, batch: int, lr: float, epochs: float, n_examples: int,
                  n_corpus: int, seed: int, device: str, progress: bool) -> dict[str, Any]:
    def ceil(x: float) -> int:  # a count past any float (epochs 1e308) is refused by the trainer, named there
        return math.ceil(x) if math.isfinite(x) else 2**63

    steps = max(1, ceil(epochs * n_examples / batch))
    tokens_per_step = batch * settings.block_size
    warmup = min(steps - 1, ceil(settings.warmup_tokens / tokens_per_step)) if steps > 1 else 0
    decay = None
    if settings.decay_epochs is not None:
        decay = max(warmup + 1, ceil(settings.decay_epochs * n_corpus * settings.block_size / tokens_per_step))
    return {"steps": steps, "batch_size": batch, "lr": lr, "warmup_steps": warmup, "decay_steps": decay,
            "schedule": "cosine", "min_lr_ratio": 0.1, "weight_decay": settings.weight_decay,
            "betas": (0.9, 0.95), "grad_clip": 1.0, "seed": seed, "precision": settings.precision,
            "device": device, "progress": progress, "log_every": max(1, min(25, steps // 50 or 1)),
            "save_every": max(0, steps // 4)}


def _check_phase_settings(kind: str, variant: Variant, config: dict[str, Any]) -> None:
    """Refuse a phase whose trainer settings the trainer refuses, naming the experiment's settings they come from
    (the trainer names its own, which the user never gave)."""
    from attnlab.training.trainer import TrainerConfig

    try:
        TrainerConfig.from_dict(config, where="train")
    except ConfigError as e:
        epochs = ("pretrain_epochs" if kind == "pretrain" else
                  "finetune_epochs_pretrained" if variant.pretrain else "finetune_epochs_scratch")
        batch, lr = f"{kind}_batch", f"{kind}_lr"
        made_of = {"steps": f"{epochs} and {batch}", "batch_size": batch, "lr": lr, "decay_steps": "decay_epochs",
                   "warmup_steps": "warmup_tokens"}
        knobs = next((v for k, v in made_of.items() if str(e).startswith(f"train.{k}:")), "the --set values")
        phase = "pretraining" if kind == "pretrain" else "fine-tuning"
        raise ConfigError(f"--set: the {phase} phase of row {variant.name} gets a setting the trainer refuses "
                          f"from {knobs} ({e}); change {knobs}") from None


def _check_outputs_free(out: Path, rows: list[Variant], earlier: list[Path], *, predict: bool) -> None:
    """Refuse an entry of the user's where an output goes (a file named as a phase folder, a folder named as a
    table), before any phase is trained: found only when the run wrote there, it had cost every phase before."""
    paths = [out / name for name in _OUTPUT_FILES] + [out / "predictions"]
    for variant in rows:
        paths += [out / f"{kind}-{variant.name}" for kind in ("pretrain", "finetune")[not variant.pretrain:]]
        paths += [out / "predictions" / f"{variant.name}{ext}" for ext in (".tsv", ".predict.tsv")[:1 + predict]]
    for path in paths:
        folder = path.name.startswith(("pretrain-", "finetune-")) or path.name == "predictions"
        if path not in earlier and (path.is_file() if folder else path.is_dir()):
            raise ConfigError(f"--out: {str(path)!r} is a {'file' if folder else 'folder'}, where this run writes "
                              f"its {'folder' if folder else 'file'} {path.name!r}; move it, or choose another --out")


def _phase_done(folder: Path, steps: int) -> bool:
    from attnlab.training.checkpoint import read_trainer_state

    try:
        return int(read_trainer_state(folder).get("step", -1)) >= steps
    except (CheckpointError, TypeError, ValueError, OverflowError):  # no or unreadable state: not done
        return False


def _check_resumed_vocabulary(phases: list[Path], vocab) -> None:
    """--resume continues phases (their folders, with a checkpoint) trained on a vocabulary of the run's
    training data (the corpus and the fine-tuning pairs): other files, or another synthetic world, can give other
    characters, which would change every embedding's shape. Each phase's saved vocabulary is compared (a folder
    left by another run can differ)."""
    from attnlab.data.knowledge import KnowledgeVocab
    from attnlab.data.tokenizers import load_tokenizer
    from attnlab.training.checkpoint import checkpoint_in_place

    for folder in phases:
        try:
            before = KnowledgeVocab.from_tokenizer(load_tokenizer(checkpoint_in_place(folder / "checkpoint"))).itos
        except AttnlabError:
            continue  # a damaged phase: its own checkpoint check reports it
        if before != vocab.itos:
            new = sorted(set(vocab.itos) - set(before))
            gone = sorted(set(before) - set(vocab.itos))
            change = ", ".join(filter(None, [f"new {''.join(new)!r}" if new else "",
                                             f"missing {''.join(gone)!r}" if gone else ""]))
            raise ConfigError(f"--resume: the files give a vocabulary of {len(vocab.itos)} characters, but "
                              f"{folder.name} was trained with {len(before)} "
                              f"({change or 'another order'}); "
                              "resume with the same --corpus and --train files (or, for the "
                              "synthetic world, the same --seed and n_people), or start without --resume (a "
                              "run from files begun before the vocabulary held the corpus's line end, "
                              "'\\n', must start again)")


# What a finished or interrupted phase must share with this run for --resume to continue it.
_PHASE_SETTINGS = ("steps", "batch_size", "lr", "min_lr_ratio", "weight_decay", "betas", "schedule",
                   "warmup_steps", "decay_steps", "grad_clip", "seed", "precision")


def data_fingerprint(items: list) -> str:
    """A short hash of a phase's examples (documents or question/answer pairs)."""
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def _check_resumable(folder: Path, model_settings: dict[str, Any], config: dict[str, Any], fingerprint: str) -> None:
    """--resume may only continue a phase trained with this run's settings, model and data: a phase of
    another --set, --seed or file would be reused silently (and results.json record the new settings)."""
    from attnlab.training.checkpoint import read_config, read_trainer_state

    try:
        state = read_trainer_state(folder)
        saved_model = read_config(folder)
    except CheckpointError:
        return  # an unreadable phase: loading or resuming it reports the problem itself
    saved = state.get("trainer_config") if isinstance(state.get("trainer_config"), dict) else {}
    changes = []
    for key in _PHASE_SETTINGS:
        now = list(config[key]) if isinstance(config.get(key), tuple) else config.get(key)
        if key in saved and saved[key] != now:
            changes.append(f"{key} {saved[key]!r} → {now!r}")
    model_now = json.loads(json.dumps(model_settings))
    changes += [f"model.{k} {saved_model[k]!r} → {model_now[k]!r}" for k in model_now  # the vocabulary: below
                if k in saved_model and saved_model[k] != model_now[k] and k != "vocab_size"]
    extra = state.get("extra_state") if isinstance(state.get("extra_state"), dict) else {}
    if extra.get("data_sha256") not in (None, fingerprint):
        changes.append("the data (other files, or a world of another --seed or n_people)")
    if changes:
        raise ConfigError(f"--resume: {folder} was trained with other settings ({'; '.join(changes[:4])}"
                          f"{'; ...' if len(changes) > 4 else ''}); resume with the same --scale, --set, --seed "
                          "and files, or start without --resume or in another --out")


def _train_phase(model, source, folder: Path, config: dict[str, Any], tokenizer, *, resume: bool,
                 title: str, echo, fingerprint: str) -> dict[str, Any]:
    from attnlab.training.checkpoint import checkpoint_present, load_checkpoint_into
    from attnlab.training.device import SlowPrecisionWarning
    from attnlab.training.trainer import Trainer

    if resume and _phase_done(folder, config["steps"]):
        load_checkpoint_into(folder, model)
        steps = config["steps"]
        echo(f"{title}: already done ({steps} step{'s' * (steps != 1)}), loaded {folder / 'checkpoint'}")
        earlier = _earlier_seconds(folder)
        figures = _finished_phase_figures(folder)
        _warn_other_precision(folder, figures["precision"], config)
        return {"steps": config["steps"], "wall_time_s": earlier, "earlier_s": earlier, "skipped": True, **figures}
    resume_here = resume and checkpoint_present(folder / "checkpoint")  # or the .old copy a crashed save left
    earlier = _earlier_seconds(folder) if resume_here else 0.0
    steps = f"{config['steps']} step{'' if config['steps'] == 1 else 's'}"
    echo(f"{title}: {steps} of {config['batch_size']} examples of up to {source.block_size} "
         "characters" + (", packed into rows" if source.pack else ""))
    with warnings.catch_warnings():  # a slow precision was named once, when the run started; not again each phase
        warnings.simplefilter("ignore", SlowPrecisionWarning)
        trainer = Trainer(model, config, source, out_dir=folder, tokenizer=tokenizer, resume=resume_here,
                          extra_state={"data_sha256": fingerprint})
    summary = trainer.fit()
    return {"steps": summary["steps"], "wall_time_s": earlier + summary["wall_time_s"], "earlier_s": earlier,
            "skipped": False, "final_train_loss": summary["final_train_loss"],
            "tokens_per_s": summary["tokens_per_s"], "precision": summary["precision"]}


def _warn_other_precision(folder: Path, used: str | None, config: dict[str, Any]) -> None:
    """Warn where a finished phase that --resume reuses was trained in another precision than this run trains in
    (precision "auto" on a machine with bf16 and one without): the table would mix the two without a word."""
    from attnlab.training.device import SlowPrecisionWarning, precision_name, resolve_precision, select_device

    with warnings.catch_warnings():  # a slow precision was named once, when the run started
        warnings.simplefilter("ignore", SlowPrecisionWarning)
        now = precision_name(resolve_precision(config["precision"], select_device(config["device"])))
    if used is not None and used != now:  # (None: a state that does not say)
        warnings.warn(f"{folder.name} was trained in {used}, but precision {config['precision']!r} gives {now} "
                      "here: its row mixes the two (results.json gives each phase's precision); for one precision "
                      "throughout, start without --resume", stacklevel=3)


def _finished_phase_figures(folder: Path) -> dict[str, float | None]:
    """The last training loss and the tokens/s a finished phase's checkpoint records, for results.json to say
    of a phase that --resume skips what it said when the phase ran (None where the state lacks them)."""
    from attnlab.config import finite_number
    from attnlab.training.checkpoint import read_trainer_state

    try:
        state = read_trainer_state(folder)
    except CheckpointError:
        state = {}
    loss, tokens, seconds, used = (state.get(k) for k in ("last_train_loss", "tokens_seen", "train_seconds",
                                                          "precision_used"))
    return {"final_train_loss": float(loss) if finite_number(loss) else None,
            "tokens_per_s": tokens / seconds if finite_number(tokens) and finite_number(seconds) and seconds > 0
            else None, "precision": used if used in ("bf16", "fp16", "fp32") else None}


def _earlier_seconds(folder: Path) -> float:
    """The time a phase's checkpoint says was spent on it before this run (its trainer's `elapsed`): a phase that
    --resume skips or continues counts it, so the table's times stay those of the whole experiment (they read 0 s
    once a resume had skipped every phase)."""
    from attnlab.training.checkpoint import read_trainer_state

    try:
        seconds = float(read_trainer_state(folder).get("elapsed", 0.0))
    except (CheckpointError, TypeError, ValueError, OverflowError):
        return 0.0
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


@torch.no_grad()
def answer_questions(model, vocab, questions: list[str], *, batch_size: int = 128, longest: int | None = None,
                     what: str | None = "questions") -> list[str]:
    """Greedy answers: the model continues ``question ⁇`` until it writes ``⁇`` (KV cache, batched), up to the end
    of the block (or `longest` characters, if fewer): each question gets the answer it gets alone, whatever it is
    batched with. A question with a character outside the vocabulary gets "" (one warning names how many, as
    `what`; None: no warning)."""
    from attnlab.data.knowledge import MASK, parse_answer, qa_prompt
    from attnlab.inference.generate import generate

    block = model.config.block_size
    unreadable = _unreadable(vocab, questions, what)
    prompts = [None if i in unreadable else vocab.encode(qa_prompt(q)) for i, q in enumerate(questions)]
    rooms = [min(block - len(p), longest if longest is not None else block) if p is not None else 0
             for p in prompts]
    if any(room < 1 for room, p in zip(rooms, prompts) if p is not None):
        raise DataError(f"a question fills the whole block of {block} characters; shorten it")
    answers: list[str] = [""] * len(questions)

    def answer(rows: list[int], room: int) -> list[int]:
        """Answer `rows` in one batch with `room` characters each; the rows whose answers have not ended."""
        new = generate(model, [prompts[i] for i in rows], room, greedy=True, eos_id=vocab.mask_id,
                       pad_id=vocab.pad_id)
        for i, ids in zip(rows, new):
            # A pad the model writes ends the answer (parse_answer): deleting it read "Pa□ris⁇" as "Paris".
            answers[i] = parse_answer(MASK + vocab.decode(ids))
        return [i for i, ids in zip(rows, new) if vocab.mask_id not in ids and vocab.pad_id not in ids]

    # Shortest questions first, in batches whose room is the longest question's: most answers end there. One that
    # has not ended by then and has more room alone is answered again with its own room (batched with others of
    # that room), so a long question never cuts its neighbours' answers short: each gets the answer it gets alone.
    readable = sorted((i for i, p in enumerate(prompts) if p is not None), key=lambda i: len(prompts[i]))
    again: dict[int, list[int]] = {}
    for lo in range(0, len(readable), batch_size):
        chunk = readable[lo:lo + batch_size]
        room = min(rooms[i] for i in chunk)
        for i in answer(chunk, room):
            if rooms[i] > room:
                again.setdefault(rooms[i], []).append(i)
    for room, rows in again.items():
        for lo in range(0, len(rows), batch_size):
            answer(rows[lo:lo + batch_size], room)
    return answers


def _unreadable(vocab, questions: list[str], what: str | None) -> set[int]:
    """The questions holding a character the training data never had, which the model cannot read; warned of as
    `what` (None: not)."""
    from attnlab.data.knowledge import qa_prompt

    unreadable = [i for i, q in enumerate(questions) if not set(qa_prompt(q)) <= vocab.stoi.keys()]
    if unreadable and what is not None:
        first = questions[unreadable[0]]
        ch = next(c for c in qa_prompt(first) if c not in vocab.stoi)
        # A question spelt in another Unicode normal form (decomposed, as macOS names files) reads like the corpus
        # but holds other characters: say so, or the warning names a question that looks right.
        form = next((f for f in ("NFC", "NFD") if set(qa_prompt(unicodedata.normalize(f, first))) <= vocab.stoi.keys()),
                    None)
        hint = f"; in Unicode form {form} it is readable: save every file in one form (e.g. all NFC)" \
            if form is not None else ""
        warnings.warn(f"{len(unreadable)} of {len(questions)} {what} hold characters that neither the corpus nor "
                      f"the fine-tuning pairs have (the first: {first!r}, with {ch!r} U+{ord(ch):04X}); the model "
                      f"cannot read them, and their answers are left empty{hint}", stacklevel=3)
    return set(unreadable)


def _warn_other_normal_form(corpus: list[str], train: list[tuple[str, str]]) -> None:
    """Warn where the corpus and the fine-tuning pairs are written in different Unicode normal forms (accents
    composed in one, decomposed in the other, as files made on macOS can be): the pairs then spell the names with
    characters the corpus never uses, and fine-tuning teaches what pretraining cannot have stored."""
    def composed(text: str) -> bool:
        return unicodedata.is_normalized("NFC", text)

    odd_pairs = [q + "\t" + a for q, a in train if not composed(q + a)]
    odd_corpus = next((line for line in corpus if not composed(line)), None)
    if bool(odd_pairs) == (odd_corpus is not None):
        return
    where = (f"{len(odd_pairs)} of {len(train)} fine-tuning pairs are written in decomposed Unicode (the first: "
             f"{odd_pairs[0]!r}), the corpus composed") if odd_pairs else \
        f"the corpus is written in decomposed Unicode (the first such line: {odd_corpus[:60]!r}), the fine-tuning " \
        "pairs composed"
    warnings.warn(f"{where}: their accented names are spelt with other characters, so fine-tuning cannot reach what "
                  "pretraining stored of them; save every file in one form (e.g. all NFC)", stacklevel=3)


# ------------------------------------------------------------------------------------------------
# The experiment
# ------------------------------------------------------------------------------------------------


_OUTPUT_FILES = ("results.json", "results.md", "curves.png", "accuracy.png")  # written at the end of a run


# What a phase's trainer writes into its folder: its checkpoints (and the hidden siblings of an atomic save), its
# metrics log and loss curve (and their temporary files, `files.atomic_write`'s, and a replaced log's).
_PHASE_ENTRY = re.compile(r"(checkpoint|best|\.(checkpoint|best)\.(tmp|old))"
                          r"|(metrics\.jsonl|loss\.png)(\.\d+\.tmp\.(jsonl|png))?|\.metrics\.jsonl\.replaced")


def _earlier_outputs(out: Path, inputs: list[Path]) -> list[Path]:
    """What an earlier knowledge run left in `out` for this run to replace: its tables and plots, its phase
    folders (holding what a trainer writes and nothing else), and, where those show such a run, its predictions
    (`<variant>.tsv` files; the whole folder unless it holds files of the user's) and its synthetic world
    (`corpus.txt`, `train.tsv`, `dev.tsv`). Never a folder of the user's with other files (a `data/` of their own
    was deleted with them), nor one that holds an input file of this run."""
    def ours(folder: Path, allowed) -> bool:  # a file browser's own files (.DS_Store) go with the folder
        return folder.is_dir() and all(allowed(entry.name) or entry.name in _SYSTEM_FILES
                                       for entry in folder.iterdir())

    def phase(path: Path) -> bool:  # a row's phase folder (`pretrain-` only for a pretrained row) of a trainer's
        kind, row = path.name.split("-", 1)
        return _row_written(row, pretrained=kind == "pretrain" or None) and ours(path, _PHASE_ENTRY.fullmatch)

    phases = [path for path in [*sorted(out.glob("pretrain-*")), *sorted(out.glob("finetune-*"))] if phase(path)]
    tables = [out / name for name in _OUTPUT_FILES if (out / name).is_file()]
    if not phases and not tables:
        return []
    # an earlier knowledge run was here: its predictions and world go with it
    predictions = out / "predictions"
    world = out / "data"
    world_files = {"corpus.txt", "train.tsv", "dev.tsv", WORLD_MARK}
    if ours(predictions, _prediction_file):
        stale = [predictions]
    else:  # a file of the user's among them: the earlier rows' own files go, theirs stay
        rows = {path.name.split("-", 1)[1] for path in phases}
        stale = [path for row in sorted(rows) for name in (f"{row}.tsv", f"{row}.predict.tsv")
                 if (path := predictions / name).is_file()]
    generated = ours(world, world_files.__contains__) and _generated_world(out)
    found = [*stale, *phases, *tables, *([world] if generated else [])]
    given = [path.resolve() for path in inputs]
    return [path for path in found
            if not any(path.resolve() == p or path.resolve() in p.parents for p in given)]


def _prediction_file(name: str) -> bool:
    """Whether a file name is one a knowledge run gives its predictions: `<row>.tsv` or `<row>.predict.tsv`, the row
    as a run names it (a `mine.tsv` of the user's is not, nor `scratch.tsv`, and keeps the folder)."""
    return name.endswith(".tsv") and _row_written(name.removesuffix(".tsv").removesuffix(".predict"))


def _row_written(row: str, pretrained: bool | None = None) -> bool:
    """Whether a run names one of its rows `row` in its files (`none`, `dot`, `dot+rotary`: a name `--variants`
    takes, as the row's name spells it, not an alias such as `scratch` or `dot + rotary`), pretrained if asked."""
    try:
        variants = parse_variants(row) if row and "," not in row else []
    except ConfigError:
        return False
    return len(variants) == 1 and variants[0].name == row and pretrained in (None, variants[0].pretrain)


# Files a file browser leaves in folders it shows (macOS, Windows): they do not make a folder the user's.
_SYSTEM_FILES = (".DS_Store", "Thumbs.db", "desktop.ini")


def _generated_world(out: Path) -> bool:
    """Whether `out/data` holds the synthetic world of an earlier run: exactly the world its mark describes, or,
    unmarked (a run from before the mark), the world its results describe. The user's own files under the world's
    names were taken for one (beside any synthetic run's results, their own world.json removed; or put in a
    marked world's place and read by a run with --corpus/--train/--eval)."""
    mark = out / "data" / WORLD_MARK
    try:  # the world's recipe: (people, seed, eval fraction, split seed)
        if mark.is_file():  # the files must still hold it: the user may have put theirs there since
            recipe = json.loads(mark.read_text(encoding="utf-8"))
            n_people, seed, fraction, split_seed = (recipe["n_people"], recipe["seed"], recipe["eval_fraction"],
                                                    recipe["split_seed"])
        else:
            earlier = json.loads((out / "results.json").read_text(encoding="utf-8"))
            if earlier["data"]["source"] != "synthetic":
                return False
            seed = split_seed = earlier["data"]["seed"]
            n_people, fraction = earlier["settings"]["n_people"], earlier["settings"]["eval_fraction"]
        world = make_world(int(n_people), int(seed))
        return _holds_world(out / "data", world.files(float(fraction), int(split_seed)))
    except (OSError, ValueError, KeyError, TypeError, AttnlabError):  # a damaged mark, no (knowledge) results
        return False


def _holds_world(folder: Path, files: dict[str, str]) -> bool:
    """Whether `folder`'s corpus and question files hold exactly the world a run would write (one written before
    the mark, resumed): rewriting them loses nothing."""
    try:
        return all((folder / name).read_bytes() == text.encode("utf-8") for name, text in files.items()
                   if name != WORLD_MARK)
    except OSError:  # missing, or unreadable
        return False


def run_knowledge(out_dir: str | Path = "runs/knowledge", **options: Any) -> dict[str, Any]:
    """Run every variant and write ``results.md``, ``results.json``, ``curves.png``, ``accuracy.png``
    and ``predictions/`` into `out_dir`; returns the results dict. Options: scale ("quick"), variants, corpus,
    train, eval_path, predict (files), seed (0), device ("auto"), overrides (settings by name), resume, progress,
    echo (print).

    One run at a time in a folder (`folder_lock`, which makes it, and names a file given as one): a second one into
    the same `out_dir` is refused in one line."""
    from attnlab.training.distributed import env_world

    if env_world().size > 1:  # every process would write the same outputs and print the same table
        raise ConfigError("attnlab run knowledge runs in one process; run it without torchrun")
    if not str(out_dir).strip():  # "" would write into the working directory
        raise ConfigError("--out is empty; give the experiment's folder, e.g. runs/knowledge")
    for flag, key in (("--corpus", "corpus"), ("--train", "train"), ("--eval", "eval_path"), ("--predict", "predict")):
        if options.get(key) is not None and not str(options[key]).strip():  # an unset shell variable, say: it had
            # counted as not given, and the synthetic experiment ran in its place
            raise ConfigError(f"{flag} is empty; give the path of a file, or leave {flag} out")
    with folder_lock(out_dir, "--out"):
        return _run_knowledge(out_dir, **options)


def _run_knowledge(out_dir: str | Path, *, scale: str = "quick",
                   variants: str | list[str] | None = None, corpus: str | None = None, train: str | None = None,
                   eval_path: str | None = None, predict: str | None = None, seed: int = 0,
                   device: str = "auto", overrides: dict[str, Any] | None = None, resume: bool = False,
                   progress: bool = True, echo=print) -> dict[str, Any]:
    from attnlab.data.knowledge import (
        KnowledgeVocab,
        QASource,
        SpanCorruptionSource,
        exact_match,
        london_baseline,
    )
    from attnlab.models.gpt import GPT
    from attnlab.training.device import cpu_has_bf16, resolve_precision, select_device
    from attnlab.training.trainer import seed_everything

    start = time.perf_counter()
    settings = scale_settings(scale, overrides)
    worldly = [name for name in ("n_people", "eval_fraction") if name in (overrides or {})]
    if corpus and worldly:  # they would be said to change the scale (header, results), and change nothing
        raise ConfigError(f"{' and '.join(worldly)} shape{'s' if len(worldly) == 1 else ''} the synthetic world, "
                          "which --corpus, --train and --eval replace; drop "
                          + " and ".join(f"--set {name}" for name in worldly))
    rows = parse_variants(variants)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ConfigError(f"--seed must be an integer from 0 to 2**63 - 1, got {seed!r}")
    dev_name = select_device(device)  # settings that can be refused are checked before anything is written
    precision = "bf16 autocast" if resolve_precision(settings.precision, dev_name) is not None else "fp32"
    out = Path(out_dir)  # made by `run_knowledge`'s lock
    if (out / "checkpoint").is_dir() or (out / "model.safetensors").is_file():
        raise ConfigError(f"--out: {str(out)!r} holds a training run or checkpoint; give the experiment a folder "
                          "of its own, e.g. runs/knowledge")
    # Without --resume, an earlier run's outputs (finished, or stopped before its table) are replaced: rows of
    # variants this run leaves out must not sit beside its table, nor a synthetic world's data/ beside the results
    # of a run from the user's files. Only what a knowledge run writes is replaced (see `_earlier_outputs`).
    inputs = [Path(p) for p in (corpus, train, eval_path, predict) if p]
    earlier = [] if resume else _earlier_outputs(out, inputs)
    # The user's files are read before anything is written (a missing file leaves nothing behind: the lock removes
    # the folder it made), and checked with the settings before the warning that this run replaces an earlier one
    # (a refused run replaces nothing).
    data = load_data(out, settings, corpus=corpus, train=train, eval_path=eval_path, predict=predict, seed=seed)
    world = out / "data"
    if data.world_files is not None and world.exists() and world not in earlier and not _generated_world(out) \
            and not _holds_world(world, data.world_files):  # resuming too: it rewrote the user's files
        if not world.is_dir():
            raise ConfigError(f"--out: {str(world)!r} is a file, where this run writes its synthetic world's folder "
                              "'data'; move it, or choose another --out")
        raise ConfigError(f"--out: {str(world)!r} holds files that are not an earlier knowledge run's synthetic "
                          "world (or no such run's results lie beside them), and this run would write its world "
                          "there; move them (or remove the folder, if an interrupted run left it), or choose "
                          "another --out")
    # The characters of the training data only (as the assignment's): the files evaluated or answered must not
    # change the model (a new character would also move every initial weight).
    # A corpus file's line ends count, as in the assignment (its vocabulary is the set of wiki.txt's characters,
    # "\n" among them: 256 with pad and mask, the 3,323,392 parameters its model has); "\n" is in no example.
    line_end = "\n" if data.source == "files" else ""
    vocab = KnowledgeVocab.from_texts("".join(data.corpus) + line_end, "".join(q + a for q, a in data.train))
    tokenizer = vocab.to_tokenizer()
    dev_q, dev_a = [q for q, _ in data.dev], [a for _, a in data.dev]
    train_q, train_a = [q for q, _ in data.train], [a for _, a in data.train]
    counts = Counter(train_a).most_common()  # ties in the order the answers are first met
    common, ties = counts[0][0], sum(n == counts[0][1] for _, n in counts)
    n_params = {v.name: parameter_count(settings, vocab.vocab_size, v) for v in rows}
    assignment_params = parameter_count(SCALES["full"], ASSIGNMENT_VOCAB, Variant("dot", True))
    if precision == "fp32" and settings.precision == "auto" and dev_name.type == "cpu" and not cpu_has_bf16():
        precision += ", as this CPU has no bf16 instructions"
    label = scale_label(scale, changed_settings(scale, settings))
    echo(f"knowledge access, scale {label}: {len(data.corpus)} documents, {len(data.train)} fine-tuning and "
         f"{_questions(len(data.dev), 'evaluation')} ({DATA_SOURCES.get(data.source, data.source)}), "
         f"vocabulary {vocab.vocab_size}, "
         f"device {dev_name.type} ({precision})")
    layers, heads = settings.n_layers, settings.n_heads
    echo(f"model: {layers} layer{'s' * (layers != 1)}, {heads} head{'s' * (heads != 1)}, {settings.d_model} wide, "
         f"block {settings.block_size}: {n_params[rows[0].name]:,} parameters "
         f"(the assignment's model: {assignment_params:,} with its vocabulary of {ASSIGNMENT_VOCAB})")

    pretrain_source = SpanCorruptionSource(data.corpus, vocab, settings.block_size, settings.pretrain_batch,
                                           seed=seed, pack=True)
    finetune_source = QASource(data.train, vocab, settings.block_size, settings.finetune_batch, seed=seed,
                               name=data.train_name, pack=True)

    def phases(variant: Variant) -> list[tuple[str, dict[str, Any]]]:
        """(kind, trainer settings) of each phase of a row, in order."""
        plan = []
        if variant.pretrain:
            plan.append(("pretrain", _phase_config(
                settings, batch=settings.pretrain_batch, lr=settings.pretrain_lr, epochs=settings.pretrain_epochs,
                n_examples=len(data.corpus), n_corpus=len(data.corpus), seed=seed, device=device,
                progress=progress)))
        epochs = settings.finetune_epochs_pretrained if variant.pretrain else settings.finetune_epochs_scratch
        plan.append(("finetune", _phase_config(
            settings, batch=settings.finetune_batch, lr=settings.finetune_lr, epochs=epochs,
            n_examples=len(data.train), n_corpus=len(data.corpus), seed=seed, device=device, progress=progress)))
        return plan

    # Refused before an earlier run is replaced, not when a row reaches them after hours of training: a trainer
    # setting a phase cannot have (steps beyond 64 bits from a huge epochs setting), and an entry in an output's way.
    for variant in rows:
        for kind, cfg in phases(variant):
            _check_phase_settings(kind, variant, cfg)
    _check_outputs_free(out, rows, earlier, predict=bool(data.predict))
    results: list[dict[str, Any]] = []
    if earlier:
        what = ("the results of a knowledge run" if (out / "results.json").is_file() else
                "an unfinished knowledge run (" + ", ".join(p.name for p in earlier[:3])
                + (", ..." if len(earlier) > 3 else "") + ")")
        warnings.warn(f"{out} already holds {what}; this run replaces it (--resume continues it instead)",
                      stacklevel=2)
    for stale in earlier:  # everything is checked by now: the earlier run's rows must not sit beside the new ones
        if stale.is_dir():
            shutil.rmtree(stale)
        else:
            stale.unlink(missing_ok=True)
    (out / "predictions").mkdir(exist_ok=True)
    fingerprints = {"pretrain": data_fingerprint(data.corpus), "finetune": data_fingerprint(data.train)}
    sources = {"pretrain": pretrain_source, "finetune": finetune_source}

    if resume:  # every phase on disk is checked before any is trained
        from attnlab.training.checkpoint import checkpoint_present

        trained = []
        for variant in rows:
            for kind, cfg in phases(variant):
                folder = out / f"{kind}-{variant.name}"
                if checkpoint_present(folder / "checkpoint"):
                    _check_resumable(folder, model_config(settings, vocab.vocab_size, variant).to_dict(), cfg,
                                     fingerprints[kind])
                    trained.append(folder)
        # Settings and data first (they name what changed); then the characters (a --predict file with new ones).
        _check_resumed_vocabulary(trained, vocab)
    if data.world_files is not None:  # the synthetic world's files, now that the run is accepted
        write_files(world, data.world_files)
    for questions, what in ((dev_q, "evaluation questions"), (data.predict, "questions of --predict")):
        _unreadable(vocab, questions, what)  # said once, here: every row shares the vocabulary (answered silently)
    if data.source == "files":
        _warn_other_normal_form(data.corpus, data.train)
    n_phases = sum(1 + v.pretrain for v in rows)
    phase = 0
    earlier_total = 0.0  # seconds spent in earlier runs on the phases --resume skipped or continued
    for variant in rows:
        row_start = time.perf_counter()
        seed_everything(seed)
        model = GPT(model_config(settings, vocab.vocab_size, variant))
        record: dict[str, Any] = {"variant": variant.name, "label": variant.label, "pretrained": variant.pretrain,
                                  "attention": variant.attention, "position": variant.position,
                                  "parameters": n_params[variant.name]}
        for kind, cfg in phases(variant):
            phase += 1
            title = f"[{phase}/{n_phases}] {'pretrain' if kind == 'pretrain' else 'fine-tune'} {variant.name}"
            record[kind] = _train_phase(model, sources[kind], out / f"{kind}-{variant.name}", cfg, tokenizer,
                                        resume=resume, title=title, echo=echo, fingerprint=fingerprints[kind])
        model.to(dev_name).eval()  # where the trainer put it; a row whose phases --resume skipped was on the CPU
        # Each answer has the rest of the block: a cap drawn from the gold answers had stopped a longer answer at
        # the gold one's length (and scored its prefix right), and cut --predict's at 64 characters.
        predictions = answer_questions(model, vocab, dev_q, what=None)
        record["accuracy"] = exact_match(predictions, dev_a)
        record["train_accuracy"] = exact_match(answer_questions(model, vocab, train_q), train_a)
        record["correct"] = round(record["accuracy"] * len(dev_a) / 100)
        _write_predictions(out / "predictions" / f"{variant.name}.tsv", data.dev_lines, dev_q, predictions, dev_a)
        if data.predict:
            _write_predictions(out / "predictions" / f"{variant.name}.predict.tsv", data.predict_lines,
                               data.predict, answer_questions(model, vocab, data.predict, what=None), None)
        earlier = sum(record[kind].get("earlier_s", 0.0) for kind, _ in phases(variant))
        record["wall_time_s"] = time.perf_counter() - row_start + earlier
        earlier_total += earlier
        echo(f"{variant.label}: {record['accuracy']:.1f}% of {_questions(len(dev_q), 'evaluation')} "
             f"(fine-tuning questions: {record['train_accuracy']:.1f}%)")
        results.append(record)

    summary = {
        "experiment": "knowledge",
        "scale": scale,
        "changed_settings": changed_settings(scale, settings),  # --set values that differ from the scale's
        "data": {"source": data.source, "documents": len(data.corpus), "train_questions": len(data.train),
                 "eval_questions": len(data.dev), "predict_questions": len(data.predict),
                 # absolute, so the record names the files wherever it is read from
                 "files": {k: str(Path(v).resolve()) for k, v in data.files.items()},
                 "vocab_size": vocab.vocab_size, "seed": seed},
        "baselines": {"london": london_baseline(dev_a), "most_common": exact_match([common] * len(dev_a), dev_a),
                      "most_common_answer": common, "most_common_ties": ties},
        "notes": NOTES,
        "variants": results,
        "settings": settings.to_dict(),
        "assignment_parameters": assignment_params,
        "wall_time_s": time.perf_counter() - start + earlier_total,
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "threads": torch.get_num_threads(), "device": dev_name.type, "torch": torch.__version__,
                    "precision": precision, "cpu_bf16": cpu_has_bf16()},
    }
    _write_results(out, summary)
    echo("")
    echo(results_markdown(summary))
    echo(f"results, curves and predictions in {out}")
    return summary


_ESCAPED = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _write_predictions(path: Path, line_numbers: list[int], questions: list[str], predictions: list[str],
                       answers: list[str] | None) -> None:
    """A TSV with a header row and a row per question: the question's line in its input file (blank lines
    there have no row), the question, the prediction and, for evaluation questions, the answer and 1 or 0.

    A prediction can hold a line end or a tab (a corpus's line end is in the vocabulary, and an undertrained
    model writes it): they are written as the two characters \\n, \\r and \\t, so that each question keeps
    one row of its columns, and a backslash as two, so that a written \\n is always a line end. Questions and
    answers are written the same way (a backslash in them doubled too), so that the columns compare as the texts
    do; the 1 or 0 is for the prediction as generated."""
    lines = []
    for i, (n, q, p) in enumerate(zip(line_numbers, questions, predictions, strict=True)):
        row = f"{n}\t{q.translate(_ESCAPED)}\t{p.translate(_ESCAPED)}"
        if answers is not None:
            row += f"\t{answers[i].translate(_ESCAPED)}\t{int(p.strip() == answers[i].strip())}"
        lines.append(row)
    header = "line\tquestion\tprediction" + ("" if answers is None else "\tanswer\tcorrect")
    write_text_atomic(path, header + "\n" + "".join(line + "\n" for line in lines))


def _note(notes: dict[str, float], row: dict[str, Any]) -> float | None:
    """The course notes' figure for a row's model, however its variant was spelt ("dot", "learned", "dot+learned"
    are one model): the notes' models have learned positions."""
    if "position" not in row or "pretrained" not in row:  # a record that does not say: by its spelling
        return notes.get(row["variant"])
    if not row["pretrained"]:
        return notes.get("none")
    return notes.get(row["attention"]) if row["position"] == "learned" else None


def _questions(n: int, kind: str) -> str:
    return f"{n} {kind} question{'s' * (n != 1)}"


def results_markdown(summary: dict[str, Any]) -> str:
    """The results table (Markdown) with the course notes' figures beside ours."""
    base = summary["baselines"]
    n = summary["data"]["eval_questions"]
    source = DATA_SOURCES.get(summary["data"]["source"], summary["data"]["source"])
    lines = [
        f"Knowledge access (scale {scale_label(summary['scale'], summary.get('changed_settings'))}, {source}, "
        f"{_questions(n, 'evaluation')})",
        "",
        "| variant | accuracy (%) | correct | fine-tuning questions (%) | course notes (%) | parameters | time (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in summary["variants"]:
        note = _note(summary["notes"], r)
        lines.append(f"| {r['label']} | {r['accuracy']:.1f} | {r['correct']}/{n} | {r['train_accuracy']:.1f} | "
                     f"{'—' if note is None else f'{note:.1f}'} | {r['parameters']:,} | {r['wall_time_s']:.0f} |")
    lines.append(f"| always \"London\" | {base['london']:.1f} | | | {summary['notes']['london']:.1f} | | |")
    if base["most_common_answer"] != "London":  # else the row above is that baseline already
        answer = base["most_common_answer"].replace("|", "\\|")  # a "|" of its own would end the cell
        ties = base.get("most_common_ties", 1)  # answers as common as it (a summary of an earlier version: 1)
        which = "most common training answer" if ties == 1 else f"the first met of {ties} equally common training " \
            "answers"
        lines.append(f"| always \"{answer}\" ({which}) | {base['most_common']:.1f} | | | | | |")
    lines += ["", f"Total wall time {summary['wall_time_s']:.0f} s; the assignment's model has "
              f"{summary['assignment_parameters']:,} parameters with its vocabulary of {ASSIGNMENT_VOCAB}."]
    return "\n".join(lines)


def _write_results(out: Path, summary: dict[str, Any]) -> None:
    from attnlab.training.logging import MetricsLog

    write_text_atomic(out / "results.json", json.dumps(summary, indent=2) + "\n")
    write_text_atomic(out / "results.md", results_markdown(summary) + "\n")
    curves: dict[str, dict[str, list]] = {"pretrain": {}, "finetune": {}}
    for r in summary["variants"]:
        for phase in ("pretrain", "finetune"):
            path = out / f"{phase}-{r['variant']}" / "metrics.jsonl"
            if path.is_file():
                records = [x for x in MetricsLog(path).read() if finite_number(x.get("loss"))]
                curves[phase][r["label"]] = [(x["step"], x["loss"]) for x in records]
    _plot(out, summary, curves)


def _plot(out: Path, summary: dict[str, Any], curves: dict[str, dict[str, list]]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    for i, (phase, title) in enumerate((("pretrain", "span-corruption pretraining"),
                                        ("finetune", "fine-tuning on questions"))):
        ax = fig.add_subplot(1, 2, i + 1)
        for label, points in curves[phase].items():
            if points:
                ax.plot(*zip(*points), label=label, linewidth=1.2)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (nats/char)")
        ax.grid(alpha=0.3)
        if curves[phase]:
            ax.legend()
    fig.tight_layout()
    with atomic_path(out / "curves.png") as tmp:
        fig.savefig(tmp)

    fig = Figure(figsize=(7, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labels = [r["label"] for r in summary["variants"]] + ["always London", "most common"]
    values = [r["accuracy"] for r in summary["variants"]] + [summary["baselines"]["london"],
                                                            summary["baselines"]["most_common"]]
    bars = ax.barh(labels[::-1], values[::-1], color=["#999999", "#999999"] + ["#3b75af"] * len(summary["variants"]))
    ax.bar_label(bars, fmt="%.1f", padding=2)
    ax.set_xlabel("exact-match accuracy on evaluation questions (%)")
    ax.set_xlim(0, max(10.0, max(values) * 1.15))
    fig.tight_layout()
    with atomic_path(out / "accuracy.png") as tmp:
        fig.savefig(tmp)
