"""Hugging Face BERT checkpoints → attnlab `BertModel`.

`bert_from_hf` maps a state dict and a `config.json` dict (no `transformers` needed);
`load_hf_bert` reads a local folder (`config.json` + `model.safetensors`; pickled `.bin` files are
never opened, since unpickling can run code).

Accepted layouts: `BertModel` (keys `embeddings.…`), `BertForPreTraining` / `BertForMaskedLM` /
`BertForSequenceClassification` (keys under `bert.`, heads under `cls.…` / `classifier.…`), and
checkpoints converted from TensorFlow (`LayerNorm.gamma` / `beta`). The heads present decide
`BertConfig.heads`: MLM (+ NSP) → "pretraining", classifier → "classification", none → "none".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnlab.errors import CheckpointError
from attnlab.models.bert import BertConfig, BertModel

# HF `hidden_act` → attnlab activation name.
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu-tanh",
    "gelu_pytorch_tanh": "gelu-tanh",
    "gelu_fast": "gelu-tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}

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


def bert_config_from_hf(hf_config: dict[str, Any], *, heads: str = "none", nsp: bool = True,
                   pooler: bool | None = None, n_classes: int = 2) -> BertConfig:
    """An attnlab BertConfig from the dict of a HF BERT `config.json`.

    Raises:
        CheckpointError: a setting our BERT does not implement (relative position embeddings, a decoder).
    """
    get = hf_config.get
    kind = get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise CheckpointError(f"position_embedding_type {kind!r} is not supported; only 'absolute' is")
    if get("is_decoder") or get("add_cross_attention"):
        raise CheckpointError("BERT checkpoints configured as a decoder (is_decoder, add_cross_attention) "
                          "are not supported")
    act = get("hidden_act", "gelu")
    if act not in HF_ACTIVATIONS:
        raise CheckpointError(f"hidden_act {act!r} is not supported; known: {', '.join(HF_ACTIVATIONS)}")
    return BertConfig(
        vocab_size=hf_config["vocab_size"], d_model=hf_config["hidden_size"],
        n_layers=hf_config["num_hidden_layers"], n_heads=hf_config["num_attention_heads"],
        d_ff=hf_config["intermediate_size"], max_len=get("max_position_embeddings", 512),
        type_vocab_size=get("type_vocab_size", 2), activation=HF_ACTIVATIONS[act],
        layer_norm_eps=float(get("layer_norm_eps", 1e-12)), dropout=float(get("hidden_dropout_prob", 0.1)),
        attention_dropout=float(get("attention_probs_dropout_prob", 0.1)),
        classifier_dropout=get("classifier_dropout"), initializer_range=float(get("initializer_range", 0.02)),
        pad_id=get("pad_token_id", 0), tie_output=get("tie_word_embeddings", True),
        heads=heads, nsp=nsp, pooler=pooler, n_classes=n_classes,
    )


def _rename(key: str) -> str | None:
    """Our name for a HF key (with any `bert.` prefix already removed); None if unknown."""
    key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
    if key == "cls.predictions.bias":
        return "mlm.decoder.bias"
    if key.startswith("encoder.layer."):
        rest = key[len("encoder.layer."):]
        index, rest = rest.split(".", 1)
        module, leaf = rest.rsplit(".", 1)
        if module in _LAYER_KEYS:
            return f"encoder.layers.{index}.{_LAYER_KEYS[module]}.{leaf}"
        return None
    module, leaf = key.rsplit(".", 1)
    if module in _OTHER_KEYS:
        return f"{_OTHER_KEYS[module]}.{leaf}"
    return None


def bert_from_hf(state_dict: dict[str, Tensor],
                 hf_config: dict[str, Any]) -> tuple[BertConfig, dict[str, Tensor]]:
    """Map a HF BERT state dict and config to (our BertConfig, a state dict for `BertModel`).

    The heads are read from the keys present. A tied MLM decoder (whose weight safetensors files
    usually omit) takes the token embedding matrix.

    Raises:
        CheckpointError: keys this converter does not know, or keys our model needs that are missing.
    """
    prefixed = any(k.startswith("bert.") for k in state_dict)
    ours: dict[str, Tensor] = {}
    unknown = []
    for key, value in state_dict.items():
        if prefixed and key.startswith("bert."):
            key = key[len("bert."):]
        if key in _IGNORED:
            continue
        name = _rename(key)
        if name is None:
            unknown.append(key)
        else:
            ours[name] = value
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
    n_classes = ours["classifier.weight"].shape[0] if has_classifier else 2
    config = bert_config_from_hf(hf_config, heads=heads, nsp=has_nsp, pooler=has_pooler, n_classes=n_classes)
    if has_mlm and "mlm.decoder.weight" not in ours:
        if not config.tie_output:
            raise CheckpointError("the checkpoint has an untied MLM head (tie_word_embeddings false) "
                                  "but no cls.predictions.decoder.weight")
        ours["mlm.decoder.weight"] = ours["embeddings.token.weight"]

    with torch.device("meta"):  # only the names are needed: allocate nothing
        expected = set(BertModel(config).state_dict())
    missing = sorted(expected - set(ours))
    if missing:
        raise CheckpointError(f"the BERT checkpoint lacks: {', '.join(missing[:8])}"
                              + (" ..." if len(missing) > 8 else ""))
    return config, {k: ours[k] for k in expected}


def load_hf_bert(model_dir: str | Path) -> BertModel:
    """Load a local HF BERT folder (`config.json` + `model.safetensors`) as an attnlab BertModel.

    The model is returned in eval mode, in the checkpoint's dtype.

    Raises:
        CheckpointError: the folder lacks either file (a folder with only `pytorch_model.bin` must be
            re-saved with `save_pretrained(..., safe_serialization=True)` first) or does not hold BERT.
    """
    from attnlab.convert.hf_folder import read_hf_folder

    hf_config, state_dict = read_hf_folder(model_dir, "BERT")
    folder = Path(model_dir)
    if hf_config.get("model_type", "bert") != "bert":
        raise CheckpointError(f"{folder}: model_type is {hf_config.get('model_type')!r}, not 'bert'")
    config, state = bert_from_hf(state_dict, hf_config)
    model = BertModel(config)
    dtype = next(iter(state.values())).dtype
    model.to(dtype)
    model.load_state_dict(state)
    return model.eval()
