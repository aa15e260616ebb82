"""`attnlab run knowledge`: the real-data path end to end on files the test writes, the variants, the
scales (the assignment's parameter count), and the trimming of pad columns (same loss, fewer columns)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from attnlab.cli import main
from attnlab.data.knowledge import IGNORE, KnowledgeVocab, QASource, SpanCorruptionSource
from attnlab.data.world import make_world
from attnlab.errors import ConfigError, DataError
from attnlab.experiments.knowledge import (
    ASSIGNMENT_VOCAB,
    SCALES,
    Variant,
    parameter_count,
    parse_variants,
    run_knowledge,
    scale_settings,
)
from attnlab.models.gpt import GPT, GPTConfig

TINY = {"n_layers": 1, "n_heads": 2, "d_model": 32, "block_size": 64, "pretrain_epochs": 2,
        "pretrain_batch": 8, "finetune_batch": 8, "finetune_epochs_scratch": 2, "finetune_epochs_pretrained": 1,
        "precision": "fp32"}

PLACES = ["Lyon", "Oslo", "Porto", "Quito", "Accra", "Hanoi"]
NAMES = ["Ada Varn", "Bo Tesk", "Cy Mordo", "Di Lansk", "Ed Pirro", "Fa Quell", "Gus Orme", "Hal Ytte"]


def write_files(tmp_path):
    corpus = [f"{n}. {n} is a painter born in {PLACES[i % 6]} ." for i, n in enumerate(NAMES)]
    (tmp_path / "wiki.txt").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    qa = [f"Where was {n} born?\t{PLACES[i % 6]}" for i, n in enumerate(NAMES)]
    (tmp_path / "train.tsv").write_text("\n".join(qa[:5]) + "\n", encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("\n".join(qa[5:]) + "\n", encoding="utf-8")
    (tmp_path / "test.tsv").write_text("Where was Ada Varn born?\nWhere was Gus Orme born?\t\n", encoding="utf-8")
    return {k: str(tmp_path / f) for k, f in
            (("corpus", "wiki.txt"), ("train", "train.tsv"), ("eval", "dev.tsv"), ("predict", "test.tsv"))}


def test_real_data_path_end_to_end(tmp_path):
    files = write_files(tmp_path)
    out = tmp_path / "out"
    summary = run_knowledge(out, variants="none,dot", corpus=files["corpus"], train=files["train"],
                            eval_path=files["eval"], predict=files["predict"], device="cpu", overrides=TINY,
                            progress=False, echo=lambda *_: None)
    assert summary["data"] == {**summary["data"], "source": "files", "documents": 8, "train_questions": 5,
                               "eval_questions": 3, "predict_questions": 2}
    rows = {r["variant"]: r for r in summary["variants"]}
    assert set(rows) == {"none", "dot"} and rows["dot"]["pretrained"] and not rows["none"]["pretrained"]
    assert "pretrain" in rows["dot"] and "pretrain" not in rows["none"]
    for r in rows.values():
        assert 0.0 <= r["accuracy"] <= 100.0 and r["correct"] == round(r["accuracy"] * 3 / 100)
    assert summary["baselines"]["london"] == 0.0
    assert summary["assignment_parameters"] == 3_323_392
    # The vocabulary is the assignment's: the corpus file's characters, its line end among them, with pad and mask
    # (the questions bring "W", "h", "?" and the like the biographies lack).
    text = Path(files["corpus"]).read_text(encoding="utf-8") + Path(files["train"]).read_text(encoding="utf-8")
    assert summary["data"]["vocab_size"] == len(set(text) - {"\t"}) + 2
    for name in ("results.md", "results.json", "curves.png", "accuracy.png", "predictions/none.tsv",
                 "predictions/dot.tsv", "predictions/dot.predict.tsv", "pretrain-dot/checkpoint/model.safetensors",
                 "finetune-dot/checkpoint/model.safetensors", "finetune-none/metrics.jsonl"):
        assert (out / name).exists(), name
    assert json.loads((out / "results.json").read_text())["variants"][1]["variant"] == "dot"
    table = (out / "results.md").read_text()
    assert "| no pretraining |" in table and "| dot (pretrained) |" in table and "22.2" in table
    dev_rows = (out / "predictions" / "dot.tsv").read_text().splitlines()
    assert dev_rows[0] == "line\tquestion\tprediction\tanswer\tcorrect" and len(dev_rows) == 4
    predicted = (out / "predictions" / "dot.predict.tsv").read_text().splitlines()
    assert predicted[0] == "line\tquestion\tprediction" and predicted[1].startswith("1\tWhere was Ada Varn born?\t")

    # --resume skips the finished phases and gives the same table.
    again = run_knowledge(out, variants="none,dot", corpus=files["corpus"], train=files["train"],
                          eval_path=files["eval"], device="cpu", overrides=TINY, progress=False, resume=True,
                          echo=lambda *_: None)
    assert [r["accuracy"] for r in again["variants"]] == [r["accuracy"] for r in summary["variants"]]
    assert again["variants"][1]["pretrain"].get("skipped")
    # The skipped phases keep the time their checkpoints record: a resume that only redrew the table wrote 0 s for
    # every phase and row, and a total of the resume's own seconds.
    from attnlab.training.checkpoint import read_trainer_state

    for resumed in again["variants"]:
        phases = [resumed[kind] for kind in ("pretrain", "finetune") if kind in resumed]
        for kind in ("pretrain", "finetune"):
            if kind in resumed:
                recorded = read_trainer_state(out / f"{kind}-{resumed['variant']}")["elapsed"]
                assert resumed[kind]["wall_time_s"] == pytest.approx(recorded) and recorded > 0
        assert resumed["wall_time_s"] > sum(p["wall_time_s"] for p in phases)
    assert again["wall_time_s"] > sum(r["wall_time_s"] for r in again["variants"])
    # ... and the figures of each skipped phase's training, which results.json left out (None) after a resume.
    for first, resumed in zip(summary["variants"], again["variants"]):
        for kind in ("pretrain", "finetune"):
            if kind in first:
                assert resumed[kind]["final_train_loss"] == first[kind]["final_train_loss"] is not None
                assert resumed[kind]["tokens_per_s"] == pytest.approx(first[kind]["tokens_per_s"], rel=1e-6)

    # ... but only phases trained with this run's settings, model and data: another one is refused in one
    # message, before anything is trained or written (it was reused silently, results.json naming the new
    # settings).
    before = (out / "results.json").read_text()
    corpus_changed = tmp_path / "wiki2.txt"
    corpus_changed.write_text(Path(files["corpus"]).read_text().replace("painter", "pointer"), encoding="utf-8")
    for overrides, corpus, needle in [
        ({**TINY, "finetune_lr": 0.5}, files["corpus"], "lr 0.0005 → 0.5"),
        ({**TINY, "pretrain_lr": 0.01}, files["corpus"], "pretrain-dot was trained with other settings (lr 0.003"),
        ({**TINY, "dropout": 0.25}, files["corpus"], "model.dropout 0.0 → 0.25"),
        (TINY, str(corpus_changed), "the data"),
    ]:
        with pytest.raises(ConfigError, match="resume with the same") as error:
            run_knowledge(out, variants="dot", corpus=corpus, train=files["train"], eval_path=files["eval"],
                          device="cpu", overrides=overrides, progress=False, resume=True, echo=lambda *_: None)
        assert needle in str(error.value), str(error.value)
    with pytest.raises(ConfigError, match="seed 0 → 1"):
        run_knowledge(out, variants="none", corpus=files["corpus"], train=files["train"], eval_path=files["eval"],
                      device="cpu", overrides=TINY, progress=False, resume=True, seed=1, echo=lambda *_: None)
    assert (out / "results.json").read_text() == before


def test_synthetic_world_default_and_cli(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = Path("synthetic")  # relative, as typed
    args = ["run", "knowledge", "--out", str(out), "--variants", "none,synthesizer-dense", "--device", "cpu",
            "--quiet", "--set", "n_people=24"]
    for key, value in TINY.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    main(args)  # returns normally on success
    printed = capsys.readouterr().out
    assert "| synthesizer-dense (pretrained) |" in printed and "always \"London\"" in printed
    for name in ("data/corpus.txt", "data/train.tsv", "data/dev.tsv"):
        assert (out / name).is_file()
    summary = json.loads((out / "results.json").read_text())
    assert summary["data"]["documents"] == 24 and summary["data"]["eval_questions"] == 12
    # results.json names the files absolutely, whatever folder it is read from
    # ... under the keys the flags' files have (--corpus, --train, --eval), so one reader serves both kinds of run
    assert summary["data"]["files"] == {name: str(tmp_path / "synthetic" / "data" / file) for name, file in
                                        (("corpus", "corpus.txt"), ("train", "train.tsv"), ("eval", "dev.tsv"))}
    # --resume with a --predict file of new characters: the vocabulary is the training data's, so the finished
    # phases answer; the question they cannot read is answered with nothing, said once.
    questions = tmp_path / "questions.tsv"
    questions.write_text("Where was Zo\u00eb \u00dcnal born?\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="1 of 1 questions of --predict hold characters"):
        main([*args, "--resume", "--predict", str(questions)])
    answered = (out / "predictions" / "none.predict.tsv").read_text(encoding="utf-8").splitlines()
    assert answered == ["line\tquestion\tprediction", "1\tWhere was Zo\u00eb \u00dcnal born?\t"]


def test_cli_errors_are_one_line(tmp_path, capsys):
    files = write_files(tmp_path)
    given = ["--corpus", files["corpus"], "--train", files["train"], "--eval", files["eval"]]
    cases = [
        (["--variants", "dot,bogus"], "unknown variant 'bogus'"),
        (["--scale", "huge"], "unknown scale"),
        (["--corpus", files["corpus"]], "needs --corpus, --train and --eval together"),
        (["--corpus", str(tmp_path / "missing.txt"), "--train", files["train"], "--eval", files["eval"]],
         "missing.txt"),
        (["--set", "n_peple=3"], "n_peple"),
        (["--seed", str(2**64)], "--seed must be an integer from 0 to 2**63 - 1"),
        (["--variants", "dot+synthesizer-dense+rotary"], "names two attention variants (dot and synthesizer-dense)"),
        (["--variants", "rotary+alibi"], "names two position schemes (rotary and alibi)"),
        # the world's settings with the user's files: said in the header and results as changes, and ignored
        ([*given, "--set", "n_people=600", "--set", "eval_fraction=0.9"],
         "n_people and eval_fraction shape the synthetic world, which --corpus, --train and --eval replace; drop "
         "--set n_people and --set eval_fraction"),
    ]
    for extra, needle in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(["run", "knowledge", "--out", str(tmp_path / "o"), *extra])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2, (extra, err)
        assert needle in err and len(err.strip().splitlines()) == 1, err


def test_variants_parse():
    rows = parse_variants("none,dot,synthesizer-dense,rotary,bilinear+alibi,dot")
    assert [r.name for r in rows] == ["none", "dot", "synthesizer-dense", "rotary", "bilinear+alibi"]
    assert rows[3] == Variant("rotary", True, "dot", "rotary")
    assert rows[4].attention == "bilinear" and rows[4].position == "alibi"
    assert [r.name for r in parse_variants(None)] == ["none", "dot", "synthesizer-dense"]
    with pytest.raises(ConfigError, match="unknown variant"):
        parse_variants("dot,nope")
    # One attention variant and one position scheme per row: a second one used to replace the first silently,
    # under the row's full name.
    with pytest.raises(ConfigError, match="give them as separate rows, e.g. --variants bilinear,synthesizer-dense"):
        parse_variants("bilinear+alibi+synthesizer-dense")


def test_scales():
    full = SCALES["full"]
    # The assignment: 4 layers, 8 heads, 256 wide, block 128; 650 pretraining epochs of batch 128 at 6e-3;
    # fine-tuning batch 256 at 6e-4 for 75 epochs from scratch or 10 after pretraining.
    assert (full.n_layers, full.n_heads, full.d_model, full.block_size) == (4, 8, 256, 128)
    assert (full.pretrain_epochs, full.pretrain_batch, full.pretrain_lr) == (650, 128, 6e-3)
    assert (full.finetune_batch, full.finetune_lr, full.finetune_epochs_scratch,
            full.finetune_epochs_pretrained) == (256, 6e-4, 75, 10)
    assert full.warmup_tokens == 512 * 20 and full.decay_epochs == 200
    assert parameter_count(full, ASSIGNMENT_VOCAB, Variant("dot", True)) == 3_323_392
    # Every variant a user can name is counted (on the meta device: no weights are made), exactly.
    from attnlab.modules.positions import POSITIONS
    from attnlab.modules.variants import VARIANTS

    quick = SCALES["quick"]
    for name in [*VARIANTS.names(), *POSITIONS.names()]:
        variant = parse_variants(name)[0]
        with torch.random.fork_rng():
            built = GPT(GPTConfig(vocab_size=70, block_size=quick.block_size, d_model=quick.d_model,
                                  n_heads=quick.n_heads, n_layers=quick.n_layers, attention=variant.attention,
                                  position=variant.position, tie_embeddings=False))
        assert parameter_count(quick, 70, variant) == sum(p.numel() for p in built.parameters()), name
    assert scale_settings("quick", {"n_people": 50}).n_people == 50
    with pytest.raises(ConfigError):
        scale_settings("quick", {"n_people": 0})


@pytest.mark.parametrize("source_kind", ["span", "qa"])
def test_trimmed_batches_give_the_same_loss_and_gradient(source_kind):
    docs = ["Ada Varn. Ada Varn is a painter born in Lyon .", "Bo Tesk. Born in Oslo , Bo Tesk sings .", "Cy."]
    pairs = [("Where was Ada Varn born?", "Lyon"), ("Where was Bo born?", "Oslo")]
    vocab = KnowledgeVocab.from_texts("".join(docs), "".join(q + a for q, a in pairs))
    if source_kind == "span":
        full, trimmed = (SpanCorruptionSource(docs, vocab, 96, 3, seed=1, trim=t) for t in (False, True))
    else:
        full, trimmed = (QASource(pairs, vocab, 96, 2, seed=1, trim=t) for t in (False, True))
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab.vocab_size, block_size=96, d_model=16, n_heads=2, n_layers=1))
    for step in range(3):
        a, b = full.batch(step), trimmed.batch(step)
        assert a["input_ids"].shape[1] == 96 and b["input_ids"].shape[1] < 96
        assert torch.equal(a["input_ids"][:, : b["input_ids"].shape[1]], b["input_ids"])
        assert (a["labels"][:, b["labels"].shape[1]:] == IGNORE).all()
        grads = []
        for batch in (a, b):
            model.zero_grad()
            loss = model(**batch).loss
            loss.backward()
            grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
        torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-5, atol=1e-6)
        for g1, g2 in zip(grads[0][1], grads[1][1]):
            torch.testing.assert_close(g1, g2, rtol=1e-4, atol=1e-6)


def test_a_new_run_in_an_old_folder_warns_and_leaves_no_stale_rows(tmp_path):
    files = write_files(tmp_path)
    out = tmp_path / "out"
    args = dict(corpus=files["corpus"], train=files["train"], eval_path=files["eval"], device="cpu", overrides=TINY,
                progress=False, echo=lambda *_: None)
    run_knowledge(out, variants="none,dot", **args)
    with pytest.warns(UserWarning, match="already holds the results of a knowledge run"):
        summary = run_knowledge(out, variants="none", **args)
    assert [r["variant"] for r in summary["variants"]] == ["none"]
    # The dot row's folders and predictions were the earlier run's: they must not sit beside the new table.
    assert not (out / "pretrain-dot").exists() and not (out / "finetune-dot").exists()
    assert sorted(p.name for p in (out / "predictions").iterdir()) == ["none.tsv"]


def test_a_run_from_files_replacing_a_synthetic_one_leaves_no_stale_data(tmp_path):
    # The synthetic world's data/ stayed beside the results of a run from files, where the README says data/ holds
    # the data the run used (stop-33 knowledge audit).
    files = write_files(tmp_path)
    out = tmp_path / "out"
    make_world(20, 3).write(out / "data", 0.5, 3)  # a generated world, with its mark
    (out / "results.json").write_text("{}", encoding="utf-8")
    with pytest.warns(UserWarning, match="already holds the results of a knowledge run"):
        run_knowledge(out, variants="none", corpus=files["corpus"], train=files["train"], eval_path=files["eval"],
                      device="cpu", overrides=TINY, progress=False, echo=lambda *_: None)
    assert not (out / "data").exists()


def test_an_empty_predict_file_is_described_as_it_is_read(tmp_path):
    from attnlab.data.knowledge import read_qa_lines

    empty = tmp_path / "ask.tsv"
    empty.write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="the questions, one a line \\(an answer after a tab is optional\\)"):
        read_qa_lines(empty, require_answers=False)
    with pytest.raises(DataError, match="should hold the 'question<TAB>answer' lines"):
        read_qa_lines(empty)


def test_resume_looks_only_at_the_requested_rows(tmp_path):
    # A phase folder of a row not asked for (left by an earlier run) was compared too and blamed the files.
    from attnlab.data.knowledge import KnowledgeVocab

    files = write_files(tmp_path)
    out = tmp_path / "out"
    args = dict(corpus=files["corpus"], train=files["train"], eval_path=files["eval"], device="cpu", overrides=TINY,
                progress=False, echo=lambda *_: None)
    first = run_knowledge(out, variants="none", **args)
    (out / "finetune-alibi" / "checkpoint").mkdir(parents=True)
    KnowledgeVocab.from_texts("xyz").to_tokenizer().save(out / "finetune-alibi" / "checkpoint")
    again = run_knowledge(out, variants="none", resume=True, **args)
    assert again["variants"][0]["finetune"].get("skipped")
    assert again["variants"][0]["accuracy"] == first["variants"][0]["accuracy"]
    with pytest.raises(ConfigError, match="--resume: the files give a vocabulary of .* finetune-alibi was trained"):
        run_knowledge(out, variants="none,alibi", resume=True, **args)


def test_resume_after_a_changed_world_names_the_data(tmp_path):
    # It was reported as a vocabulary change of the files, though no file was given (--set n_people changed).
    out = tmp_path / "out"
    small = {**TINY, "n_people": 12, "pretrain_epochs": 1}
    run_knowledge(out, variants="none", device="cpu", overrides=small, progress=False, echo=lambda *_: None)
    with pytest.raises(ConfigError, match=r"the data \(other files, or a world of another --seed or n_people\)"):
        run_knowledge(out, variants="none", device="cpu", overrides={**small, "n_people": 16}, progress=False,
                      resume=True, echo=lambda *_: None)


def test_a_new_run_over_an_unfinished_one_leaves_no_stale_rows(tmp_path):
    """A run stopped before its table (no results.json) left phase folders and predictions; a new run without
    --resume kept the ones of variants it does not run beside its own table. It warns and removes them."""
    files = write_files(tmp_path)
    out = tmp_path / "out"
    args = dict(corpus=files["corpus"], train=files["train"], eval_path=files["eval"], device="cpu", overrides=TINY,
                progress=False, echo=lambda *_: None)
    run_knowledge(out, variants="none,dot", **args)
    for name in ("results.json", "results.md", "curves.png", "accuracy.png"):
        (out / name).unlink()  # as a run interrupted after its last phase leaves the folder
    (out / "pretrain-notes.txt").write_text("the user's", encoding="utf-8")  # not a phase folder: kept
    with pytest.warns(UserWarning, match=r"already holds an unfinished knowledge run \(predictions, pretrain-dot"):
        summary = run_knowledge(out, variants="none", **args)
    assert [r["variant"] for r in summary["variants"]] == ["none"]
    assert not (out / "pretrain-dot").exists() and not (out / "finetune-dot").exists()
    assert sorted(p.name for p in (out / "predictions").iterdir()) == ["none.tsv"]
    assert (out / "pretrain-notes.txt").is_file()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fresh folder, or --resume, has nothing to replace
        run_knowledge(tmp_path / "fresh", variants="none", **args)
        run_knowledge(out, variants="none", resume=True, **args)


def test_bf16_on_a_cpu_without_it_is_warned_once_not_once_per_phase(tmp_path, monkeypatch):
    from attnlab.training import device
    from attnlab.training.device import SlowPrecisionWarning

    monkeypatch.setattr(device, "cpu_has_bf16", lambda: False)
    small = {**TINY, "precision": "bf16", "n_people": 12, "pretrain_epochs": 1}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning raised counts, none is folded by location
        run_knowledge(tmp_path / "out", variants="none,dot", device="cpu", overrides=small, progress=False,
                      echo=lambda *_: None)
    slow = [w for w in caught if issubclass(w.category, SlowPrecisionWarning)]
    assert len(slow) == 1, [str(w.message) for w in caught]


def test_the_table_says_which_settings_differ_from_the_scale():
    # After --set the header and results.md still read "scale quick", beside the course notes' figures.
    from attnlab.experiments.knowledge import changed_settings, scale_label, scale_settings

    settings = scale_settings("quick", {"n_people": 40, "pretrain_epochs": 16})
    changed = changed_settings("quick", settings)
    assert changed == {"n_people": 40, "pretrain_epochs": 16}
    assert scale_label("quick", changed) == "quick with n_people=40, pretrain_epochs=16"
    assert scale_label("quick", changed_settings("quick", scale_settings("quick"))) == "quick"


def test_a_run_names_the_settings_set_changed_everywhere(tmp_path):
    # scale_label and changed_settings were tested alone: the header, results.json and results.md must use them.
    from attnlab.experiments.knowledge import changed_settings

    files = write_files(tmp_path)
    out, lines = tmp_path / "out", []
    summary = run_knowledge(out, variants="none", corpus=files["corpus"], train=files["train"],
                            eval_path=files["eval"], device="cpu", overrides=TINY, progress=False, echo=lines.append)
    expected = changed_settings("quick", scale_settings("quick", TINY))
    assert expected and summary["changed_settings"] == expected
    assert json.loads((out / "results.json").read_text(encoding="utf-8"))["changed_settings"] == expected
    assert (out / "results.md").read_text(encoding="utf-8").startswith("Knowledge access (scale quick with n_layers=1")
    assert any(line.startswith("knowledge access, scale quick with n_layers=1") for line in lines)


def _interrupted_run(tmp_path, monkeypatch, at_call: int):
    """A files run of the "none" row stopped by Ctrl-C at the `at_call`-th training step (its checkpoint saved);
    returns its folder and the arguments that continue it."""
    from attnlab.training import TrainingInterrupted
    from attnlab.training.trainer import Trainer

    files = write_files(tmp_path)
    out = tmp_path / "out"
    args = dict(corpus=files["corpus"], train=files["train"], eval_path=files["eval"], device="cpu",
                overrides={**TINY, "finetune_epochs_scratch": 4}, progress=False, echo=lambda *_: None)
    step, calls = Trainer._train_step, {"n": 0}

    def interrupted(self, n):
        calls["n"] += 1
        if calls["n"] == at_call:
            raise KeyboardInterrupt
        return step(self, n)

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "_train_step", interrupted)
        with pytest.raises(TrainingInterrupted):
            run_knowledge(out, variants="none", **args)
    return out, args


def test_a_continued_phase_counts_the_time_spent_before(tmp_path, monkeypatch):
    # A phase interrupted and continued by --resume counts its checkpoint's elapsed time, as a skipped one does;
    # its row and the total count it too. (Only skipped phases were tested, and rows only against their phases.)
    out, args = _interrupted_run(tmp_path, monkeypatch, at_call=2)
    state_file = out / "finetune-none" / "checkpoint" / "trainer_state.json"
    state = json.loads(state_file.read_text(encoding="utf-8"))
    assert state["step"] == 1
    state["elapsed"] = 1000.0  # a phase that had run for a while: far more than this test takes
    state_file.write_text(json.dumps(state), encoding="utf-8")
    summary = run_knowledge(out, variants="none", resume=True, **args)
    row = summary["variants"][0]
    assert row["finetune"]["earlier_s"] == 1000.0 and not row["finetune"].get("skipped")
    assert row["finetune"]["wall_time_s"] > 1000.0
    assert row["wall_time_s"] > row["finetune"]["wall_time_s"] and summary["wall_time_s"] > row["wall_time_s"]


def test_a_resumed_row_whose_phases_are_all_done_answers_on_the_device_asked_for(tmp_path, monkeypatch):
    """--resume loads a finished row's checkpoint into a model built on the CPU; with no trainer to move it, its
    questions were answered there, not on the GPU asked for (found by the stop-32 CUDA audit). The meta device
    stands in for a GPU: what matters is where the model is when the questions are asked."""
    import attnlab.experiments.knowledge as K
    import attnlab.training.device as device_module

    files = write_files(tmp_path)
    args = dict(variants="none", corpus=files["corpus"], train=files["train"], eval_path=files["eval"],
                overrides=TINY, progress=False, echo=lambda *_: None)
    run_knowledge(tmp_path / "out", device="cpu", **args)
    seen = []

    def answers(model, vocab, questions, **_):
        seen.append(next(model.parameters()).device.type)
        return [""] * len(questions)

    monkeypatch.setattr(K, "answer_questions", answers)
    monkeypatch.setattr(device_module, "select_device", lambda name=None: torch.device("meta"))
    run_knowledge(tmp_path / "out", device="cpu", resume=True, **args)
    assert seen and set(seen) == {"meta"}


def test_a_phase_whose_save_crashed_between_its_renames_resumes_from_the_old_copy(tmp_path, monkeypatch):
    """A crash between the two renames of a save leaves only .checkpoint.old, which `attnlab train --resume`
    continues from; the knowledge run retrained that phase from step 0 and deleted the copy."""
    from attnlab.training.trainer import Trainer

    out, args = _interrupted_run(tmp_path, monkeypatch, at_call=3)
    phase = out / "finetune-none"
    (phase / "checkpoint").rename(phase / ".checkpoint.old")
    resumed, real_fit = [], Trainer.fit

    def fit(self, *a, **kw):
        summary = real_fit(self, *a, **kw)
        resumed.append(summary["start_step"])
        return summary

    monkeypatch.setattr(Trainer, "fit", fit)
    run_knowledge(out, variants="none", resume=True, **args)
    assert resumed == [2]


def test_a_data_folder_of_the_users_own_files_is_never_replaced(tmp_path):
    """A project folder given as --out, the user's files in its data/: the run deleted data/ with its inputs,
    calling it "an unfinished knowledge run". A synthetic run, which writes its world into data/, is refused."""
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    files = write_files(project / "data")
    (project / "notes.txt").write_text("mine\n", encoding="utf-8")
    before = {p.name: p.read_bytes() for p in (project / "data").iterdir()}
    args = dict(device="cpu", overrides=TINY, progress=False, echo=lambda *_: None)
    for _ in range(2):  # into the bare folder, then beside the first run's results
        run_knowledge(project, variants="none", corpus=files["corpus"], train=files["train"],
                      eval_path=files["eval"], **args)
        assert {p.name: p.read_bytes() for p in (project / "data").iterdir()} == before
        assert (project / "notes.txt").is_file() and (project / "results.json").is_file()
    # A synthetic run would write corpus.txt, train.tsv and dev.tsv over them
    with pytest.raises(ConfigError, match="data' holds files that are not an earlier knowledge run's synthetic"):
        run_knowledge(project, variants="none", **args)
    assert {p.name: p.read_bytes() for p in (project / "data").iterdir()} == before


def test_the_users_files_under_the_worlds_names_are_never_replaced(tmp_path):
    """The user's data/corpus.txt, train.tsv and dev.tsv were taken for an earlier run's generated world by their
    names alone: a synthetic run wrote its world over them, a run from copies elsewhere deleted the folder."""
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    files = write_files(project / "data")
    (project / "data" / "wiki.txt").rename(project / "data" / "corpus.txt")
    (project / "data" / "test.tsv").unlink()
    before = {p.name: p.read_bytes() for p in (project / "data").iterdir()}
    args = dict(variants="none", device="cpu", overrides=TINY, progress=False, echo=lambda *_: None)
    mine = {"corpus": str(project / "data" / "corpus.txt"), "train": files["train"], "eval_path": files["eval"]}
    run_knowledge(project, **mine, **args)
    with pytest.raises(ConfigError, match="data' holds files that are not an earlier knowledge run's synthetic"):
        run_knowledge(project, **args)
    elsewhere = write_files(tmp_path)
    run_knowledge(project, corpus=elsewhere["corpus"], train=elsewhere["train"], eval_path=elsewhere["eval"],
                  **args)
    assert {p.name: p.read_bytes() for p in (project / "data").iterdir()} == before


def test_resuming_never_writes_the_world_over_the_users_files(tmp_path):
    """--resume skipped the data/ check, and the world was written over the user's corpus.txt, train.tsv, dev.tsv."""
    out = tmp_path / "out"
    (out / "data").mkdir(parents=True)
    mine = {name: f"my own {name}\n" for name in ("corpus.txt", "train.tsv", "dev.tsv")}
    for name, text in mine.items():
        (out / "data" / name).write_text(text, encoding="utf-8")
    args = dict(variants="none", device="cpu", overrides=TINY, progress=False, echo=lambda *_: None)
    with pytest.raises(ConfigError, match="data' holds files that are not an earlier knowledge run's synthetic"):
        run_knowledge(out, resume=True, **args)
    assert {name: (out / "data" / name).read_text(encoding="utf-8") for name in mine} == mine


