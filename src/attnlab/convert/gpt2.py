"""Convert HF transformers GPT-2 weights (a state dict and its config) into an attnlab `GPT`.

GPT-2 stores its projections as `Conv1D` (y = x·W + b, W of shape (in, out)), the transpose of
`nn.Linear`, and packs Q, K, V into one `c_attn` matrix; both are undone here.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from attnlab.errors import CheckpointError
from attnlab.models.gpt import GPT, GPTConfig

_ACTIVATIONS = {"gelu_new": "gelu-tanh", "gelu_pytorch_tanh": "gelu-tanh", "gelu": "gelu", "relu": "relu"}


def gpt2_config(hf_config: dict) -> GPTConfig:
    act = hf_config.get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS:
        raise CheckpointError(f"GPT-2 activation {act!r} is not supported; known: {', '.join(_ACTIVATIONS)}")
    d = hf_config["n_embd"]
    return GPTConfig(
        vocab_size=hf_config["vocab_size"], block_size=hf_config["n_positions"], d_model=d,
        n_heads=hf_config["n_head"], n_layers=hf_config["n_layer"], d_ff=hf_config.get("n_inner") or 4 * d,
        activation=_ACTIVATIONS[act], layer_norm_eps=hf_config.get("layer_norm_epsilon", 1e-5),
        dropout=0.0, attention_dropout=0.0, position="learned", norm="pre", tie_embeddings=True,
    )


def gpt2_from_hf(state_dict: dict[str, Tensor], hf_config: dict) -> tuple[GPTConfig, dict[str, Tensor]]:
    """HF `GPT2LMHeadModel`/`GPT2Model` state dict -> (our config, our state dict)."""
    sd = {k.removeprefix("transformer."): v for k, v in state_dict.items()}
    config = gpt2_config(hf_config)
    d = config.d_model
    out: dict[str, Tensor] = {
        "embed.token.weight": sd["wte.weight"],
        "position.embedding.weight": sd["wpe.weight"],
        "blocks.norm.weight": sd["ln_f.weight"],
        "blocks.norm.bias": sd["ln_f.bias"],
    }
    for i in range(config.n_layers):
        h, ours = f"h.{i}.", f"blocks.layers.{i}."
        wq, wk, wv = sd[h + "attn.c_attn.weight"].t().split(d, dim=0)  # Conv1D (D, 3D) -> 3 × (D, D)
        bq, bk, bv = sd[h + "attn.c_attn.bias"].split(d)
        out.update({
            ours + "attn_block.norm.weight": sd[h + "ln_1.weight"],
            ours + "attn_block.norm.bias": sd[h + "ln_1.bias"],
            ours + "self_attn.scores.q_proj.weight": wq, ours + "self_attn.scores.q_proj.bias": bq,
            ours + "self_attn.scores.k_proj.weight": wk, ours + "self_attn.scores.k_proj.bias": bk,
            ours + "self_attn.v_proj.weight": wv, ours + "self_attn.v_proj.bias": bv,
            ours + "self_attn.out_proj.weight": sd[h + "attn.c_proj.weight"].t(),
            ours + "self_attn.out_proj.bias": sd[h + "attn.c_proj.bias"],
            ours + "ff_block.norm.weight": sd[h + "ln_2.weight"],
            ours + "ff_block.norm.bias": sd[h + "ln_2.bias"],
            ours + "ff.fc1.weight": sd[h + "mlp.c_fc.weight"].t(), ours + "ff.fc1.bias": sd[h + "mlp.c_fc.bias"],
            ours + "ff.fc2.weight": sd[h + "mlp.c_proj.weight"].t(),
            ours + "ff.fc2.bias": sd[h + "mlp.c_proj.bias"],
        })
    out["lm_head.weight"] = out["embed.token.weight"]
    return config, {k: v.contiguous() for k, v in out.items()}


def gpt_from_hf(state_dict: dict[str, Tensor], hf_config: dict) -> GPT:
    config, sd = gpt2_from_hf(state_dict, hf_config)
    model = GPT(config)
    model.load_state_dict(sd, strict=True)
    return model


def load_hf_gpt2(model_dir: str | Path) -> GPT:
    """Load a local HF GPT-2 folder (`config.json` + `model.safetensors`; never a pickle)."""
    from safetensors.torch import load_file

    folder = Path(model_dir)
    cfg_path, weights = folder / "config.json", folder / "model.safetensors"
    for p in (cfg_path, weights):
        if not p.is_file():
            raise CheckpointError(f"{p} not found; a GPT-2 folder needs config.json and model.safetensors")
    try:
        hf_config = json.loads(cfg_path.read_text())
        state = load_file(str(weights))
    except (json.JSONDecodeError, OSError, Exception) as e:  # safetensors raises its own error types
        raise CheckpointError(f"cannot read GPT-2 weights from {folder}: {e}") from None
    with torch.no_grad():
        return gpt_from_hf(state, hf_config)
