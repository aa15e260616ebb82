"""Mutation-testing additions for `attnlab run knowledge` and the distributed helpers: the assignment's
schedule and optimizer numbers written out by hand, the phases' step counts of a tiny run, the results table,
the baselines, --resume refusing changed schedules or fine-tuning data, and torchrun's world."""

from __future__ import annotations

import json

import pytest
import torch

from attnlab.errors import ConfigError
from attnlab.experiments.knowledge import (
    ASSIGNMENT_VOCAB,
    SCALES,
    Variant,
    _phase_config,
    model_config,
    parse_variants,
    results_markdown,
    run_knowledge,
    scale_settings,
)

TINY = {"n_layers": 1, "n_heads": 2, "d_model": 32, "block_size": 64, "pretrain_epochs": 2, "pretrain_batch": 4,
        "finetune_batch": 4, "finetune_epochs_scratch": 3, "finetune_epochs_pretrained": 1, "decay_epochs": 3.0,
        "warmup_tokens": 256, "precision": "fp32"}
NAMES = ["Ada Varn", "Bo Tesk", "Cy Mordo", "Di Lansk", "Ed Pirro", "Fa Quell", "Gus Orme", "Hal Ytte"]
BORN = ["Lyon", "Oslo", "London", "Oslo", "Lyon", "London", "Porto", "London"]


def _files(tmp_path, born=BORN, dev_born=None):
    """8 biographies; the first 5 people are the fine-tuning questions, the last 3 the evaluation ones."""
    (tmp_path / "wiki.txt").write_text("".join(f"{n}. {n} was born in {b} .\n" for n, b in zip(NAMES, BORN)),
                                       encoding="utf-8")
    qa = [f"Where was {n} born?\t{b}\n" for n, b in zip(NAMES, born)]
    (tmp_path / "train.tsv").write_text("".join(qa[:5]), encoding="utf-8")
    dev = qa[5:] if dev_born is None else [f"Where was {n} born?\t{b}\n" for n, b in zip(NAMES[5:], dev_born)]
    (tmp_path / "dev.tsv").write_text("".join(dev), encoding="utf-8")
    return dict(corpus=str(tmp_path / "wiki.txt"), train=str(tmp_path / "train.tsv"),
                eval_path=str(tmp_path / "dev.tsv"))


def _quiet(**kwargs):
    return dict(device="cpu", progress=False, echo=lambda *_: None, **kwargs)


# ---- the assignment's schedule, by hand ----------------------------------------------------------------------


def test_full_scale_phase_schedules_are_the_assignments():
    """CS224n a5 with a corpus of 1000 biographies and 2000 fine-tuning questions: warmup 512·20 tokens, the
    cosine reaching 10% at 200·len(corpus)·128 tokens (in both phases), AdamW betas (0.9, 0.95), weight decay
    0.1, gradient clipping at 1.0."""
    full = SCALES["full"]
    common = dict(n_corpus=1000, seed=0, device="cpu", progress=False)
    pre = _phase_config(full, batch=128, lr=6e-3, epochs=650, n_examples=1000, **common)
    # 650·1000/128 = 5078.1 → 5079 steps of 128·128 = 16384 tokens; 10240/16384 → 1 warmup step;
    # 200·1000·128/16384 = 1562.5 → 1563.
    assert (pre["steps"], pre["warmup_steps"], pre["decay_steps"]) == (5079, 1, 1563)
    tuned = _phase_config(full, batch=256, lr=6e-4, epochs=10, n_examples=2000, **common)
    # 10·2000/256 = 78.1 → 79 steps of 32768 tokens; 200·1000·128/32768 = 781.25 → 782 (the corpus, not the pairs).
    assert (tuned["steps"], tuned["warmup_steps"], tuned["decay_steps"]) == (79, 1, 782)
    scratch = _phase_config(full, batch=256, lr=6e-4, epochs=75, n_examples=2000, **common)
    assert scratch["steps"] == 586  # 75·2000/256 = 585.9
    # A warmup longer than one step: 10240 tokens of 2·1024 per step = 5 steps; of 3·1024 → 3.33 → 4 steps.
    wide = scale_settings("full", {"block_size": 1024})
    assert _phase_config(wide, batch=2, lr=1e-3, epochs=100, n_examples=10, **common)["warmup_steps"] == 5
    assert _phase_config(wide, batch=3, lr=1e-3, epochs=100, n_examples=10, **common)["warmup_steps"] == 4
    for cfg in (pre, tuned, scratch):
        assert cfg["schedule"] == "cosine" and cfg["min_lr_ratio"] == 0.1
        assert tuple(cfg["betas"]) == (0.9, 0.95) and cfg["weight_decay"] == 0.1 and cfg["grad_clip"] == 1.0
    assert pre["lr"] == 6e-3 and pre["batch_size"] == 128
    # No decay_epochs: the cosine ends with the phase.
    assert _phase_config(SCALES["quick"], batch=32, lr=1e-3, epochs=1, n_examples=64, **common)["decay_steps"] is None


