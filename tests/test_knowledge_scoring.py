"""The knowledge experiment's labels and scoring, pinned exactly: span-corruption targets stop at the last
real character, evaluation batches do not depend on the batch size, answers are read up to the closing
mask, accuracies and baselines are computed on the right split (scripted answers), and the phase schedules
follow the assignment's token counts."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from attnlab.data.knowledge import IGNORE, MASK, PAD, KnowledgeVocab, SpanCorruptionSource, exact_match

DOC = "Amara Velt. Amara Velt is a painter born in Tovriss . She later worked in Quendal ."


def test_span_labels_stop_at_the_last_real_character():
    """Only s[1:n] are targets (n = unpadded length); the first pad must not be a target."""
    docs = [DOC, "Short one .", "Another document about Quendal ."]
    v = KnowledgeVocab.from_texts(*docs)
    src = SpanCorruptionSource(docs, v, block_size=64, batch_size=3, seed=0)
    for step in range(20):
        b = src.batch(step)
        for x, y in zip(b["input_ids"], b["labels"]):
            body = v.decode(x).rstrip(PAD)  # prefix ⁇ suffix ⁇ content (fits: L + 2 <= 58 < 64)
            targets = y[y != IGNORE]
            assert len(targets) == len(body) - 1
            assert v.pad_id not in targets.tolist()


def test_span_eval_corruption_does_not_depend_on_the_batch_size():
    docs = [DOC, "Short one .", "Another document about Quendal .", "Tovriss ."] * 3
    v = KnowledgeVocab.from_texts(*docs)
    src = SpanCorruptionSource(docs, v, block_size=64, batch_size=4, seed=3)
    a = torch.cat([b["input_ids"] for b in src.iter_batches(16)])
    b = torch.cat([b["input_ids"] for b in src.iter_batches(5)])
    assert torch.equal(a, b)


def test_exact_match_is_case_sensitive():
    assert exact_match(["tovriss"], ["Tovriss"]) == 0.0


def test_answer_questions_reads_the_text_before_the_closing_mask(monkeypatch):
    import attnlab.inference.generate as gen
    from attnlab.experiments.knowledge import answer_questions

    vocab = KnowledgeVocab.from_texts("Where was Ada born? Bo Lyon Oslo junk")
    calls = []

    def fake_generate(model, prompts, max_new_tokens, **kw):
        calls.append((max_new_tokens, kw))
        tails = {"Ada": "Lyon" + MASK + "junk", "Bo": "Oslo" + PAD + PAD}
        return [vocab.encode(next(t for name, t in tails.items() if name in vocab.decode(p))) for p in prompts]

    monkeypatch.setattr(gen, "generate", fake_generate)
    model = SimpleNamespace(config=SimpleNamespace(block_size=32))
    questions = ["Where was Ada born?", "Where was Bo born?"]
    assert answer_questions(model, vocab, questions) == ["Lyon", "Oslo"]
    # One batch, with the room the longest question leaves in the block: both answers end within it.
    assert [room for room, _ in calls] == [32 - (len(questions[0]) + 1)]
    assert all(kw["greedy"] and kw["eos_id"] == vocab.mask_id and kw["pad_id"] == vocab.pad_id for _, kw in calls)


def test_a_long_question_does_not_cut_the_answers_batched_with_it():
    """Every question of a batch had the room of the longest: a long one cut its neighbours' answers short. Each
    now gets the answer it gets alone (an untrained model never writes the closing mask, so the answers fill
    their room: what is left of the block, each question's own)."""
    import torch

    from attnlab.experiments.knowledge import answer_questions
    from attnlab.models.gpt import GPT, GPTConfig

    vocab = KnowledgeVocab.from_texts("Where was Ada Bo born? abcdefghijklmnopqrstuvwxyz")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab.vocab_size, block_size=96, d_model=16, n_heads=2, n_layers=1)).eval()
    with torch.no_grad():
        model.lm_head.weight[vocab.mask_id] = -1.0  # tied to the embedding: the mask's own row, pushed down
    questions = ["Where was Ada born?", "Where was " + "abcdefghij" * 6 + " born?", "Where was Bo born?"]
    alone = [answer_questions(model, vocab, [q])[0] for q in questions]
    assert answer_questions(model, vocab, questions, batch_size=2) == alone
    assert [len(a) for a in alone] == [96 - len(q) - 1 for q in questions]


