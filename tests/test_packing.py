"""Packed batches: several documents in one row, told apart by ``document_ids``.

A packed document must get exactly what it gets alone in a row of its own (logits, loss, gradient), for every
attention variant and position scheme; a packed source must hold every example of its batch once; and the
trainer must share packed rows among micro-batches without changing the gradient.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from attnlab.data.knowledge import IGNORE, KnowledgeVocab, QASource, SpanCorruptionSource
from attnlab.errors import ConfigError, DataError
from attnlab.models.common import packed_layout
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.modules.positions import POSITIONS, check_compatible
from attnlab.modules.variants import VARIANTS
from attnlab.training.trainer import Trainer

DOCS = ["Ada Varn. Ada Varn is a painter born in Lyon .", "Bo Tesk. Born in Oslo , Bo Tesk sings .", "Cy.",
        "Di Lansk. Di Lansk was born in Porto and works in Quito .", "Ed."]
PAIRS = [("Where was Ada Varn born?", "Lyon"), ("Where was Bo born?", "Oslo"), ("Who?", "Cy"),
         ("Where was Di Lansk born?", "Porto")]


def vocab() -> KnowledgeVocab:
    return KnowledgeVocab.from_texts("".join(DOCS), "".join(q + a for q, a in PAIRS))


def test_packed_layout_restarts_positions_and_walls_off_each_document():
    ids = torch.tensor([[0, 0, 0, 2, 2, -1], [1, 1, 1, 1, 1, 1]])
    positions, mask = packed_layout(ids)
    assert positions.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]
    assert mask.shape == (2, 1, 6, 6)
    same = torch.tensor([0, 0, 0, 1, 1, 2])
    assert torch.equal(mask[0, 0], same[:, None] == same[None, :])
    assert mask[1].all()
    # Documents are runs: the same id again after another document is a new document.
    positions, mask = packed_layout(torch.tensor([[3, 3, 4, 3]]))
    assert positions.tolist() == [[0, 1, 0, 0]] and not mask[0, 0, 3, 0]


def _pairs():
    for variant, position in itertools.product(VARIANTS.names(), POSITIONS.names()):
        try:
            check_compatible(variant, position)
        except ConfigError:
            continue
        yield variant, position


@pytest.mark.parametrize(("variant", "position"), list(_pairs()))
def test_a_packed_document_gets_the_logits_it_gets_alone(variant, position):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, d_model=16, n_heads=2, n_layers=2, attention=variant,
                          position=position, dropout=0.0)).eval()
    docs = [torch.randint(0, 11, (n,)) for n in (5, 7, 3, 9)]
    row0 = torch.cat([docs[0], docs[1], docs[2], torch.zeros(1, dtype=torch.long)])  # 16: three and a pad
    row1 = torch.cat([docs[3], torch.zeros(7, dtype=torch.long)])
    ids = torch.tensor([[0] * 5 + [1] * 7 + [2] * 3 + [-1], [3] * 9 + [-1] * 7])
    with torch.no_grad():
        packed = model(torch.stack([row0, row1]), document_ids=ids).logits
        starts = {0: (0, 0), 1: (0, 5), 2: (0, 12), 3: (1, 0)}
        for d, doc in enumerate(docs):
            alone = model(doc[None]).logits[0]
            r, s = starts[d]
            torch.testing.assert_close(packed[r, s : s + len(doc)], alone, rtol=1e-5, atol=1e-5)


def test_document_ids_refuse_a_cache_or_padding_mask():
    model = GPT(GPTConfig(vocab_size=11, block_size=16, d_model=16, n_heads=2, n_layers=1))
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ConfigError, match="document_ids"):
        model(ids, document_ids=ids, attention_mask=torch.ones(1, 4))
    with pytest.raises(ConfigError, match="document_ids"):
        model(ids, document_ids=ids, cache=model.new_cache())


def _sources(kind: str, batch: int, **layout):
    if kind == "span":
        return SpanCorruptionSource(DOCS, vocab(), 96, batch, seed=1, **layout)
    return QASource(PAIRS, vocab(), 96, batch, seed=1, **layout)


@pytest.mark.parametrize("kind", ["span", "qa"])
def test_a_packed_batch_holds_each_example_once_as_it_is_unpacked(kind):
    plain, packed = _sources(kind, 4), _sources(kind, 4, pack=True)
    for step in range(4):
        a, b = plain.batch(step), packed.batch(step)
        assert b["input_ids"].shape[0] < 4 and b["input_ids"].shape[1] <= 96
        assert sorted(set(b["document_ids"][b["document_ids"] >= 0].tolist())) == [0, 1, 2, 3]
        for i in range(4):
            where = b["document_ids"] == i
            r = int(where.any(dim=1).nonzero()[0])
            cols = where[r].nonzero().flatten()
            n = int((a["labels"][i] != IGNORE).nonzero().max()) + 1  # the example up to its last target
            assert len(cols) == n and int(cols[-1] - cols[0]) == n - 1  # one contiguous run
            assert torch.equal(b["input_ids"][r, cols], a["input_ids"][i, :n])
            assert torch.equal(b["labels"][r, cols], a["labels"][i, :n])
        assert (b["labels"][b["document_ids"] < 0] == IGNORE).all()
    evaluated = list(_sources(kind, 3, pack=True).iter_batches(3))
    assert sum(len(set(e["document_ids"][e["document_ids"] >= 0].tolist())) for e in evaluated) == len(
        DOCS if kind == "span" else PAIRS)


@pytest.mark.parametrize("kind", ["span", "qa"])
def test_packed_batches_give_the_same_loss_and_gradient(kind):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab().vocab_size, block_size=96, d_model=16, n_heads=2, n_layers=2))
    plain, packed = _sources(kind, 4), _sources(kind, 4, pack=True)
    for step in range(3):
        results = []
        for batch in (plain.batch(step), packed.batch(step)):
            model.zero_grad()
            out = model(**batch)
            out.loss.backward()
            results.append((out.loss.detach(), out.n_targets, [p.grad.clone() for p in model.parameters()]))
        torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
        assert int(results[0][1]) == int(results[1][1])
        for g1, g2 in zip(results[0][2], results[1][2]):
            torch.testing.assert_close(g1, g2, rtol=1e-4, atol=1e-6)


def _trained(tmp_path, name: str, source, **config) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab().vocab_size, block_size=96, d_model=16, n_heads=2, n_layers=1))
    settings = {"steps": 4, "batch_size": 4, "lr": 1e-2, "warmup_steps": 0, "precision": "fp32", "device": "cpu",
                "progress": False, "save_every": 0, "eval_every": 0, **config}
    Trainer(model, settings, source, out_dir=tmp_path / name).fit()
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_training_on_packed_batches_equals_training_on_one_example_per_row(tmp_path):
    plain = _trained(tmp_path, "plain", _sources("span", 4))
    packed = _trained(tmp_path, "packed", _sources("span", 4, pack=True))
    micro = _trained(tmp_path, "micro", _sources("span", 4, pack=True), micro_batch_size=2)
    for key in plain:
        if key.endswith("k_proj.bias"):  # its true gradient is 0 (a softmax ignores q·b_k); AdamW scales up the noise
            continue
        torch.testing.assert_close(packed[key], plain[key], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(micro[key], plain[key], rtol=1e-4, atol=1e-5)


def test_packed_rows_are_shared_among_micro_batches():
    trainer_source = _sources("span", 4, pack=True)
    batch = trainer_source.batch(0)
    rows = batch["input_ids"].shape[0]

    class Stub:  # just what micro_batches reads
        config = type("C", (), {"batch_size": 4, "micro_batch_size": 1})()
        world = type("W", (), {"size": 1, "rank": 0})()

    micro = Trainer.micro_batches(Stub(), batch)
    assert len(micro) == min(4, rows)  # never an empty pass
    assert torch.equal(torch.cat([m["document_ids"] for m in micro]), batch["document_ids"])
    Stub.world.size, Stub.config.micro_batch_size = rows + 1, None
    with pytest.raises(DataError, match=f"packed batch of {rows} row"):
        Trainer.micro_batches(Stub(), batch)


@pytest.mark.parametrize("variant", ["synthesizer-dense", "synthesizer-random"])
def test_position_indexed_scores_have_reproducible_gradients_with_per_row_positions(variant):
    # Packed (and padded) batches give each row its own positions, which repeat across rows. Indexing a
    # parameter with them (table[positions]) adds the repeats in a thread-dependent order on the CPU: two
    # identical runs then drifted apart (two runs of the knowledge experiment ended 2 % and 0 %).
    from attnlab.modules.variants import build_variant

    torch.manual_seed(0)
    layer = build_variant(variant, d_model=64, n_heads=4, kv_dim=64, bias=True, block_size=128)
    positions = packed_layout(torch.sort(torch.randint(0, 6, (16, 128)), dim=1).values)[0]
    x = torch.randn(16, 128, 64)
    side = layer.keys if variant == "synthesizer-dense" else layer.queries
    weight = torch.randn_like(side(x, positions))

    def gradients():
        layer.zero_grad()
        (side(x, positions) * weight).sum().backward()
        return [p.grad.clone() for p in layer.parameters() if p.grad is not None]

    first = gradients()
    for _ in range(30):
        assert all(torch.equal(a, b) for a, b in zip(first, gradients()))


def test_packed_documents_on_the_half_precision_path():
    # In bf16 on a CPU attention takes the explicit path (see prefers_explicit): the document mask goes there too.
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, d_model=16, n_heads=2, n_layers=2)).to(torch.bfloat16)
    docs = [torch.randint(0, 11, (n,)) for n in (6, 10)]
    with torch.no_grad():
        packed = model(torch.cat(docs)[None], document_ids=torch.tensor([[0] * 6 + [1] * 10])).logits[0]
        for doc, start in zip(docs, (0, 6)):
            alone = model(doc[None]).logits[0]
            torch.testing.assert_close(packed[start : start + len(doc)].float(), alone.float(), rtol=0, atol=2e-2)


def test_a_model_that_cannot_keep_packed_examples_apart_is_refused(tmp_path):
    # The encoder LM would take document_ids as an unused keyword and let the examples see each other.
    from attnlab.models.encoder import EncoderConfig, EncoderModel

    model = EncoderModel(EncoderConfig(vocab_size=vocab().vocab_size, d_model=16, n_heads=2, n_layers=1, d_ff=32))
    settings = {"steps": 1, "batch_size": 4, "precision": "fp32", "device": "cpu", "progress": False}
    with pytest.raises(DataError, match="cannot keep apart"):
        Trainer(model, settings, _sources("span", 4, pack=True), out_dir=tmp_path / "run").fit()


def test_the_trainer_counts_packed_examples_as_the_model_reads_them(tmp_path):
    """A run of equal document ids is one document (`packed_layout`): rows that each number their documents from
    0 hold four examples here. Counting distinct ids made it two and refused the batch ("a batch of 2 examples
    ... but batch_size is 4")."""
    from attnlab.training.trainer import _batch_size

    documents = torch.tensor([[0, 0, 0, 1, 1, -1], [0, 0, 1, 1, 1, 1]])
    assert _batch_size({"document_ids": documents}) == 4
    assert _batch_size({"document_ids": torch.tensor([[0, 0, 1, 1], [2, 2, 3, -1]])}) == 4  # numbered across rows

    class RestartingIds:
        def batch(self, step):
            ids = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(step))
            return {"input_ids": ids, "labels": ids.clone(), "document_ids": torch.tensor([[0] * 4 + [1] * 4] * 2)}

    model = GPT(GPTConfig(vocab_size=11, block_size=8, d_model=16, n_heads=2, n_layers=1))
    trainer = Trainer(model, {"steps": 1, "batch_size": 4, "precision": "fp32", "device": "cpu", "progress": False,
                              "save_every": 0, "eval_every": 0}, RestartingIds(), out_dir=tmp_path)
    assert trainer.fit()["steps"] == 1


@pytest.mark.parametrize("lengths, rows", [([4, 4], [[0, 0, 0, 0, 1, 1, 1, 1]]),  # exactly filled: one row
                                           ([3, 3, 5, 5], [[2, 2, 2, 2, 2, 0, 0, 0], [3, 3, 3, 3, 3, 1, 1, 1]])])
def test_packing_is_first_fit_longest_first(lengths, rows):
    """The rows the docstring promises (as few as the examples fit in, first fit, longest first), pinned on lengths
    where in-order packing, or a row never filled to the brim, would take more rows."""
    from attnlab.data.knowledge import _packed_batch

    width = 8
    ids = np.zeros((len(lengths), width + 1), dtype=np.int64)
    labels = np.full((len(lengths), width), IGNORE, dtype=np.int64)
    for i, n in enumerate(lengths):
        ids[i, :n], labels[i, :n] = np.arange(2, 2 + n), 5
    assert _packed_batch(ids, labels, pad_id=0)["document_ids"].tolist() == rows
