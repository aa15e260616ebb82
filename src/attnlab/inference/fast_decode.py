"""A low-overhead decoder for the common GPT: the same numbers as `GPT.forward` with a KV cache, in a
fraction of the framework calls.

Decoding one token at batch 1 is dominated by per-call overhead, not arithmetic: the general forward
(variants, position hooks, masks, module calls) issues ~600 ATen calls per token for a 4-layer model.
For the configuration most GPTs use (dot-product attention, a position scheme that only adds to the
embeddings, pre-norm blocks) and unpadded prompts, `FastGPTDecoder` runs each layer as a dozen
functional calls: one fused QKV product over weights concatenated once, writes into a preallocated cache,
the fused attention kernel, and the MLP. `generate` picks it automatically where it applies; anything
else (rotary, relative biases, Synthesizer, post-norm, padded batches) takes the general path.

Legend: B batch, T new tokens, S cached + new, D width, H heads, Dh head width, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.modules.positions import PositionScheme


class FastGPTDecoder:
    """Incremental decoding for a `GPT` that `supports` accepts (a snapshot of its weights: build it for
    one `generate` call, after training, and do not change the model while it is in use).

    Args:
        model: the GPT, in eval mode.
        batch: rows decoded together (all of the same length: no padding).
        capacity: the most positions the cache will hold (prompt + new tokens).
    """

    def __init__(self, model: nn.Module, batch: int, capacity: int):
        if not self.supports(model):
            raise ValueError("FastGPTDecoder needs a pre-norm GPT with dot attention and additive positions")
        c = model.config
        self.model = model
        self.n_heads, self.head_dim = c.n_heads, c.d_model // c.n_heads
        self.pos = 0
        weight = model.lm_head.weight
        self.layers = []
        for layer in model.blocks.layers:
            attn = layer.self_attn
            qkv_w, qkv_b = attn.scores.fused_qkv(attn.v_proj)  # (3D, D), (3D,)
            self.layers.append((layer.attn_block.norm, qkv_w, qkv_b, attn.scores.scale, attn.out_proj,
                                layer.ff_block.norm, layer.ff.fc1, layer.ff.act, layer.ff.fc2))
        shape = (len(self.layers), batch, self.n_heads, capacity, self.head_dim)
        self.k = weight.new_empty(shape)
        self.v = weight.new_empty(shape)

    @staticmethod
    def supports(model: nn.Module) -> bool:
        """Whether `model` is a GPT this decoder reproduces exactly (checked by structure, not by name)."""
        from attnlab.models.gpt import GPT

        if not isinstance(model, GPT) or model.config.norm != "pre" or model.blocks.norm is None:
            return False
        scheme = type(model.position)
        additive_only = (scheme.rotate_q is PositionScheme.rotate_q and scheme.rotate_k is PositionScheme.rotate_k
                         and scheme.score_bias is PositionScheme.score_bias)
        # A variant with a fused QKV projection declares its queries and keys plain projections of the input.
        return additive_only and all(layer.self_attn.scores.fused_qkv(layer.self_attn.v_proj) is not None
                                     for layer in model.blocks.layers)

    @torch.no_grad()
    def step(self, ids: Tensor) -> Tensor:
        """Feed (B, T) new tokens (the whole prompt first, then one token at a time); return the (B, V)
        logits of the last one."""
        b, t = ids.shape
        start, end = self.pos, self.pos + t
        if t > 1 and start:
            raise ValueError("after the prompt, feed one token at a time")
        if end > self.k.shape[3]:
            raise ValueError(f"the cache holds {self.k.shape[3]} positions; build the decoder with more capacity")
        m = self.model
        positions = torch.arange(start, end, device=ids.device)[None]  # (1, T)
        x = m.embed(ids, positions, m.position)  # (B, T, D)
        h_, dh = self.n_heads, self.head_dim
        for i, (norm1, qkv_w, qkv_b, scale, out, norm2, fc1, act, fc2) in enumerate(self.layers):
            h = F.layer_norm(x, norm1.normalized_shape, norm1.weight, norm1.bias, norm1.eps)
            q, k, v = F.linear(h, qkv_w, qkv_b).view(b, t, 3, h_, dh).permute(2, 0, 3, 1, 4)  # 3 × (B, H, T, Dh)
            self.k[i, :, :, start:end] = k
            self.v[i, :, :, start:end] = v
            # A prompt starts at position 0, so the square causal mask is exact; one new token sees everything.
            a = F.scaled_dot_product_attention(q, self.k[i, :, :, :end], self.v[i, :, :, :end], is_causal=t > 1,
                                               scale=scale)
            x = x + out(a.transpose(1, 2).reshape(b, t, h_ * dh))
            h = F.layer_norm(x, norm2.normalized_shape, norm2.weight, norm2.bias, norm2.eps)
            x = x + fc2(act(fc1(h)))
        self.pos = end
        return m.lm_head(m.blocks.norm(x[:, -1]))  # (B, V)
