"""Use a finished (or interrupted) run folder: load its model and tokenizer, generate text, and score
a file. These are the library halves of `attnlab generate` and `attnlab evaluate`.

A run folder is what `attnlab train` writes: ``run.json`` (the run's config), ``checkpoint/`` (latest)
and ``best/`` (best evaluation), each checkpoint holding ``model.safetensors``, ``config.json`` and
``tokenizer.json``. Any checkpoint folder works too.
"""

from __future__ import annotations

import json
import math
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.errors import CheckpointError, ConfigError, DataError, UnknownToken, a_name
from attnlab.inference.generate import check_beam_size
from attnlab.training.logging import RUN_FILE, perplexity, progress_bar
from attnlab.training.recipe import evaluate_batches

LM_FAMILIES = ("gpt",)


@dataclass
class LoadedRun:
    model: nn.Module
    tokenizer: Any
    family: str
    folder: Path  # the checkpoint folder actually read
    data: dict[str, Any]  # the run's [data] table ({} for a bare checkpoint folder)
    seed: int = 0  # the run's train.seed (0 where the checkpoint does not say)


# Weight precisions for inference. Decoding one token reads every weight once, so halving the bytes can halve
# the time where memory is the limit: batch-1 decoding of a 6-layer 384-wide GPT on 2 CPU cores ran 1.2-1.4x
# as fast with bf16 weights as with fp32 ones on an AMD Zen 5 and a Zen 3 (torch's bf16/fp16 matrix-vector
# kernels accumulate in fp32). On a Zen 4, whose fp32 products stream the weights on both cores
# (`fast_decode._slices`), the two ran at the same speed.
WEIGHT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def weight_dtype(name: str) -> torch.dtype:
    if name not in WEIGHT_DTYPES:
        raise ConfigError(f"dtype (--dtype): unknown value {name!r}; choose one of: {', '.join(WEIGHT_DTYPES)}")
    return WEIGHT_DTYPES[name]


def load_run(path: str | Path, device: str | torch.device = "cpu", *, which: str = "checkpoint",
             dtype: str = "fp32") -> LoadedRun:
    """Model (eval mode, on `device`) and tokenizer of a run folder or checkpoint folder; of a run that is
    training, as one of its saves left it (read again where a save replaced the folder while it was read).

    Args:
        which: "checkpoint" (the latest, the default) or "best" (the best evaluation) for a run folder.
        dtype: precision of the weights, "fp32" (as trained, the default), "bf16" or "fp16" (half the memory,
            and faster decoding where reading the weights is the limit; results differ from fp32 by rounding).
    """
    from attnlab.training.checkpoint import read_settled
    from attnlab.training.device import select_device

    # The call's own arguments first: refused at once, not read again as if a save were in the way.
    if which not in ("checkpoint", "best"):
        raise ConfigError(f"which must be 'checkpoint' or 'best', got {which!r}")
    weight_dtype(dtype)
    device = select_device(device)  # "gpu" had failed in torch's words; "auto" picks one
    return read_settled(lambda: _load_run(Path(path), device, which, dtype), path)


