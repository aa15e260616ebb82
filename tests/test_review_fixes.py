"""Defects a review of the day's change found in it, each pinned here."""

from __future__ import annotations

import pytest
import torch

from attnlab.models.gpt import GPT, GPTConfig


def test_params_checks_position_options_without_building_the_tables(monkeypatch):
    """The check built the whole sinusoidal table (block 131,072 x 4,096: 28 s and 10 GB) to count parameters."""
    import attnlab.modules.positions as positions
    from attnlab.analysis.params import count_parameters

    lengths = []
    real = positions.sinusoidal_table
    monkeypatch.setattr(positions, "sinusoidal_table", lambda p, *a, **k: (lengths.append(len(p)), real(p, *a, **k))[1])
    config = GPTConfig(vocab_size=65, block_size=1_000_000, d_model=64, n_heads=4, n_layers=1, position="sinusoidal")
    assert count_parameters(config).total > 0
    assert lengths and max(lengths) <= 1


def test_a_long_last_paragraph_does_not_take_the_held_out_part_over(tmp_path):
    from attnlab.data.text_files import line_split_offset

    path = tmp_path / "t.txt"
    head = "a heading line\n" * 5
    path.write_text(head + "word " * 36_000, encoding="utf-8")  # a 180 KB last paragraph, no final line end
    cut = line_split_offset(path, 0.9)
    size = path.stat().st_size
    assert 0.85 * size < cut < size  # about the tenth asked for, at a character boundary inside the line


def test_a_prompt_ending_in_whitespace_gets_no_second_space():
    from attnlab.data.tokenizers import WordTokenizer
    from attnlab.inference.runs import _continuation

    tok = WordTokenizer.train(["good movie nice great"], specials={"pad": "<pad>", "unk": "<unk>"})
    new = tok.encode("nice great")
    expected = {"good movie": "good movie nice great", "good movie ": "good movie nice great",
                "good movie\n": "good movie\nnice great"}
    for prompt, text in expected.items():
        assert prompt + _continuation(tok, prompt, tok.encode(prompt), new) == text


def test_greedy_with_a_beam_on_a_language_model_says_what_language_models_take(tmp_path, capsys):
    import json

    from cli_helpers import one_line_error, run_cli

    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=1",
                           "--set", "train.warmup_steps=0", "--set", f"train.out_dir={json.dumps(str(out))}",
                           "--set", "train.progress=false", "--set", "train.eval_every=0", "--set",
                           "train.precision=fp32", "--set", "train.device=cpu")
    assert code == 0, err
    line = one_line_error(capsys, "generate", str(out), "-p", "def ", "--greedy", "--beam-size", "2",
                          "--device", "cpu")
    assert "--beam-size is for translation models" in line


def test_a_checkpoint_loads_into_a_model_on_the_meta_device(tmp_path):
    from attnlab.training.checkpoint import load_checkpoint_into, save_checkpoint

    config = GPTConfig(vocab_size=11, block_size=8, d_model=8, n_heads=2, n_layers=1, tie_embeddings=False)
    save_checkpoint(tmp_path / "ck", GPT(config))
    with torch.device("meta"):
        model = GPT(config)
    with pytest.warns(UserWarning):  # torch: copying into meta parameters is a no-op
        load_checkpoint_into(tmp_path / "ck", model)


def test_a_longer_context_may_be_loaded_where_positions_are_not_weights(tmp_path):
    from attnlab.training.checkpoint import ModelMismatch, load_checkpoint_into, save_checkpoint

    for position in ("sinusoidal", "rotary", "alibi"):
        save_checkpoint(tmp_path / position, GPT(GPTConfig(vocab_size=11, block_size=8, d_model=8, n_heads=2,
                                                           n_layers=1, position=position)))
        load_checkpoint_into(tmp_path / position, GPT(GPTConfig(vocab_size=11, block_size=16, d_model=8,
                                                                n_heads=2, n_layers=1, position=position)))
    save_checkpoint(tmp_path / "learned", GPT(GPTConfig(vocab_size=11, block_size=8, d_model=8, n_heads=2,
                                                        n_layers=1)))
    with pytest.raises(ModelMismatch, match="has shape"):
        load_checkpoint_into(tmp_path / "learned", GPT(GPTConfig(vocab_size=11, block_size=16, d_model=8, n_heads=2,
                                                                 n_layers=1)))


def test_seq2seq_special_ids_of_the_wrong_type_get_a_config_error():
    from attnlab.errors import ConfigError
    from attnlab.models.transformer import TransformerConfig

    with pytest.raises(ConfigError, match="bos_id: expected an integer, got None"):  # as a config file's is
        TransformerConfig(src_vocab_size=11, tgt_vocab_size=11, d_model=8, n_heads=2, d_ff=16, bos_id=None)
