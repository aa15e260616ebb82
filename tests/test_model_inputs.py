"""What the models do with inputs a caller of the Python API can get wrong, or that are merely unusual: ids
outside the model's tables, segment ids of the wrong shape, empty batches and sequences; and plausible mistakes
named in one line: a 1-D sequence, float ids, labels of another shape, type or range, targets for fewer sources
(they had failed deep inside torch, or been broadcast silently), sequences of no tokens given to a classifier."""

from __future__ import annotations

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.models.common import IdOutOfRange
from attnlab.models.gpt import GPTConfig
from attnlab.models.registry import build_model, get_preset
from attnlab.modules.variants import VARIANTS


def _model(preset: str):
    torch.manual_seed(0)
    return build_model(get_preset(preset)[1]).eval()


@pytest.mark.parametrize("preset", ["gpt-char-tiny", "encoder-tiny", "bert-tiny"])
@pytest.mark.parametrize("bad", ["high", "negative"])
def test_an_id_outside_the_vocabulary_is_named(preset, bad):
    # torch's own error, "index out of range in self", named neither the argument nor the table's size.
    model = _model(preset)
    vocab = model.config.vocab_size
    ids = torch.full((2, 5), 3)
    ids[1, 2] = vocab if bad == "high" else -1
    with pytest.raises(IdOutOfRange, match=rf"input_ids must lie in 0 to {vocab - 1} .*got {ids[1, 2].item()}"):
        model(ids)


def test_the_seq2seq_model_names_the_source_or_target_ids():
    model = _model("seq2seq-tiny")
    vocab = model.config.src_vocab_size
    good = torch.full((1, 4), 3)
    with pytest.raises(IdOutOfRange, match=f"src_ids must lie in 0 to {vocab - 1}.*got {vocab}"):
        model(torch.tensor([[3, vocab]]), good)
    with pytest.raises(IdOutOfRange, match="tgt_ids .* got -1"):
        model(good, torch.tensor([[1, -1]]))


def test_bert_segment_ids_out_of_range_or_of_the_wrong_shape():
    model = _model("bert-tiny")
    ids = torch.full((2, 6), 5)
    segments = torch.zeros(2, 6, dtype=torch.long)
    segments[0, 3] = 2
    with pytest.raises(IdOutOfRange, match="token_type_ids must lie in 0 to 1 .*got 2; give each token its segment"):
        model(ids, token_type_ids=segments)
    with pytest.raises(ValueError, match=r"token_type_ids has shape \(6,\); it must be \(2, 6\)"):
        model(ids, token_type_ids=torch.zeros(6, dtype=torch.long))  # broadcast error from inside before
    model(ids, token_type_ids=torch.zeros(1, 6, dtype=torch.long))  # one row for the batch, as HF takes it


def test_the_error_is_still_an_index_error_and_valid_ids_pass():
    model = _model("gpt-char-tiny")
    with pytest.raises(IndexError):
        model(torch.tensor([[model.config.vocab_size]]))
    model(torch.tensor([[0, model.config.vocab_size - 1]]))


@pytest.mark.parametrize("attention", VARIANTS.names())
@pytest.mark.parametrize("shape", [(0, 5), (2, 0)])
def test_an_empty_batch_or_sequence_gives_empty_logits(attention, shape):
    # Only the fused q/k/v split of dot attention named the head width; the others split with view(..., -1),
    # which cannot infer it from 0 elements ("cannot reshape tensor of 0 elements").
    torch.manual_seed(0)
    model = build_model(GPTConfig(vocab_size=29, block_size=16, d_model=16, n_heads=2, n_layers=1,
                                  attention=attention)).eval()
    assert model(torch.zeros(shape, dtype=torch.long)).logits.shape == (*shape, 29)


@pytest.mark.parametrize("src, tgt", [((0, 5), (0, 3)), ((2, 5), (2, 0))])
def test_the_seq2seq_model_takes_an_empty_batch_or_target(src, tgt):
    model = _model("seq2seq-tiny")
    out = model(torch.full(src, 3), torch.full(tgt, 1))
    assert out.logits.shape == (*tgt, model.config.tgt_vocab_size)


