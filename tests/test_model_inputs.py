"""Plausible mistakes in a model's inputs get one line naming the argument and what it must be: a 1-D sequence,
float ids, labels of another shape or type or outside the vocabulary, targets for fewer sources. They had failed
deep inside torch (an unpacking error, an embedding's dtype error, "Target 99 is out of bounds") or, targets for
one source given two, been broadcast silently."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.models.common import IdOutOfRange
from attnlab.models.registry import build_model, get_preset

IDS = torch.randint(3, 20, (2, 6))


@pytest.mark.parametrize("preset", ["gpt-char-tiny", "encoder-tiny", "bert-tiny"])
def test_ids_that_are_not_a_batch_of_integers_are_named(preset):
    model = build_model(get_preset(preset)[1]).eval()
    with pytest.raises(ConfigError, match=r"^input_ids must be a \(B, T\) tensor of integer token ids; got a tensor "
                                          r"of shape \(6,\) and int64 \(one sequence: input_ids\[None\]\)$"):
        model(IDS[0])
    with pytest.raises(ConfigError, match=r"got a tensor of shape \(2, 6\) and float32$"):
        model(IDS.float())
    with pytest.raises(ConfigError, match="got list$"):
        model(IDS.tolist())


def test_labels_of_another_shape_type_or_range_are_named():
    model = build_model(get_preset("gpt-char-tiny")[1]).eval()
    says = r"^labels must be integer ids of the logits' shape without their last axis, \(2, 6\) \(-100 where"
    for labels in (IDS[:, 0], IDS.float()):
        with pytest.raises(ConfigError, match=says):
            model(IDS, labels=labels)
    vocab = model.config.vocab_size
    for bad in (vocab, -5):
        labels = IDS.clone()
        labels[1, 2] = bad
        with pytest.raises(IdOutOfRange, match=f"^labels must lie in 0 to {vocab - 1} \\(or be -100, not scored\\), "
                                               f"got {bad}$"):
            model(IDS, labels=labels)
    labels = IDS.clone()
    labels[0] = -100  # ignored rows are no mistake
    assert torch.isfinite(model(IDS, labels=labels).loss)


def test_a_seq2seq_model_names_targets_for_another_number_of_sources():
    model = build_model(get_preset("seq2seq-tiny")[1]).eval()
    with pytest.raises(ConfigError, match=r"^src_ids must be a \(B, T\) tensor of integer token ids"):
        model(IDS[0], IDS)
    for rows in (1, 3):
        with pytest.raises(ConfigError, match=f"^tgt_ids has {rows} rows but there are 2 sources; give one target "
                                              "row per source$"):
            model(IDS, torch.randint(3, 20, (rows, 4)))


@pytest.mark.parametrize("preset, options", [("encoder-tiny", {"pooling": "mean"}),
                                             ("encoder-tiny", {"pooling": "first"}),
                                             ("encoder-tiny", {"pooling": "last"}), ("bert-tiny", {})])
def test_a_classifier_given_sequences_of_no_tokens_says_so(preset, options):
    """Mean pooling gave NaN scores silently; first/last pooling and BERT's pooler an IndexError."""
    config = get_preset(preset)[1]
    config = config.replace(**options, **({"head": "classification"} if preset.startswith("encoder") else
                                          {"heads": "classification"}), n_classes=3)
    model = build_model(config).eval()
    with pytest.raises(ConfigError, match=r"^the sequences have no tokens \(input_ids of shape \(B, 0\)\), so there "
                                          "is nothing to pool"):
        model(torch.zeros((2, 0), dtype=torch.long))
