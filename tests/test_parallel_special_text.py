"""Parallel text that spells a special token ("<eos>", "<pad>") is read as that token by the word, BPE and
WordPiece tokenizers: an eos inside a target taught the model to stop there, silently. It is now said."""

from __future__ import annotations

import warnings

import pytest

from attnlab.data.tokenizers import CharTokenizer, WordTokenizer
from attnlab.training.recipe import _warn_special_text


def test_sentences_that_spell_a_special_token_are_named():
    tokenizer = WordTokenizer.train(["big runs red tree gib snur der eert"])
    lines = ["gib snur", "gib <eos> snur", "der <pad> eert"]
    assert tokenizer.eos_id in tokenizer.encode(lines[1])
    with pytest.warns(UserWarning, match=r"2 line\(s\) of tgt.txt spell a special token, which the word tokenizer "
                                         r"reads as that token \(line 2: '<eos>'"):
        _warn_special_text(lines, tokenizer, "tgt.txt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say: "<eos" is not the token
        _warn_special_text(["gib snur", "der eert <eos"], tokenizer, "tgt.txt")
        # "<pad>s" is one unknown word (<unk>, itself a special): no pad is read (stop-39 review)
        _warn_special_text(["gib snur<pad>s"], tokenizer, "tgt.txt")
        char = CharTokenizer.train("good film")  # its specials are characters: "<pad>" is read as 5 of them
        _warn_special_text(["good <pad> film é"], char, "tgt.txt")


def test_a_translation_run_says_so_for_its_files(tmp_path):
    import json
    from pathlib import Path

    from attnlab.training.recipe import load_run_config, prepare

    src, tgt = tmp_path / "train.src", tmp_path / "train.tgt"
    src.write_text("".join(f"big runs {i}\n" for i in range(20)), encoding="utf-8")
    tgt.write_text("".join(f"gib {'<eos> ' if i == 3 else ''}snur {i}\n" for i in range(20)), encoding="utf-8")
    run = load_run_config(Path(__file__).resolve().parents[1] / "configs" / "translate.toml", [
        f"data.src_path={json.dumps(str(src))}", f"data.tgt_path={json.dumps(str(tgt))}", "data.tokenizer=\"word\"",
        "data.vocab_size=none", "data.eval_src_path=\"\"", "data.eval_tgt_path=\"\"", "train.device=\"cpu\"",
        f"train.out_dir={json.dumps(str(tmp_path / 'run'))}"])
    with pytest.warns(UserWarning, match=r"1 line\(s\) of .*train.tgt spell a special token.*line 4: '<eos>'"):
        prepare(run)


def test_a_cut_source_sentence_is_not_said_to_hold_specials():
    # Source sentences carry no bos or eos: "(4 tokens with specials)" named tokens they do not have.
    from attnlab.data.sources import ParallelTextSource

    tokenizer = WordTokenizer.train(["a b c d e f g h"])
    with pytest.warns(UserWarning) as caught:
        ParallelTextSource(["a b c d e f g", "a b"], ["a b c d e f g", "a"], tokenizer, tokenizer, 2,
                           max_src_length=4, max_tgt_length=4)
    said = {str(w.message).split(" are longer")[0]: str(w.message) for w in caught}
    assert "allows (4 tokens) and were cut (the longest has 7)" in said["1 of 2 source sentences"]
    assert "tokens with specials)" in said["1 of 2 target sentences"]


def _prepared(tmp_path, config: str, *settings: str):
    import json
    from pathlib import Path

    from attnlab.training.recipe import load_run_config, prepare

    run = load_run_config(Path(__file__).resolve().parents[1] / "configs" / config, [
        *settings, "data.tokenizer=\"word\"", "data.vocab_size=none", "train.device=\"cpu\"",
        f"train.out_dir={json.dumps(str(tmp_path / 'run'))}"])
    return prepare(run)


def test_bert_and_classifier_texts_that_spell_a_special_token_are_named(tmp_path):
    """A "<sep>" in a sentence split segment A, a "<pad>" was read as a blank token whose embedding never trains, a
    "<mask>" was never predicted: translation said so, pre-training and classification did not (stop-39 BERT
    audit)."""
    import json

    corpus = tmp_path / "docs.txt"
    corpus.write_text("".join(f"the dog {'<pad> ' if i == 7 else ''}ran {i} .\nit was fast .\n\n" for i in range(30)),
                      encoding="utf-8")
    with pytest.warns(UserWarning, match=r"1 sentence\(s\) of .*docs.txt spell a special token, which the word "
                                         r"tokenizer reads as that token \(sentence 15: '<pad>'; a separator inside "
                                         # attended to, as HF does too: it had said "left out of attention"
                                         r"a text splits it, a pad is read as a blank token whose embedding never "
                                         r"trains\)"):
        _prepared(tmp_path, "bert-mlm.toml", f"data.path={json.dumps(str(corpus))}", "data.max_length=32")
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    train.write_text("sentence\tlabel\n" + "".join(f"good film {i}\t1\nbad film {i}\t0\n" for i in range(10)),
                     encoding="utf-8")
    dev.write_text("sentence\tlabel\ngood <sep> film\t1\nbad film\t0\n", encoding="utf-8")
    # numbered by the file's lines (the header is line 1): "text 1" had counted examples
    with pytest.warns(UserWarning, match=r"1 line\(s\) of .*dev.tsv spell a special token.*\(line 2: '<sep>'"):
        _prepared(tmp_path, "encoder-classify.toml", f"data.path={json.dumps(str(train))}",
                  f"data.eval_path={json.dumps(str(dev))}")
