"""A source line of whitespace only is blank everywhere a translation model reads one: `generate --input` printed
nothing for it, while `evaluate` (through the parallel-text source) translated its spaces into words and scored
those, and `generate -p "   "` translated them too."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import DataError


def _run():
    from attnlab.data.tokenizers import CharTokenizer
    from attnlab.inference.runs import LoadedRun
    from attnlab.models.transformer import Seq2SeqTransformer, TransformerConfig

    tok = CharTokenizer.train(["the cat sat on a mat", "a dog ran far"],
                              specials={"pad": "<pad>", "unk": None, "bos": "<bos>", "eos": "<eos>"})
    torch.manual_seed(0)
    model = Seq2SeqTransformer(TransformerConfig(
        src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=16, n_heads=2, d_ff=32,
        n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, pad_id=tok.pad_id, bos_id=tok.bos_id,
        eos_id=tok.eos_id, tie_output=False, max_len=64)).eval()
    return LoadedRun(model, tok, "seq2seq", None, {}), tok


def test_a_whitespace_line_has_no_source_tokens_in_parallel_text():
    from attnlab.data.sources import ParallelTextSource

    _, tok = _run()
    assert tok.encode("   ")  # the tokenizer keeps spaces: the line would have tokens of its own
    with pytest.warns(UserWarning, match="one side empty"):
        source = ParallelTextSource(["the cat", "   "], ["a dog", "a mat"], tok, tok, batch_size=2)
    assert source.src[1] == [] and source.src[0] == tok.encode("the cat")


def test_evaluate_scores_the_translations_generate_prints(tmp_path, monkeypatch):
    import sacrebleu

    from attnlab.inference.runs import _scoring_length, evaluate_file, translate_file

    run, _ = _run()
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("the cat\n   \na dog ran\n", encoding="utf-8")
    ref.write_text("a cat\n\nthe dog\n", encoding="utf-8")
    scored = []
    bleu = sacrebleu.corpus_bleu
    monkeypatch.setattr(sacrebleu, "corpus_bleu", lambda hyps, refs: scored.append(list(hyps)) or bleu(hyps, refs))
    with pytest.warns(UserWarning, match="blank on both sides"):
        evaluate_file(run, src, target=ref)
    # evaluate decodes at most what training's targets held (data.max_length, here what the positions hold less bos
    # and eos), generate --input at most -n tokens (README): compared at evaluate's length.
    printed = translate_file(run, src, max_len=_scoring_length(run, specials=2)[0])
    assert printed[1] == "" and scored == [printed]


def test_a_blank_prompt_is_refused_for_translation():
    from attnlab.inference.runs import generate_texts

    run, _ = _run()
    with pytest.raises(DataError, match="a prompt is blank .*nothing to translate"):
        generate_texts(run, ["the cat", "   "], max_new_tokens=5)