def _load_run(path: Path, device: str | torch.device, which: str, dtype: str) -> LoadedRun:
    from attnlab.data.tokenizers import load_tokenizer
    from attnlab.training.checkpoint import (
        check_tokenizer_fits,
        checkpoint_present,
        class_names,
        find_checkpoint,
        load_model,
        read_config,
        read_trainer_state,
    )

    # best/ and checkpoint/ (or the .old copy a crash between two renames left) are read as the latest is.
    chosen = checkpoint_present(path / which)
    if which == "best" and not chosen and path.name == "checkpoint" and (path / "config.json").is_file():
        raise CheckpointError(f"{path} is the run's latest checkpoint, and --best asks for its best one: give the run "
                              f"folder {path.parent} with --best, or {path} without it")
    if which == "best" and not chosen and path.name != "best":  # no fallback to the latest
        raise CheckpointError(f"{path} has no best/ checkpoint (a run keeps one only where it evaluates held-out "
                              "data during training, every train.eval_every steps); drop --best")
    folder = find_checkpoint(path / which if chosen else path)
    if not (folder / "tokenizer.json").is_file():
        raise CheckpointError(f"{folder} has no tokenizer.json; generate and evaluate need a run trained "
                              "by `attnlab train` (it saves the tokenizer beside the weights)")
    torch_dtype = weight_dtype(dtype)
    model = load_model(folder, device)
    if torch_dtype != torch.float32:
        model = model.to(torch_dtype)
    tokenizer = load_tokenizer(folder)
    # `attnlab train` sizes the model to its tokenizer (a translation model: both sides, to its one tokenizer).
    check_tokenizer_fits(model.config, tokenizer, folder)
    # The run's data settings and class names as saved in the checkpoint itself: they travel with its weights,
    # whereas run.json may describe another run (one that replaced this one in the folder and failed before its
    # first checkpoint). run.json gives what a checkpoint written before they were saved lacks.
    seed: int | None = None  # train.seed (a BERT's masks and sentence pairs are drawn with it)
    try:
        state = read_trainer_state(folder)
        extra = state.get("extra_state") or {}
        data = dict(extra.get("data") or {})
        if data and "classification_sep" in extra:  # how the run laid out a classifier's texts (since 2026-12-06)
            data["classification_sep"] = extra["classification_sep"]
        saved_seed = (state.get("trainer_config") or {}).get("seed")
        seed = saved_seed if type(saved_seed) is int and saved_seed >= 0 else None
    except (CheckpointError, AttributeError, TypeError, ValueError):
        data = {}
    labels = class_names(folder) or []
    config = model.config
    classifier = "classification" in (getattr(config, "head", None), getattr(config, "heads", None))
    for candidate in (path / RUN_FILE, folder.parent / RUN_FILE):
        # Read only for what the checkpoint lacks (a non-classifier has no labels to find): a damaged run.json
        # refused runs whose checkpoints held everything.
        if (data and (labels or not classifier) and seed is not None) or not candidate.is_file():
            continue
        try:
            saved = json.loads(candidate.read_text(encoding="utf-8"))
            saved_data, saved_labels = saved.get("data", {}), saved.get("labels") or []
            if not isinstance(saved_data, dict) or not isinstance(saved_labels, list) or not all(
                    isinstance(x, (str, int)) and not isinstance(x, bool) for x in saved_labels):
                raise ValueError("wrong types")  # a list, number or text where a table or names go
            if not data:
                data = dict(saved_data)
                if isinstance(saved.get("classification_sep"), bool):  # run.json records it too (since 2026-12-06)
                    data["classification_sep"] = saved["classification_sep"]
            labels = labels or [str(x) for x in saved_labels]
            saved_seed = (saved.get("train") or {}).get("seed") if seed is None else None
            seed = saved_seed if type(saved_seed) is int and saved_seed >= 0 else seed
        except (ValueError, UnicodeDecodeError, AttributeError, RecursionError):  # JSONDecodeError is a ValueError
            raise CheckpointError(f"{candidate} is not a valid run description; re-run training or "
                                  "remove the file") from None
        break
    if labels:
        data["labels"] = labels
    return LoadedRun(model, tokenizer, read_config(folder)["family"], folder, data, 0 if seed is None else seed)


# How evaluation and translation say a cut they make: the length is the trained model's.
TRAINED_LENGTH = "the model was trained on sequences cut the same way"
HEAD_NAMES = {"classification": " (a classifier)", "pretraining": " (masked LM + next sentence)"}
# A model with no head (an encoder alone, as a converted HF BertModel) has nothing to generate or score.
NO_HEAD = ("it is an encoder without a head, whose outputs are hidden states: train a head on it with "
           "--set model.init_from=FOLDER (data.task = classification or mlm)")
_TRANSLATE_BATCH = 64  # sources translated at once by `generate`; bounds the memory of a long list of prompts


def check_generates(run: LoadedRun) -> None:
    """Refuse, in one line, a run whose model continues no text and translates none (a classifier, BERT's
    pre-training heads), naming what takes it instead."""
    model = run.model
    if run.family in LM_FAMILIES or run.family == "seq2seq" or (run.family == "encoder" and model.config.head == "lm"):
        return
    head = getattr(model.config, "head", None) or getattr(model.config, "heads", None)
    scored = head in ("classification", "pretraining")  # `evaluate` takes these; a bare encoder neither
    raise ConfigError(f"{a_name(run.family)} model with the {head!r} head{HEAD_NAMES.get(head, '')} does not "
                      "generate text; " + ("`attnlab evaluate` scores it on a file" if scored else NO_HEAD))


def translate_lines(run: LoadedRun, lines: Sequence[str], *, beam_size: int = 1, max_len: int = 128,
                    batch_size: int = _TRANSLATE_BATCH, name: str = "source") -> list[str]:
    """Translate each line with a seq2seq run, greedily or by beam search (`beam_size` > 1), at most `max_len`
    tokens each; returns the translations in line order, "" for a blank line.

    Sources are cut to the run's `data.max_length` as training cut them (with a warning), and translated in
    batches of similar length (less padding; each source gets the translation it gets alone). `name` names
    the lines in errors (a file's path: "FILE line N: ...")."""
    if isinstance(lines, str):  # iterated, it gave one translation per character
        raise ConfigError("translate_lines takes a list of sentences, not one string: give [text]")
    tok = run.tokenizer
    encoded = []
    for number, line in enumerate(lines, start=1):
        _check_utf8(line, f"{name} line {number}")
        try:
            encoded.append(tok.encode(line) if line.strip() else [])
        except UnknownToken as e:
            raise DataError(f"{name} line {number}: {e.token!r} is not in the vocabulary the model was trained "
                            "with (and it has no unk token); remove it or train on text that contains it") from None
    return translate_ids(run, _cut_sources(run, encoded), beam_size=beam_size, max_len=max_len,
                         batch_size=batch_size)


