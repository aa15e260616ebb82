"""Fourth BERT audit: a malformed next_sentence_label was refused in words about `labels` (the masked-LM labels,
which were right)."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.common import IdOutOfRange


@pytest.fixture(scope="module")
def bert():
    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, d_ff=37, max_len=16)).eval()


def _mlm_labels():
    labels = torch.full((2, 6), -100)
    labels[:, 2] = 7
    return labels


@pytest.mark.parametrize("bad, got", [
    (torch.tensor([[0], [1]]), "got shape (2, 1) and int64"),
    (torch.tensor([0.0, 1.0]), "got shape (2,) and float32"),
    (torch.tensor([0, 1, 1]), "got shape (3,) and int64"),
])
def test_a_malformed_next_sentence_label_is_named_as_such(bert, bad, got):
    ids = torch.randint(5, 50, (2, 6))
    with pytest.raises(ConfigError) as caught:
        bert(ids, labels=_mlm_labels(), next_sentence_label=bad)
    assert str(caught.value).startswith("next_sentence_label must be integer ids of the logits' shape without "
                                        "their last axis, (2,)") and got in str(caught.value), caught.value


def test_a_next_sentence_label_out_of_range_is_named_as_such(bert):
    ids = torch.randint(5, 50, (2, 6))
    with pytest.raises(IdOutOfRange, match=r"^next_sentence_label must lie in 0 to 1 \(or be -100, not scored\), "
                                          r"got 2$"):
        bert(ids, labels=_mlm_labels(), next_sentence_label=torch.tensor([0, 2]))


def test_malformed_masked_lm_labels_are_still_named_labels(bert):
    ids = torch.randint(5, 50, (2, 6))
    with pytest.raises(ConfigError, match=r"^labels must be integer ids"):
        bert(ids, labels=_mlm_labels()[:, :3], next_sentence_label=torch.tensor([0, 1]))
