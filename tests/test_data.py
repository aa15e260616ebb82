"""Data layer: reading files, token files, and batch sources."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.data.corpus import TokenFile, build_token_file, pydoc_corpus, sidecar_path
from attnlab.data.sources import (
    BatchSource,
    BertSource,
    CausalLMSource,
    ClassificationSource,
    MaskSpec,
    MLMSource,
    NSPPairs,
    ParallelTextSource,
    evaluation_batches,
    mask_tokens,
    pad_batch,
)
from attnlab.data.text_files import (
    ClassificationData,
    iter_text_blocks,
    line_split_offset,
    read_classification_file,
    read_lines,
    read_text,
)
from attnlab.data.tokenizers import BPETokenizer, CharTokenizer, WordTokenizer
from attnlab.errors import ConfigError, DataError

TEXT = "To be, or not to be: that is the question.\nWhether 'tis nobler in the mind to suffer\n" * 20


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert message and "\n" not in message
    return message


def write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def equal_batches(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def char_tok() -> CharTokenizer:
    return CharTokenizer.train(TEXT + "é✓")


# ------------------------------------------------------------------------------------------------
# Reading files
# ------------------------------------------------------------------------------------------------
def test_read_text_errors(tmp_path):
    with pytest.raises(DataError) as err:
        read_text(tmp_path / "nope.txt")
    assert "does not exist" in one_line(err)
    with pytest.raises(DataError) as err:
        read_text(tmp_path)
    assert "directory" in one_line(err)
    with pytest.raises(DataError) as err:
        read_text(write(tmp_path / "empty.txt", ""))
    assert "empty" in one_line(err)
    with pytest.raises(DataError) as err:
        read_text(write(tmp_path / "blank.txt", " \n\n"))
    assert "whitespace" in one_line(err)
    with pytest.raises(DataError) as err:
        read_text(write(tmp_path / "latin1.txt", "line one\ncaf\xe9\n".encode("latin-1")))
    message = one_line(err)
    assert "byte offset 12" in message and "line 2" in message and "0xe9" in message and "UTF-8" in message


def test_read_text_and_lines(tmp_path):
    path = write(tmp_path / "a.txt", "\ufeffone\r\ntwo\u2028still two\n\nfour\n")
    assert read_text(path).startswith("one")
    assert read_lines(path) == ["one", "two\u2028still two", "", "four"]


def test_iter_text_blocks_streams_exactly(tmp_path):
    text = "ab✓\n" * 300 + "é" * 50 + "\nlast line without end"
    path = write(tmp_path / "t.txt", text)
    blocks = list(iter_text_blocks(path, block_bytes=37))
    assert "".join(blocks) == text
    assert all(b.endswith("\n") for b in blocks[:-1]) and len(blocks) > 10
    bad = write(tmp_path / "bad.txt", b"x\n" * 100 + b"\xff rest")
    with pytest.raises(DataError) as err:
        list(iter_text_blocks(bad, block_bytes=16))
    assert "byte offset 200" in one_line(err) and "line 101" in str(err.value)
    # Parts of the file, cut at a line start: together they are the whole text.
    cut = line_split_offset(path, 0.9)
    head, tail = "".join(iter_text_blocks(path, 37, stop=cut)), "".join(iter_text_blocks(path, 37, start=cut))
    assert head + tail == text and head.endswith("\n") and len(head.encode()) == cut
    # A line longer than four blocks is cut between characters instead of being held whole.
    long_line = write(tmp_path / "long.txt", "é" * 400)
    pieces = list(iter_text_blocks(long_line, block_bytes=32))
    assert "".join(pieces) == "é" * 400 and len(pieces) > 2
    cut = line_split_offset(long_line, 0.5)
    assert "".join(iter_text_blocks(long_line, start=cut)) == "é" * 200  # never inside a character


# ------------------------------------------------------------------------------------------------
# Token files
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["string", "path", "lines"])
def test_build_token_file_equals_direct_encode(kind, tmp_path, char_tok):
    source = {
        "string": TEXT,
        "path": write(tmp_path / "corpus.txt", TEXT),
        "lines": iter(TEXT.splitlines(keepends=True)),
    }[kind]
    out = tmp_path / "ids" / "train.bin"
    built = build_token_file(source, char_tok, out, block_chars=100)
    reopened = TokenFile(out)
    expected = char_tok.encode(TEXT)
    assert len(reopened) == len(expected) == len(built)
    assert reopened.dtype == np.uint16 and reopened.vocab_size == char_tok.vocab_size
    assert reopened[:].tolist() == expected
    assert reopened[5:9].tolist() == expected[5:9]
    assert not reopened.ids.flags.writeable
    meta = json.loads(sidecar_path(out).read_text())
    assert meta["dtype"] == "uint16" and meta["length"] == len(expected)


def test_build_token_file_subwords_and_eos(tmp_path):
    lines = TEXT.splitlines()
    bpe = BPETokenizer.train(lines, vocab_size=300)
    tf = build_token_file(lines, bpe, tmp_path / "bpe.bin", add_eos=True, block_chars=50)
    expected = [i for line in lines for i in [*bpe.encode(line), bpe.eos_id]]
    assert np.asarray(tf).tolist() == expected


def test_token_file_uint32_for_big_vocab(tmp_path):
    words = [f"w{i}" for i in range(70_000)]
    specials = {"pad": None, "unk": "<unk>", "mask": None, "cls": None, "sep": None, "bos": None, "eos": None}
    tok = WordTokenizer(["<unk>", *words], specials=specials)
    tf = build_token_file("w69999 w1 zzz", tok, tmp_path / "big.bin")
    assert tf.dtype == np.uint32 and tf[:].tolist() == [70_000, 2, 0]


def test_token_file_errors(tmp_path, char_tok):
    with pytest.raises(DataError) as err:
        build_token_file("", char_tok, tmp_path / "empty.bin")
    assert "empty" in one_line(err)
    assert not (tmp_path / "empty.bin").exists()
    with pytest.raises(DataError) as err:
        TokenFile(tmp_path / "missing.bin")
    one_line(err)
    out = tmp_path / "t.bin"
    build_token_file(TEXT, char_tok, out)
    with open(out, "ab") as f:
        f.write(b"\x00")
    with pytest.raises(DataError) as err:
        TokenFile(out)
    assert "rebuild" in one_line(err)
    sidecar_path(out).unlink()
    with pytest.raises(DataError) as err:
        TokenFile(out)
    assert "sidecar" in one_line(err)


def test_pydoc_corpus_is_deterministic_and_encodable():
    text = pydoc_corpus()
    assert len(text) > 100_000 and text == pydoc_corpus()
    tok = CharTokenizer.train(text)
    assert tok.decode(tok.encode(text[:2000])) == text[:2000]


# ------------------------------------------------------------------------------------------------
# Causal LM
# ------------------------------------------------------------------------------------------------
def test_causal_batches_are_pure_functions_of_seed_and_step(tmp_path, char_tok):
    tf = build_token_file(TEXT, char_tok, tmp_path / "t.bin")
    source = CausalLMSource(tf, block_size=16, batch_size=4, seed=7)
    assert isinstance(source, BatchSource) and source.steps_per_epoch is None
    b5 = source.batch(5)
    assert source.batch(2) is not None
    assert equal_batches(b5, source.batch(5))
    assert equal_batches(b5, CausalLMSource(np.asarray(tf), 16, 4, seed=7).batch(5))  # any process, any order
    assert not torch.equal(b5["input_ids"], source.batch(6)["input_ids"])
    assert not torch.equal(b5["input_ids"], CausalLMSource(tf, 16, 4, seed=8).batch(5)["input_ids"])
    assert b5["input_ids"].shape == (4, 16) and b5["input_ids"].dtype == torch.long


def test_causal_labels_are_next_tokens():
    tokens = np.arange(1000, dtype=np.uint16)
    batch = CausalLMSource(tokens, block_size=8, batch_size=16, seed=0).batch(0)
    assert torch.equal(batch["labels"], batch["input_ids"] + 1)
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
    starts = {
        int(s) for step in range(50) for s in CausalLMSource(tokens, 8, 16).batch(step)["input_ids"][:, 0]
    }
    assert min(starts) >= 0 and max(starts) <= 1000 - 9 and len(starts) > 200


def test_causal_eval_covers_every_target_once():
    tokens = np.arange(103) * 3
    source = CausalLMSource(tokens, block_size=10, batch_size=4)
    batches = list(source.iter_batches())
    labels = torch.cat([b["labels"].flatten() for b in batches])
    assert labels[labels != -100].tolist() == tokens[1:].tolist()
    inputs = torch.cat([b["input_ids"].flatten() for b in batches])
    assert inputs[labels != -100].tolist() == tokens[:-1].tolist()
    with pytest.raises(DataError) as err:
        CausalLMSource(tokens[:5], block_size=10, batch_size=2)
    assert "block_size" in one_line(err)
    assert len(list(MLMSource(tokens[:10], 10, 2, MaskSpec(1, 400)).iter_batches())) == 1


def test_pad_batch():
    out = pad_batch([[5, 6, 7], [8], []], pad_id=0, labels=[[1, 2, 3], [4], []])
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]
    assert out["labels"].tolist() == [[1, 2, 3], [4, -100, -100], [-100, -100, -100]]
    cut = pad_batch([[1, 2, 3, 4], [5]], pad_id=9, max_length=2)
    assert cut["input_ids"].tolist() == [[1, 2], [5, 9]]


# ------------------------------------------------------------------------------------------------
# Masked LM and NSP
# ------------------------------------------------------------------------------------------------
def test_mask_tokens_80_10_10_statistics():
    vocab, specials = 500, (0, 1, 2, 3, 4)
    spec = MaskSpec(mask_id=2, vocab_size=vocab, special_ids=specials)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (200, 500), generator=gen)
    ids[:, 0], ids[:, -1], ids[:, 10] = 3, 4, 0  # specials sprinkled in
    masked, labels = mask_tokens(ids, spec, torch.Generator().manual_seed(1))
    picked = labels != -100
    is_special = torch.isin(ids, torch.tensor(specials))
    assert not (picked & is_special).any()
    assert torch.equal(masked[is_special], ids[is_special])
    assert torch.equal(labels[picked], ids[picked])
    eligible = (~is_special).sum().item()
    assert abs(picked.sum().item() / eligible - 0.15) < 0.005
    n = picked.sum().item()
    to_mask = (masked == 2) & picked
    kept = (masked == ids) & picked
    changed = picked & ~to_mask & ~kept
    assert abs(to_mask.sum().item() / n - 0.8) < 0.015
    assert abs(changed.sum().item() / n - 0.1) < 0.01
    assert abs(kept.sum().item() / n - 0.1) < 0.01
    assert not torch.isin(masked[changed], torch.tensor(specials)).any()  # random draws avoid specials
    assert torch.equal(masked[~picked], ids[~picked])
    again = mask_tokens(ids, spec, torch.Generator().manual_seed(1))
    assert torch.equal(again[0], masked) and torch.equal(again[1], labels)


def test_mask_tokens_respects_attention_mask_and_never_empty():
    spec = MaskSpec(mask_id=1, vocab_size=50, special_ids=(0, 1), mask_prob=0.0)
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0]])
    attention = (ids != 0).long()
    _, labels = mask_tokens(ids, spec, torch.Generator().manual_seed(0), attention_mask=attention)
    assert ((labels != -100).sum(1) == 1).all()  # one forced pick per row
    assert (labels[attention == 0] == -100).all()


def test_mlm_source_determinism():
    tokens = np.random.default_rng(0).integers(7, 60, size=2000)
    spec = MaskSpec(mask_id=2, vocab_size=60, special_ids=tuple(range(7)))
    source = MLMSource(tokens, block_size=32, batch_size=8, masking=spec, seed=3)
    a, b = source.batch(4), source.batch(4)
    assert equal_batches(a, b) and not equal_batches(a, source.batch(5))
    assert a["input_ids"].shape == a["labels"].shape == (8, 32)
    evals = list(source.iter_batches(16))
    assert sum(e["input_ids"].shape[0] for e in evals) == 2000 // 32
    assert equal_batches(evals[0], next(iter(source.iter_batches(16))))


def documents() -> list[list[str]]:
    return [[f"doc {d} sentence {s} " + "x" * ((d * 7 + s) % 9) for s in range(2 + d % 4)] for d in range(12)]


@pytest.fixture(scope="module")
def word_tok() -> WordTokenizer:
    return WordTokenizer.train([" ".join(s) for s in documents()])


def test_nsp_pairs_half_random_and_token_types(word_tok):
    pairs = NSPPairs(documents(), word_tok, max_length=16)
    rng = np.random.default_rng(0)
    a, b, is_next = pairs.sample(rng, 4000)
    assert abs(is_next.mean() - 0.5) < 0.03
    assert (b[is_next == 1] == a[is_next == 1] + 1).all()
    assert (pairs.doc_of[b[is_next == 1]] == pairs.doc_of[a[is_next == 1]]).all()
    assert (pairs.doc_of[b[is_next == 0]] != pairs.doc_of[a[is_next == 0]]).all()
    ids, types = pairs.encode_pair([10, 11, 12], [20, 21])
    assert ids == [word_tok.cls_id, 10, 11, 12, word_tok.sep_id, 20, 21, word_tok.sep_id]
    assert types == [0, 0, 0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("la,lb", [(3, 30), (30, 3), (20, 20), (20, 19), (19, 20), (7, 6), (0, 40)])
def test_nsp_truncation_matches_bert(word_tok, la, lb):
    pairs = NSPPairs(documents(), word_tok, max_length=16)
    a, b = list(range(100, 100 + la)), list(range(200, 200 + lb))
    ta, tb = list(a), list(b)
    while len(ta) + len(tb) > 13:  # BERT's truncate_seq_pair
        (ta if len(ta) > len(tb) else tb).pop()
    ids, types = pairs.encode_pair(a, b)
    assert ids == [word_tok.cls_id, *ta, word_tok.sep_id, *tb, word_tok.sep_id]
    assert len(ids) <= 16 and len(types) == len(ids)


def test_bert_source_batches(word_tok):
    pairs = NSPPairs(documents(), word_tok, max_length=12)
    source = BertSource(pairs, batch_size=64, masking=MaskSpec.from_tokenizer(word_tok), seed=1)
    batch = source.batch(0)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels", "next_sentence_label"}
    assert equal_batches(batch, source.batch(0)) and not equal_batches(batch, source.batch(1))
    B, T = batch["input_ids"].shape
    assert B == 64 and T <= 12
    assert (batch["input_ids"][:, 0] == word_tok.cls_id).all()
    assert ((batch["labels"] != -100) & (batch["attention_mask"] == 0)).sum() == 0
    assert (batch["token_type_ids"][batch["attention_mask"] == 0] == 0).all()
    assert set(batch["next_sentence_label"].tolist()) == {0, 1}
    types = batch["token_type_ids"]
    assert (types[:, 0] == 0).all() and (types.sum(1) > 0).all()
    assert sum(b["input_ids"].shape[0] for b in source.iter_batches(10)) == len(pairs)


def _pair_rows(batches) -> list[tuple]:
    """Each row of BERT batches as (input ids, labels, token types, next-sentence label), without padding."""
    out = []
    for batch in batches:
        for r in range(batch["input_ids"].shape[0]):
            n = int(batch["attention_mask"][r].sum())
            out.append(tuple(tuple(batch[k][r, :n].tolist()) for k in ("input_ids", "labels", "token_type_ids"))
                       + (int(batch["next_sentence_label"][r]),))
    return out


def _real_share(batches) -> float:
    masks = [b["attention_mask"] for b in batches]
    return sum(m.sum().item() for m in masks) / sum(m.numel() for m in masks)


def test_bert_evaluation_masks_do_not_depend_on_the_batch_size(word_tok):
    # They were drawn per batch: `attnlab evaluate --batch-size` changed the masked tokens and the scores.
    pairs = NSPPairs(documents(), word_tok, max_length=12)
    source = BertSource(pairs, batch_size=64, masking=MaskSpec.from_tokenizer(word_tok), seed=1)

    def rows(size):
        return _pair_rows(source.iter_batches(size))

    one = rows(1)
    assert len(one) == len(pairs) and any(label != -100 for row in one for label in row[1])
    assert rows(3) == one and rows(64) == one and rows(1000) == one
    again = BertSource(pairs, batch_size=8, masking=MaskSpec.from_tokenizer(word_tok), seed=1)
    labels = [b["labels"].tolist() for b in source.iter_batches(5)]
    assert [b["labels"].tolist() for b in again.iter_batches(5)] == labels  # the source's own batch size: no matter


def test_bert_batches_by_length(word_tok):
    """With bucket_by_length the pairs of 50 steps are drawn at once and sorted by length into those steps'
    batches: little padding, every batch a pure function of (seed, step), NSP still half random."""
    docs = [[f"doc {d} sentence {s} " + "x " * ((d * 7 + s * 5) % 23) for s in range(2 + d % 4)] for d in range(40)]
    tok = WordTokenizer.train([" ".join(doc) for doc in docs])
    pairs = NSPPairs(docs, tok, max_length=64)
    spec = MaskSpec.from_tokenizer(tok)
    plain = BertSource(pairs, batch_size=8, masking=spec, seed=1)
    bucketed = BertSource(pairs, batch_size=8, masking=spec, seed=1, bucket_by_length=True)
    steps = range(120)  # two full pools and part of a third
    assert _real_share(bucketed.batch(s) for s in steps) > 0.9 > 0.75 > _real_share(plain.batch(s) for s in steps)
    fresh = BertSource(pairs, batch_size=8, masking=spec, seed=1, bucket_by_length=True)
    for step in (117, 3, 60, 49, 50, 0):  # any order, any process
        assert equal_batches(fresh.batch(step), bucketed.batch(step))
    assert not equal_batches(bucketed.batch(0), bucketed.batch(1))
    labels = torch.cat([bucketed.batch(s)["next_sentence_label"] for s in steps]).float()
    assert abs(labels.mean().item() - 0.5) < 0.05
    with pytest.raises(ValueError):
        bucketed.batch(-1)


@pytest.mark.parametrize("max_batches", [None, 2])
def test_bert_evaluation_sorted_by_length_masks_each_pair_as_in_order(word_tok, max_batches):
    pairs = NSPPairs(documents(), word_tok, max_length=32)  # no pair cut: lengths differ
    spec = MaskSpec.from_tokenizer(word_tok)
    plain = BertSource(pairs, batch_size=8, masking=spec, seed=1)
    bucketed = BertSource(pairs, batch_size=8, masking=spec, seed=1, bucket_by_length=True)
    in_order = _pair_rows(evaluation_batches(plain, 4, max_batches))
    by_length = _pair_rows(evaluation_batches(bucketed, 4, max_batches))
    assert len(in_order) == (len(pairs) if max_batches is None else 8)
    assert sorted(by_length) == sorted(in_order)  # each pair masked the same way
    assert max_batches or by_length != in_order
    lengths = [len(row[0]) for row in by_length]
    assert lengths == sorted(lengths)


def test_sentences_always_cut_in_a_pair_are_reported(word_tok):
    """A sentence longer than max_length - 4 ([CLS] A [SEP] B [SEP], B at least one token) loses tokens in every
    pair it is in (a paragraph per line, as in WikiText): said with counts, not silently."""
    import warnings

    docs = [["doc 0 sentence 0 x x x x x x x", "doc 0 sentence 1"], ["doc 1 sentence 0", "doc 1 sentence 1"]]
    with pytest.warns(UserWarning, match=r"1 of 4 sentences are longer than data.max_length allows \(12 tokens "
                                         r"with specials\) and were cut \(the longest has 15\), as are pairs of "
                                         r"shorter sentences that pass it together; raise data.max_length to keep "
                                         r"them whole"):
        NSPPairs(docs, word_tok, max_length=12)
    from attnlab.data.sources import cut_advice

    with cut_advice("as in training"), pytest.warns(UserWarning,
                                                    match=r"the longest has 15\), as are pairs .*; as in training$"):
        NSPPairs(docs, word_tok, max_length=12)  # evaluation: a trained model's length cannot be raised
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        NSPPairs(docs, word_tok, max_length=15)  # 11 tokens + 4 fit


def test_nsp_needs_documents(word_tok):
    with pytest.raises(DataError) as err:
        NSPPairs([["one sentence"], ["another"]], word_tok)
    one_line(err)
    with pytest.raises(DataError) as err:
        NSPPairs([["a", "b", "c"]], word_tok)
    one_line(err)
    assert len(NSPPairs([["a", "b", "c"]], word_tok, random_next_prob=0.0)) == 2


# ------------------------------------------------------------------------------------------------
# Classification
# ------------------------------------------------------------------------------------------------
def test_read_tsv_with_glue_header(tmp_path):
    path = write(
        tmp_path / "dev.tsv", 'sentence\tlabel\nit \'s a "charming" journey . \t1\nbleak \t0\n\nok\t1\n'
    )
    data = read_classification_file(path)
    assert data.texts == ['it \'s a "charming" journey .', "bleak", "ok"]
    assert data.labels == ["1", "0", "1"] and data.line_numbers == [2, 3, 5]
    assert data.label_names == ["0", "1"] and data.label_ids() == [1, 0, 1]
    named = read_classification_file(path, "sentence", "label")
    assert named.texts == data.texts


def test_read_headerless_tsv_with_indices(tmp_path):
    path = write(tmp_path / "cola.tsv", "src1\t1\t\tgood sentence .\nsrc2\t0\t*\tbad sentence .\n")
    data = read_classification_file(path, text_column=3, label_column=1)
    assert data.texts == ["good sentence .", "bad sentence ."] and data.labels == ["1", "0"]


def test_read_csv_and_jsonl_with_string_labels(tmp_path):
    csv_path = write(tmp_path / "d.csv", 'id,text,label\n1,"hello, world",pos\n2,"a ""quoted"" word",neg\n')
    data = read_classification_file(csv_path)
    assert data.texts == ["hello, world", 'a "quoted" word'] and data.labels == ["pos", "neg"]
    assert data.label_names == ["neg", "pos"] and data.label_ids() == [1, 0]
    jsonl = write(tmp_path / "d.jsonl", '{"text": "good", "label": 2}\n\n{"text": "fine", "label": 10}\n')
    data = read_classification_file(jsonl)
    assert data.texts == ["good", "fine"] and data.label_names == ["2", "10"]  # numeric order
    review = write(tmp_path / "r.jsonl", '{"review": "meh", "stars": "low"}\n')
    assert read_classification_file(review, "review", "stars").labels == ["low"]


@pytest.mark.parametrize(
    "name,content,expected",
    [
        ("empty.tsv", "", "empty"),
        ("header_only.tsv", "sentence\tlabel\n", "no examples"),
        (
            "short.tsv",
            "sentence\tlabel\ngood\t1\nno label here\nbad\t0\n",
            "line 3: expected 2 tab-separated",
        ),
        ("extra.tsv", "a\t1\nb\t0\tx\n", "line 2: expected 2"),
        ("nolabel.tsv", "sentence\tlabel\ngood\t \n", "line 2: the label is empty"),
        ("cols.tsv", "text\tscore\ngood\t1\n", "label column"),
        ("bad.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": \n', "line 2: not valid JSON"),
        ("missing.jsonl", '{"text": "a", "label": 1}\n{"text": "b"}\n', "line 2: no field 'label'"),
        ("bad.csv", 'text,label\n"open quote,1\n', "line 2"),
        ("data.txt", "a\t1\n", "extension"),
    ],
)
def test_classification_file_errors(tmp_path, name, content, expected):
    with pytest.raises(DataError) as err:
        read_classification_file(write(tmp_path / name, content))
    assert expected in one_line(err)


def test_classification_source(tmp_path, char_tok):
    lines = "".join(f"{'to be ' * (i % 5 + 1)}\t{i % 3}\n" for i in range(20))
    path = write(tmp_path / "train.tsv", "sentence\tlabel\n" + lines)
    cls_tok = CharTokenizer.train(TEXT)
    source = ClassificationSource.from_file(
        path,
        cls_tok,
        batch_size=4,
        max_length=12,
        seed=0,
        prefix_ids=[cls_tok.cls_id],
        suffix_ids=[cls_tok.sep_id],
    )
    assert source.steps_per_epoch == 5 and source.label_names == ["0", "1", "2"] and source.num_labels == 3
    batch = source.batch(0)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["labels"].shape == (4,) and batch["input_ids"].shape[1] <= 12
    assert (batch["input_ids"][:, 0] == cls_tok.cls_id).all()
    assert equal_batches(batch, source.batch(0))
    assert equal_batches(
        batch,
        ClassificationSource.from_file(
            path, cls_tok, 4, max_length=12, prefix_ids=[cls_tok.cls_id], suffix_ids=[cls_tok.sep_id]
        ).batch(0),
    )
    epoch = [sorted(source.indices(s).tolist()) for s in range(5)]
    assert sorted(i for e in epoch for i in e) == list(range(20))  # each example once per epoch
    assert source.indices(5).tolist() != source.indices(0).tolist()  # reshuffled next epoch
    ordered = list(source.iter_batches(8))
    assert [len(b["labels"]) for b in ordered] == [8, 8, 4]
    assert torch.cat([b["labels"] for b in ordered]).tolist() == [i % 3 for i in range(20)]


def test_classification_shared_labels_and_small_sets(tmp_path, char_tok):
    dev = read_classification_file(write(tmp_path / "dev.tsv", "sentence\tlabel\nto be\t2\n"))
    source = ClassificationSource(dev, char_tok, batch_size=3, label_names=["0", "1", "2"])
    batch = source.batch(0)
    assert batch["labels"].tolist() == [2, 2, 2] and source.steps_per_epoch == 1  # repeated to fill
    with pytest.raises(DataError) as err:
        ClassificationSource(dev, char_tok, batch_size=3, label_names=["0", "1"])
    assert "line 2" in one_line(err)


# ------------------------------------------------------------------------------------------------
# Parallel text
# ------------------------------------------------------------------------------------------------
def test_cut_and_one_sided_examples_are_reported(tmp_path):
    # They were cut, or trained on, without a word: 500 identical words before the text left every example
    # looking the same; pairs with one empty side taught translating to nothing.
    words = ["bad"] * 12 + ["good", "fine"]
    tok = WordTokenizer.train([" ".join(words)])
    long = ClassificationData(texts=[" ".join(words), "good"], labels=["0", "1"], line_numbers=[1, 2])
    with pytest.warns(UserWarning, match=r"1 of 2 texts are longer than data.max_length allows \(8 tokens with "
                                         r"specials\) and were cut \(the longest has 15\)"):
        ClassificationSource(long, tok, batch_size=2, max_length=8, prefix_ids=[0])
    src = write(tmp_path / "a.src", "x y\nz\n\ny\n")
    tgt = write(tmp_path / "a.tgt", "y x\n\nx\ny\n")
    src_tok = WordTokenizer.train(["x y z"], specials={"bos": "<s>", "eos": "</s>", "pad": "<pad>", "unk": "<unk>"})
    with pytest.warns(UserWarning, match="2 of 4 sentence pairs have one side empty .the first at line 2 of '.*a.src'"):
        ParallelTextSource(src, tgt, src_tok, src_tok, batch_size=2)


def test_parallel_text_source(tmp_path):
    src_lines = [f"ein satz {'x ' * (i % 7)}nummer {i}" for i in range(30)]
    tgt_lines = [f"a sentence {'y ' * (i % 5)}number {i}" for i in range(30)]
    src_path = write(tmp_path / "train.de", "\n".join(src_lines) + "\n")
    tgt_path = write(tmp_path / "train.en", "\n".join(tgt_lines) + "\n")
    src_tok = WordTokenizer.train(src_lines)
    tgt_tok = WordTokenizer.train(tgt_lines)
    source = ParallelTextSource(src_path, tgt_path, src_tok, tgt_tok, batch_size=6, seed=2, max_tgt_length=8)
    batch = source.batch(3)
    assert set(batch) == {"src_ids", "src_mask", "tgt_ids", "labels"}
    assert equal_batches(batch, source.batch(3)) and source.steps_per_epoch == 5
    assert (batch["tgt_ids"][:, 0] == tgt_tok.bos_id).all()
    assert batch["tgt_ids"].shape == batch["labels"].shape and batch["tgt_ids"].shape[1] <= 8
    for row_in, row_out in zip(batch["tgt_ids"].tolist(), batch["labels"].tolist()):
        body = [t for t in row_out if t != -100]
        assert body[-1] == tgt_tok.eos_id or len(body) == 8  # eos, or a cut sentence's next token
        assert row_in[1 : len(body)] == body[:-1]  # labels are decoder inputs shifted by one
    assert ((batch["src_ids"] == src_tok.pad_id) == (batch["src_mask"] == 0)).all()
    first = next(iter(source.iter_batches()))
    labels = [[t for t in row if t != -100] for row in first["labels"].tolist()]
    assert labels[0] == tgt_tok.encode(tgt_lines[0]) + [tgt_tok.eos_id]  # 4 tokens: whole, then eos
    # 8 tokens, cut to max_tgt_length - 1 = 7 as decoder input; the last label is the 8th token, not eos (the
    # sentence does not end there)
    assert len(tgt_tok.encode(tgt_lines[4])) == 8 and labels[4] == tgt_tok.encode(tgt_lines[4])
    assert first["tgt_ids"][4].tolist() == [tgt_tok.bos_id, *tgt_tok.encode(tgt_lines[4])[:7]]


def test_parallel_bucketing_reduces_padding():
    src = [" ".join(["w"] * (1 + (i * 37) % 40)) for i in range(400)]
    tok = WordTokenizer.train(["w"])
    plain = ParallelTextSource(src, src, tok, tok, batch_size=8, seed=0)
    bucketed = ParallelTextSource(src, src, tok, tok, batch_size=8, seed=0, bucket_by_length=True)

    def padding(source):
        return sum((source.batch(s)["src_mask"] == 0).sum().item() for s in range(source.steps_per_epoch))

    assert padding(bucketed) < padding(plain) / 3
    assert sorted(i for s in range(50) for i in bucketed.indices(s).tolist()) == list(range(400))


@pytest.mark.parametrize("max_batches", [None, 3])
def test_evaluation_sorted_by_length_holds_the_examples_file_order_would(max_batches):
    """With bucket_by_length, evaluation batches sentences sorted by source, then target length: every example
    once, and under a batch limit the same examples as the first batches in file order (not the shortest)."""
    src = [" ".join(["w"] * (1 + (i * 37) % 40)) for i in range(100)]
    tgt = [" ".join(["w"] * (1 + (i * 11) % 7)) for i in range(100)]
    tok = WordTokenizer.train(["w"])
    plain = ParallelTextSource(src, tgt, tok, tok, batch_size=8, seed=0)
    bucketed = ParallelTextSource(src, tgt, tok, tok, batch_size=8, seed=0, bucket_by_length=True)
    in_file_order = np.concatenate(plain.eval_indices(8, max_batches))
    assert in_file_order.tolist() == list(range(len(in_file_order)))
    batches = bucketed.eval_indices(8, max_batches)
    order = np.concatenate(batches)
    assert sorted(order.tolist()) == in_file_order.tolist()
    keys = [(len(bucketed.src[i]), len(bucketed.tgt[i])) for i in order.tolist()]
    assert keys == sorted(keys)
    assert [len(b) for b in batches] == [len(b) for b in plain.eval_indices(8, max_batches)]

    def real_share(source):
        masks = [b["src_mask"] for b in evaluation_batches(source, 8, max_batches)]
        return sum(m.sum().item() for m in masks) / sum(m.numel() for m in masks)

    assert real_share(bucketed) > real_share(plain) + 0.15
    assert max_batches or real_share(bucketed) > 0.9 > 0.6 > real_share(plain)


def test_evaluation_batches_limits_any_source():
    source = CausalLMSource(np.arange(1000) % 50, block_size=10, batch_size=4, seed=0)
    every = list(source.iter_batches(4))
    first = list(evaluation_batches(source, 4, 3))
    assert len(first) == 3 < len(every) and all(equal_batches(a, b) for a, b in zip(first, every))
    assert len(list(evaluation_batches(source, 4, 0))) == len(every)


def test_parallel_mismatched_files(tmp_path):
    a = write(tmp_path / "a.de", "eins\nzwei\ndrei\n")
    b = write(tmp_path / "b.en", "one\ntwo\n")
    tok = WordTokenizer.train(["eins zwei drei one two"])
    with pytest.raises(DataError) as err:
        ParallelTextSource(a, b, tok, tok, batch_size=2)
    message = one_line(err)
    assert "3 lines" in message and "has 2" in message
    with pytest.raises(ConfigError):
        ParallelTextSource(a, a, tok, CharTokenizer(["a"]), batch_size=2)


# ------------------------------------------------------------------------------------------------
# Real data sets (skipped where the shared folder is missing)
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_real_sst2_dev(shared_data):
    data = read_classification_file(shared_data("sst2", "dev.tsv"))
    assert len(data) == 872 and data.label_names == ["0", "1"]
    assert sum(data.label_ids()) == 444


@pytest.mark.slow
def test_real_tinyshakespeare_token_file(tmp_path, shared_data):
    path = shared_data("tinyshakespeare", "input.txt")
    text = read_text(path)
    tok = CharTokenizer.train(text)
    tf = build_token_file(path, tok, tmp_path / "shakespeare.bin")
    assert np.array_equal(np.asarray(tf), tok.encode_array(text))
    batch = CausalLMSource(tf, block_size=64, batch_size=8, seed=0).batch(0)
    assert torch.equal(batch["input_ids"][:, 1:], batch["labels"][:, :-1])


@pytest.mark.slow
def test_real_multi30k_val(shared_data):
    de, en = shared_data("multi30k", "val.de"), shared_data("multi30k", "val.en")
    src_tok = BPETokenizer.train(read_lines(de), vocab_size=500)
    tgt_tok = BPETokenizer.train(read_lines(en), vocab_size=500)
    source = ParallelTextSource(de, en, src_tok, tgt_tok, batch_size=32, bucket_by_length=True)
    assert len(source) == len(read_lines(en))
    assert source.batch(0)["src_ids"].shape[0] == 32
