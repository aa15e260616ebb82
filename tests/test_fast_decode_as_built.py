"""`generate` takes the fast decoder by default, which reads a GPT's weights as tensors: a model a notebook user
changed — a forward hook (steering, activation patching), an adapter or a norm swapped in, a parametrized weight, a
subclass with its own forward — was decoded as if unchanged, giving the unchanged model's tokens without a word
(Python API audit 4). Such a model now takes its own forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.utils.parametrize as parametrize
from torch import nn

from attnlab.inference.fast_decode import FastGPTDecoder
from attnlab.inference.generate import generate
from attnlab.models.gpt import GPT, GPTConfig

PROMPT = [[1, 2, 3]]


def _model(cls=GPT):
    torch.manual_seed(0)
    return cls(GPTConfig(vocab_size=11, block_size=16, d_model=16, n_heads=2, n_layers=1)).eval()


def _steer(module, inputs, output):
    output = output.clone()
    output[..., 7] += 1e4
    return output


class Adapter(nn.Linear):  # LoRA-like: the weight's product plus a low-rank change of its own
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        generator = torch.Generator().manual_seed(1)
        self.down = nn.Parameter(torch.randn(self.in_features, 2, generator=generator))
        self.up = nn.Parameter(torch.randn(2, self.out_features, generator=generator) * 20)

    def forward(self, x):
        return super().forward(x) + x @ self.down @ self.up


class Zero(nn.Module):
    def forward(self, weight):
        return torch.zeros_like(weight)


class Banned(GPT):  # never emits token 3
    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits[..., 3] = float("-inf")
        return out


def _hooked():
    model = _model()
    model.lm_head.register_forward_hook(_steer)
    return model


def _adapter():
    model = _model()
    fc1 = model.blocks.layers[0].ff.fc1
    adapter = Adapter(fc1.in_features, fc1.out_features)
    adapter.load_state_dict(fc1.state_dict(), strict=False)
    model.blocks.layers[0].ff.fc1 = adapter
    return model


def _parametrized():
    model = _model()
    parametrize.register_parametrization(model.blocks.layers[0].ff.fc2, "weight", Zero())
    return model


def _pre_hooked():
    model = _model()
    model.lm_head.register_forward_pre_hook(lambda module, args: (-args[0],))  # the least likely token first
    return model


@pytest.mark.parametrize("changed", [_hooked, _adapter, _parametrized, _pre_hooked, lambda: _model(Banned)])
def test_a_changed_model_decodes_with_its_own_forward(changed):
    model = changed()
    assert not FastGPTDecoder.supports(model)
    expected = generate(model, PROMPT, 6, greedy=True, fast=False)
    assert generate(model, PROMPT, 6, greedy=True) == expected == generate(model, PROMPT, 6, greedy=True,
                                                                           use_cache=False)
    assert expected != generate(_model(), PROMPT, 6, greedy=True)  # the change changes the tokens


def test_a_global_forward_hook_is_heard():
    model = _model()
    handle = nn.modules.module.register_module_forward_hook(
        lambda module, inputs, output: _steer(module, inputs, output) if module is model.lm_head else None)
    try:
        assert not FastGPTDecoder.supports(model)
        assert generate(model, PROMPT, 4, greedy=True) == [[7, 7, 7, 7]]
    finally:
        handle.remove()
    assert FastGPTDecoder.supports(model)


def test_a_model_as_built_still_takes_the_fast_decoder_and_a_removed_hook_gives_it_back():
    model = _model()
    assert FastGPTDecoder.supports(model)
    handle = model.lm_head.register_forward_hook(_steer)
    assert not FastGPTDecoder.supports(model)
    handle.remove()
    assert FastGPTDecoder.supports(model)
    assert generate(model, PROMPT, 6, greedy=True) == generate(model, PROMPT, 6, greedy=True, fast=False)
    assert FastGPTDecoder.supports(_model().to(torch.bfloat16))
