"""Decoding options a model would silently ignore are refused, in the library as on the command line, and the
translation decoders refuse sources they cannot read in one line (stop-33 decoding audit: each test failed before
its fix)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_helpers import one_line_error, toml_str

from attnlab.data.tokenizers import train_tokenizer
from attnlab.errors import ConfigError
from attnlab.inference.generate import beam_search, greedy_translate
from attnlab.inference.runs import LoadedRun, check_decoding_options, generate_texts
from attnlab.models.transformer import Seq2SeqTransformer, TransformerConfig


@pytest.fixture(scope="module")
def translation_run() -> LoadedRun:
    tok = train_tokenizer("word", "alpha beta gamma delta\n" * 4)
    torch.manual_seed(0)
    config = TransformerConfig(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=16, n_heads=2,
                               d_ff=32, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_len=16,
                               pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id)
    return LoadedRun(Seq2SeqTransformer(config).eval(), tok, "seq2seq", Path("."), {})


@pytest.mark.parametrize("temperature", [0.0, 1e-40])
@pytest.mark.parametrize("option", ["top_k", "top_p", "seed"])
def test_a_temperature_of_zero_with_sampling_options_is_refused(temperature, option):
    # A temperature below float32's smallest normal number decodes greedily: the options did nothing.
    value = {"top_k": 5, "top_p": 0.3, "seed": 7}[option]
    flag = "--" + option.replace("_", "-")
    with pytest.raises(ConfigError, match=f"always takes the most likely token, as --greedy does; drop {flag}, or "
                                          "give a temperature above 0 to sample"):
        check_decoding_options("gpt", temperature=temperature, **{option: value})
    check_decoding_options("gpt", temperature=temperature)  # alone it is a way to ask for greedy decoding
    check_decoding_options("gpt", temperature=0.5, **{option: value})


def test_generate_texts_refuses_for_a_translation_what_the_command_refuses(translation_run):
    # temperature and seed went unchecked in the library (the command checks them itself), and greedy=True with a
    # beam ran the beam search.
    with pytest.raises(ConfigError, match="translation decodes greedily or with --beam-size; drop --temperature"):
        generate_texts(translation_run, ["alpha beta"], max_new_tokens=4, temperature=5.0)
    with pytest.raises(ConfigError, match="translation decodes greedily or with --beam-size; drop --seed"):
        generate_texts(translation_run, ["alpha beta"], max_new_tokens=4, seed=123)
    with pytest.raises(ConfigError, match="--greedy and --beam-size 4 ask for two searches"):
        generate_texts(translation_run, ["alpha beta"], max_new_tokens=4, greedy=True, beam_size=4)
    greedy = generate_texts(translation_run, ["alpha beta"], max_new_tokens=4, greedy=True)
    assert greedy == generate_texts(translation_run, ["alpha beta"], max_new_tokens=4)


@pytest.mark.parametrize("decode", [greedy_translate, beam_search], ids=["greedy", "beam"])
def test_the_translation_decoders_refuse_sources_they_cannot_read(translation_run, decode):
    # generate() refused such prompts in one line; these raised an IndexError from inside the embedding, or a
    # reshape error for sources of no tokens.
    model, vocab = translation_run.model, translation_run.model.config.src_vocab_size
    for bad in (vocab, -1):
        with pytest.raises(ConfigError, match=f"source token id {bad} is outside the model's source vocabulary "
                                              f"\\(0 to {vocab - 1}\\)"):
            decode(model, torch.tensor([[3, bad]]), max_len=4)
    with pytest.raises(ConfigError, match="the sources have no tokens"):
        decode(model, torch.zeros(2, 0, dtype=torch.long), max_len=4)
    for ids in (torch.tensor([3.0, 4.0]), torch.tensor([[3, 4]], dtype=torch.int16)):  # as the model's forward says
        with pytest.raises(ConfigError, match=r"^src_ids must be a \(B, T\) tensor of integer token ids"):
            decode(model, ids, max_len=4)
    assert len(decode(model, torch.tensor([[3, 4]]), max_len=4)) == 1


def test_the_command_refuses_a_temperature_of_zero_with_a_seed(capsys, tmp_path):
    from attnlab.cli import main

    run = tmp_path / "run"
    main(["train", "--set", "model.preset=gpt-char-tiny", "--set", "model.block_size=16", "--set",
          "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu", "--set",
          "train.steps=1", "--set", "train.warmup_steps=0", "--set", f"train.out_dir={toml_str(run)}"])
    capsys.readouterr()
    line = one_line_error(capsys, "generate", str(run), "-p", "a", "-n", "3", "--temperature", "0", "--top-k", "5",
                          "--seed", "7", "--device", "cpu")
    assert line == ("attnlab: error: --temperature 0 always takes the most likely token, as --greedy does; drop "
                    "--top-k, --seed, or give a temperature above 0 to sample")


def _translator_choosing(tok, token: int) -> Seq2SeqTransformer:
    """A tiny untrained translation model whose first choice, at every step, is `token`."""
    config = TransformerConfig(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=16, n_heads=2,
                               d_ff=32, n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_len=16,
                               pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id, tie_output=False,
                               output_bias=True)
    torch.manual_seed(0)
    model = Seq2SeqTransformer(config).eval()
    with torch.no_grad():
        model.lm_head.bias[token] = 100.0
    return model


def test_a_translation_holds_no_line_break_token(tmp_path, capsys):
    """A byte-level BPE has tokens for the bytes "\\n" and "\\r", which no target (a line) holds: a decoder early in
    training that emitted one split `generate --input`'s output onto other lines (stop-39 seq2seq audit)."""
    from attnlab.inference.runs import line_break_ids, translate_ids

    tok = train_tokenizer("bpe", "alpha beta gamma delta\n" * 4, 300)
    breaks = line_break_ids(tok)
    assert sorted(tok.decode([i]) for i in breaks) == ["\n", "\r"]
    model = _translator_choosing(tok, breaks[0])
    run = LoadedRun(model, tok, "seq2seq", Path("."), {})
    src = torch.tensor([tok.encode("alpha beta")])
    assert breaks[0] in greedy_translate(model, src, max_len=3)[0]  # the model alone still emits it
    for beam in (1, 3):
        (text,) = translate_ids(run, [tok.encode("alpha beta")], beam_size=beam, max_len=6)
        assert text and "\n" not in text and "\r" not in text
    for decode in (greedy_translate, beam_search):
        assert breaks[0] not in decode(model, src, max_len=3, never_emit=breaks)[0]
        with pytest.raises(ConfigError, match=rf"never_emit holds {tok.vocab_size}, not a target token id"):
            decode(model, src, max_len=3, never_emit=[tok.vocab_size])


