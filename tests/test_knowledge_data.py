"""The data rules of the knowledge-access experiment: vocabulary, span corruption, fine-tuning layout,
BatchSource determinism, the synthetic world, and the one-line DataErrors."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from attnlab.data.knowledge import (
    IGNORE,
    MASK,
    PAD,
    KnowledgeVocab,
    QASource,
    SpanCorruptionSource,
    build_char_vocab,
    corrupt_document,
    exact_match,
    london_baseline,
    parse_answer,
    qa_prompt,
    read_corpus,
    read_qa_file,
)
from attnlab.data.world import TEMPLATES, make_world
from attnlab.errors import ConfigError, DataError

DOC = "Amara Velt. Amara Velt is a painter born in Tovriss . She later worked in Quendal ."


def _split(s: str) -> tuple[str, str, str, str]:
    """(prefix, suffix, content, padding) of a corrupted string."""
    body = s.rstrip(PAD)
    prefix, suffix, content = body.split(MASK)
    return prefix, suffix, content, s[len(body):]


@pytest.fixture(scope="module")
def world():
    return make_world(600, seed=7)


@pytest.fixture(scope="module")
def vocab(world):
    pairs = world.split(0.2, 0)
    text = "".join(q + a for q, a in pairs[0] + pairs[1])
    return KnowledgeVocab.from_texts(*world.corpus_lines(), text)


# ---- vocabulary ----------------------------------------------------------------------------------------


def test_vocab_order_and_round_trip():
    chars = build_char_vocab("cab", "b?", MASK + PAD)
    assert chars == [PAD, MASK, "?", "a", "b", "c"]
    v = KnowledgeVocab(chars)
    assert (v.pad_id, v.mask_id, v.stoi[PAD], v.stoi[MASK]) == (0, 1, 0, 1)
    assert v.encode("abc?") == [3, 4, 5, 2]
    assert v.encode_array("abc?").tolist() == [3, 4, 5, 2]
    assert v.decode(torch.tensor([3, 1, 0])) == "a" + MASK + PAD
    assert KnowledgeVocab.from_json(v.to_json()) == v


def test_encode_array_takes_a_lone_surrogate_as_encode_does():
    # Text read with errors="surrogateescape" holds lone surrogates: the vocabulary took them, encode too, but
    # encode_array (the pretraining data's path) failed with a raw UnicodeEncodeError (stop-40 knowledge audit).
    v = KnowledgeVocab.from_texts("Caf\udce9 born")
    assert v.encode_array("Caf\udce9").tolist() == v.encode("Caf\udce9")
    for encode in (v.encode, v.encode_array):
        with pytest.raises(DataError, match="is not in the vocabulary"):
            encode("Caf\ud800")


def test_vocab_converts_to_the_project_char_tokenizer(tmp_path):
    from attnlab.data.tokenizers import load_tokenizer

    v = KnowledgeVocab.from_texts("Where was Amara born?", "Tovriss")
    tok = v.to_tokenizer()
    assert tok.encode("Amara?") == v.encode("Amara?") and (tok.pad_id, tok.mask_id) == (0, 1)
    tok.save(tmp_path / "tokenizer.json")
    assert KnowledgeVocab.from_tokenizer(load_tokenizer(tmp_path / "tokenizer.json")) == v


def test_vocab_unknown_character_is_a_one_line_error():
    v = KnowledgeVocab(build_char_vocab("abc"))
    for encode in (v.encode, v.encode_array):
        with pytest.raises(DataError, match=r"'z' \(U\+007A\) is not in the vocabulary.*fine-tuning") as e:
            encode("abz")
        assert "\n" not in str(e.value)
        # above every character of the vocabulary (□ and ⁇ included): past the end of its sorted codes
        with pytest.raises(DataError, match=r"'中' \(U\+4E2D\) is not in the vocabulary"):
            encode("ab中")
    with pytest.raises(DataError):
        KnowledgeVocab(["a", "b"])
    with pytest.raises(DataError):
        KnowledgeVocab.from_json("{not json")


# ---- span corruption -----------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [5, 16, 64])
def test_corruption_layout(block_size):
    rng = np.random.default_rng(0)
    max_len = int(block_size * 7 / 8)
    lengths = set()
    for _ in range(400):
        s = corrupt_document(DOC, block_size, rng)
        assert len(s) == block_size + 1
        assert s.count(MASK) == 2
        prefix, suffix, content, pads = _split(s)
        kept = prefix + content + suffix
        assert DOC.startswith(kept)
        assert 4 <= len(kept) <= max_len
        assert 1 <= len(content) <= len(kept) // 2
        assert set(pads) <= {PAD}
        lengths.add(len(kept))
    assert lengths == set(range(4, max_len + 1))  # every truncation length occurs, both ends included


def test_short_documents_are_kept_whole():
    rng = np.random.default_rng(1)
    for doc in ("a", "ab", "abc", "abcdefg"):
        for _ in range(20):
            prefix, suffix, content, _ = _split(corrupt_document(doc, 64, rng))
            assert prefix + content + suffix == doc[: len(prefix + content + suffix)]
            assert len(prefix + content + suffix) <= len(doc) and len(content) >= 1
    assert {len(_split(corrupt_document("abc", 64, rng))[2]) for _ in range(20)} == {1}


def test_mean_masked_length_is_a_quarter_of_kept_length():
    rng = np.random.default_rng(2)
    kept, masked = [], []
    for _ in range(3000):
        prefix, suffix, content, _ = _split(corrupt_document("x" * 300, 128, rng))
        kept.append(len(prefix + suffix + content))
        masked.append(len(content))
    assert abs(np.mean(masked) - np.mean(kept) / 4) < 0.3
    # At a fixed kept length the mean is exactly L/4, for odd and even L alike.
    for length in (13, 16):
        spans = []
        for _ in range(3000):
            prefix, suffix, content, _ = _split(corrupt_document("y" * length, 64, rng))
            if len(prefix + suffix + content) == length:
                spans.append(len(content))
        assert len(spans) > 2000 and abs(np.mean(spans) - length / 4) < 0.15


def test_span_source_batch_matches_the_rule_and_labels():
    docs = [DOC, "Short one .", "Another document about Quendal ."]
    v = KnowledgeVocab.from_texts(*docs)
    src = SpanCorruptionSource(docs, v, block_size=32, batch_size=4, seed=5)
    assert src.steps_per_epoch == 1
    b = src.batch(0)
    x, y = b["input_ids"], b["labels"]
    assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.long
    for row in range(4):
        text, labels = v.decode(x[row]), y[row].tolist()
        n_real = sum(label != IGNORE for label in labels)
        assert text.count(MASK) == 2
        assert labels[:n_real] == v.encode(text[1:n_real + 1])  # y is x shifted by one
        assert all(label == IGNORE for label in labels[n_real:])  # no loss where the target is padding
        assert text[n_real + 1:] == PAD * (len(text) - n_real - 1)
    # Row i of step s is corrupt_document with the generator seeded by (seed, 2, s, i), on the documents
    # of the epoch's shuffle (seeded by (seed, 1, epoch)); the short last batch wraps around.
    order = np.random.default_rng([5, 1, 0]).permutation(3)
    for row, doc in enumerate([docs[order[0]], docs[order[1]], docs[order[2]], docs[order[0]]]):
        expected = corrupt_document(doc, 32, np.random.default_rng([5, 2, 0, row]))
        assert v.decode(x[row]) == expected[:-1]


def test_span_corruption_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigError, match="block_size"):
        corrupt_document(DOC, 4, rng)
    with pytest.raises(DataError, match="empty document"):
        corrupt_document("", 16, rng)
    v = KnowledgeVocab.from_texts("abc")
    with pytest.raises(DataError, match=r"corpus document 2 is empty; remove blank lines"):
        SpanCorruptionSource(["abc", ""], v, 16, 2)
    with pytest.raises(DataError, match=r"pretraining corpus: character 'z'"):
        SpanCorruptionSource(["abc", "abz"], v, 16, 2)
    with pytest.raises(DataError, match="no documents"):
        SpanCorruptionSource([], v, 16, 2)


def test_batch_is_a_pure_function_of_seed_and_step(world, vocab):
    docs = world.corpus_lines()
    a = SpanCorruptionSource(docs, vocab, 64, 32, seed=1)
    b = SpanCorruptionSource(docs, vocab, 64, 32, seed=1)
    later = a.batch(7)
    a.batch(3)
    assert all(torch.equal(later[k], b.batch(7)[k]) for k in later)
    assert not torch.equal(a.batch(7)["input_ids"], a.batch(8)["input_ids"])
    other_seed = SpanCorruptionSource(docs, vocab, 64, 32, seed=2)
    assert not torch.equal(a.batch(7)["input_ids"], other_seed.batch(7)["input_ids"])
    assert a.steps_per_epoch == -(-len(docs) // 32)


def test_epochs_cover_every_example_and_reshuffle():
    pairs = [(f"q{i}", "a") for i in range(10)]
    v = KnowledgeVocab.from_texts("q0123456789a")
    src = QASource(pairs, v, 16, batch_size=4, seed=0)
    assert src.steps_per_epoch == 3

    def questions(step):
        return [v.decode(row).split(MASK)[0] for row in src.batch(step)["input_ids"]]

    epoch0 = questions(0) + questions(1) + questions(2)
    epoch1 = questions(3) + questions(4) + questions(5)
    assert len(epoch0) == 12 and set(epoch0) == {q for q, _ in pairs}
    assert epoch0[:10] != epoch1[:10]


def test_span_eval_iteration_is_fixed_and_complete(world, vocab):
    docs = world.corpus_lines()[:50]
    src = SpanCorruptionSource(docs, vocab, 64, 8, seed=3)
    first = list(src.iter_batches(16))
    second = list(src.iter_batches(16))
    assert [b["input_ids"].shape[0] for b in first] == [16, 16, 16, 2]
    assert all(torch.equal(p["input_ids"], q["input_ids"]) for p, q in zip(first, second))
    # each document its own draws (seeded by its index): equal documents are corrupted differently
    same = SpanCorruptionSource([docs[0]] * 8, vocab, 64, 8, seed=3)
    rows = next(iter(same.iter_batches(8)))["input_ids"]
    assert len({tuple(r.tolist()) for r in rows}) > 4


# ---- fine-tuning ---------------------------------------------------------------------------------------


def test_qa_layout_and_labels_cover_only_answer_and_mask():
    question, answer = "Where was Amara Velt born?", "Tovriss"
    v = KnowledgeVocab.from_texts(question, answer)
    b = QASource([(question, answer)], v, block_size=48, batch_size=1).batch(0)
    x, y = b["input_ids"][0], b["labels"][0]
    s = question + MASK + answer + MASK
    assert v.decode(x) == (s + PAD * (49 - len(s)))[:-1]
    q = len(question)
    assert (y[:q] == IGNORE).all()  # targets inside the question and the first mask mark
    assert y[q:q + len(answer) + 1].tolist() == v.encode(answer + MASK)
    assert (y[q + len(answer) + 1:] == IGNORE).all()
    assert v.decode(x[q + 1:q + 1 + len(answer)]) == answer


def test_qa_source_errors():
    v = KnowledgeVocab.from_texts("abc?")
    with pytest.raises(DataError, match=r"pair 2: question and answer take 12 characters .* block_size"):
        QASource([("a?", "b"), ("a" * 9, "b")], v, block_size=10, batch_size=2)
    with pytest.raises(DataError, match=r"pair 1: character 'z'"):
        QASource([("az?", "b")], v, block_size=10, batch_size=2)
    with pytest.raises(DataError, match="no answer"):
        QASource([("a?", None)], v, block_size=10, batch_size=2)
    with pytest.raises(ConfigError):
        QASource([("a?", "b")], v, block_size=10, batch_size=0)


def test_read_qa_file(tmp_path):
    good = tmp_path / "train.tsv"
    good.write_text("Where was A born?\tTovriss\r\n\nWhere was B born? \t Quendal\n", encoding="utf-8")
    assert read_qa_file(good) == [("Where was A born?", "Tovriss"), ("Where was B born?", "Quendal")]

    questions = tmp_path / "test.tsv"
    questions.write_text("Where was A born?\nWhere was B born?\t\n", encoding="utf-8")
    assert read_qa_file(questions, require_answers=False) == [("Where was A born?", None),
                                                              ("Where was B born?", None)]

    cases = {
        "Where was A born?\tX\nWhere was B born?\n": r"train\.tsv line 2: expected 'question<TAB>answer', "
                                                     r"found no tab",
        "q\ta\tb\n": "line 1: expected 'question<TAB>answer', found 2 tabs",
        "q\t\n": "line 1: the answer .* is empty",
        "\tX\n": "line 1: the question .* is empty",
        "\n  \n": "file is empty",
        "q" * 40 + "\tX\n": "line 1: question and answer take 43 characters",
    }
    for content, pattern in cases.items():
        good.write_text(content, encoding="utf-8")
        with pytest.raises(DataError, match=pattern) as e:
            read_qa_file(good, block_size=32)
        assert "\n" not in str(e.value)

    good.write_bytes(b"q\tTovriss\n" + b"q\t\xff\xfe\n")
    with pytest.raises(DataError, match=r"line 2: not valid UTF-8; save the file as UTF-8"):
        read_qa_file(good)
    with pytest.raises(DataError, match="file not found"):
        read_qa_file(tmp_path / "missing.tsv")
    # UTF-16 without a byte-order mark decodes as UTF-8 full of NULs: it was read, and trained on (stop-32 audit).
    good.write_bytes("Where was Ann Lee born?\tLyon\n".encode("utf-16-le"))
    with pytest.raises(DataError, match=r"holds NUL characters \(the first at line 1\): it looks like UTF-16"):
        read_qa_file(good)
    good.write_bytes("Ann Lee. Ann Lee was born in Lyon.\n".encode("utf-16-le"))
    with pytest.raises(DataError, match="holds NUL characters"):
        read_corpus(good)
    with pytest.raises(DataError, match="not a file"):
        read_corpus(tmp_path)


def test_read_corpus_skips_blank_lines(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("one doc .\r\n\n   \t\ntwo doc .\n", encoding="utf-8")
    assert read_corpus(path) == ["one doc .", "two doc ."]  # a line of spaces is blank too


@pytest.mark.parametrize("char", [MASK, PAD])
def test_pad_and_mask_characters_in_the_files_are_refused(tmp_path, char):
    # They structure every example (a mask ends an answer): in the data they were read as structure, and an
    # answer holding one could never be matched.
    corpus, qa = tmp_path / "corpus.txt", tmp_path / "qa.tsv"
    corpus.write_text(f"one doc .\ntwo {char} doc .\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"corpus.txt line 2 holds '{char}' .*remove or replace it"):
        read_corpus(corpus)
    qa.write_text(f"Where was Ada born?\tLyon\nWhere was Bo born?\tSaler{char}mere\n", encoding="utf-8")
    with pytest.raises(DataError, match="qa.tsv line 2 holds"):
        read_qa_file(qa)
    qa.write_text(f"Where was {char} born?\n", encoding="utf-8")
    with pytest.raises(DataError, match="qa.tsv line 1 holds"):
        read_qa_file(qa, require_answers=False)
    # For prediction the answer column is read past: a dev file with such an answer still gives its questions.
    qa.write_text(f"Where was Ada born?\tSaler{char}mere\n", encoding="utf-8")
    assert read_qa_file(qa, require_answers=False) == [("Where was Ada born?", f"Saler{char}mere")]


def test_metrics_and_prompt():
    assert exact_match(["Tovriss", " Quendal", "x"], ["Tovriss", "Quendal", "y"]) == pytest.approx(200 / 3)
    assert london_baseline(["London", "Paris", "Rome", "Oslo"]) == 25.0
    with pytest.raises(ValueError):
        exact_match(["a"], [])
    assert qa_prompt("Where?") == "Where?" + MASK
    assert parse_answer("Where?" + MASK + "Tovriss" + MASK + "junk") == "Tovriss"
    assert parse_answer("Where?" + MASK + "Tov" + PAD * 3) == "Tov"
    assert parse_answer("no mark") == ""


# ---- the synthetic world -------------------------------------------------------------------------------


def test_world_is_deterministic(world):
    again = make_world(600, seed=7)
    assert again.corpus_lines() == world.corpus_lines()
    assert again.split(0.2, 3) == world.split(0.2, 3)
    other = make_world(600, seed=8)
    assert other.corpus_lines() != world.corpus_lines()
    # Pinned to guard determinism across Python versions and machines; regenerate with
    # `python -c "from attnlab.data.world import make_world; print(make_world(3, 0).corpus_lines()[0])"`
    # only when the generator is changed on purpose.
    assert make_world(3, seed=0).corpus_lines()[0] == (
        "Ridorin Delow. Ridorin Delow lives in Isiwick but was born in Orerport ."
    )


def test_world_people_and_biographies(world):
    names = [p.name for p in world.people]
    assert len(set(names)) == len(names)
    assert len(set(world.places)) == len(world.places) >= 300 and "London" not in world.places
    for p in world.people:
        assert p.biography.startswith(f"{p.name}. ")
        assert f" {p.birthplace} " in p.biography and f" {p.home} " in p.biography
        assert p.home != p.birthplace and p.studied_in != p.birthplace
        assert "\n" not in p.biography and "\t" not in p.biography
    assert len({p.template for p in world.people}) == len(TEMPLATES) >= 6  # varied phrasings
    assert sorted(world.corpus_lines()) == sorted(p.biography for p in world.people)
    assert world.corpus_lines() != [p.biography for p in world.people]  # shuffled


def test_birthplaces_are_spread_out():
    big = make_world(3000, seed=0)
    counts = collections.Counter(p.birthplace for p in big.people)
    assert counts.most_common(1)[0][1] / 3000 < 0.05
    assert london_baseline([p.birthplace for p in big.people]) == 0.0


def test_split_is_disjoint_by_person(world):
    train, dev = world.split(0.25, seed=1)
    assert len(train) + len(dev) == 600 and len(dev) == 150
    assert not {q for q, _ in train} & {q for q, _ in dev}
    by_question = {p.question: p.birthplace for p in world.people}
    assert all(by_question[q] == a for q, a in train + dev)
    assert world.split(0.25, seed=2) != (train, dev)
    with pytest.raises(ConfigError):
        world.split(1.0)


def test_world_write_round_trips_through_the_readers(tmp_path):
    w = make_world(40, seed=3)
    paths = w.write(tmp_path / "world", eval_fraction=0.25, seed=0)
    assert read_corpus(paths["corpus"]) == w.corpus_lines()
    train, dev = w.split(0.25, seed=0)
    assert read_qa_file(paths["train"]) == train and read_qa_file(paths["dev"]) == dev
    vocab = KnowledgeVocab.from_texts(paths["corpus"].read_text(), paths["train"].read_text(),
                                      paths["dev"].read_text())
    QASource(train, vocab, 128, 8)
    SpanCorruptionSource(read_corpus(paths["corpus"]), vocab, 128, 8)


def test_sources_refuse_text_holding_the_layout_characters():
    """□ and ⁇ are the layout's pad and mask: a document or pair holding one would read as padding or a mark
    (the files' readers refuse them; the sources, used from Python, too)."""
    from attnlab.data.knowledge import KnowledgeVocab, QASource, SpanCorruptionSource
    from attnlab.errors import DataError

    vocab = KnowledgeVocab.from_texts("abcdefgh?")
    with pytest.raises(DataError, match="corpus document 2: holds '⁇', the mask character"):
        SpanCorruptionSource(["abcd", "ab⁇cd"], vocab, 16, 2)
    with pytest.raises(DataError, match="pair 1: holds '□', the pad character"):
        QASource([("ab□?", "c")], vocab, 16, 2)
