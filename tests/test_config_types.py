"""Configs built directly in Python are checked as config files are: a Path or a NumPy/torch integer is taken as
what it stands for; a value of the wrong type is refused at construction, not after the run (a Path in
TrainerConfig trained every step and then could not write its checkpoint), nor written into a checkpoint that
cannot be read back (GPTConfig(bias="no"))."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from training_helpers import ToySource, tiny_model

from attnlab.errors import ConfigError
from attnlab.models.gpt import GPTConfig
from attnlab.training import Trainer, TrainerConfig
from attnlab.training.checkpoint import load_model


def test_a_path_and_numpy_or_torch_integers_are_taken_as_what_they_stand_for(tmp_path):
    config = TrainerConfig(steps=2, batch_size=8, precision="fp32", device="cpu", progress=False,
                           out_dir=tmp_path / "run")
    assert config.out_dir == str(tmp_path / "run")
    Trainer(tiny_model(), config, ToySource()).fit()
    assert (tmp_path / "run" / "checkpoint" / "model.safetensors").is_file()
    ids = torch.tensor([[3, 9, 4]])
    for vocab in (np.int64(10), ids.max() + 1, np.array(ids).max() + 1):
        assert GPTConfig(vocab_size=vocab).vocab_size == 10 and type(GPTConfig(vocab_size=vocab).vocab_size) is int
    assert type(GPTConfig(dropout=np.float32(0.25)).dropout) is float


@pytest.mark.parametrize("build, says", [
    (lambda: TrainerConfig(steps=True), "steps: expected an integer, got True"),
    (lambda: TrainerConfig(steps=2.5), "steps: expected an integer, got 2.5"),
    (lambda: GPTConfig(bias="no"), "bias: expected true or false, got 'no'"),
    (lambda: GPTConfig(tie_embeddings="false"), "tie_embeddings: expected true or false, got 'false'"),
    (lambda: GPTConfig(d_model=16.0), "d_model: expected an integer, got 16.0"),
    (lambda: GPTConfig(vocab_size=torch.tensor(2.0)), "vocab_size: expected an integer"),
    (lambda: GPTConfig(attention=3), "attention: expected a string, got 3"),
])
def test_a_value_of_the_wrong_type_is_refused_at_construction(build, says):
    with pytest.raises(ConfigError, match=f"^{says}"):
        build()


def test_a_checkpoint_of_a_directly_built_config_reads_back(tmp_path):
    from attnlab.models.gpt import GPT
    from attnlab.training.checkpoint import save_checkpoint

    model = GPT(GPTConfig(vocab_size=np.int64(12), block_size=torch.tensor(8), d_model=8, n_heads=2, n_layers=1))
    save_checkpoint(Path(tmp_path) / "ckpt", model)
    assert load_model(tmp_path / "ckpt").config == model.config