@pytest.mark.parametrize("special", ["mask", "cls", "sep"])
def test_a_translation_spends_no_step_on_a_special_token_no_target_held(special):
    """mask, cls and sep are in a subword tokenizer's vocabulary but in no target; decoding drops them from the text
    (skip_special_tokens), so an untrained decoder that ranked one first gave an empty or cut translation."""
    from attnlab.inference.runs import never_translated_ids, translate_ids

    tok = train_tokenizer("bpe", "alpha beta gamma delta\n" * 4, 300)
    banned = getattr(tok, f"{special}_id")
    assert banned in never_translated_ids(tok) and tok.eos_id not in never_translated_ids(tok)
    model = _translator_choosing(tok, banned)
    run = LoadedRun(model, tok, "seq2seq", Path("."), {})
    src = [tok.encode("alpha beta")]
    never = never_translated_ids(tok)
    for beam in (1, 3):
        (text,) = translate_ids(run, src, beam_size=beam, max_len=6)
        expected = (beam_search(model, torch.tensor(src), beam_size=3, max_len=6, never_emit=never) if beam > 1
                    else greedy_translate(model, torch.tensor(src), max_len=6, never_emit=never))[0]
        assert expected and banned not in expected
        assert text and text == tok.decode(expected, skip_special_tokens=True)


def test_a_translation_shows_the_unk_its_model_put_there():
    # Dropped with the other specials, the words around an unk were joined ("the <unk> cat" printed "the cat"),
    # where an LM's continuation keeps it (stop-47 tokenizer and seq2seq audits).
    from attnlab.inference.runs import translate_ids

    tok = train_tokenizer("word", "alpha beta gamma delta\n" * 4)
    run = LoadedRun(_translator_choosing(tok, tok.unk_id), tok, "seq2seq", Path("."), {})
    for beam in (1, 3):
        (text,) = translate_ids(run, [tok.encode("alpha beta")], beam_size=beam, max_len=4)
        assert text.split() == [tok.id_to_token(tok.unk_id)] * 4
