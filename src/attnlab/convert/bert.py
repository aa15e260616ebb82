"""Hugging Face BERT checkpoints → attnlab `BertModel`.

`bert_from_hf` maps a state dict and a `config.json` dict (no `transformers` needed);
`load_hf_bert` reads a local folder (`config.json` + `model.safetensors`; pickled `.bin` files are
never opened, since unpickling can run code).

Accepted layouts: `BertModel` (keys `embeddings.…`), `BertForPreTraining` / `BertForMaskedLM` /
`BertForSequenceClassification` (keys under `bert.`, heads under `cls.…` / `classifier.…`), and
checkpoints converted from TensorFlow (`LayerNorm.gamma` / `beta`). The heads present decide
`BertConfig.heads`: MLM (+ NSP) → "pretraining", classifier → "classification", none → "none".

The keys alone cannot tell every HF class apart: a `BertForTokenClassification` classifier has the shape
of a sequence classifier, and a `BertForNextSentencePrediction` NSP head is a pretraining head without its
masked LM. So a checkpoint with head weights whose `config.json` names another class in `architectures`
is refused, and so is any converted weight the built model would not use: a head must never be dropped or
read as another one without an error. A body-only state dict converts whatever `architectures` says
(`AutoModel.from_pretrained` on a token classifier keeps the config's class name), since the encoder is
the same in every class.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.convert.hf_folder import (
    HF_ACTIVATIONS,
    REQUIRED,
    check_model_type,
    config_bool,
    config_float,
    config_int,
    config_str,
    require_keys,
    shape_mismatch,
)
from attnlab.errors import CheckpointError, ConfigError
from attnlab.models.bert import BertConfig, BertModel

# Per-layer renames: HF suffix after `encoder.layer.{i}.` → ours after `encoder.layers.{i}.`.
_LAYER_KEYS = {
    "attention.self.query": "self_attn.scores.q_proj",
    "attention.self.key": "self_attn.scores.k_proj",
    "attention.self.value": "self_attn.v_proj",
    "attention.output.dense": "self_attn.out_proj",
    "attention.output.LayerNorm": "attn_block.norm",
    "intermediate.dense": "ff.fc1",
    "output.dense": "ff.fc2",
    "output.LayerNorm": "ff_block.norm",
}

# Modules outside the layers: HF prefix (after any `bert.`) → ours.
_OTHER_KEYS = {
    "embeddings.word_embeddings": "embeddings.token",
    "embeddings.position_embeddings": "embeddings.position.embedding",
    "embeddings.token_type_embeddings": "embeddings.segment",
    "embeddings.LayerNorm": "embeddings.norm",
    "pooler.dense": "pooler.dense",
    "cls.predictions.transform.dense": "mlm.dense",
    "cls.predictions.transform.LayerNorm": "mlm.norm",
    "cls.predictions.decoder": "mlm.decoder",
    "cls.seq_relationship": "nsp",
    "classifier": "classifier",
}

# Buffers some checkpoints carry that have no parameter behind them.
_IGNORED = ("embeddings.position_ids", "embeddings.token_type_ids")

# The HF classes whose heads map onto ours (`architectures` in config.json).
SUPPORTED_CLASSES = ("BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification")
_SUPPORTED = ", ".join(SUPPORTED_CLASSES)

# The shared encoder (after any `bert.`): every other key belongs to a head.
_BODY = ("embeddings.", "encoder.", "pooler.")

_REQUIRED_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def _check_architectures(hf_config: dict[str, Any], head_keys: list[str], source: str) -> None:
    """Refuse a checkpoint whose head weights belong to a class we do not convert (see the module docstring)."""
    classes = hf_config.get("architectures")
    if classes is None or not head_keys:
        return
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise CheckpointError(f"{source}: architectures is {classes!r}; it must be a list of class names")
    other = [c for c in classes if c not in SUPPORTED_CLASSES]
    if other:
        raise CheckpointError(f"{source}: architectures names {other[0]}, whose head attnlab's BERT does not "
                              f"have ({head_keys[0]}, ...); supported: {_SUPPORTED}")


def _check_computes_as_ours(hf_config: dict[str, Any], source: str) -> str:
    """Refuse the settings our BERT does not compute (relative position embeddings, a decoder, an unknown
    activation), naming them; the hidden activation's HF name back. Checked before the weights' names, which such
    a checkpoint's extra weights (distance_embedding, crossattention) would only report as unknown keys."""
    kind = config_str(hf_config, "position_embedding_type", source, "absolute")
    if kind != "absolute":
        raise CheckpointError(f"position_embedding_type {kind!r} is not supported; only 'absolute' is")
    if config_bool(hf_config, "is_decoder", source, False) or \
            config_bool(hf_config, "add_cross_attention", source, False):
        raise CheckpointError("BERT checkpoints configured as a decoder (is_decoder, add_cross_attention) "
                          "are not supported")
    act = config_str(hf_config, "hidden_act", source, "gelu")
    if act not in HF_ACTIVATIONS:
        raise CheckpointError(f"hidden_act {act!r} is not supported; known: {', '.join(HF_ACTIVATIONS)}")
    return act


