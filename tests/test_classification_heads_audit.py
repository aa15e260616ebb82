"""Classifiers that could not tell inputs apart (found by the stop-31 data audit): a head reading the first
token under a causal mask, and a batch of empty texts without a [CLS] prefix."""

from __future__ import annotations

import pytest
import torch

from attnlab.data.sources import ClassificationSource
from attnlab.data.text_files import ClassificationData
from attnlab.data.tokenizers import train_tokenizer
from attnlab.errors import ConfigError
from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.encoder import EncoderConfig, EncoderModel

TINY = dict(d_model=16, n_heads=2, d_ff=16, n_layers=1)


@pytest.mark.parametrize("heads, nsp", [("classification", True), ("pretraining", True)])
def test_causal_bert_refuses_a_head_on_the_pooled_cls_state(heads, nsp):
    # [CLS] attends to itself only: the pooled state and the head's logits were the same for every input.
    with pytest.raises(ConfigError, match=r"\[CLS\] sees only itself.*set causal = false"):
        BertConfig(vocab_size=20, max_len=16, heads=heads, nsp=nsp, causal=True, **TINY)
    BertConfig(vocab_size=20, max_len=16, heads="pretraining", nsp=False, causal=True, **TINY)  # the ablation


def test_causal_encoder_refuses_first_token_pooling_and_keeps_the_others():
    with pytest.raises(ConfigError, match='pooling = "first" under a causal mask'):
        EncoderConfig(vocab_size=20, head="classification", causal=True, pooling="first", **TINY)
    lm = EncoderModel(EncoderConfig(vocab_size=20, head="lm", **TINY))
    with pytest.raises(ConfigError, match='pooling = "first"'):
        lm.with_head("classification", pooling="first")  # the LM's causal mask is kept
    for pooling in ("mean", "last"):
        model = lm.with_head("classification", pooling=pooling).eval()
        a, b = model(torch.tensor([[3, 4, 5]])).logits, model(torch.tensor([[3, 9, 7]])).logits
        assert not torch.allclose(a, b)
    EncoderConfig(vocab_size=20, head="classification", causal=False, pooling="first", **TINY)


def test_a_batch_of_empty_texts_without_a_prefix_has_a_column():
    # Its input_ids were (B, 0): first-token pooling and BERT's pooler raised an IndexError from argmax.
    data = ClassificationData(["", "", "good film", "bad film"], ["1", "0", "1", "0"], [2, 3, 4, 5])
    tokenizer = train_tokenizer("word", data.texts)
    source = ClassificationSource(data, tokenizer, 2, bucket_by_length=True)
    batches = list(source.iter_batches(2))
    empty = next(b for b in batches if not b["attention_mask"].any())
    assert empty["input_ids"].shape == (2, 1)
    encoder = EncoderModel(EncoderConfig(vocab_size=tokenizer.vocab_size, head="classification", pooling="first",
                                         pad_id=tokenizer.pad_id, **TINY)).eval()
    bert = BertModel(BertConfig(vocab_size=tokenizer.vocab_size, max_len=16, heads="classification",
                                pad_id=tokenizer.pad_id, **TINY)).eval()
    for model in (encoder, bert):
        assert torch.isfinite(model(**empty).logits).all()


@pytest.mark.parametrize("name, content", [("train.tsv", "\t1\n  \t0\n"), ("train.jsonl", '{"text": "", "label": 1}\n'),
                                           ("train.csv", "text,label\n,1\n,0\n")])
def test_a_classification_file_whose_texts_are_all_empty_is_refused(tmp_path, name, content):
    # It trained on the [CLS] token alone: a classifier of the labels' frequencies, without a word.
    from attnlab.data.text_files import read_classification_file
    from attnlab.errors import DataError

    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match="every text is empty.*data.text_column"):
        read_classification_file(path)


def test_classification_accuracy_skips_rows_the_loss_ignores():
    # Labels of -100 are the cross-entropy's ignore index: the accuracy counted them as wrong answers.
    from types import SimpleNamespace

    from attnlab.training.recipe import classification_counts

    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 2.0]])
    batch = {"labels": torch.tensor([0, 1, -100, 0])}
    total, count = classification_counts(batch, SimpleNamespace(logits=logits))["accuracy"]
    assert int(count) == 3 and float(total) / int(count) == pytest.approx(200.0 / 3)