def translate_file(run: LoadedRun, path: str | Path, *, beam_size: int = 1, max_len: int = 128) -> list[str]:
    """`translate_lines` of a file's lines (`generate --input`), errors naming the file and line. The file is
    read once, so a pipe does (`<(...)`), and "-" reads standard input."""
    from attnlab.data.text_files import file_name, read_lines

    _check_translation_lengths(max_len, beam_size)
    lines = read_lines(path, pipes=True)
    return translate_lines(run, lines, beam_size=beam_size, max_len=max_len, name=file_name(path, pipes=True))


def _check_translation_lengths(max_len: int, beam_size: int) -> None:
    check_beam_size(beam_size)
    from attnlab.inference.generate import MAX_NEW_TOKENS

    if not 1 <= max_len <= MAX_NEW_TOKENS:
        raise ConfigError(f"-n is the longest translation in tokens for a translation model; give 1 to "
                          f"{MAX_NEW_TOKENS:,}, got {max_len}")


def _scoring_length(run: LoadedRun, specials: int = 0) -> tuple[int, str]:
    """The length `evaluate` cuts examples to: the run's data.max_length, as training cut them; for a checkpoint
    that keeps none (copied without its trainer_state.json), 128 (data.max_length's default) or what the model's
    positions hold where less (128 made a 16-position model fail on every long example), `specials` positions
    kept for tokens the length does not count (a translation's bos and eos). Second: the cut warning's ending,
    for `cut_advice` (TRAINED_LENGTH for the run's own length, as `evaluate` says it anyway)."""
    saved = run.data.get("max_length")
    if isinstance(saved, int) and not isinstance(saved, bool) and saved > 0:
        return saved, TRAINED_LENGTH
    limit = getattr(run.model, "max_len", None)
    room = limit - specials if isinstance(limit, int) and limit > specials else None
    if room is not None and room < 128:
        return room, POSITIONS_LENGTH
    return 128, DEFAULT_LENGTH  # a model nothing bounds (sinusoidal positions) was named a position table's


POSITIONS_LENGTH = "the checkpoint keeps no data.max_length, so they were cut to what the model's positions hold"
DEFAULT_LENGTH = "the checkpoint keeps no data.max_length, so they were cut to that setting's default, 128"


def _cut_sources(run: LoadedRun, encoded: list[list[int]]) -> list[list[int]]:
    """Sources cut as `evaluate` cuts them (`_scoring_length`): to the run's data.max_length, as its training cut
    them, or for a checkpoint that keeps none to what the model's positions hold (a longer source failed the whole
    batch, naming no line) or data.max_length's default, with a warning that says so."""
    from attnlab.data.sources import _warn_cut, cut_advice

    room, advice = _scoring_length(run, specials=2)  # training sized max_len as max_length + 2 (bos and eos)
    setting = {TRAINED_LENGTH: "the run's data.max_length", POSITIONS_LENGTH: "the model's position table"}.get(
        advice, "data.max_length's default")
    with cut_advice(advice):
        _warn_cut([len(ids) for ids in encoded], room, "source sentences", setting)
    return [ids[:room] for ids in encoded]


def translate_ids(run: LoadedRun, sources: Sequence[Sequence[int]], *, beam_size: int = 1, max_len: int = 128,
                  batch_size: int = _TRANSLATE_BATCH, batches: Sequence[Any] | None = None) -> list[str]:
    """`translate_lines` of encoded sources (an empty one gives ""): batches of `batch_size` sources sorted by
    length (stably), or the index arrays of `batches`, padded together and masked per row, so each gets the
    translation it gets alone; the texts come back in the sources' order."""
    import numpy as np

    from attnlab.data.sources import pad_batch
    from attnlab.inference.generate import _whole, beam_search, greedy_translate

    _check_translation_lengths(max_len, beam_size)  # a width of 0 had decoded greedily without a word
    if not _whole(batch_size) or batch_size < 1:
        raise ConfigError(f"batch_size must be a whole number of sources, at least 1; got {batch_size!r}")
    tok, model = run.tokenizer, run.model
    device = _device(model)
    texts = [""] * len(sources)
    if batches is None:
        todo = np.array([i for i, ids in enumerate(sources) if len(ids)], dtype=np.int64)
        todo = todo[np.argsort([len(sources[i]) for i in todo], kind="stable")]
        batches = [todo[start: start + batch_size] for start in range(0, len(todo), batch_size)]
    pad = tok.pad_id if tok.pad_id is not None else 0
    never = never_translated_ids(tok)
    for indices in progress_bar(batches, len(batches), "translate"):
        indices = [i for i in np.asarray(indices).tolist() if len(sources[i])]  # given batches may hold blanks
        if not indices:
            continue
        batch = pad_batch([sources[i] for i in indices], pad)
        src, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        out = (beam_search(model, src, mask, beam_size=beam_size, max_len=max_len, never_emit=never) if beam_size > 1
               else greedy_translate(model, src, mask, max_len=max_len, never_emit=never))
        for i, ids in zip(indices, out):
            texts[i] = tok.decode(shown_ids(tok, ids))
    return texts


def shown_ids(tok, ids: list[int]) -> list[int]:
    """The ids of a model's output that its text shows: every special token left out but unk, a word the model put
    there, shown as the tokenizer writes it (left out, the words around it were joined: "for <unk> statement"
    printed as "for statement")."""
    hidden = set(tok.special_ids) - {tok.unk_id}
    return [i for i in ids if i not in hidden]