def test_full_scale_model_is_the_assignments_mingpt():
    cfg = model_config(SCALES["full"], ASSIGNMENT_VOCAB, Variant("dot", True))
    assert (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.block_size, cfg.vocab_size) == (4, 8, 256, 128, 256)
    assert cfg.activation == "gelu" and cfg.dropout == 0.1 and cfg.attention_dropout == 0.1
    assert cfg.attention == "dot" and cfg.position == "learned" and cfg.tie_embeddings is False
    combined = model_config(SCALES["full"], 70, parse_variants("bilinear+alibi")[0])
    assert (combined.attention, combined.position) == ("bilinear", "alibi")


def test_empty_variant_names_are_skipped():
    assert [v.name for v in parse_variants("none,,dot,")] == ["none", "dot"]
    with pytest.raises(ConfigError, match="no variants given"):
        parse_variants(" , ")


# ---- the phases of a tiny run ------------------------------------------------------------------------------


def _trained(out, phase):
    state = json.loads((out / phase / "checkpoint" / "trainer_state.json").read_text())
    return state["trainer_config"]


def test_each_phase_trains_its_own_steps_and_rows_state_their_own_parameters(tmp_path):
    """8 documents, 5 fine-tuning pairs, batch 4: pretraining 2 epochs → ceil(16/4) = 4 steps; fine-tuning
    from scratch 3 epochs → ceil(15/4) = 4 steps, after pretraining 1 epoch → ceil(5/4) = 2 steps; the cosine
    ends after 3 passes over the *corpus*: ceil(3·8·64 / (4·64)) = 6 steps in every phase."""
    from attnlab.training.checkpoint import load_model

    out = tmp_path / "out"
    lines = []
    summary = run_knowledge(out, variants="none,synthesizer-dense", **_files(tmp_path), overrides=TINY,
                            device="cpu", progress=False, echo=lines.append)
    assert (_trained(out, "pretrain-synthesizer-dense")["steps"], _trained(out, "finetune-synthesizer-dense")["steps"],
            _trained(out, "finetune-none")["steps"]) == (4, 2, 4)
    assert [_trained(out, p)["decay_steps"] for p in ("pretrain-synthesizer-dense", "finetune-synthesizer-dense",
                                                      "finetune-none")] == [6, 6, 6]
    rows = {r["variant"]: r for r in summary["variants"]}
    assert rows["none"]["finetune"]["steps"] == 4 and rows["synthesizer-dense"]["pretrain"]["steps"] == 4
    # Each row states its own model's size (synthesizer-dense has more parameters than dot).
    for name in ("none", "synthesizer-dense"):
        model = load_model(out / f"finetune-{name}")
        assert rows[name]["parameters"] == sum(p.numel() for p in model.parameters()), name
    assert rows["none"]["parameters"] != rows["synthesizer-dense"]["parameters"]
    # The "model:" line describes the first row's model (learned positions, dot attention).
    model_line = next(line for line in lines if line.startswith("model: "))
    assert f": {rows['none']['parameters']:,} parameters" in model_line, model_line


