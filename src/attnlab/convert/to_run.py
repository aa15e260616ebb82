"""A HF transformers BERT or GPT-2 folder (what `save_pretrained` writes) as an attnlab run folder.

`load_hf_bert` / `load_hf_gpt2` give a model; the command line (`attnlab generate`, `evaluate`, `params`) and
`model.init_from` want a run folder: ``checkpoint/`` holding ``model.safetensors``, ``config.json`` (naming the
model family) and ``tokenizer.json`` (attnlab's). `save_hf_as_run` writes one, and nothing else: no ``run.json``,
which only `attnlab train` writes and nothing requires: `find_checkpoint` takes the folder by its ``checkpoint/``,
and a converted run has no data settings to record (`evaluate` then reads a classifier's texts as HF encodes them,
[CLS] text [SEP], cut to 128 tokens, data.max_length's default, or to the model's positions where fewer).

The tokenizer is the folder's own ``tokenizer.json`` (the fast-tokenizer file; for BERT, a folder with only
``vocab.txt`` gets the WordPiece that HF builds from it, with the tokens of its ``added_tokens.json``), wrapped in
attnlab's `WordPieceTokenizer` (BERT) or `BPETokenizer` (GPT-2): the same normalizer, pre-tokenizer and vocabulary,
so it gives HF's ids without the special tokens HF's post-processor adds. As HF reads the folder, the casing,
accent and Chinese character settings of ``tokenizer_config.json`` (HF's defaults where it names none: lowercase)
replace those of a BERT's tokenizer.json, unless it names a tokenizer class other than BertTokenizer; and the
additional_special_tokens the files name are matched whole. The normalizer's clean_text (dropping control
characters) stays the tokenizer.json's, as transformers 4 reads it: transformers 5's BertTokenizer always cleans,
which differs only for a tokenizer.json with clean_text false, on text holding control characters.

The special tokens are HF's (``tokenizer_config.json`` and ``special_tokens_map.json`` when present, else the
family's usual ones), mapped to attnlab's names. attnlab gives each token one part, so a token HF names for
several parts keeps the first of the family's order:

- BERT: pad, unk, cls, sep, mask, bos, eos ([PAD] [UNK] [CLS] [SEP] [MASK] by default).
- GPT-2: eos, pad, unk, bos, ... GPT-2's one special, ``<|endoftext|>`` (HF's bos, eos and unk alike), is attnlab's
  eos: generation stops at it, as HF's does, and a language model's corpus separates its documents with it. There
  is no pad and none is added (it would change the vocabulary the weights were trained with): attnlab's language
  models train and evaluate on windows without padding, and `generate` pads a batch of prompts with id 0 under an
  attention mask. Byte-level BPE needs no unk.

Nothing is unpickled: the weights are read from safetensors by the converters, which refuse a folder with only
``pytorch_model.bin``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from attnlab.errors import AttnlabError, CheckpointError, one_line
from attnlab.files import check_readable
from attnlab.training.trainer import CHECKPOINT_DIR  # a run's latest checkpoint, where `find_checkpoint` looks

SUPPORTED_TYPES = ("bert", "gpt2")

# The extra special tokens a folder names, matched whole: transformers 4's key and 5's.
EXTRA_SPECIAL_KEYS = ("additional_special_tokens", "extra_special_tokens")
# HF's name of each special token (a tokenizer_config.json / special_tokens_map.json key) -> attnlab's.
HF_SPECIAL_KEYS = {"pad_token": "pad", "unk_token": "unk", "mask_token": "mask", "cls_token": "cls",
                   "sep_token": "sep", "bos_token": "bos", "eos_token": "eos"}

# Per model_type: its name in messages, the HF tokenizers model its tokenizer.json must hold, the
# special tokens HF's tokenizer class uses when the folder names none, and the order in which the parts take a token
# named for several (attnlab's specials are distinct strings).
_FAMILIES: dict[str, dict[str, Any]] = {
    "bert": {"what": "BERT", "model": "WordPiece",
             "defaults": {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
             "order": ("pad", "unk", "cls", "sep", "mask", "bos", "eos")},
    "gpt2": {"what": "GPT-2", "model": "BPE",
             "defaults": {"eos": "<|endoftext|>", "bos": "<|endoftext|>", "unk": "<|endoftext|>"},
             "order": ("eos", "pad", "unk", "bos", "mask", "cls", "sep")},
}


def save_hf_as_run(hf_folder: str | os.PathLike[str], run_folder: str | os.PathLike[str], *,
                   overwrite: bool = False) -> Path:
    """Convert the HF BERT or GPT-2 folder `hf_folder` (config.json, model.safetensors or its shards, tokenizer.json)
    into the attnlab run folder `run_folder`, which `attnlab generate`, `evaluate`, `params` and `model.init_from`
    take; returns its checkpoint folder (``run_folder/checkpoint``).

    The run folder is held as a training run holds its own (`attnlab.files.folder_lock`), and its checkpoint is
    written whole or not at all, as every checkpoint is (`save_checkpoint`). A BERT sequence
    classifier whose config.json names its classes (id2label, other than HF's LABEL_0, LABEL_1...) keeps those names
    as a classifier trained by attnlab does; otherwise label i of a file is scored as output i.

    Args:
        overwrite: replace `run_folder` where it is not empty; only an attnlab run folder (one holding a
            checkpoint/ or best/, or a run.json) is replaced, and then everything in it goes.

    Raises:
        CheckpointError: a model_type other than bert and gpt2; a folder the converters refuse (no
            model.safetensors, weights that do not fit config.json...); no tokenizer.json (nor, for BERT, vocab.txt);
            a tokenizer of another vocabulary size than the model's, or whose special tokens do not fit it; a
            `run_folder` that is not empty (without `overwrite`, or holding something other than a run).
        PathError: a `run_folder` that another attnlab run (a training, another conversion) is writing into, or
            that cannot be made.
    """
    from attnlab.files import LOCK_FILE, folder_lock
    from attnlab.training.checkpoint import save_checkpoint

    hf, run = Path(hf_folder), Path(run_folder)
    if run.exists() and not run.is_dir():
        raise CheckpointError(f"{run} is a file; give a new or empty folder for the run")
    # Held as `attnlab train` holds its run folder: a run writing there (or a second convert) is refused in one
    # line, and a folder this call made and left empty goes again.
    with folder_lock(run, "run folder") as folder:
        replacing = _check_run_folder(folder, hf, overwrite, run)  # before the conversion: a refusal costs nothing
        model_type, hf_config = _model_type(hf)
        family = _FAMILIES[model_type]
        model = _load_model(hf, model_type)
        tokenizer = hf_tokenizer(hf, model_type)
        _check_fits(model.config, tokenizer, hf, family["what"])
        labels = _class_names(hf_config, model.config)
        state = {"extra_state": {"labels": labels}} if labels else None
        if replacing:  # the run's records and other checkpoints go first: an interruption leaves a checkpoint alone
            for entry in folder.iterdir():
                if entry.name in (CHECKPOINT_DIR, LOCK_FILE):
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        # Into the folder itself (its permissions, and a shell standing in it, are kept), written whole or not at
        # all as every checkpoint is.
        save_checkpoint(folder / CHECKPOINT_DIR, model, tokenizer=tokenizer, trainer_state=state)
    return run / CHECKPOINT_DIR


def _check_run_folder(folder: Path, hf: Path, overwrite: bool, run: Path) -> bool:
    """Refuse a run folder (`folder`, held by this call; `run` as given, for messages) that holds the HF folder, or
    is not empty (without `overwrite`, or holding something other than an attnlab run); whether it holds a run that
    will be replaced."""
    from attnlab.files import LOCK_FILE
    from attnlab.training.checkpoint import read_config

    if hf.exists() and (hf.resolve() == folder.resolve() or folder.resolve() in hf.resolve().parents):
        raise CheckpointError(f"the run folder {run} holds the HF folder {hf}; give another folder for the run")
    entries = sorted(entry.name for entry in folder.iterdir() if entry.name != LOCK_FILE)  # the lock: this call's
    if not entries:
        return False
    if not overwrite:
        raise CheckpointError(f"run folder {run} is not empty; give a new or empty folder, or overwrite=True "
                              "(attnlab convert --overwrite) to replace the run in it")
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():  # a run's checkpoint/, a HF one
        raise CheckpointError(f"{run} is a checkpoint folder (a model's config.json and weights), not a run folder; "
                              "give the run folder that holds it, or a new one")
    try:
        read_config(folder)  # an attnlab run: its checkpoint/ (or best/)
    except (AttnlabError, OSError):
        if not (folder / "run.json").is_file():  # a run stopped before its first save
            raise CheckpointError(f"run folder {run} holds files that are not an attnlab run (e.g. {entries[0]!r}), "
                                  "which overwrite does not delete; give a new or empty folder") from None
    return True


def _model_type(folder: Path) -> tuple[str, dict[str, Any]]:
    """config.json's model_type, refused in one line unless it is one of SUPPORTED_TYPES, and the config read."""
    if folder.is_file():
        raise CheckpointError(f"{folder} is a file; give the HF model's folder (the one holding config.json)")
    if not folder.is_dir():
        raise CheckpointError(f"{folder} does not exist; give a HF model folder (as save_pretrained writes it)")
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no config.json; give a HF model folder (as save_pretrained writes it)")
    config = _read_json(path)
    kind = config.get("model_type") if isinstance(config, dict) else None
    if kind in SUPPORTED_TYPES:
        return kind, config
    if isinstance(config, dict) and "family" in config:
        raise CheckpointError(f"{path} is an attnlab model config (family {config['family']!r}), not a HF one: "
                              "the folder is an attnlab checkpoint already")
    said = "missing" if kind is None else repr(kind)
    raise CheckpointError(f"{path}: model_type is {said}; save_hf_as_run converts {' and '.join(SUPPORTED_TYPES)} "
                          "models")


def _read_json(path: Path) -> Any:
    """A JSON file of the HF folder, or a one-line CheckpointError naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise CheckpointError(f"cannot read {path}: {one_line(e)}") from None


def _load_model(folder: Path, model_type: str):
    """The converted model (the existing converters: every check of the weights is theirs)."""
    if model_type == "bert":
        from attnlab.convert.bert import load_hf_bert

        return load_hf_bert(folder)
    from attnlab.convert.gpt2 import load_hf_gpt2

    return load_hf_gpt2(folder)


# ----------------------------------------------------------------------------------------------------
# The tokenizer


def _check_byte_level(hf, source: Path) -> None:
    """Refuse a BPE whose pre-tokenizer is not GPT-2's byte level with its word pattern: attnlab encodes a corpus in
    pieces cut before line ends (in parallel, in bounded memory), where that pattern ends a token; a Metaspace
    (SentencePiece's) or no pre-tokenizer reads across them, so its token files would hold other ids than the
    text's."""
    from attnlab.data.tokenizers import pre_tokenizer_state

    state = pre_tokenizer_state(hf)
    if state.get("type") != "ByteLevel" or not state.get("use_regex", True):
        kind = state.get("type", "?") + (" without its word pattern" if state.get("type") == "ByteLevel" else "")
        raise CheckpointError(f"{source}: its pre-tokenizer is {kind}, which does not end a token at each line end "
                              "as GPT-2's byte-level one does; attnlab encodes a corpus in pieces cut there, so it "
                              "converts GPT-2 tokenizers with a byte-level pre-tokenizer only")


def hf_tokenizer(hf_folder: str | os.PathLike[str], model_type: str):
    """attnlab's tokenizer for the HF folder of a `model_type` ("bert" or "gpt2") model: its tokenizer.json (or,
    for BERT, vocab.txt) in a `WordPieceTokenizer` or `BPETokenizer`, with HF's special tokens (see the module
    docstring). Its `encode` gives the ids of HF's fast tokenizer called with add_special_tokens=False.

    Raises:
        CheckpointError: no tokenizer file, one that cannot be read, of another kind than the family's, or naming a
            special token its vocabulary lacks.
    """
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HFTokenizer

    from attnlab.data.tokenizers import BPETokenizer, WordPieceTokenizer, tokenizer_from_dict

    if model_type not in _FAMILIES:
        raise CheckpointError(f"model_type {model_type!r} has no tokenizer here; give one of: "
                              f"{', '.join(SUPPORTED_TYPES)}")
    folder, family = Path(hf_folder), _FAMILIES[model_type]
    settings = _tokenizer_settings(folder)
    file = folder / "tokenizer.json"
    if file.is_file():
        try:
            check_readable(file)
            hf = HFTokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception for a malformed file
            raise CheckpointError(f"cannot read {file} as a HF tokenizers file: {one_line(e)}") from None
        source = file
    elif model_type == "bert" and (folder / "vocab.txt").is_file():
        hf, source = _wordpiece_from_vocab(folder / "vocab.txt", settings), folder / "vocab.txt"
    else:
        also = " (nor vocab.txt, from which a BERT WordPiece is built)" if model_type == "bert" else \
            " (vocab.json and merges.txt are not read)"
        raise CheckpointError(f"{folder}: no tokenizer.json{also}; only the fast-tokenizer file is read: save it "
                              "there with transformers' AutoTokenizer.from_pretrained(...).save_pretrained(folder)")
    held = type(hf.model).__name__
    if held != family["model"]:
        raise CheckpointError(f"{source} holds a {held} tokenizer; a {family['what']} run reads a {family['model']} "
                              "one")
    if model_type != "bert":
        _check_byte_level(hf, source)
    added: set[str] = set()
    if source.name == "vocab.txt":
        added = _add_added_tokens(folder / "added_tokens.json", hf)
    elif model_type == "bert" and settings.get("tokenizer_class") in (None, "BertTokenizer", "BertTokenizerFast"):
        # HF reads a BERT folder with BertTokenizer unless tokenizer_config.json names another class
        _bert_settings_over_normalizer(hf, settings)
    specials = _specials(settings, family, hf)
    extra, named_in = settings.get("additional_special_tokens", ([], None))
    for token in extra:
        if hf.token_to_id(token) is None:
            raise CheckpointError(f"{named_in} names {token!r} among additional_special_tokens, and the tokenizer's "
                                  "vocabulary lacks it")
    # As HF's fast tokenizer adds them (vocab.txt) or reads them (a special the files name beside tokenizer.json):
    # matched whole, before the normalizer; a token of added_tokens.json stays matched after it, as HF keeps it
    # (an uncased model's "[E1]" also matches "[e1]").
    hf.add_special_tokens([*(specials.tokens() if source.name == "vocab.txt" else ()),
                           *(AddedToken(token, special=True, normalized=True) if token in added else token
                             for token in extra)])
    cls = WordPieceTokenizer if model_type == "bert" else BPETokenizer
    try:
        tokenizer = cls(hf, specials)
        tokenizer_from_dict(tokenizer.to_dict())  # every check `load_tokenizer` makes of the saved file
    except AttnlabError as e:
        raise CheckpointError(f"{source}: {e}") from None
    return tokenizer


def _tokenizer_settings(folder: Path) -> dict[str, Any]:
    """tokenizer_config.json's settings, with special_tokens_map.json's special tokens over them (as HF reads
    them): each special (its HF key) as (its string or None, the file that names it). {} where neither file is
    there."""
    settings: dict[str, Any] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / name
        if not path.is_file():
            continue
        data = _read_json(path)
        if not isinstance(data, dict):
            raise CheckpointError(f"{path} is not a JSON object")
        named = [key for key in EXTRA_SPECIAL_KEYS if key in data]
        if named:  # special_tokens_map.json's over tokenizer_config.json's
            extra = [token for key in named for token in _additional_specials(data[key], path, key)]
            settings["additional_special_tokens"] = (list(dict.fromkeys(extra)), path)
        for key, value in data.items():
            if key in EXTRA_SPECIAL_KEYS:
                continue
            if key in HF_SPECIAL_KEYS:
                token = value.get("content") if isinstance(value, dict) else value  # an AddedToken's fields
                if token is not None and (not isinstance(token, str) or not token):
                    raise CheckpointError(f"{path}: {key} is {json.dumps(value)}; it must be a token (a string)")
                settings[key] = (token, path)
            elif name == "tokenizer_config.json":
                settings[key] = value
    return settings


def _additional_specials(value: Any, path: Path, key: str) -> list[str]:
    """The strings of an additional_special_tokens list (strings, or AddedToken fields with their "content"), or of
    transformers 5's extra_special_tokens (such a list, or an object of named tokens)."""
    if value is None:
        return []
    items = list(value.values()) if isinstance(value, dict) and key == "extra_special_tokens" else value
    tokens = [item.get("content") if isinstance(item, dict) else item for item in items] \
        if isinstance(items, list) else None
    if tokens is None or not all(isinstance(token, str) and token for token in tokens):
        raise CheckpointError(f"{path}: {key} is {json.dumps(value)[:80]}; it must be a list of tokens (strings)")
    return tokens


def _add_added_tokens(path: Path, hf: Any) -> set[str]:
    """The tokens of a vocab.txt folder's added_tokens.json ({token: id}, the ids after vocab.txt's, where
    `resize_token_embeddings` made room for them), added to `hf` as HF's tokenizer adds them: matched after the
    normalizer (its lowercasing included), before the rest of the pipeline. Returns them."""
    from tokenizers import AddedToken

    if not path.is_file():
        return set()
    try:
        check_readable(path)
    except AttnlabError as e:
        raise CheckpointError(f"cannot read {path}: {one_line(e)}") from None
    added = _read_json(path)
    if not isinstance(added, dict) or not all(isinstance(t, str) and t and type(i) is int for t, i in added.items()):
        raise CheckpointError(f"{path} is not a JSON object of tokens and their ids ({{\"[E1]\": 30522, ...}})")
    new = [token for token, _ in sorted(added.items(), key=lambda item: item[1]) if hf.token_to_id(token) is None]
    size = hf.get_vocab_size(with_added_tokens=True)
    if [added[token] for token in new] != list(range(size, size + len(new))):
        raise CheckpointError(f"{path}: the ids of its tokens ({', '.join(f'{t!r} {added[t]}' for t in new[:4])}) do "
                              f"not follow the vocabulary's {size} tokens; give the model's own files, or save its "
                              "tokenizer.json there")
    hf.add_tokens([AddedToken(token, normalized=True) for token in new])
    return set(new)


def _bert_normalizer(settings: dict[str, Any], clean_text: bool = True):
    """BERT's normalizer as HF's BertTokenizer makes it from tokenizer_config.json's casing, accent and Chinese
    character settings (HF's defaults where it has none: lowercase, accents stripped where lowercased)."""
    from tokenizers import normalizers

    return normalizers.BertNormalizer(
        clean_text=clean_text, handle_chinese_chars=_setting(settings, "tokenize_chinese_chars", True, (True, False)),
        strip_accents=_setting(settings, "strip_accents", None, (None, True, False)),
        lowercase=_setting(settings, "do_lower_case", True, (True, False)))


def _setting(settings: dict[str, Any], key: str, default: Any, allowed: tuple) -> Any:
    """tokenizer_config.json's `key` (`default` where it has none), one of `allowed` or refused in one line."""
    value = settings.get(key, default)
    if not any(value is a for a in allowed):  # true, false, null: 1 and "true" are not HF's
        raise CheckpointError(f"tokenizer_config.json: {key} is {json.dumps(value)}; it must be "
                              + " or ".join(json.dumps(a) for a in allowed))
    return value


def _bert_settings_over_normalizer(hf: Any, settings: dict[str, Any]) -> None:
    """A BertTokenizer folder's tokenizer.json with tokenizer_config.json's casing, accent and Chinese character
    settings over its BertNormalizer's, as HF's BertTokenizer loads it (the two files can disagree: the config is
    what HF reads)."""
    normalizer = json.loads(hf.to_str()).get("normalizer")
    if isinstance(normalizer, dict) and normalizer.get("type") == "BertNormalizer":
        hf.normalizer = _bert_normalizer(settings, clean_text=normalizer.get("clean_text", True) is not False)


def _specials(settings: dict[str, Any], family: dict[str, Any], hf: Any):
    """The SpecialTokens of a HF tokenizer: the files' (else the family's defaults that its vocabulary has), each
    token in one part (the first of the family's order)."""
    from attnlab.data.tokenizers import SPECIAL_NAMES, SpecialTokens

    named: dict[str, tuple[str | None, Path | None]] = {role: (token, None) for role, token in
                                                        family["defaults"].items()}
    for key, role in HF_SPECIAL_KEYS.items():
        if key in settings:
            named[role] = settings[key]
    chosen: dict[str, str] = {}
    for role in family["order"]:
        token, file = named.get(role, (None, None))
        if token is None or token in chosen.values():
            continue
        if hf.token_to_id(token) is None:
            if file is None:  # a usual token this vocabulary does without
                continue
            raise CheckpointError(f"{file} names {token!r} as the {role} token, and the tokenizer's vocabulary "
                                  "lacks it")
        chosen[role] = token
    return SpecialTokens(**{name: chosen.get(name) for name in SPECIAL_NAMES})


def _wordpiece_from_vocab(vocab: Path, settings: dict[str, Any]):
    """The WordPiece HF's BertTokenizerFast builds from a vocab.txt (its converter's pipeline), with the casing and
    accent settings of tokenizer_config.json (HF's defaults where it has none: lowercase)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    if _setting(settings, "do_basic_tokenize", True, (True, False)) is False:
        raise CheckpointError("tokenizer_config.json: do_basic_tokenize false (WordPiece on whitespace-split text "
                              "alone) is not read; save a tokenizer.json with the folder instead")
    unk = settings.get("unk_token", (None,))[0] or "[UNK]"
    try:
        check_readable(vocab)
        hf = HFTokenizer(models.WordPiece.from_file(str(vocab), unk_token=unk))
    except Exception as e:  # tokenizers' own error type, or an OSError
        raise CheckpointError(f"cannot read {vocab}: {one_line(e)}") from None
    hf.normalizer = _bert_normalizer(settings)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece(prefix="##")
    return hf


# ----------------------------------------------------------------------------------------------------
# The model and its tokenizer together


def _check_fits(config: Any, tokenizer: Any, hf: Path, what: str) -> None:
    """Refuse a tokenizer that does not belong to the weights: another vocabulary size, or another pad token than
    config.json's pad_token_id (BERT: its embedding row is the padding one)."""
    if tokenizer.vocab_size != config.vocab_size:
        raise CheckpointError(f"{hf}: the tokenizer has {tokenizer.vocab_size} tokens and the {what} model "
                              f"{config.vocab_size} (vocab_size in config.json): another model's tokenizer, or "
                              "embeddings padded beyond its vocabulary (resize_token_embeddings with "
                              "pad_to_multiple_of), which are not converted; give the model's own tokenizer.json, and "
                              "embeddings of its size")
    want, have = getattr(config, "pad_id", None), tokenizer.pad_id
    if want is not None and have is not None and want != have:
        raise CheckpointError(f"{hf}: the tokenizer's pad token {tokenizer.specials.pad!r} is id {have}, config.json's "
                              f"pad_token_id is {want}: they are not of one model")


def _class_names(hf_config: dict[str, Any], config: Any) -> list[str] | None:
    """A sequence classifier's class names from config.json's id2label (`hf_config`, read by `_model_type`), in
    output order; None for another head, or where they are HF's placeholders (LABEL_0, LABEL_1...), which no data
    file uses."""
    if getattr(config, "heads", None) != "classification":
        return None
    id2label = hf_config.get("id2label")
    n = config.n_classes
    if not isinstance(id2label, dict) or sorted(id2label) != sorted(str(i) for i in range(n)):
        return None
    names = [id2label[str(i)] for i in range(n)]
    if not all(isinstance(name, str) and name for name in names) or len(set(names)) != n or \
            names == [f"LABEL_{i}" for i in range(n)]:
        return None
    return names
