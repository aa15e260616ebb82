"""BERT pre-training data with no token the masking can pick (every token special: the unknown token stands for
text outside the tokenizer's vocabulary) is refused, naming the file: `evaluate` had reported a loss of 0 and a
perplexity of 1 for such a file, and continued pre-training logged a training loss of 0."""

from __future__ import annotations

import json
import math

import pytest
import torch
from cli_helpers import run_cli
from test_bert_pretraining import CONFIG, TINY, corpus

from attnlab.cli import main
from attnlab.data.sources import BertSource, MaskSpec, NSPPairs
from attnlab.data.tokenizers import WordTokenizer
from attnlab.errors import DataError
from attnlab.models.registry import build_model, get_preset
from attnlab.training.recipe import evaluate_batches, pretraining_counts

UNKNOWN = "日本 語\n中文 字\n\n東京 大阪\n漢 書\n"  # words no tokenizer trained on `corpus()` holds


def _sets(*items: str) -> list[str]:
    return [a for s in items for a in ("--set", s)]


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert")
    docs = folder / "docs.txt"
    docs.write_text(corpus(), encoding="utf-8")
    out = folder / "run"
    main(["train", str(CONFIG), *_sets(
        f"data.path={json.dumps(str(docs))}", "data.tokenizer=word", "data.vocab_size=100", "data.max_length=24",
        "train.steps=2", "train.eval_every=0", "train.warmup_steps=0", "data.val_fraction=0", "model.d_model=16",
        "model.d_ff=32", "model.n_layers=1",
        f"train.out_dir={json.dumps(str(out))}", *TINY)])
    return out


def test_evaluate_refuses_a_file_of_unknown_words(tmp_path, capsys, bert_run):
    text = tmp_path / "unknown.txt"
    text.write_text(UNKNOWN, encoding="utf-8")
    code, stdout, err = run_cli(capsys, "evaluate", str(bert_run), "--data", str(text), "--json", "--device", "cpu")
    assert code == 2 and not stdout
    assert err.startswith(f"attnlab: error: {text}: no token of the text can be masked"), err


@pytest.mark.parametrize("key", ["data.path", "data.eval_path"])
def test_continued_pretraining_refuses_such_a_file_naming_it(tmp_path, capsys, bert_run, key):
    text = tmp_path / "unknown.txt"
    text.write_text(UNKNOWN, encoding="utf-8")
    docs = {"data.path": bert_run.parent / "docs.txt", "data.eval_path": bert_run.parent / "docs.txt", key: text}
    code, _, err = run_cli(capsys, "train", *_sets(
        "data.task=mlm", f"model.init_from={json.dumps(str(bert_run))}",
        *(f"{name}={json.dumps(str(path))}" for name, path in docs.items()),
        "data.max_length=24", "train.steps=2", f"train.out_dir={json.dumps(str(tmp_path / 'more'))}", *TINY))
    assert code == 2 and f"{text} ({key}): no token of the text can be masked" in err, err
    assert not (tmp_path / "more").exists()


def test_the_source_refuses_text_of_special_tokens_only():
    tokenizer = WordTokenizer.train(["a b c", "d e f"], vocab_size=50)
    documents = [["zz yy", "xx"], ["ww", "vv uu"]]  # unknown words only
    pairs = NSPPairs(documents, tokenizer, max_length=16)
    with pytest.raises(DataError, match="no token of the text can be masked"):
        BertSource(pairs, 2, MaskSpec.from_tokenizer(tokenizer))
    BertSource(NSPPairs([["zz a"], ["b", "yy"]], tokenizer, max_length=16), 2, MaskSpec.from_tokenizer(tokenizer))


def test_a_batch_without_masked_tokens_has_no_masked_lm_loss_rather_than_zero():
    """evaluate_batches' masked-LM loss over no masked token is undefined (nan), and its loss is the
    next-sentence term alone, not 0."""
    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny")[1].replace(vocab_size=40))
    ids = torch.randint(5, 40, (2, 6))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
             "labels": torch.full_like(ids, -100), "next_sentence_label": torch.tensor([0, 1])}
    values, sizes = evaluate_batches(model, [batch], pretraining_counts)
    assert sizes["targets"] == 0 and math.isnan(values["mlm_loss"])
    model.eval()
    with torch.no_grad():
        nsp = torch.nn.functional.cross_entropy(model(**batch).extra["nsp_logits"], batch["next_sentence_label"])
    assert values["loss"] == pytest.approx(float(nsp), rel=1e-5)
