"""Data rules the other data tests leave open: masking never picks padding (even when pad is not a special
id), a row gets a forced pick only when it drew none, a random next sentence can be any sentence of another
document, causal windows reach the end of the stream, byte-order marks and character boundaries in
streamed text, header detection, unlabelled files, the token dtype boundary, specials kept whole."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.errors import DataError


def test_mask_tokens_never_picks_padding_even_when_pad_is_not_special():
    from attnlab.data.sources import MaskSpec, mask_tokens

    spec = MaskSpec(mask_id=1, vocab_size=50, special_ids=(1,), mask_prob=1.0)  # id 0 is an ordinary id
    ids = torch.tensor([[5, 6, 0, 0], [8, 0, 0, 0]])
    attention = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    masked, labels = mask_tokens(ids, spec, torch.Generator().manual_seed(0), attention_mask=attention)
    assert (labels[attention == 0] == -100).all()
    assert torch.equal(masked[attention == 0], ids[attention == 0])


def test_forced_pick_only_for_rows_with_no_pick():
    from attnlab.data.sources import MaskSpec, mask_tokens

    spec = MaskSpec(mask_id=1, vocab_size=100, special_ids=(0, 1))
    ids = torch.randint(2, 100, (20000, 8), generator=torch.Generator().manual_seed(0))
    _, labels = mask_tokens(ids, spec, torch.Generator().manual_seed(1))
    per_row = (labels != -100).sum(1).double()
    expected = 8 * 0.15 + 0.85**8  # Bernoulli picks, plus one where a row drew none
    assert abs(per_row.mean().item() - expected) < 0.03
    assert (per_row >= 1).all()


def test_random_next_sentence_can_be_any_sentence_of_another_document():
    from attnlab.data.sources import NSPPairs
    from attnlab.data.tokenizers import WordTokenizer

    docs = [[f"doc {d} sentence {s}" for s in range(4)] for d in range(6)]
    tok = WordTokenizer.train([" ".join(s) for s in docs])
    pairs = NSPPairs(docs, tok, max_length=16)
    a, b, is_next = pairs.sample(np.random.default_rng(0), 2000)
    offsets = (b - pairs.doc_starts[pairs.doc_of[b]])[is_next == 0]
    assert set(offsets.tolist()) == {0, 1, 2, 3}


def test_causal_windows_reach_the_end_of_the_stream():
    from attnlab.data.sources import CausalLMSource

    src = CausalLMSource(np.arange(10), block_size=8, batch_size=64, seed=0)
    starts = {int(s) for s in src.batch(0)["input_ids"][:, 0]}
    assert starts == {0, 1}  # 10 tokens, windows of 9: start 1 is the last valid one


def test_streamed_blocks_drop_the_byte_order_mark_like_read_text(tmp_path):
    from attnlab.data.text_files import iter_text_blocks, read_text

    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffab\ncd\n".encode())
    assert "".join(iter_text_blocks(path)) == read_text(path) == "ab\ncd\n"


def test_headerless_file_with_word_labels_keeps_its_first_row(tmp_path):
    from attnlab.data.text_files import read_classification_file

    path = tmp_path / "d.tsv"
    path.write_text("great film\tpos\nawful\tneg\n", encoding="utf-8")
    data = read_classification_file(path)
    assert data.texts == ["great film", "awful"] and data.labels == ["pos", "neg"]


def test_single_column_file_without_labels(tmp_path):
    from attnlab.data.text_files import read_classification_file

    path = tmp_path / "test.tsv"
    path.write_text("just some text\nmore text\n", encoding="utf-8")
    data = read_classification_file(path, require_labels=False)
    assert data.texts == ["just some text", "more text"] and data.labels is None


def test_jsonl_whose_first_lines_lack_the_label_is_refused_when_labels_are_optional(tmp_path):
    """Unlabelled lines before the first labelled one would shift every label onto the wrong text."""
    from attnlab.data.text_files import read_classification_file

    path = tmp_path / "m.jsonl"
    path.write_text('{"text": "first"}\n{"text": "second", "label": "b"}\n{"text": "third", "label": "c"}\n',
                    encoding="utf-8")
    with pytest.raises(DataError, match="line 1: no field 'label', which line 2 has"):
        read_classification_file(path, require_labels=False)
    path.write_text('{"text": "first"}\n{"text": "second"}\n', encoding="utf-8")
    assert read_classification_file(path, require_labels=False).labels is None


def test_integer_labels_that_compare_equal_sort_in_one_order():
    """"1" and "01" tie on int(): the order (hence the class ids) must not depend on the set's hash order."""
    from attnlab.data.text_files import sort_labels

    assert sort_labels({"1", "01", "2", "+2", "-1"}) == ["-1", "01", "1", "+2", "2"]
    assert sort_labels(["2", "01", "1", "+2", "-1"]) == ["-1", "01", "1", "+2", "2"]


def test_line_split_offset_inside_a_long_line_lands_on_a_character_boundary(tmp_path):
    from attnlab.data.text_files import iter_text_blocks, line_split_offset

    path = tmp_path / "long.txt"
    path.write_text("é" * 400, encoding="utf-8")  # 800 bytes, no newline
    cut = line_split_offset(path, 401.5 / 800)  # byte 401 is the second byte of a character
    assert cut == 402
    assert "".join(iter_text_blocks(path, start=cut)) == "é" * 199


def test_token_dtype_boundary():
    from attnlab.data.corpus import token_dtype

    assert token_dtype(1 << 16) == np.uint16 and token_dtype((1 << 16) + 1) == np.uint32


def test_wordpiece_keeps_special_tokens_in_text_whole():
    from attnlab.data.tokenizers import WordPieceTokenizer

    wp = WordPieceTokenizer.train(["The quick brown fox jumps over the lazy dog ."] * 5, vocab_size=200,
                                  min_frequency=1)
    ids = wp.encode("fox <mask> dog")
    assert wp.mask_id in ids and len(ids) == 3


def test_the_embedded_texts_are_held_out_from_a_line_start():
    # A file's held-out part begins at a line start; the pydoc texts were cut at a character offset, inside a word.
    from attnlab.data.corpus import pydoc_corpus
    from attnlab.training.recipe import DataConfig, _lm_text_parts

    train, held_out = _lm_text_parts(DataConfig(val_fraction=0.1))
    train_text, held_text = "".join(train()), "".join(held_out())
    assert train_text + held_text == pydoc_corpus() and train_text.endswith("\n")
    assert abs(len(held_text) - 0.1 * len(pydoc_corpus())) < 200
