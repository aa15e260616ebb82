"""Generation cases a second audit found: beam widths beyond any use, temperatures beyond float32, prompts given
as a generator, and a pad id outside the vocabulary."""

from __future__ import annotations

import json

import pytest
import torch
from cli_helpers import one_line_error, run_cli

from attnlab.errors import ConfigError
from attnlab.inference.generate import MAX_BEAM_SIZE, beam_search, generate, sample_next
from attnlab.models.registry import build_model, get_preset


@pytest.mark.parametrize("width", [0, 2.5, True, MAX_BEAM_SIZE + 1, 10**20])
def test_a_beam_width_beyond_use_is_refused(width):
    model = build_model(get_preset("seq2seq-tiny")[1]).eval()
    with pytest.raises(ConfigError, match=r"beam_size \(--beam-size\) must be a whole number from 1 to 1,000"):
        beam_search(model, torch.randint(3, 60, (1, 4)), beam_size=width, max_len=3)


def test_the_command_line_refuses_a_huge_beam_in_one_line(tmp_path, capsys):
    src, tgt = tmp_path / "s.txt", tmp_path / "t.txt"
    src.write_text("a b c\nd e\nb a\n" * 10, encoding="utf-8")
    tgt.write_text("C B A\nE D\nA B\n" * 10, encoding="utf-8")
    out = tmp_path / "run"
    sets = {"model.preset": "seq2seq-tiny", "data.task": "translation", "data.src_path": str(src),
            "data.tgt_path": str(tgt), "data.tokenizer": "word", "train.steps": 1, "train.warmup_steps": 0,
            "train.progress": False, "train.device": "cpu", "train.eval_every": 0, "train.out_dir": str(out)}
    code, _, err = run_cli(capsys, "train", *[a for k, v in sets.items() for a in ("--set", f"{k}={json.dumps(v)}")])
    assert code == 0, err
    huge = "99999999999999999999"
    line = one_line_error(capsys, "generate", str(out), "-p", "a b", "-n", "3", "--beam-size", huge)
    assert "--beam-size" in line and huge in line
    line = one_line_error(capsys, "evaluate", str(out), "--data", str(src), "--target", str(tgt),
                          "--beam-size", huge)
    assert "--beam-size" in line


@pytest.mark.parametrize("temperature", [1.0, 1e30, 1e39, 1e300])
def test_top_k_and_top_p_keep_their_order_at_any_temperature(temperature):
    logits = torch.tensor([[0.0, 5.0, 1.0, 2.0]])
    draws = {int(sample_next(logits, temperature=temperature, top_k=1, generator=torch.Generator().manual_seed(s)))
             for s in range(30)}
    assert draws == {1}
    draws = {int(sample_next(logits, temperature=temperature, top_p=0.1, generator=torch.Generator().manual_seed(s)))
             for s in range(30)}
    assert draws == {1}
    # top_k = 2 at a huge temperature: the two best tokens, equally likely
    draws = [int(sample_next(logits, temperature=temperature, top_k=2, generator=torch.Generator().manual_seed(s)))
             for s in range(200)]
    assert set(draws) == {1, 3} if temperature > 1e6 else set(draws) <= {1, 3}


def test_prompts_from_a_generator_are_read_once():
    model = build_model(get_preset("gpt-char-tiny")[1]).eval()
    expected = generate(model, [[1, 2, 3], [4, 5]], 4, greedy=True)
    assert generate(model, (p for p in [[1, 2, 3], [4, 5]]), 4, greedy=True) == expected
    assert generate(model, iter([iter([1, 2, 3]), (4, 5)]), 4, greedy=True) == expected


@pytest.mark.parametrize("pad_id", [-1, 65, 2.0])
def test_a_pad_id_outside_the_vocabulary_is_refused(pad_id):
    model = build_model(get_preset("gpt-char-tiny")[1]).eval()
    for fast in (True, False):
        with pytest.raises(ConfigError, match=f"pad_id {pad_id!r} is not a token id of the model's vocabulary"):
            generate(model, [[1, 2, 3], [4]], 2, greedy=True, pad_id=pad_id, fast=fast)


