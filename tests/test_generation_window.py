"""A bounded model decodes in the window it was trained on: `generate(context=...)` slides a window shorter
than the model's position table, and `attnlab generate` passes a run's data.block_size."""

from __future__ import annotations

import warnings

import pytest
import torch
from cli_helpers import run_cli, spy_on_generate_context, toml_str

from attnlab.errors import ConfigError
from attnlab.inference.generate import generate
from attnlab.models.gpt import GPT, GPTConfig


def _reference(model: GPT, prompt: list[int], n: int, window: int) -> list[int]:
    """Greedy decoding that reads the last `window` tokens at each step, positions from 0."""
    ids = list(prompt)
    for _ in range(n):
        logits = model(torch.tensor([ids[-window:]])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("position", ["learned", "rotary"])
@pytest.mark.parametrize("fast", [True, False])
def test_a_context_shorter_than_the_model_slides_at_it(position, fast):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=23, block_size=32, d_model=32, n_heads=4, n_layers=2, position=position,
                          init_std=0.5)).eval()  # large weights: tokens that change with what is read
    prompt = [3, 1, 4, 1, 5]
    with torch.no_grad():
        expected = _reference(model, prompt, 20, 8)
    assert generate(model, [prompt], 20, greedy=True, context=8, fast=fast)[0] == expected
    assert generate(model, [prompt], 20, greedy=True, fast=fast)[0] != expected  # the table's 32 by default


@pytest.mark.parametrize("context", [0, -3, 2.5, True])
def test_a_context_that_is_not_a_positive_whole_number_is_refused(context):
    model = GPT(GPTConfig(vocab_size=23, block_size=32, d_model=32, n_heads=4, n_layers=1))
    with pytest.raises(ConfigError, match="context must be a whole number"):
        generate(model, [[1, 2]], 3, greedy=True, context=context)


def test_attnlab_generate_decodes_in_the_runs_trained_window(capsys, tmp_path, monkeypatch):
    # Trained on windows of 16 with a table of 32 learned positions: positions 16-31 never trained.
    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--set", 'model.preset="gpt-char-tiny"', "--set", "data.block_size=16",
                           "--set", "train.steps=2", "--set", "train.progress=false",
                           "--set", f"train.out_dir={toml_str(run)}")
    assert code == 0, err
    seen = spy_on_generate_context(monkeypatch)
    code, out, err = run_cli(capsys, "generate", str(run), "--prompt", "The", "-n", "40", "--greedy")
    assert code == 0, err
    assert seen == [16]

    # A prompt longer than that window is read from its last 16 tokens: said, not done silently
    with pytest.warns(UserWarning, match="a prompt of 32 tokens is longer than the windows of 16 the run trained on: "
                                         "only its last 16 tokens are read"):
        code, out, err = run_cli(capsys, "generate", str(run), "--prompt", "Return the list of all items in ",
                                 "-n", "5", "--greedy")
    assert code == 0, err
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run_cli(capsys, "generate", str(run), "--prompt", "x" * 16, "-n", "5", "--greedy")[0] == 0