def test_pretraining_and_fine_tuning_batches_have_their_own_sizes(tmp_path, monkeypatch):
    from attnlab.data import knowledge as data

    seen = {"span": set(), "qa": set()}
    for kind, cls in (("span", data.SpanCorruptionSource), ("qa", data.QASource)):
        real = cls.batch

        def batch(self, step, _real=real, _kind=kind):
            b = _real(self, step)
            docs = b["document_ids"]  # packed several to a row: count the examples, not the rows
            seen[_kind].add(len(set(docs[docs >= 0].tolist())))
            return b

        monkeypatch.setattr(cls, "batch", batch)
    run_knowledge(tmp_path / "out", variants="dot", **_files(tmp_path),
                  overrides={**TINY, "pretrain_batch": 3, "finetune_batch": 5}, **_quiet())
    assert seen == {"span": {3}, "qa": {5}}


# ---- results -------------------------------------------------------------------------------------------------


def test_baselines_count_exact_answers(tmp_path, monkeypatch):
    """The London baseline is exact match, as in the assignment ("london" is not "London")."""
    import attnlab.experiments.knowledge as knowledge

    monkeypatch.setattr(knowledge, "answer_questions", lambda model, vocab, questions, **_: ["x"] * len(questions))
    files = _files(tmp_path, dev_born=["London", "london", "Oslo"])
    summary = run_knowledge(tmp_path / "out", variants="none", **files, overrides=TINY, **_quiet())
    # London, london, Oslo: one exact "London" of three; the most common training answer (Lyon/Oslo tie →
    # the first seen, Lyon) matches none.
    assert summary["baselines"]["london"] == pytest.approx(100 / 3)
    assert summary["baselines"]["most_common_answer"] == "Lyon" and summary["baselines"]["most_common"] == 0.0
    assert summary["variants"][0]["correct"] == 0
    # the table says the row's answer is one of several equally common ones (it read as the one most common)
    ties = summary["baselines"]["most_common_ties"]
    assert ties >= 2 and f'| always "Lyon" (the first met of {ties} equally common training answers) |' in \
        (tmp_path / "out" / "results.md").read_text(encoding="utf-8")


def test_results_table_rows():
    summary = {
        "scale": "full", "data": {"source": "files", "eval_questions": 500},
        "baselines": {"london": 5.0, "most_common": 3.4, "most_common_answer": "Paris"},
        "notes": {"none": 1.2, "dot": 22.2, "synthesizer-dense": 23.8, "london": 5.0},
        "variants": [
            {"variant": "none", "label": "no pretraining", "attention": "dot", "accuracy": 1.6, "correct": 8,
             "train_accuracy": 99.4, "parameters": 3323392, "wall_time_s": 61.4},
            {"variant": "dot", "label": "dot (pretrained)", "attention": "dot", "accuracy": 23.4, "correct": 117,
             "train_accuracy": 100.0, "parameters": 3323392, "wall_time_s": 4000.6},
            {"variant": "synthesizer-dense+rotary", "label": "synthesizer-dense+rotary (pretrained)",
             "attention": "synthesizer-dense", "accuracy": 12.0, "correct": 60, "train_accuracy": 50.0,
             "parameters": 4000000, "wall_time_s": 1.0},
        ],
        "assignment_parameters": 3323392, "wall_time_s": 4063.2,
    }
    lines = results_markdown(summary).splitlines()
    assert lines[4:] == [
        "| no pretraining | 1.6 | 8/500 | 99.4 | 1.2 | 3,323,392 | 61 |",
        "| dot (pretrained) | 23.4 | 117/500 | 100.0 | 22.2 | 3,323,392 | 4001 |",
        "| synthesizer-dense+rotary (pretrained) | 12.0 | 60/500 | 50.0 | — | 4,000,000 | 1 |",
        '| always "London" | 5.0 | | | 5.0 | | |',
        '| always "Paris" (most common training answer) | 3.4 | | | | | |',
        "",
        "Total wall time 4063 s; the assignment's model has 3,323,392 parameters with its vocabulary of 256.",
    ]
    summary["data"]["eval_questions"] = 1  # "1 evaluation questions" (stop-40 audit)
    assert results_markdown(summary).splitlines()[0].endswith(", 1 evaluation question)")
    summary["baselines"]["most_common_answer"] = "London"  # one row for that baseline, not two
    assert [line for line in results_markdown(summary).splitlines() if "always" in line] == [
        '| always "London" | 5.0 | | | 5.0 | | |']
    # A "|" in the answer is escaped: written raw, it split the row into more cells than the header's (stop-40 audit).
    summary["baselines"]["most_common_answer"] = "Saint-Denis | Réunion"
    assert [line for line in results_markdown(summary).splitlines() if "most common" in line] == [
        '| always "Saint-Denis \\| Réunion" (most common training answer) | 3.4 | | | | | |']


