"""Generation found wrong by an audit of decoding: each case failed before its fix (a prompt glued to its
continuation, a traceback for an accepted option, blank sources translated from nothing, a batch of blank
sources crashing evaluation, top-p ties broken in no fixed order)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from cli_helpers import one_line_error, run_cli

from attnlab.errors import ConfigError

TINY = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu",
        "--set", "train.eval_every=0"]


def test_generate_keeps_the_space_between_the_prompt_and_a_word_tokenizers_continuation(tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat and the dog sat on the log\n" * 40, encoding="utf-8")
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--set", "model.preset=gpt-char-tiny", "--set", "model.block_size=16",
                           "--set", "data.tokenizer=\"word\"", "--set", f"data.path={json.dumps(str(text))}",
                           "--set", "train.steps=30", "--set", "train.lr=3e-3", "--set", "train.warmup_steps=0",
                           "--set", f"train.out_dir={json.dumps(str(out))}", *TINY)
    assert code == 0, err
    code, shown, err = run_cli(capsys, "generate", str(out), "-p", "the cat", "-n", "6", "--greedy",
                               "--device", "cpu")
    assert code == 0, err
    from attnlab.inference.runs import load_run

    run = load_run(out)
    prompt = run.tokenizer.encode("the cat")
    from attnlab.inference.generate import generate

    new = generate(run.model, [prompt], 6, greedy=True, eos_id=run.tokenizer.eos_id)[0]
    assert shown.rstrip("\n") == run.tokenizer.decode(prompt + new, skip_special_tokens=True)
    assert shown.startswith("the cat ")  # "the catthe ..." before


def test_a_temperature_below_float32s_range_is_greedy_and_a_huge_n_is_refused():
    from attnlab.inference.generate import MAX_NEW_TOKENS, generate, sample_next

    logits = torch.tensor([[0.5, 3.0, 1.0, 2.9]])
    for temperature in (1e-45, 1e-46, 1e-300):
        assert sample_next(logits, temperature=temperature).tolist() == [1]
    torch.manual_seed(0)
    from attnlab.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=7, block_size=8, d_model=16, n_heads=2, n_layers=1)).eval()
    assert len(generate(model, [[1, 2]], 3, temperature=1e-46)[0]) == 3
    for n in (MAX_NEW_TOKENS + 1, 10**20):
        with pytest.raises(ConfigError, match=r"max_new_tokens \(-n\) must be in \[0, 10,000,000\]"):
            generate(model, [[1, 2]], n)


def test_generate_cli_refuses_a_huge_n_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=1",
                           "--set", "train.warmup_steps=0", "--set", f"train.out_dir={json.dumps(str(out))}", *TINY)
    assert code == 0, err
    line = one_line_error(capsys, "generate", str(out), "-p", "def ", "-n", "99999999999999999999", "--device", "cpu")
    assert "must be in [0, 10,000,000]" in line
    # a temperature that float32 rounds to zero decodes greedily (it divided 0 by 0)
    code, _, err = run_cli(capsys, "generate", str(out), "-p", "def ", "--temperature", "1e-46", "-n", "3",
                           "--device", "cpu")
    assert code == 0, err


def test_top_p_breaks_ties_in_vocabulary_order():
    from attnlab.inference.generate import sample_next

    logits = torch.zeros(1, 100)  # 100 tied tokens: p = 0.5 keeps the first 50 in vocabulary order
    seen = {int(sample_next(logits, top_p=0.5, generator=torch.Generator().manual_seed(s))) for s in range(400)}
    assert seen == set(range(50))


def _translation_run():
    from attnlab.data.tokenizers import WordTokenizer
    from attnlab.inference.runs import LoadedRun
    from attnlab.models.transformer import Seq2SeqTransformer, TransformerConfig

    tok = WordTokenizer.train(["the cat sat on a mat", "a dog ran far"],
                              specials={"pad": "<pad>", "unk": "<unk>", "bos": "<bos>", "eos": "<eos>"})
    torch.manual_seed(0)
    model = Seq2SeqTransformer(TransformerConfig(
        src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=16, n_heads=2, d_ff=32,
        n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, pad_id=tok.pad_id, bos_id=tok.bos_id,
        eos_id=tok.eos_id, tie_output=False)).eval()
    return LoadedRun(model, tok, "seq2seq", None, {}), tok


def test_translate_ids_gives_blank_sources_nothing_in_batches_it_is_given():
    from attnlab.inference.runs import translate_ids

    run, tok = _translation_run()
    sources = [[], tok.encode("the cat"), [], tok.encode("a dog ran far")]
    own = translate_ids(run, sources, max_len=4)
    assert own[0] == own[2] == ""
    for batches in ([np.array([0, 1, 2, 3])], [np.array([0, 2]), np.array([1, 3])]):
        assert translate_ids(run, sources, max_len=4, batches=batches) == own


def test_a_batch_of_blank_sources_has_a_padding_column(tmp_path):
    """Sorted by length, blank source lines make batches of their own: they were tensors without columns,
    which crashed the encoder (in training with bucketing, and in `attnlab evaluate`)."""
    from attnlab.data.sources import ParallelTextSource

    run, tok = _translation_run()
    src = ["", "", "the cat sat", "a dog"]
    tgt = ["a dog", "the cat", "a mat", "the dog ran"]
    with pytest.warns(UserWarning, match="have one side empty"):
        source = ParallelTextSource(src, tgt, tok, tok, batch_size=2, bucket_by_length=True)
    batch = source.collate(np.array([0, 1]))
    assert batch["src_ids"].shape == (2, 1) and batch["src_mask"].sum() == 0
    out = run.model(batch["src_ids"], batch["tgt_ids"], src_mask=batch["src_mask"], labels=batch["labels"])
    assert torch.isfinite(out.loss)


def test_prompt_ids_outside_the_vocabulary_are_refused_in_one_line():
    from attnlab.inference.generate import generate
    from attnlab.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=7, block_size=8, d_model=16, n_heads=2, n_layers=1)).eval()
    for prompt in ([[1, 7]], [[-1, 2]], torch.tensor([[3, 9]])):
        with pytest.raises(ConfigError, match="prompt token id -?\\d+ is outside the model's vocabulary \\(0 to 6\\)"):
            generate(model, prompt, 2)


def test_greedy_and_a_beam_together_are_refused(tmp_path, capsys, monkeypatch):
    run, _ = _translation_run()
    monkeypatch.setattr("attnlab.inference.runs.load_run", lambda *a, **k: run)  # imported by the command
    line = one_line_error(capsys, "generate", str(tmp_path), "-p", "the cat", "--greedy", "--beam-size", "3",
                          "--device", "cpu")
    assert "--greedy and --beam-size 3 ask for two searches" in line


def test_translation_search_lengths_are_bounded_in_the_library_too():
    from attnlab.inference.generate import MAX_NEW_TOKENS, beam_search, greedy_translate

    run, tok = _translation_run()
    src = torch.tensor([tok.encode("the cat")])
    for search in (greedy_translate, beam_search):
        with pytest.raises(ConfigError, match=r"max_len \(-n\) must be a whole number in \[0, 10,000,000\]"):
            search(run.model, src, max_len=MAX_NEW_TOKENS + 1)
