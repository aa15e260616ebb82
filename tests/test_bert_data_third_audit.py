"""BERT pre-training data, third audit: lines of control characters (sentences of no tokens once WordPiece's
normaliser drops them) and a one-document corpus with next-sentence prediction on."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from cli_helpers import one_line_error, run_cli

from attnlab.data.sources import NSPPairs
from attnlab.data.text_files import split_documents
from attnlab.training.recipe import load_run_config, prepare

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "bert-mlm.toml"
TINY = ["train.progress=false", "train.precision=fp32", "train.device=cpu", "model.d_model=16", "model.d_ff=32",
        "model.n_layers=1", "model.n_heads=2", "data.vocab_size=120", "data.max_length=24"]
TEXT = "the cat sat on the mat .\nthe dog ran fast .\n\nbig red house .\nsmall blue tree .\n\n"


def sets(*pairs: str) -> list[str]:
    return [a for s in pairs for a in ("--set", s)]


def test_a_line_of_control_characters_is_blank():
    # "\x01" was kept as a sentence, which WordPiece encodes to no tokens: pairs "[CLS] [SEP] [SEP]".
    text = "a b.\nc d.\n\x01\ne f.\n\x02\x7f \x1b\ng h.\ni j.\x07\n\x1b[0m\n"
    assert split_documents(text) == [["a b.", "c d."], ["e f."], ["g h.", "i j.\x07", "\x1b[0m"]]
    assert split_documents("\x01\n\x02\n") == []


def test_pre_training_pairs_have_no_sentence_of_no_tokens(tmp_path):
    path = tmp_path / "ctrl.txt"
    path.write_text((TEXT + "\x01\n\x02\n\n") * 5, encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prep = prepare(load_run_config(str(CONFIG), [f"data.path={json.dumps(str(path))}", "data.val_fraction=0",
                                                     f"train.out_dir={json.dumps(str(tmp_path / 'run'))}", *TINY]))
    assert prep.info == {"documents": 10, "sentence_pairs": 10}
    assert all(len(s) > 0 for s in prep.train_source.pairs.sentences)
    batch = prep.train_source.batch(0)
    assert (batch["attention_mask"].sum(1) > 3).all()  # no "[CLS] [SEP] [SEP]"


def test_sentences_of_no_tokens_are_left_out_of_sentence_pairs():
    # A line of characters the normaliser drops that are not control characters (U+FFFD, a private-use one).
    from attnlab.data.tokenizers import WordPieceTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = WordPieceTokenizer.train(["the cat sat on the mat", "the dog ran fast"], vocab_size=60)
    docs = [["the cat sat", "\ufffd", "the mat"], ["\ue000", "\ufffd"], ["the dog", "ran fast"]]
    pairs = NSPPairs(docs, tok, max_length=16)
    assert all(len(s) > 0 for s in pairs.sentences) and len(pairs.sentences) == 4
    assert pairs.doc_lengths.tolist() == [2, 2] and len(pairs) == 2


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    """A tiny WordPiece BERT trained for one step."""
    tmp = tmp_path_factory.mktemp("bert")
    (tmp / "docs.txt").write_text(TEXT * 4, encoding="utf-8")
    out = tmp / "run"
    from attnlab.cli import main

    main(["train", str(CONFIG), *sets(f"data.path={json.dumps(str(tmp / 'docs.txt'))}", "train.steps=1",
                                      "train.eval_every=0", "train.warmup_steps=0", "data.val_fraction=0",
                                      f"train.out_dir={json.dumps(str(out))}", *TINY)])
    return out


def test_evaluate_reads_lines_of_control_characters_as_blank(bert_run, tmp_path, capsys):
    clean, ctrl = tmp_path / "clean.txt", tmp_path / "ctrl.txt"
    clean.write_text(TEXT * 3, encoding="utf-8")
    ctrl.write_text((TEXT + "\x01\n\x02\n\n") * 3, encoding="utf-8")

    def scored(path):
        code, stdout, err = run_cli(capsys, "evaluate", str(bert_run), "--data", str(path), "--json", "--device",
                                    "cpu")
        assert code == 0, err
        return json.loads(stdout)

    assert scored(ctrl) == scored(clean)


def test_one_document_with_next_sentence_prediction_is_refused_first(tmp_path, capsys, monkeypatch):
    # It warned "nothing held out for evaluation ... or more documents", then failed without naming the file or
    # the model.nsp = false the README gives for this layout.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nodocs.txt").write_text("".join(f"the line number {i} is here .\n" for i in range(40)),
                                         encoding="utf-8")
    (tmp_path / "eval.txt").write_text(TEXT, encoding="utf-8")
    base = ["data.path=nodocs.txt", "train.steps=1", f"train.out_dir={json.dumps(str(tmp_path / 'run'))}", *TINY]
    for extra in ([], ["data.eval_path=eval.txt"]):
        line = one_line_error(capsys, "train", str(CONFIG), *sets(*base, *extra))
        assert line.startswith("attnlab: error: nodocs.txt (data.path) is one document"), line
        assert "separate the documents with blank lines" in line and "--set model.nsp=false" in line, line
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prep = prepare(load_run_config(str(CONFIG), [*base, "model.nsp=false"]))
    assert prep.info["documents"] == 1 and prep.eval_source is not None  # its last sentences held out