# ---- --resume ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("change, needle", [
    ({"warmup_tokens": 0}, "warmup_steps 1 → 0"),
    ({"decay_epochs": 1.0}, "decay_steps 6 → 2"),
])
def test_resume_refuses_a_changed_schedule(tmp_path, change, needle):
    files = _files(tmp_path)
    out = tmp_path / "out"
    run_knowledge(out, variants="none", **files, overrides=TINY, **_quiet())
    with pytest.raises(ConfigError, match="resume with the same") as error:
        run_knowledge(out, variants="none", **files, overrides={**TINY, **change}, resume=True, **_quiet())
    assert needle in str(error.value), str(error.value)


def test_resume_refuses_changed_fine_tuning_pairs(tmp_path):
    """Other answers with the same characters (the vocabulary is unchanged): the fine-tuning data changed."""
    out = tmp_path / "out"
    run_knowledge(out, variants="none", **_files(tmp_path), overrides=TINY, **_quiet())
    swapped = ["Oslo", "Lyon", *BORN[2:]]
    with pytest.raises(ConfigError, match=r"finetune-none was trained with other settings \(the data"):
        run_knowledge(out, variants="none", **_files(tmp_path, born=swapped), overrides=TINY, resume=True, **_quiet())


# ---- torchrun's world ------------------------------------------------------------------------------------------


def test_env_world_reads_torchruns_variables(monkeypatch):
    from attnlab.training.distributed import World, env_world

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert env_world() == World(0, 1, 0) and not env_world().distributed and env_world().is_main
    # The second node's first process of 2 nodes × 2 processes.
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    w = env_world()
    assert (w.rank, w.size, w.local_rank) == (2, 4, 0) and w.distributed and not w.is_main
    monkeypatch.setenv("WORLD_SIZE", "")  # empty: unset
    monkeypatch.setenv("RANK", "")
    assert env_world().size == 1 and env_world().rank == 0
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="WORLD_SIZE='two' is not an integer"):
        env_world()


class _FakeDist:
    """Two processes' collectives, seen from rank 0: the other process holds `peer`'s values."""

    class ReduceOp:
        SUM = "sum"

    def __init__(self, peer_tensor=None, peer_bytes=b""):
        self.peer_tensor, self.peer_bytes = peer_tensor, peer_bytes
        self.ops = []

    def get_backend(self):
        return "gloo"

    def all_reduce(self, tensor, op):
        self.ops.append(op)
        assert op == "sum"
        tensor += self.peer_tensor

    def all_gather(self, outputs, tensor):
        if tensor.dtype == torch.long:  # the lengths
            theirs = torch.tensor([len(self.peer_bytes)], dtype=torch.long)
        else:
            theirs = torch.zeros_like(tensor)
            theirs[: len(self.peer_bytes)] = torch.tensor(list(self.peer_bytes), dtype=torch.uint8)
        outputs[0].copy_(tensor)
        outputs[1].copy_(theirs)

    def barrier(self):
        self.ops.append("barrier")