def test_a_world_written_before_the_mark_or_alone_is_still_the_runs(tmp_path):
    """A run stopped after writing its marked world, before any phase folder, was refused on the rerun; a world
    written before the mark (the same files, no world.json) resumes."""
    from attnlab.data.world import WORLD_MARK

    out = tmp_path / "out"
    args = dict(variants="none", device="cpu", overrides=TINY, progress=False, echo=lambda *_: None)
    run_knowledge(out, **args)
    world = {p.name: p.read_bytes() for p in (out / "data").iterdir()}
    for path in out.iterdir():  # as if stopped before the first phase: the marked world alone
        if path.name not in ("data", ".attnlab.lock"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    run_knowledge(out, **args)
    assert {p.name: p.read_bytes() for p in (out / "data").iterdir()} == world
    (out / "data" / WORLD_MARK).unlink()  # a world from before the mark
    run_knowledge(out, resume=True, **args)
    assert (out / "data" / WORLD_MARK).is_file() and (out / "results.json").is_file()


def test_a_file_browsers_own_files_do_not_make_an_earlier_runs_folders_the_users(tmp_path):
    """A .DS_Store in predictions/ kept the earlier run's rows beside the new table; in data/ it refused a rerun."""
    out = tmp_path / "run"
    args = dict(device="cpu", overrides=TINY, progress=False, echo=lambda *_: None)
    run_knowledge(out, variants="none,dot", **args)
    assert (out / "predictions" / "dot.tsv").is_file() and (out / "data" / "world.json").is_file()
    for folder in ("predictions", "data", "pretrain-dot"):
        (out / folder / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    with pytest.warns(UserWarning, match="already holds the results of a knowledge run"):
        run_knowledge(out, variants="none", **args)
    assert not (out / "predictions" / "dot.tsv").exists() and not (out / "pretrain-dot").exists()
    assert (out / "predictions" / "none.tsv").is_file() and (out / "data" / "corpus.txt").is_file()


def test_one_knowledge_run_at_a_time_in_a_folder(tmp_path):
    from attnlab.files import folder_lock

    out = tmp_path / "out"
    with folder_lock(out, "--out"):
        with pytest.raises(ConfigError, match="--out: another attnlab run is writing into"):
            run_knowledge(out, variants="none", device="cpu", overrides=TINY, progress=False, echo=lambda *_: None)
    with pytest.raises(ConfigError, match="--out is empty"):
        run_knowledge("", variants="none")
    # An empty path (an unset shell variable) had counted as not given: the synthetic experiment ran instead.
    for flag, key in (("--corpus", "corpus"), ("--train", "train"), ("--eval", "eval_path"), ("--predict", "predict")):
        with pytest.raises(ConfigError, match=f"^{flag} is empty; give the path of a file, or leave {flag} out$"):
            run_knowledge(tmp_path / "other", variants="none", **{key: " "})
    assert not (tmp_path / "other").exists()