def test_results_score_the_evaluation_split(tmp_path, monkeypatch):
    """Accuracy, 'correct' column, fine-tuning accuracy and both baselines, with scripted answers."""
    import attnlab.experiments.knowledge as kx

    names = ["Ada Varn", "Bo Tesk", "Cy Mordo", "Di Lansk", "Ed Pirro", "Fa Quell", "Gus Orme", "Hal Ytte"]
    places = ["Lyon", "Lyon", "Porto", "Quito", "Accra", "London", "Oslo", "Oslo"]
    corpus = [f"{n}. {n} is a painter born in {p} ." for n, p in zip(names, places)]
    qa = [f"Where was {n} born?\t{p}" for n, p in zip(names, places)]
    files = {"corpus": tmp_path / "wiki.txt", "train": tmp_path / "train.tsv", "eval": tmp_path / "dev.tsv"}
    files["corpus"].write_text("\n".join(corpus) + "\n", encoding="utf-8")
    files["train"].write_text("\n".join(qa[:5]) + "\n", encoding="utf-8")
    files["eval"].write_text("\n".join(qa[5:]) + "\n", encoding="utf-8")
    script = {"Where was Fa Quell born?": "London", "Where was Gus Orme born?": "Oslo",
              "Where was Hal Ytte born?": "Rome", "Where was Ed Pirro born?": "Rome"}
    truth = dict(line.split("\t") for line in qa)
    monkeypatch.setattr(kx, "answer_questions",
                        lambda model, vocab, qs, **kw: [script.get(q, truth[q]) for q in qs])
    tiny = {"n_layers": 1, "n_heads": 2, "d_model": 16, "block_size": 64, "finetune_batch": 4,
            "finetune_epochs_scratch": 1, "precision": "fp32"}
    summary = kx.run_knowledge(tmp_path / "out", variants="none", corpus=str(files["corpus"]),
                               train=str(files["train"]), eval_path=str(files["eval"]), device="cpu",
                               overrides=tiny, progress=False, echo=lambda *_: None)
    row = summary["variants"][0]
    assert row["accuracy"] == pytest.approx(200 / 3) and row["correct"] == 2
    assert row["train_accuracy"] == pytest.approx(80.0)
    base = summary["baselines"]
    assert base["london"] == pytest.approx(100 / 3)  # of the evaluation answers, not the training ones
    assert base["most_common_answer"] == "Lyon" and base["most_common"] == 0.0  # the training answers' mode
    rows = (tmp_path / "out" / "predictions" / "none.tsv").read_text().splitlines()[1:]
    assert [r.split("\t")[-1] for r in rows] == ["1", "1", "0"]


def test_phase_config_follows_the_assignment_token_schedule():
    from attnlab.experiments.knowledge import SCALES, _phase_config

    full = SCALES["full"]
    cfg = _phase_config(full, batch=128, lr=6e-3, epochs=650, n_examples=2000, n_corpus=2000, seed=0,
                        device="cpu", progress=False)
    # warmup 512·20 tokens = 1 step of 128×128; cosine floor after 200·len(corpus)·block_size tokens
    assert cfg["steps"] == math.ceil(650 * 2000 / 128)
    assert cfg["warmup_steps"] == 1 and cfg["decay_steps"] == 200 * 2000 * 128 // (128 * 128)
    ft = _phase_config(full, batch=256, lr=6e-4, epochs=10, n_examples=500, n_corpus=2000, seed=0,
                       device="cpu", progress=False)
    assert ft["decay_steps"] == math.ceil(200 * 2000 * 128 / (256 * 128))


def test_a_pad_the_model_writes_ends_its_answer(monkeypatch):
    # Pads were deleted from the completion, so "Pa□ris⁇" scored as the right answer "Paris".
    import attnlab.inference.generate as generation
    from attnlab.data.knowledge import KnowledgeVocab
    from attnlab.experiments.knowledge import KnowledgeScale, Variant, answer_questions, model_config
    from attnlab.models.gpt import GPT

    question = "Where was Al born?"
    vocab = KnowledgeVocab.from_texts(question + "Paris")
    model = GPT(model_config(KnowledgeScale(n_layers=1, n_heads=1, d_model=8, block_size=32, dropout=0.0),
                             vocab.vocab_size, Variant("dot", True))).eval()
    written = vocab.encode("Pa") + [vocab.pad_id] + vocab.encode("ris") + [vocab.mask_id]
    monkeypatch.setattr(generation, "generate", lambda *args, **kwargs: [written])
    assert answer_questions(model, vocab, [question]) == ["Pa"]