def never_translated_ids(tok) -> list[int]:
    """The target ids a translation never holds beyond pad and bos (see generate's `_never_emitted`): line breaks
    (see `line_break_ids`) and the mask, cls and sep tokens, which no target held (a target is bos, the line's
    tokens, eos) and which decoding with skip_special_tokens drops from the text: an untrained decoder that ranked
    one first spent steps of max_len on tokens nobody sees."""
    specials = (tok.mask_id, tok.cls_id, tok.sep_id)
    return sorted(set(line_break_ids(tok)) | {i for i in specials if i is not None and i != tok.eos_id})


def line_break_ids(tok) -> list[int]:
    """The ids of the tokens that hold a line break (a byte-level BPE's "\n" and "\r" bytes): a translation, of a
    sentence that was a line, never holds one (no target did), and a decoder early in training emitting one split
    `generate --input`'s output, one translation per line, onto other lines. Found once per tokenizer (decoding
    every id of a 32k vocabulary takes ~0.3 s)."""
    found = _LINE_BREAKS.get(tok)
    if found is None or found[0] != tok.vocab_size:
        ids = [i for i in range(tok.vocab_size) if any(c in tok.decode([i], skip_special_tokens=True) for c in "\n\r")]
        found = _LINE_BREAKS[tok] = (tok.vocab_size, ids)
    return list(found[1])


_LINE_BREAKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> (its size, the ids)