def test_generate_refuses_models_that_do_not_predict_the_next_token():
    """A classifier's class scores had been read as token ids (greedy: token 0 every time), BERT's masked-LM guess
    of the last token itself as the next one, and a seq2seq model failed with a TypeError from deep inside."""
    from attnlab.models.bert import BertConfig, BertModel
    from attnlab.models.encoder import EncoderConfig, EncoderModel
    from attnlab.models.transformer import Seq2SeqTransformer, TransformerConfig

    small = dict(d_model=16, n_heads=2, d_ff=32, dropout=0.0)
    classifier = EncoderModel(EncoderConfig(vocab_size=10, n_layers=1, head="classification", **small))
    with pytest.raises(ConfigError, match="EncoderModel with the 'classification' head does not predict the next "
                                          "token, so generate cannot continue a prompt with it"):
        generate(classifier, [[3, 4, 5]], 4, greedy=True)
    with pytest.raises(ConfigError, match="BertModel with the 'pretraining' head does not predict the next token"):
        generate(BertModel(BertConfig(vocab_size=10, n_layers=1, **small)), [[3, 4, 5]], 4, greedy=True)
    seq2seq = Seq2SeqTransformer(TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, n_encoder_layers=1,
                                                   n_decoder_layers=1, **small))
    with pytest.raises(ConfigError, match="use greedy_translate or beam_search, not generate"):
        generate(seq2seq, [[3, 4, 5]], 4, greedy=True)
    with pytest.raises(ConfigError, match="EncoderModel with the 'classification' head does not predict"):
        generate(torch.compile(classifier), [[3, 4, 5]], 4, greedy=True)  # judged by the model inside
    lm = EncoderModel(EncoderConfig(vocab_size=10, n_layers=1, head="lm", **small))  # the encoder LM generates
    assert len(generate(lm, [[3, 4, 5]], 4, greedy=True)[0]) == 4


def test_the_run_helpers_refuse_one_string_and_translation_options_out_of_range(tmp_path):
    """A string where a list goes was iterated: one text per character; a beam width of 0 or -3 decoded greedily,
    a batch size of 0 failed in range(); the translation decoders on another model raised AttributeErrors."""
    from attnlab.data.tokenizers import train_tokenizer
    from attnlab.inference.generate import greedy_translate
    from attnlab.inference.runs import LoadedRun, generate_texts, translate_lines

    tok = train_tokenizer("word", ["a b c d"])
    seq2seq = LoadedRun(build_model(get_preset("seq2seq-tiny")[1]).eval(), tok, "seq2seq", tmp_path, {})
    gpt = LoadedRun(build_model(get_preset("gpt-char-tiny")[1]).eval(), tok, "gpt", tmp_path, {})
    with pytest.raises(ConfigError, match=r"generate_texts takes a list of prompts, not one string: give \[prompt\]"):
        generate_texts(gpt, "The")
    with pytest.raises(ConfigError, match=r"translate_lines takes a list of sentences, not one string: give \[text\]"):
        translate_lines(seq2seq, "a b")
    for width in (0, -3):
        with pytest.raises(ConfigError, match=f"beam_size \\(--beam-size\\) must be a whole number from 1 to 1,000, "
                                              f"got {width}"):
            translate_lines(seq2seq, ["a b"], beam_size=width)
    with pytest.raises(ConfigError, match="batch_size must be a whole number of sources, at least 1; got 0"):
        translate_lines(seq2seq, ["a b"], batch_size=0)
    for decode in (greedy_translate, beam_search):
        with pytest.raises(ConfigError, match="GPT is no translation model .*continue a prompt with generate instead"):
            decode(gpt.model, torch.tensor([[3, 4]]))


@pytest.mark.parametrize("seed", [1.5, 2**64, -2**63 - 1, "7"])
def test_a_seed_torch_cannot_take_is_refused_in_one_line(seed):
    model = build_model(get_preset("gpt-char-tiny")[1]).eval()
    with pytest.raises(ConfigError, match=r"seed \(--seed\) must be a whole number from -2\*\*63 to 2\*\*64 - 1"):
        generate(model, [[3, 4]], 2, seed=seed)


def test_load_run_and_select_device_take_what_users_write(tmp_path):
    from attnlab.data.tokenizers import CharTokenizer
    from attnlab.inference.runs import load_run
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.training.checkpoint import save_checkpoint
    from attnlab.training.device import select_device

    assert select_device(torch.device("cpu")) == torch.device("cpu")
    tok = CharTokenizer.train("abc")
    save_checkpoint(tmp_path, GPT(GPTConfig(vocab_size=tok.vocab_size, block_size=8, d_model=8, n_heads=2,
                                            n_layers=1)), tokenizer=tok)
    assert load_run(tmp_path, torch.device("cpu")).model.config.vocab_size == tok.vocab_size
    with pytest.raises(ConfigError, match="device: unknown device 'gpu'; choose one of: auto, cpu, cuda, mps"):
        load_run(tmp_path, "gpu")
