"""Convert HF transformers GPT-2 weights (a state dict and its config) into an attnlab `GPT`.

GPT-2 stores its projections as `Conv1D` (y = x·W + b, W of shape (in, out)), the transpose of
`nn.Linear`, and packs Q, K, V into one `c_attn` matrix; both are undone here. Every weight's shape is
checked against the config in HF's layout first, so a config.json from another checkpoint is named as such
instead of failing in the Q/K/V split or in `load_state_dict`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import Tensor

from attnlab.convert.hf_folder import (
    HF_ACTIVATIONS,
    check_model_type,
    config_bool,
    config_float,
    config_int,
    config_str,
    require_keys,
    shape_mismatch,
)
from attnlab.errors import CheckpointError, ConfigError
from attnlab.models.gpt import GPT, GPTConfig

_LAYER_KEYS = ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
               "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
               "mlp.c_proj.weight", "mlp.c_proj.bias")
_BUFFERS = ("attn.bias", "attn.masked_bias")  # the causal mask and its fill value, stored by older versions


def gpt2_config(hf_config: dict, *, source: str = "config.json") -> GPTConfig:
    """Our `GPTConfig` for a HF GPT-2 config dict; `source` names it in messages.

    Raises:
        CheckpointError: another model_type (checked first, so a BERT config is not reported as a GPT-2
            config lacking keys), a required key missing, a value of the wrong type or range, or a setting
            our GPT does not compute.
    """
    check_model_type(hf_config, "gpt2", source, "GPT-2")
    require_keys(hf_config, ("vocab_size", "n_positions", "n_embd", "n_head", "n_layer"), source, "GPT-2")
    act = config_str(hf_config, "activation_function", source, "gelu_new")
    if act not in HF_ACTIVATIONS:
        raise CheckpointError(f"GPT-2 activation {act!r} is not supported; known: {', '.join(HF_ACTIVATIONS)}")
    # Attention-score scalings other than 1/sqrt(head_dim) would give other numbers without an error.
    if not config_bool(hf_config, "scale_attn_weights", source, True) or \
            config_bool(hf_config, "scale_attn_by_inverse_layer_idx", source, False):
        raise CheckpointError("GPT-2 attention scaled other than by 1/sqrt(head_dim) (scale_attn_weights false "
                              "or scale_attn_by_inverse_layer_idx true) is not supported")
    if config_bool(hf_config, "add_cross_attention", source, False):  # it was refused as "unknown keys" alone
        raise CheckpointError(f"{source}: add_cross_attention true (a GPT-2 decoder that attends to an encoder) is "
                              "not supported: attnlab's GPT is decoder-only; convert a GPT-2 without it")
    d, n_heads = config_int(hf_config, "n_embd", source), config_int(hf_config, "n_head", source)
    if d % n_heads:
        raise CheckpointError(f"{source}: n_embd {d} is not divisible by n_head {n_heads}: the config.json is "
                              "damaged or from another model")
    n_inner = config_int(hf_config, "n_inner", source, None)  # null: HF's 4 * n_embd
    # Training dropouts (HF's defaults 0.1): our GPT has one rate for the embeddings and the residual branches.
    resid = config_float(hf_config, "resid_pdrop", source, 0.1, below=1)
    embd = config_float(hf_config, "embd_pdrop", source, 0.1, below=1)
    if embd != resid:
        warnings.warn(f"{source}: embd_pdrop {embd:g} differs from resid_pdrop {resid:g}; attnlab's GPT has one "
                      f"dropout for both and takes {resid:g} (this changes training only, not the logits)",
                      stacklevel=2)
    try:
        return GPTConfig(
            vocab_size=config_int(hf_config, "vocab_size", source),
            block_size=config_int(hf_config, "n_positions", source), d_model=d, n_heads=n_heads,
            n_layers=config_int(hf_config, "n_layer", source), d_ff=4 * d if n_inner is None else n_inner,
            activation=HF_ACTIVATIONS[act], layer_norm_eps=config_float(hf_config, "layer_norm_epsilon", source, 1e-5),
            dropout=resid, attention_dropout=config_float(hf_config, "attn_pdrop", source, 0.1, below=1),
            position="learned", norm="pre",
            tie_embeddings=config_bool(hf_config, "tie_word_embeddings", source, True),
        )
    except ConfigError as e:  # a combination the checks above do not cover: still one line, naming the file
        raise CheckpointError(f"{source}: {e}") from None


def _hf_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every parameter in HF's names and (Conv1D, packed Q/K/V) layout, from our config."""
    v, p, d, f = config.vocab_size, config.block_size, config.d_model, config.ff_width
    shapes = {"wte.weight": (v, d), "wpe.weight": (p, d), "ln_f.weight": (d,), "ln_f.bias": (d,),
              "lm_head.weight": (v, d)}
    layer = {"ln_1.weight": (d,), "ln_1.bias": (d,), "attn.c_attn.weight": (d, 3 * d), "attn.c_attn.bias": (3 * d,),
             "attn.c_proj.weight": (d, d), "attn.c_proj.bias": (d,), "ln_2.weight": (d,), "ln_2.bias": (d,),
             "mlp.c_fc.weight": (d, f), "mlp.c_fc.bias": (f,), "mlp.c_proj.weight": (f, d), "mlp.c_proj.bias": (d,)}
    for i in range(config.n_layers):
        shapes.update({f"h.{i}.{name}": shape for name, shape in layer.items()})
    return shapes