def _check_utf8(text: str, what: str) -> None:
    """Refuse text holding bytes that were not UTF-8 (kept by Python as lone surrogates, as a command-line
    argument's are): the subword tokenizers fail on them with a TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(f"{what} is not valid UTF-8 text (at character {e.start + 1}); give it as UTF-8, "
                        "e.g. from a UTF-8 terminal or file") from None


def _encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    _check_utf8(prompt, "the prompt")
    try:
        ids = tokenizer.encode(prompt)
    except UnknownToken as e:  # the tokenizer's own words told the user to retrain it or "add an unk"
        raise DataError(f"the prompt's {e.token!r} is not in the vocabulary the model was trained with (and it has "
                        "no unk token); remove it from the prompt") from None
    if not ids:
        raise DataError("the prompt encodes to no tokens; give a non-empty prompt")
    return ids


def check_decoding_options(family: str, *, greedy: bool = False, temperature: float | None = None,
                           top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                           beam_size: int = 1) -> None:
    """Refuse decoding options the model would silently ignore; None means an option was not given. Translation
    decodes greedily or by beam search (no sampling options, and not both); a language model told --greedy, or
    given a temperature of 0 (greedy in effect: see `generate.sample_next`), does not sample.

    Raises:
        ConfigError: naming the options to drop, or a seed outside 0 to 2**63 - 1.
    """
    if seed is not None and not 0 <= seed < 2**63:  # torch's generators take 64-bit seeds, as train.seed
        raise ConfigError(f"--seed must be an integer from 0 to 2**63 - 1, got {seed}")
    given = [flag for flag, value in (("--temperature", temperature), ("--top-k", top_k), ("--top-p", top_p),
                                      ("--seed", seed)) if value is not None]
    if family == "seq2seq":
        if given:
            raise ConfigError(f"translation decodes greedily or with --beam-size; drop {', '.join(given)}")
        if greedy and beam_size != 1:
            raise ConfigError(f"--greedy and --beam-size {beam_size} ask for two searches; drop --greedy for beam "
                              "search, or --beam-size for greedy decoding")
    elif greedy and given:
        raise ConfigError(f"--greedy always takes the most likely token; drop {', '.join(given)}, or drop "
                          "--greedy to sample")
    elif temperature is not None and 0 <= temperature < torch.finfo(torch.float32).tiny and len(given) > 1:
        raise ConfigError(f"--temperature {temperature:g} always takes the most likely token, as --greedy does; drop "
                          f"{', '.join(flag for flag in given if flag != '--temperature')}, or give a temperature "
                          "above 0 to sample")


def generate_text(run: LoadedRun, prompt: str, *, max_new_tokens: int = 200, greedy: bool = False,
                  temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                  seed: int | None = None, beam_size: int = 1) -> str:
    """Continue `prompt` with a language model, or translate it with a seq2seq model."""
    return generate_texts(run, [prompt], max_new_tokens=max_new_tokens, greedy=greedy, temperature=temperature,
                          top_k=top_k, top_p=top_p, seed=seed, beam_size=beam_size)[0]


def generate_texts(run: LoadedRun, prompts: list[str], *, max_new_tokens: int = 200, greedy: bool = False,
                   temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                   seed: int | None = None, beam_size: int = 1) -> list[str]:
    """Continue each prompt with a language model (one batch: prompts of different lengths are padded, and
    greedy decoding gives each the text it would get alone; sampling draws for all rows at once, so a seed
    reproduces the texts of the same list of prompts), or translate each with a seq2seq model (sources padded
    and masked in batches: each gets the translation it gets alone).

    Options left at None were not given (a translation refuses the sampling ones, see `check_decoding_options`);
    a language model samples at temperature 1.0 with seed 0 unless told otherwise."""
    from attnlab.inference.generate import generate

    tok, model = run.tokenizer, run.model
    if isinstance(prompts, str):  # iterated, it gave one text per character
        raise ConfigError("generate_texts takes a list of prompts, not one string: give [prompt] (or use "
                          "generate_text)")
    if not prompts:
        raise ConfigError("give at least one prompt")
    check_generates(run)  # before the prompts: an empty one was refused as such by a classifier, which takes none
    check_beam_size(beam_size)
    check_decoding_options(run.family, greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                           beam_size=beam_size)
    if run.family == "seq2seq" and any(not prompt.strip() for prompt in prompts):  # `-i` gives blank lines ""
        raise DataError("a prompt is blank (whitespace only): there is nothing to translate; give a sentence")
    encoded = [_encode_prompt(tok, prompt) for prompt in prompts]
    if run.family == "seq2seq":
        _check_translation_lengths(max_new_tokens, beam_size)
        return translate_ids(run, _cut_sources(run, encoded), beam_size=beam_size, max_len=max_new_tokens)
    if beam_size != 1:
        raise ConfigError("--beam-size is for translation models; language models take --greedy or sampling "
                          "options")
    limit = getattr(model, "max_len", None)
    longest = max(len(ids) for ids in encoded)
    if limit is not None and longest > limit:
        raise DataError(f"a prompt of {longest} tokens is longer than the model's {limit} positions; "
                        f"shorten it to at most {limit} tokens")
    # A bounded model (learned positions) trained on shorter windows than its table slides at that window:
    # beyond it lie positions its training never used.
    trained = run.data.get("block_size")
    context = trained if limit is not None and type(trained) is int and 0 < trained < limit else None
    if context is not None and longest > context:
        warnings.warn(f"a prompt of {longest} tokens is longer than the windows of {context} the run trained on: only "
                      f"its last {context} tokens are read (the model's positions beyond them were never trained); "
                      f"shorten it to at most {context} tokens to have all of it read", stacklevel=2)
    temperature = 1.0 if temperature is None else temperature
    new = generate(model, encoded, max_new_tokens, greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p,
                   eos_id=tok.eos_id, pad_id=tok.pad_id if tok.pad_id is not None else 0,
                   seed=0 if seed is None else seed, context=context)
    return [_continuation(tok, prompt, ids, more) for prompt, ids, more in zip(prompts, encoded, new)]


def _continuation(tok, prompt: str, prompt_ids: list[int], new_ids: list[int]) -> str:
    """The text `new_ids` add after `prompt`: decoded with the prompt and the prompt's text cut off, as word
    and WordPiece tokenizers put the space between two words only when they decode both (alone, the first
    new word would be glued to the prompt's last), and byte-level BPE may finish a character the prompt began.
    Where the prompt ends in whitespace its decoding dropped, that space is not given twice. The prompt's
    special tokens (an unknown word's unk) are decoded with it: dropped, the word boundary after them went too
    ("Zebra" gave "Zebraquick"); the new tokens are those `shown_ids` keeps."""
    new_ids = shown_ids(tok, new_ids)
    if not new_ids:
        return ""
    head = tok.decode(list(prompt_ids))
    full = tok.decode(list(prompt_ids) + new_ids)
    text = full[len(head):] if full.startswith(head) else tok.decode(new_ids)
    if prompt[-1:].isspace() and not head[-1:].isspace():
        text = text.removeprefix(" ")
    return text


@torch.no_grad()
def evaluate_file(run: LoadedRun, data: str | Path, *, target: str | Path | None = None,
                  batch_size: int = 32, beam_size: int = 1, text_column: str | None = None,
                  label_column: str | None = None, precision: str = "fp32") -> dict[str, float]:
    """Score a file with the run's model.

    Language models: `data` is a UTF-8 text; returns loss (nats per token), perplexity and tokens.
    Classifiers: `data` is a TSV/CSV/JSONL file with the run's text and label columns; returns loss,
    accuracy (%) and examples; `text_column` / `label_column` (a name, or a 0-based number as a string)
    read a file whose columns differ from the training file's. Seq2seq: `data` holds source sentences and
    `target` their references, one per line; returns loss and perplexity of the references and the BLEU
    (sacrebleu's corpus BLEU) of the model's translations, greedy or by beam search with `beam_size` > 1.
    BERT pre-training: `data` is documents separated by blank lines, a sentence per line, masked and paired as
    training did with the run's seed; returns loss (masked LM + next sentence), mlm_loss, perplexity (of the
    masked LM), mlm_accuracy, nsp_accuracy (where the model has the head), masked_tokens and sentence_pairs.
    `precision` "bf16" (or "auto": bf16 where the hardware computes it) runs it all under bf16 autocast.
    """
    from attnlab.data.sources import cut_advice
    from attnlab.training.device import PRECISIONS, autocast, resolve_precision

    if batch_size < 1:
        raise ConfigError(f"batch_size (--batch-size) must be positive, got {batch_size}")
    check_beam_size(beam_size)
    if precision not in PRECISIONS:
        raise ConfigError(f"precision (--precision): unknown value {precision!r}; choose one of: "
                          f"{', '.join(PRECISIONS)}")
    device = _device(run.model)
    with autocast(device, resolve_precision(precision, device, setting="--precision")), cut_advice(TRAINED_LENGTH):
        return _evaluate_file(run, data, target, batch_size, beam_size, text_column, label_column)


def _evaluate_file(run: LoadedRun, data: str | Path, target: str | Path | None, batch_size: int, beam_size: int,
                   text_column: str | None, label_column: str | None) -> dict[str, float]:
    model, tok = run.model, run.tokenizer
    if run.family == "seq2seq":
        if text_column is not None or label_column is not None:
            raise ConfigError("--text-column and --label-column are for classifiers; a translation model reads "
                              "source sentences (--data) and references (--target), one per line")
        return _evaluate_translation(run, data, target, batch_size, beam_size)
    if beam_size != 1:
        raise ConfigError("--beam-size is for translation models")
    if target is not None:
        raise ConfigError("--target is only for translation models (the reference translations)")
    head = getattr(model.config, "head", None) or getattr(model.config, "heads", None)
    for flag, column in (("--text-column", text_column), ("--label-column", label_column)):
        if column is not None and not str(column).strip():  # had meant "the training file's column", silently
            raise ConfigError(f"{flag} is empty; give a column's header name or 0-based number, or leave {flag} out")
    if (text_column is not None or label_column is not None) and head != "classification":
        raise ConfigError("--text-column and --label-column are for classifiers (TSV, CSV or JSONL files)")
    if run.family in LM_FAMILIES or head == "lm":
        if not getattr(model.config, "is_causal", True):  # made in Python (with_head): training refuses one
            raise ConfigError("this encoder's LM head reads bidirectional attention (causal = false): every position "
                              "sees the token it is scored on, so a next-token loss would mean nothing; evaluate a "
                              "model trained with causal attention")
        return _evaluate_lm(model, tok, data, batch_size, run.data.get("block_size"))
    if head == "classification":
        return _evaluate_classification(run, data, batch_size, text_column, label_column)
    if run.family == "bert" and head == "pretraining":
        return _evaluate_pretraining(run, data, batch_size)
    raise ConfigError(f"cannot evaluate {a_name(run.family)} model with head {head!r} on a file (evaluate scores "
                      "language models, classifiers, BERT pre-training and translation models); " + NO_HEAD)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _evaluate_lm(model: nn.Module, tok: Any, data: str | Path, batch_size: int,
                 block_size: int | None = None) -> dict[str, float]:
    """Loss of a language model on a text, in consecutive windows of the length it was trained on
    (`block_size`, the run's data.block_size; None: the model's own length), as training's evaluation scores
    its held-out text: the same file gets the same loss."""
    import tempfile

    from attnlab.data.corpus import NO_TOKENS_FIX, NoTokens, TextStream, build_token_file, token_dtype
    from attnlab.data.sources import CausalLMSource
    from attnlab.data.text_files import check_text, iter_text_blocks
    from attnlab.training.recipe import _first_line_with, lm_window

    path = check_text(data)

    def blocks():  # a read error of the text names the text, not the temporary folder below
        try:
            yield from iter_text_blocks(path)
        except OSError as e:
            raise DataError(f"cannot read data file '{path}': {e.strerror or e}") from None

    # Streamed a block at a time into a memory-mapped token file, as training reads its text: any text the
    # model could train on can be scored (read whole, a 100 MB text took ~2 GB).
    with tempfile.TemporaryDirectory(prefix="attnlab-evaluate-") as scratch:
        try:
            ids = build_token_file(TextStream(blocks()), tok, Path(scratch) / "text.bin")
        except OSError as e:  # a full or read-only temporary folder: not the text's fault, and not the run's
            bound = path.stat().st_size * token_dtype(tok.vocab_size).itemsize / 2**20  # a token per byte at most
            raise DataError(f"cannot write the text's tokens to the temporary folder {tempfile.gettempdir()} "
                            f"({e.strerror or e}; up to {bound:,.0f} MiB are needed): set TMPDIR to a folder on a "
                            "disk with room") from None
        except NoTokens:  # named by the temporary file it was to fill
            raise DataError(f"{data}: {NO_TOKENS_FIX}") from None
        except UnknownToken as e:
            line = _first_line_with(str(path), e.token)
            where = "" if line is None else f" line {line}:"
            raise DataError(f"{data}:{where} {e.token!r} is not in the vocabulary the model was trained with (and "
                            "it has no unk token); remove it from the file or train on text that contains it") from None
        if len(ids) < 2:
            raise DataError(f"{data}: the text has fewer than two tokens; nothing to predict")
        block = lm_window(block_size if isinstance(block_size, int) and block_size > 0 else None, model.config)
        limit = getattr(model, "max_len", None)
        block = min(block, limit or block, len(ids) - 1)
        source = CausalLMSource(ids, block, batch_size)
        n_batches = math.ceil(source.eval_windows / batch_size)
        return _token_loss_metrics(model, progress_bar(source.iter_batches(batch_size), n_batches, "evaluate"))


def _token_loss_metrics(model: nn.Module, batches) -> dict[str, float]:
    """Loss per target token over `batches`, its perplexity, and the number of target tokens."""
    values, sizes = evaluate_batches(model, batches)
    loss = values["loss"]
    return {"loss": loss, "perplexity": perplexity(loss), "tokens": sizes["targets"]}


def _evaluate_pretraining(run: LoadedRun, data: str | Path, batch_size: int) -> dict[str, float]:
    """BERT pre-training objectives on a text of documents (blank-line separated, a sentence per line),
    masked and paired with the run's train.seed, as its evaluations during training were: the same numbers every
    time, and on the run's data.eval_path those of its training log (seed 0 drew other masks for a run of another
    seed)."""
    from attnlab.data.sources import cut_advice
    from attnlab.data.text_files import read_text, split_documents
    from attnlab.training.recipe import SINGLE_SEGMENT, DataConfig, pretraining_counts, sentence_pair_source

    model, tok = run.model, run.tokenizer
    if model.config.type_vocab_size == 1:  # the pairs' B tokens: an index error on the segment table
        raise ConfigError(SINGLE_SEGMENT.format(what="the run holds", reads="evaluate scores its pre-training on")
                          + "; it cannot be scored so")
    known = set(DataConfig.field_names())
    settings = DataConfig.from_dict({k: v for k, v in run.data.items() if k in known}, where="data")
    max_length, advice = _scoring_length(run)  # a bare checkpoint: what its positions hold, not 128
    settings = settings.replace(max_length=max(max_length, 5))  # [CLS] A [SEP] B [SEP] needs 5
    documents = split_documents(read_text(data), data)  # read_text's errors name the file already
    try:
        with cut_advice(advice):
            source = sentence_pair_source(documents, tok, model.config, settings, batch_size, run.seed)
    except DataError as e:  # no sentence pairs in the file, too few documents...: name the file
        raise DataError(f"{data}: {e}") from None
    batches = progress_bar(source.iter_batches(batch_size), math.ceil(len(source.pairs) / batch_size), "evaluate")
    m, sizes = evaluate_batches(model, batches, pretraining_counts)
    return {"loss": m["loss"], "mlm_loss": m["mlm_loss"], "perplexity": perplexity(m["mlm_loss"]),
            **{k: v for k, v in m.items() if k.endswith("_accuracy")}, "masked_tokens": sizes["targets"],
            "sentence_pairs": float(len(source.pairs))}


def _evaluate_classification(run: LoadedRun, data: str | Path, batch_size: int, text_column: str | None = None,
                             label_column: str | None = None) -> dict[str, float]:
    from attnlab.data.sources import ClassificationSource, classification_ends, cut_advice
    from attnlab.data.text_files import FORMATS, check_file, read_classification_file, same_number_hint
    from attnlab.training.recipe import classification_counts, parse_column

    d, tok, model = run.data, run.tokenizer, run.model
    check_file(data)  # first: a folder or a pipe is named as such, not blamed on its extension
    if Path(data).suffix.lower() not in FORMATS:
        raise DataError(f"{data}: this run is a classifier, which scores a labelled .tsv, .csv or .jsonl file (the "
                        "extension names the format); give such a file")
    labels = d.get("labels")
    # Columns the flags leave to the run's own settings, named where the file does not fit them (a run trained on a
    # headerless TSV by column number, scored on a JSONL or a CSV of other columns).
    inherited = [f"data.{what}_column = {d.get(f'{what}_column')!r}" for what, flag in
                 (("text", text_column), ("label", label_column)) if not flag and d.get(f"{what}_column") is not None]
    why = f" (the run's {' and '.join(inherited)}: give this file's with --text-column and --label-column)" \
        if inherited else ""
    try:
        examples = read_classification_file(data, parse_column(text_column or d.get("text_column")),
                                            parse_column(label_column or d.get("label_column")), training=False)
    except DataError as e:
        if not any(word in str(e) for word in ("column", "field")):  # a missing file, a malformed line: no column's
            raise
        raise DataError(f"{e}{why}") from None
    if examples.labels is None:
        raise DataError(f"{data}: no label column; evaluation needs labelled examples")
    if labels is None:
        labels = _numbered_classes(run, examples.label_names, data)
    unknown = sorted(set(examples.labels) - set(labels))
    if unknown:
        raise DataError(f"{data}: labels {unknown[:5]} were not in the training data (known: {list(labels)})"
                        f"{same_number_hint(unknown[0], labels)}; the classifier can only score the classes it was "
                        f"trained on{why}")
    # As the run was trained: [CLS] text [SEP] since 2026-12-06, [CLS] text before; a checkpoint with no recorded
    # data settings (weights converted from HF and saved with a tokenizer) reads texts as HF encodes them.
    prefix, suffix = classification_ends(tok, sep=d.get("classification_sep", "task" not in d) is True)
    max_length, advice = _scoring_length(run)
    with cut_advice(advice):
        source = ClassificationSource(examples, tok, batch_size, max_length=max_length, label_names=labels,
                                      prefix_ids=prefix, suffix_ids=suffix, bucket_by_length=True)
    order = source.eval_indices(batch_size)
    batches = progress_bar((source.collate(indices) for indices in order), len(order), "evaluate")
    values, sizes = evaluate_batches(model, batches, classification_counts)
    return {"loss": values["loss"], "accuracy": values["accuracy"], "examples": sizes["accuracy"]}


def _numbered_classes(run: LoadedRun, found: list[str], data: str | Path) -> list[str]:
    """The class names of a checkpoint that kept none (no trainer_state.json, no run.json: weights copied or
    converted on their own): the class numbers 0..n-1, when the file's labels are such numbers. Its own labels
    sorted were taken before: a file of class-1 examples alone scored as class 0, 100 % for a 0 % classifier."""
    n = int(getattr(run.model.config, "n_classes", 0) or 0)
    numbers = [str(i) for i in range(n)]
    if n and set(found) <= set(numbers):
        warnings.warn(f"{run.folder} keeps no class names: label i of {data} is scored as output i (right for a "
                      "converted checkpoint; a model trained on labels other than 0 to n - 1 needs its run folder)",
                      stacklevel=3)
        return numbers
    raise DataError(f"{run.folder} keeps no class names (neither a trainer_state.json nor a run.json there records "
                    f"them), so the labels of {data} ({found[:5]}) cannot be matched to its {n} outputs; evaluate the "
                    f"run folder that trained it, or give the labels as the class numbers 0 to {n - 1}")


def _evaluate_translation(run: LoadedRun, data: str | Path, target: str | Path | None,
                          batch_size: int, beam_size: int) -> dict[str, float]:
    import sacrebleu

    from attnlab.data.sources import ParallelTextSource, cut_advice
    from attnlab.data.text_files import read_lines

    if target is None:
        raise ConfigError("a translation model is scored against --target REFERENCES (one translation per line of "
                          "--data); to translate a file without references: attnlab generate RUN --input FILE")
    tok, model = run.tokenizer, run.model
    max_length, advice = _scoring_length(run, specials=2)  # training sized max_len as max_length + 2
    # Batches of sentences of similar length: less padding, and a greedy or beam batch ends sooner.
    with cut_advice(advice):
        source = ParallelTextSource(data, target, tok, tok, batch_size, max_src_length=max_length,
                                    max_tgt_length=max_length, bucket_by_length=True)
    order = source.eval_indices(batch_size)
    out = _token_loss_metrics(model, progress_bar((source.collate(indices) for indices in order), len(order),
                                                  "evaluate"))
    hyps = translate_ids(run, source.src, beam_size=beam_size, max_len=max_length, batches=order)
    out["bleu"] = float(sacrebleu.corpus_bleu(hyps, [_as_decoded(tok, read_lines(target), target)]).score)
    return out


UNKNOWN_IN_REFERENCE = "\ufffd"  # one word to sacrebleu's 13a tokenizer, which splits ASCII punctuation only


def _decode_marking_unknown(tok, ids: list[int]) -> str:
    """`ids` decoded, each unk id written as U+FFFD: by the ids, not the unk token's name in the text (a character
    tokenizer reads a written "<unk>" as five characters a translation can write too)."""
    unk = tok.unk_id
    if unk is None or unk not in ids:
        return tok.decode(ids)
    parts, start = [], 0
    for i, token in enumerate([*ids, unk]):
        if token == unk:
            parts.append(tok.decode(ids[start:i]))
            start = i + 1
    if tok.kind == "char":  # its tokens joined as they are
        return UNKNOWN_IN_REFERENCE.join(parts)
    return " ".join(f" {UNKNOWN_IN_REFERENCE} ".join(parts).split())  # the others' are words, which spaces separate


def _as_decoded(tok, references: list[str], path: str | Path) -> list[str]:
    """The references as the tokenizer's decoding writes text, for BLEU to compare like with like: the
    translations are decoded token ids, and a tokenizer whose decoding does not give text back (WordPiece
    spaces punctuation inside words, "the man ' s t - shirt"; a word tokenizer may lowercase) scored a
    translation equal to its reference's tokens far below 100. Exact tokenizers (BPE, char) leave every line
    as written; a word the vocabulary lacks stays unknown, written as one character (U+FFFD) that no translation
    matches: its unk token's name, "<unk>", was three words to BLEU's tokenizer ("< unk >"), which lengthened the
    references and so lowered the brevity penalty (21.7 for 34.9 on references ending in an unknown word)."""
    from attnlab.errors import UnknownToken

    out = []
    for line in references:
        try:
            out.append(_decode_marking_unknown(tok, tok.encode(line)))
        except UnknownToken:  # a vocabulary without unk: kept as written (no translation can write that token)
            out.append(line)
    changed = [(b, a) for a, b in zip(out, references) if a.split() != b.split()]  # spacing aside
    if changed:
        written, decoded = changed[0]
        warnings.warn(f"BLEU compares the translations with the references as the {tok.kind} tokenizer decodes them: "
                      f"{len(changed)} of {len(references)} lines of {path} read otherwise decoded (e.g. "
                      f"{written[:60]!r} as {decoded[:60]!r})", stacklevel=3)
    return out