@pytest.mark.parametrize("preset, keyword", [("gpt-char-tiny", "position_ids"), ("encoder-tiny", "document_ids"),
                                             ("bert-tiny", "positions"), ("gpt-char-tiny", "need_weight")])
def test_a_keyword_the_model_does_not_take_is_refused(preset, keyword):
    # Each was ignored: GPT read its own positions, the encoder let packed documents attend to each other, a
    # misspelt switch returned no weights.
    model = _model(preset)
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'; it takes input_ids"):
        model(torch.full((1, 4), 3), **{keyword: torch.zeros(1, 4, dtype=torch.long)})


def test_the_keys_of_sentence_pair_batches_are_ignored_by_models_without_segments():
    model = _model("gpt-char-tiny")
    ids = torch.full((2, 4), 3)
    ignored = {"token_type_ids": torch.zeros(2, 4, dtype=torch.long), "next_sentence_label": torch.zeros(2)}
    assert torch.equal(model(ids, **ignored).logits, model(ids).logits)
    seq2seq = _model("seq2seq-tiny")
    with pytest.raises(TypeError, match="unexpected keyword argument 'input_ids'; it takes src_ids, tgt_ids"):
        seq2seq(src_ids=ids, tgt_ids=ids, input_ids=ids)


IDS = torch.randint(3, 20, (2, 6))


@pytest.mark.parametrize("preset", ["gpt-char-tiny", "encoder-tiny", "bert-tiny"])
def test_ids_that_are_not_a_batch_of_integers_are_named(preset):
    model = build_model(get_preset(preset)[1]).eval()
    with pytest.raises(ConfigError, match=r"^input_ids must be a \(B, T\) tensor of integer token ids \(int64 or "
                                          r"int32\); got a tensor "
                                          r"of shape \(6,\) and int64 \(one sequence: input_ids\[None\]\)$"):
        model(IDS[0])
    with pytest.raises(ConfigError, match=r"got a tensor of shape \(2, 6\) and float32$"):
        model(IDS.float())
    with pytest.raises(ConfigError, match="got list$"):
        model(IDS.tolist())


def test_labels_of_another_shape_type_or_range_are_named():
    model = build_model(get_preset("gpt-char-tiny")[1]).eval()
    says = r"^labels must be integer ids of the logits' shape without their last axis, \(2, 6\) \(-100 where"
    for labels in (IDS[:, 0], IDS.float(), IDS > 10):  # bool labels had been scored as classes 0 and 1
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


def test_integer_dtypes_an_embedding_cannot_read_are_named_and_narrow_labels_are_scored():
    """int16 or uint8 ids passed the check and failed in the embedding in torch's words; int32 labels in the loss
    ("expected target dtype to be Long")."""
    model = build_model(get_preset("gpt-char-tiny")[1]).eval()
    loss = model(IDS, labels=IDS).loss
    assert torch.equal(model(IDS.int(), labels=IDS.int()).loss, loss)  # int32 ids and labels, as int64
    assert torch.equal(model(IDS, labels=IDS.short()).loss, loss)
    for dtype in (torch.int16, torch.uint8):
        with pytest.raises(ConfigError, match=r"integer token ids \(int64 or int32\); got a tensor of shape \(2, 6\)"):
            model(IDS.to(dtype))


@pytest.mark.parametrize("preset, option", [("seq2seq-tiny", "lm_logits"), ("bert-tiny", "mlm_logits")])
def test_labels_of_another_shape_are_named_where_the_head_scores_labelled_rows_only(preset, option):
    """In training with lm_logits / mlm_logits = "labelled" (configs/translate.toml), the rows were picked before any
    check: torch's "The shape of the mask ... does not match" instead of the one line."""
    model = build_model(get_preset(preset)[1].replace(**{option: "labelled"})).train()
    inputs = (IDS, IDS[:, :5]) if preset.startswith("seq2seq") else (IDS,)
    shape = tuple(inputs[-1].shape)
    with pytest.raises(ConfigError, match=f"logits' shape without their last axis, \\({shape[0]}, {shape[1]}\\) "):
        model(*inputs, labels=inputs[-1][:, :-1])