def bert_config_from_hf(hf_config: dict[str, Any], *, heads: str = "none", nsp: bool = True,
                   pooler: bool | None = None, n_classes: int = 2, source: str = "config.json") -> BertConfig:
    """An attnlab BertConfig from the dict of a HF BERT `config.json`; `source` names it in messages.

    Raises:
        CheckpointError: another model_type, a required key missing, a value of the wrong type or range
            (named with the key and the value), or a setting our BERT does not implement (relative position
            embeddings, a decoder).
    """
    check_model_type(hf_config, "bert", source, "BERT")
    require_keys(hf_config, _REQUIRED_KEYS, source, "BERT")
    act = _check_computes_as_ours(hf_config, source)

    def integer(key: str, default: Any = REQUIRED, minimum: int = 1) -> Any:
        return config_int(hf_config, key, source, default, minimum=minimum)

    def number(key: str, default: float | None, minimum: float = 0.0, below: float | None = None) -> Any:
        return config_float(hf_config, key, source, default, minimum=minimum, below=below)

    vocab_size, hidden_size, n_heads = integer("vocab_size"), integer("hidden_size"), integer("num_attention_heads")
    if hidden_size % n_heads:
        raise CheckpointError(f"{source}: hidden_size {hidden_size} is not divisible by num_attention_heads "
                              f"{n_heads}: the config.json is damaged or from another model")
    # Absent: HF's BertConfig default, 0 (the row `nn.Embedding(padding_idx=0)` keeps at zero in training);
    # written as null: no pad row.
    pad_id = config_int(hf_config, "pad_token_id", source, None if "pad_token_id" in hf_config else 0, minimum=0)
    if pad_id is not None and pad_id >= vocab_size:
        raise CheckpointError(f"{source}: pad_token_id {pad_id} is not below vocab_size {vocab_size}")
    try:
        return BertConfig(
            vocab_size=vocab_size, d_model=hidden_size, n_layers=integer("num_hidden_layers", minimum=0),
            n_heads=n_heads, d_ff=integer("intermediate_size"), max_len=integer("max_position_embeddings", 512),
            type_vocab_size=integer("type_vocab_size", 2, minimum=0), activation=HF_ACTIVATIONS[act],
            layer_norm_eps=number("layer_norm_eps", 1e-12), dropout=number("hidden_dropout_prob", 0.1, below=1),
            attention_dropout=number("attention_probs_dropout_prob", 0.1, below=1),
            classifier_dropout=number("classifier_dropout", None, below=1),
            initializer_range=number("initializer_range", 0.02), pad_id=pad_id,
            tie_output=config_bool(hf_config, "tie_word_embeddings", source, True),
            heads=heads, nsp=nsp, pooler=pooler, n_classes=n_classes,
        )
    except ConfigError as e:  # a combination the checks above do not cover: still one line, naming the file
        raise CheckpointError(f"{source}: {e}") from None