def test_collectives_sum_and_gather_in_rank_order(monkeypatch):
    import attnlab.training.distributed as distributed

    monkeypatch.setattr(distributed, "world", lambda: distributed.World(0, 2, 0))
    fake = _FakeDist(peer_tensor=torch.tensor([3.0, 1.0]), peer_bytes=b"longer state")
    monkeypatch.setattr(distributed, "dist", fake)
    assert distributed.all_reduce_sum(torch.tensor([1.0, 2.0])).tolist() == [4.0, 3.0]  # summed, not averaged
    assert distributed.all_gather_bytes(b"mine") == [b"mine", b"longer state"]
    distributed.barrier()
    assert fake.ops == ["sum", "barrier"]
    # One process: nothing to talk to.
    monkeypatch.setattr(distributed, "world", lambda: distributed.World())
    assert distributed.all_gather_bytes(b"x") == [b"x"] and distributed.all_reduce_sum(torch.ones(1)).item() == 1.0
    distributed.barrier()
    assert fake.ops == ["sum", "barrier"]


# ---- the command ---------------------------------------------------------------------------------------------


def test_run_knowledge_command_passes_its_options(monkeypatch, tmp_path):
    import attnlab.experiments.knowledge as knowledge
    from attnlab.cli import main

    calls = []
    monkeypatch.setattr(knowledge, "run_knowledge", lambda out, **kwargs: calls.append((out, kwargs)))
    main(["run", "knowledge", "--out", str(tmp_path / "k"), "--quiet", "--seed", "7", "--resume", "--variants", "dot",
          "--scale", "full", "--predict", "q.tsv", "--set", "n_people=9", "--set", "dropout=0.2", "--device", "cpu"])
    main(["run", "knowledge"])
    (out, given), (default_out, defaults) = calls
    assert out == str(tmp_path / "k") and given == {
        "scale": "full", "variants": "dot", "corpus": None, "train": None, "eval_path": None, "predict": "q.tsv",
        "seed": 7, "device": "cpu", "overrides": {"n_people": 9, "dropout": 0.2}, "resume": True, "progress": False}
    assert default_out == "runs/knowledge" and defaults == {
        "scale": "quick", "variants": "none,dot,synthesizer-dense", "corpus": None, "train": None, "eval_path": None,
        "predict": None, "seed": 0, "device": "auto", "overrides": {}, "resume": False, "progress": True}


def test_collectives_move_tensors_to_the_backends_device(monkeypatch):
    """A tensor on another device than the backend's is summed through a copy, and summed all the same."""
    import attnlab.training.distributed as distributed

    monkeypatch.setattr(distributed, "world", lambda: distributed.World(0, 2, 0))
    monkeypatch.setattr(distributed, "dist", _FakeDist(peer_tensor=torch.tensor([3.0, 1.0])))
    monkeypatch.setattr(distributed, "_comm_device", lambda: torch.device("cpu", 0))  # not torch.device("cpu")
    assert distributed.all_reduce_sum(torch.tensor([1.0, 2.0])).tolist() == [4.0, 3.0]


def test_each_process_uses_the_gpu_of_its_local_rank(monkeypatch):
    """Process 3 of 4 is the second process of its node (LOCAL_RANK 1): GPU 1, not GPU 3."""
    import attnlab.training.distributed as distributed

    for name, value in (("RANK", "3"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(name, value)
    fake = _FakeDist()
    fake.is_available = lambda: True
    fake.is_initialized = lambda: True  # joined already: nothing to initialise
    monkeypatch.setattr(distributed, "dist", fake)
    monkeypatch.setattr(distributed, "world", lambda: distributed.World(3, 4, 1))
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    w, dev = distributed.init_distributed("auto")
    assert w.rank == 3 and dev == torch.device("cuda", 1) and chosen == [torch.device("cuda", 1)]