def gpt2_from_hf(state_dict: dict[str, Tensor], hf_config: dict, *,
                 source: str = "config.json") -> tuple[GPTConfig, dict[str, Tensor]]:
    """HF `GPT2LMHeadModel`/`GPT2Model` state dict and config -> (our config, our state dict).

    A tied output layer (whose weight safetensors files omit) takes the token embedding matrix. `source`
    names the config in messages.

    Raises:
        CheckpointError: keys this converter does not know, keys our model needs that are missing, weights
            whose shape is not the config's, a malformed config, or settings our GPT does not compute.
    """
    sd = {k.removeprefix("transformer."): v for k, v in state_dict.items()}
    config = gpt2_config(hf_config, source=source)
    known = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias", "lm_head.weight"}
    known |= {f"h.{i}.{name}" for i in range(config.n_layers) for name in _LAYER_KEYS + _BUFFERS}
    unknown = sorted(set(sd) - known)
    beyond = sorted({int(k.split(".")[1]) for k in unknown
                     if k.split(".")[0] == "h" and k.split(".")[1].isascii() and k.split(".")[1].isdigit()})
    if beyond and beyond[0] >= config.n_layers:  # layers the config does not count: n_layer does not fit
        raise CheckpointError(f"{source}: n_layer {config.n_layers}, but the weights have layers up to "
                              f"h.{beyond[-1]}; give the config.json saved with these weights")
    if unknown:
        raise CheckpointError(f"unknown keys in the GPT-2 checkpoint: {', '.join(unknown[:8])}"
                              + (" ..." if len(unknown) > 8 else ""))
    needed = known - {"lm_head.weight"} - {f"h.{i}.{b}" for i in range(config.n_layers) for b in _BUFFERS}
    if not config.tie_embeddings:
        needed.add("lm_head.weight")
    missing = sorted(needed - set(sd))
    if missing:
        raise CheckpointError(f"the GPT-2 checkpoint lacks: {', '.join(missing[:8])}"
                              + (" ..." if len(missing) > 8 else ""))
    prefix = "transformer." if any(k.startswith("transformer.") for k in state_dict) else ""
    for name, shape in _hf_shapes(config).items():
        if name in sd and tuple(sd[name].shape) != shape:
            key = name if name == "lm_head.weight" else prefix + name
            raise CheckpointError(shape_mismatch(key, shape, tuple(sd[name].shape), source))
    if config.tie_embeddings and "lm_head.weight" in sd and not torch.equal(sd["lm_head.weight"], sd["wte.weight"]):
        raise CheckpointError(f"{source} ties the output layer to the token embeddings (tie_word_embeddings true), "
                              "but the checkpoint's lm_head.weight differs from its wte.weight; if the two are "
                              "meant to be separate, set \"tie_word_embeddings\": false in config.json")
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
    out["lm_head.weight"] = out["embed.token.weight"] if config.tie_embeddings else sd["lm_head.weight"]
    return config, {k: v.contiguous() for k, v in out.items()}


def gpt_from_hf(state_dict: dict[str, Tensor], hf_config: dict, *, source: str = "config.json") -> GPT:
    """An attnlab `GPT` (eval mode, the weights' dtype) from a HF GPT-2 state dict and config."""
    config, sd = gpt2_from_hf(state_dict, hf_config, source=source)
    model = GPT(config).to(next(iter(sd.values())).dtype)
    model.load_state_dict(sd, strict=True)
    return model.eval()


def load_hf_gpt2(model_dir: str | Path) -> GPT:
    """Load a local HF GPT-2 folder (`config.json` + `model.safetensors`; a pickled `pytorch_model.bin` is
    never read) as an attnlab `GPT` in eval mode.

    Raises:
        CheckpointError: a file is missing or unreadable, or the folder does not hold a GPT-2 we compute.
    """
    from attnlab.convert.hf_folder import read_hf_folder

    hf_config, state = read_hf_folder(model_dir, "GPT-2")
    with torch.no_grad():
        return gpt_from_hf(state, hf_config, source=str(Path(model_dir) / "config.json"))