def _rename(key: str) -> str | None:
    """Our name for a HF key (with any `bert.` prefix already removed); None if unknown."""
    key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
    if key == "cls.predictions.bias":
        return "mlm.decoder.bias"
    if key.startswith("encoder.layer."):
        index, _, rest = key[len("encoder.layer."):].partition(".")
        module, _, leaf = rest.rpartition(".")
        if module in _LAYER_KEYS:
            return f"encoder.layers.{index}.{_LAYER_KEYS[module]}.{leaf}"
        return None
    module, _, leaf = key.rpartition(".")
    if module in _OTHER_KEYS:
        return f"{_OTHER_KEYS[module]}.{leaf}"
    return None


def bert_from_hf(state_dict: dict[str, Tensor], hf_config: dict[str, Any], *,
                 source: str = "config.json") -> tuple[BertConfig, dict[str, Tensor]]:
    """Map a HF BERT state dict and config to (our BertConfig, a state dict for `BertModel`).

    The heads are read from the keys present. A tied MLM decoder (whose weight safetensors files
    usually omit) takes the token embedding matrix. Every weight is checked against the shape the config
    gives before anything is loaded; `source` names the config in messages.

    Raises:
        CheckpointError: keys this converter does not know, keys our model needs that are missing, weights
            our model would not use (a head of a class we do not convert), a class in `architectures` we do
            not convert, a regression head, or a config whose values are malformed or do not fit the weights.
    """
    check_model_type(hf_config, "bert", source, "BERT")
    _check_computes_as_ours(hf_config, source)
    prefixed = any(k.startswith("bert.") for k in state_dict)
    ours: dict[str, Tensor] = {}
    origin: dict[str, str] = {}  # our name -> the checkpoint's, for messages
    unknown, head_keys = [], []
    for original, value in state_dict.items():
        key = original[len("bert."):] if prefixed and original.startswith("bert.") else original
        if key in _IGNORED:
            continue
        if not key.startswith(_BODY):
            head_keys.append(original)
        name = _rename(key)
        if name is None:
            unknown.append(original)
        elif key == "cls.predictions.bias" and name in ours:
            # HF keeps the MLM bias twice; the decoder's own is the one its forward adds (the two differ in an
            # untied model), so it wins in whichever order the keys come.
            continue
        else:
            ours[name], origin[name] = value, original
    _check_architectures(hf_config, sorted(head_keys), source)
    if unknown:
        raise CheckpointError(f"unknown keys in the BERT checkpoint: {', '.join(sorted(unknown)[:8])}"
                              + (" ..." if len(unknown) > 8 else ""))

    has_mlm = any(k.startswith("mlm.") for k in ours)
    has_nsp = any(k.startswith("nsp.") for k in ours)
    has_classifier = any(k.startswith("classifier.") for k in ours)
    has_pooler = any(k.startswith("pooler.") for k in ours)
    if has_mlm:
        heads = "pretraining"
    elif has_classifier:
        heads = "classification"
    else:
        heads = "none"
    n_classes = 2
    if heads == "classification":
        weight = ours.get("classifier.weight")
        n_classes = weight.shape[0] if weight is not None and weight.dim() == 2 else 2
        if n_classes == 1:
            raise CheckpointError("the classifier has one output (a regression head, num_labels 1, or a "
                                  "BertForMultipleChoice scorer): regression heads are not supported; attnlab's "
                                  "BERT converts classifiers of 2 or more classes")
        # The logits would match, but our loss (softmax cross-entropy) would not be the one it was trained with.
        problem = hf_config.get("problem_type")
        if problem not in (None, "single_label_classification"):
            raise CheckpointError(f"problem_type {problem!r} is not supported: attnlab's BERT classifier is "
                                  "single-label (softmax over 2 or more classes), without regression or "
                                  "multi-label heads")
    # A head that reads the pooled state gets a pooler even where the checkpoint has none, so its absence is
    # reported as the missing pooler.dense weights rather than as a setting to change.
    reads_pooler = heads == "classification" or (heads == "pretraining" and has_nsp)
    config = bert_config_from_hf(hf_config, heads=heads, nsp=has_nsp, pooler=has_pooler or reads_pooler,
                                 n_classes=n_classes, source=source)
    if has_mlm and "mlm.decoder.weight" not in ours and "embeddings.token.weight" in ours:
        if not config.tie_output:
            raise CheckpointError("the checkpoint has an untied MLM head (tie_word_embeddings false) "
                                  "but no cls.predictions.decoder.weight")
        ours["mlm.decoder.weight"] = ours["embeddings.token.weight"]
        origin["mlm.decoder.weight"] = origin["embeddings.token.weight"]

    with torch.device("meta"):  # only the names and shapes are needed: allocate nothing
        expected = {k: v.shape for k, v in BertModel(config).state_dict().items()}
    if heads == "classification" and not has_pooler:
        # BertForTokenClassification has a classifier over every token and no pooler; a sequence classifier
        # reads the pooled [CLS] state, so a missing pooler means another head.
        raise CheckpointError("the checkpoint has a classifier but no pooler (pooler.dense), as "
                              "BertForTokenClassification saves it: attnlab's BERT converts sequence classifiers "
                              f"(one label per text, over the pooled [CLS] state); supported: {_SUPPORTED}")
    missing = sorted(set(expected) - set(ours))
    if missing:
        raise CheckpointError(f"the BERT checkpoint lacks: {', '.join(missing[:8])}"
                              + (" ..." if len(missing) > 8 else ""))
    unused = sorted(origin[k] for k in set(ours) - set(expected))
    if unused:
        raise CheckpointError(f"the BERT checkpoint has weights the converted model would not use: "
                              f"{', '.join(unused[:4])}" + (" ..." if len(unused) > 4 else "")
                              + f"; supported: {_SUPPORTED}, with a config.json that fits the weights")
    for name, shape in expected.items():
        if ours[name].shape != shape:
            raise CheckpointError(shape_mismatch(origin[name], shape, ours[name].shape, source))
    decoder, token = ours.get("mlm.decoder.weight"), ours.get("embeddings.token.weight")
    if config.tie_output and decoder is not None and token is not None and not torch.equal(decoder, token):
        # Loaded into our tied model, the decoder matrix would overwrite the word embeddings.
        raise CheckpointError(f"{source} ties the MLM decoder to the word embeddings (tie_word_embeddings true), "
                              f"but the checkpoint's {origin['mlm.decoder.weight']} differs from its "
                              f"{origin['embeddings.token.weight']}; if the two are meant to be separate, set "
                              "\"tie_word_embeddings\": false in config.json")
    return config, {k: ours[k] for k in expected}


def load_hf_bert(model_dir: str | Path) -> BertModel:
    """Load a local HF BERT folder (`config.json` + `model.safetensors`) as an attnlab BertModel.

    The model is returned in eval mode, in the checkpoint's dtype.

    Raises:
        CheckpointError: the folder lacks either file (a folder with only `pytorch_model.bin` must be
            re-saved with `save_pretrained(..., safe_serialization=True)` first), does not hold BERT, or
            holds something `bert_from_hf` refuses.
    """
    from attnlab.convert.hf_folder import read_hf_folder

    hf_config, state_dict = read_hf_folder(model_dir, "BERT")
    config, state = bert_from_hf(state_dict, hf_config, source=str(Path(model_dir) / "config.json"))
    model = BertModel(config)
    dtype = next(iter(state.values())).dtype
    model.to(dtype)
    model.load_state_dict(state)
    return model.eval()
