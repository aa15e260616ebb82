"""Mutation-testing gaps in the second generation audit's fixes: the widest beam accepted, every entry point
refusing a beam width below 1 (greedy decoding took it silently), top-p's mass at the sampling temperature,
and an empty string prompt."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import toml_str as _q

from attnlab.errors import ConfigError
from attnlab.inference.generate import MAX_BEAM_SIZE, check_beam_size, generate, sample_next
from attnlab.inference.runs import evaluate_file, generate_texts, load_run, translate_file
from attnlab.models.registry import build_model, get_preset
from attnlab.training.recipe import load_run_config, train_run

TINY = ["train.progress=false", "train.precision=fp32", "train.device=cpu", "train.eval_every=0", "train.steps=1"]
BEAM = r"beam_size \(--beam-size\) must be a whole number from 1 to 1,000"


def test_the_widest_beam_is_accepted():
    check_beam_size(1)
    check_beam_size(MAX_BEAM_SIZE)
    with pytest.raises(ConfigError, match=BEAM):
        check_beam_size(MAX_BEAM_SIZE + 1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("beam-entry")
    src, tgt = root / "s.txt", root / "t.txt"
    src.write_text("a b c\nd e\nb a\n" * 10, encoding="utf-8")
    tgt.write_text("C B A\nE D\nA B\n" * 10, encoding="utf-8")
    train_run(load_run_config(None, ["model.preset=seq2seq-tiny", "data.task=translation", f"data.src_path={_q(src)}",
                                     f"data.tgt_path={_q(tgt)}", "data.tokenizer=word", "train.warmup_steps=0",
                                     f"train.out_dir={_q(root / 'mt')}", *TINY]))
    train_run(load_run_config(None, ["model.preset=gpt-char-tiny", "train.warmup_steps=0",
                                     f"train.out_dir={_q(root / 'lm')}", *TINY]))
    return load_run(root / "mt"), load_run(root / "lm"), src, tgt


@pytest.mark.parametrize("width", [0, -2, True])
def test_every_entry_point_refuses_a_beam_below_one(runs, width):
    """A width the greedy path would take (beam_size > 1 picks beam search) is refused, not decoded greedily."""
    mt, lm, src, tgt = runs
    with pytest.raises(ConfigError, match=BEAM):
        translate_file(mt, src, beam_size=width, max_len=4)
    with pytest.raises(ConfigError, match=BEAM):
        evaluate_file(mt, src, target=tgt, beam_size=width)
    with pytest.raises(ConfigError, match=BEAM):
        generate_texts(lm, ["def "], max_new_tokens=2, greedy=True, beam_size=width)


def test_top_p_keeps_the_mass_of_the_temperature_scaled_distribution():
    """At temperature 100 the three tokens are almost equally likely: top_p = 0.5 keeps the best two (at
    temperature 1 the best alone holds 0.67 and would be kept alone)."""
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    draws = {int(sample_next(logits, temperature=100.0, top_p=0.5, generator=torch.Generator().manual_seed(s)))
             for s in range(100)}
    assert draws == {0, 1}
    draws = {int(sample_next(logits, temperature=1.0, top_p=0.5, generator=torch.Generator().manual_seed(s)))
             for s in range(100)}
    assert draws == {0}


def test_an_empty_string_prompt_asks_for_token_ids():
    model = build_model(get_preset("gpt-char-tiny")[1]).eval()
    for text in ("", "abc"):
        with pytest.raises(ConfigError, match="encode text with the run's tokenizer first"):
            generate(model, text, 2, greedy=True)


def test_evaluate_refuses_a_bidirectional_encoder_lm(tmp_path):
    # Training refuses data.task = 'lm' for one; made in Python (with_head on a bidirectional classifier), its
    # next-token loss was reported as if it meant something (every position sees its target; stop-39 encoder audit).
    from pathlib import Path

    from attnlab.data.tokenizers import train_tokenizer
    from attnlab.inference.runs import LoadedRun
    from attnlab.models.encoder import EncoderConfig, EncoderModel

    tok = train_tokenizer("char", "some text to read\n" * 4)
    text = tmp_path / "text.txt"
    text.write_text("some text to read\n" * 8, encoding="utf-8")
    config = EncoderConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=32,
                           head="classification", n_classes=2)
    for causal, refused in ((False, True), (True, False)):
        model = EncoderModel(config.replace(causal=causal)).with_head("lm").eval()
        run = LoadedRun(model, tok, "encoder", Path("."), {"block_size": 8})
        if refused:
            with pytest.raises(ConfigError, match=r"^this encoder's LM head reads bidirectional attention"):
                evaluate_file(run, text)
        else:
            assert evaluate_file(run, text)["loss"] > 0
