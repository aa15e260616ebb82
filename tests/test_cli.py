"""The command line end to end: every shipped config loads; train → generate → evaluate for a language
model, a classifier and a translation model on tiny data; bad input gets one line and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_helpers import run_cli

from attnlab.errors import DataError
from attnlab.training.recipe import load_run_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))
TINY = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu"]


def test_configs_exist():
    names = {p.name for p in CONFIGS}
    assert {"gpt-pydoc.toml", "gpt-text.toml", "encoder-classify.toml", "translate.toml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    run = load_run_config(path)
    assert run.train.steps > 0
    assert run.model  # model table resolved to a family or preset


def test_lm_train_generate_evaluate(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = run_cli(capsys, "train", "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=12",
                                "--set", f"train.out_dir={json.dumps(str(out))}", "--set", "train.eval_every=6",
                                *TINY)
    assert code == 0, err
    assert "final_train_loss" in stdout
    for name in ("run.json", "metrics.jsonl", "checkpoint/model.safetensors", "checkpoint/tokenizer.json",
                 "best/model.safetensors"):
        assert (out / name).exists(), name

    code, text, err = run_cli(capsys, "generate", str(out), "--prompt", "def ", "-n", "20", "--device", "cpu")
    assert code == 0, err
    assert text.startswith("def ") and len(text.rstrip("\n")) >= 4
    # Same seed, same text; greedy is deterministic too.
    assert run_cli(capsys, "generate", str(out), "--prompt", "def ", "-n", "20", "--device", "cpu")[1] == text
    code, greedy, _ = run_cli(capsys, "generate", str(out), "--prompt", "def ", "-n", "8", "--greedy",
                              "--device", "cpu")
    assert code == 0
    # Several prompts of different lengths: one batch, each text as it would be alone (greedy).
    code, other, _ = run_cli(capsys, "generate", str(out), "--prompt", "class Foo:", "-n", "8", "--greedy",
                             "--device", "cpu")
    code, both, err = run_cli(capsys, "generate", str(out), "--prompt", "def ", "--prompt", "class Foo:", "-n", "8",
                              "--greedy", "--device", "cpu")
    assert code == 0, err
    assert both == greedy.rstrip("\n") + "\n\n" + other
    for dtype in ("bf16", "fp16"):  # half-precision weights: same interface (tokens may differ by rounding)
        code, half, err = run_cli(capsys, "generate", str(out), "--prompt", "def ", "-n", "8", "--greedy",
                                  "--device", "cpu", "--dtype", dtype)
        assert code == 0, err
        assert half.startswith("def ")
    code, _, err = run_cli(capsys, "generate", str(out), "--prompt", "def ", "--dtype", "int3", "--device", "cpu")
    assert code == 2 and "dtype (--dtype): unknown value 'int3'" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "generate", str(out), "--prompt", "def ", "--beam-size", "3", "--device", "cpu")
    assert code == 2 and "--beam-size is for translation models" in err

    sample = tmp_path / "sample.txt"
    sample.write_text("The if statement is used for conditional execution.\n" * 4, encoding="utf-8")
    code, stdout, err = run_cli(capsys, "evaluate", str(out), "--data", str(sample), "--json", "--device", "cpu")
    assert code == 0, err
    metrics = json.loads(stdout)
    assert metrics["tokens"] == len(sample.read_text()) - 1
    assert metrics["perplexity"] == pytest.approx(2.718281828 ** metrics["loss"], rel=1e-6)


@pytest.mark.parametrize("settings", [
    ["model.preset=gpt-char-tiny", "data.block_size=12"],  # a window shorter than the model's 32 positions
    ["model.preset=encoder-tiny", "model.head=\"lm\"", "model.position=\"sinusoidal\""],  # unbounded: max_len 64
], ids=["gpt-short-window", "encoder-lm"])
def test_evaluate_scores_in_the_windows_training_evaluated(tmp_path, capsys, settings):
    """`evaluate` on the held-out file gives the loss training reported for it: the same windows, not the
    model's longest (which sees more context per token and scores lower)."""
    import pydoc_data.topics as topics

    text = "".join(topics.topics.values())
    (tmp_path / "train.txt").write_text(text[:6000], encoding="utf-8")
    (tmp_path / "eval.txt").write_text(text[6000:7000], encoding="utf-8")
    out = tmp_path / "run"
    sets = [arg for s in settings for arg in ("--set", s)]
    code, _, err = run_cli(capsys, "train", *sets, "--set", "train.steps=6", "--set", "train.eval_every=0",
                           "--set", f"data.path={json.dumps(str(tmp_path / 'train.txt'))}",
                           "--set", f"data.eval_path={json.dumps(str(tmp_path / 'eval.txt'))}",
                           "--set", f"train.out_dir={json.dumps(str(out))}", *TINY)
    assert code == 0, err
    reported = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    final = [m["eval_loss"] for m in reported if "eval_loss" in m][-1]
    code, stdout, err = run_cli(capsys, "evaluate", str(out), "--data", str(tmp_path / "eval.txt"), "--json",
                                "--device", "cpu")
    assert code == 0, err
    assert json.loads(stdout)["loss"] == pytest.approx(final, abs=1e-5)


def test_resume_continues_a_finished_run(tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--set", "model.preset=gpt-char-tiny", "--set", f"train.out_dir={json.dumps(str(out))}", *TINY]
    assert run_cli(capsys, "train", "--set", "train.steps=4", *common)[0] == 0
    code, stdout, err = run_cli(capsys, "train", "--set", "train.steps=8", "--resume", *common)
    assert code == 0, err
    assert "start_step=4" in stdout and "steps=8" in stdout
    code, stdout, err = run_cli(capsys, "train", "--set", "train.steps=8", "--resume", *common)
    assert code == 0, err
    assert stdout.splitlines()[-2:] == ["nothing to train: the checkpoint is already at train.steps = 8; give a "
                                        "larger train.steps to train on", f"run folder: {out}"]


def test_resume_that_redoes_the_final_evaluation_prints_its_summary(tmp_path, capsys, monkeypatch):
    """Ctrl-C inside the last step's evaluation: the resumed run redoes it, which is work, not "nothing to train"."""
    from attnlab.training.trainer import Trainer

    out = tmp_path / "run"
    common = ["--set", "model.preset=gpt-char-tiny", "--set", f"train.out_dir={json.dumps(str(out))}",
              "--set", "train.steps=4", "--set", "train.eval_every=2", "--set", "train.warmup_steps=1", *TINY]
    real = Trainer.evaluate

    def interrupted_at_the_end(self, *args, **kwargs):
        if self.step == 4:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "evaluate", interrupted_at_the_end)
    assert run_cli(capsys, "train", *common)[0] == 130
    monkeypatch.setattr(Trainer, "evaluate", real)
    code, stdout, err = run_cli(capsys, "train", "--resume", *common)
    assert code == 0, err
    assert "nothing to train" not in stdout
    assert "start_step=4" in stdout and "final_eval_loss=" in stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval_loss" in r] == [2, 4]


def test_classification_train_and_evaluate(tmp_path, capsys):
    rows = ["sentence\tlabel"] + [f"{w} movie {w}\t{lab}" for w, lab in
                                  [("great", "pos"), ("awful", "neg"), ("fine", "pos"), ("bad", "neg")] * 6]
    train = tmp_path / "train.tsv"
    train.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "cls"
    code, _, err = run_cli(capsys, "train", str(ROOT / "configs" / "encoder-classify.toml"),
                           "--set", f"data.path={json.dumps(str(train))}",
                           "--set", f"data.eval_path={json.dumps(str(train))}",
                           "--set", "model.d_model=16", "--set", "model.d_ff=16", "--set", "model.n_layers=1",
                           "--set", "train.steps=30", "--set", "train.batch_size=8", "--set", "train.eval_every=0",
                           "--set", "train.lr=3e-3", "--set", f"train.out_dir={json.dumps(str(out))}", *TINY)
    assert code == 0, err
    assert json.loads((out / "run.json").read_text())["labels"] == ["neg", "pos"]
    code, stdout, err = run_cli(capsys, "evaluate", str(out), "--data", str(train), "--json", "--device", "cpu")
    assert code == 0, err
    metrics = json.loads(stdout)
    assert metrics["examples"] == 24
    assert metrics["accuracy"] == 100.0  # four distinct sentences, learnt by heart
    code, _, err = run_cli(capsys, "generate", str(out), "--prompt", "great", "--device", "cpu")
    assert code == 2 and "does not generate" in err


def test_translation_train_generate_evaluate(tmp_path, capsys, monkeypatch):
    """A tiny Transformer learns to reverse four 5-word sentences: its greedy and beam translations then
    score BLEU 100 (sentences of at least four words: BLEU counts 4-grams), and generate translates.
    `evaluate` translates sentences sorted by length and scores them in file order."""
    src = tmp_path / "train.src"
    tgt = tmp_path / "train.tgt"
    sentences = ["a b c d e", "b c d e a", "c a e b d", "e d b a c"]
    pairs = [(s, " ".join(reversed(s.split()))) for s in sentences] * 4
    src.write_text("\n".join(s for s, _ in pairs) + "\n", encoding="utf-8")
    tgt.write_text("\n".join(t for _, t in pairs) + "\n", encoding="utf-8")
    out = tmp_path / "mt"
    code, _, err = run_cli(capsys, "train", str(ROOT / "configs" / "translate.toml"),
                           "--set", f"data.src_path={json.dumps(str(src))}",
                           "--set", f"data.tgt_path={json.dumps(str(tgt))}", "--set", "data.tokenizer=word",
                           "--set", "data.vocab_size=100", "--set", "model.d_model=16", "--set", "model.d_ff=32",
                           "--set", "model.n_heads=2", "--set", "model.n_encoder_layers=1",
                           "--set", "model.n_decoder_layers=1", "--set", "model.dropout=0.0",
                           "--set", "model.label_smoothing=0.0", "--set", "train.steps=200",
                           "--set", "train.batch_size=8", "--set", "train.schedule=constant", "--set", "train.lr=3e-3",
                           "--set", "train.warmup_steps=2",
                           "--set", f"train.out_dir={json.dumps(str(out))}", *TINY)
    assert code == 0, err
    for beam in ("1", "3"):
        code, stdout, err = run_cli(capsys, "evaluate", str(out), "--data", str(src), "--target", str(tgt),
                                    "--json", "--beam-size", beam, "--device", "cpu")
        assert code == 0, err
        metrics = json.loads(stdout)
        assert metrics["loss"] < 0.2 and metrics["tokens"] == 16 * 6  # 5 words + eos per reference
        assert metrics["bleu"] == pytest.approx(100.0)
    for beam in ("1", "3"):
        code, stdout, err = run_cli(capsys, "generate", str(out), "--prompt", "c a e b d", "--prompt", "a b c d e",
                                    "-n", "8", "--beam-size", beam, "--device", "cpu")
        assert code == 0, err
        assert stdout.strip() == "d b e a c\n\ne d c b a"
    code, _, err = run_cli(capsys, "evaluate", str(out), "--data", str(src), "--target", str(tgt), "--beam-size", "0",
                           "--device", "cpu")
    assert code == 2 and "beam_size (--beam-size) must be a whole number from 1 to 1,000, got 0" in err

    import sacrebleu

    from attnlab.inference.generate import greedy_translate
    from attnlab.inference.runs import load_run

    mixed = ["e d", "a b c d e", "c", "b c d e a d c", "d a", "c a e b d", "b"]  # lengths out of order
    (tmp_path / "mixed.src").write_text("\n".join(mixed) + "\n", encoding="utf-8")
    (tmp_path / "mixed.tgt").write_text("\n".join(" ".join(reversed(s.split())) for s in mixed) + "\n",
                                        encoding="utf-8")
    scored = []
    real_bleu = sacrebleu.corpus_bleu
    monkeypatch.setattr(sacrebleu, "corpus_bleu", lambda hyps, refs: scored.append(hyps) or real_bleu(hyps, refs))
    code, _, err = run_cli(capsys, "evaluate", str(out), "--data", str(tmp_path / "mixed.src"), "--target",
                           str(tmp_path / "mixed.tgt"), "--batch-size", "3", "--device", "cpu")
    assert code == 0, err
    run = load_run(out, "cpu")
    alone = []
    for sentence in mixed:
        ids = greedy_translate(run.model, torch.tensor([run.tokenizer.encode(sentence)]), max_len=64)[0]
        alone.append(run.tokenizer.decode(ids, skip_special_tokens=True))
    by_length = sorted(range(len(mixed)), key=lambda i: len(mixed[i].split()))
    assert [alone[i] for i in by_length] != alone  # so hypotheses left in the sorted order would show
    assert scored == [alone]

    # generate --input: a file translated in batches sorted by length, one line out per line in, in order.
    (tmp_path / "blank.src").write_text("\n".join(mixed[:3] + ["  "] + mixed[3:]) + "\n", encoding="utf-8")
    code, stdout, err = run_cli(capsys, "generate", str(out), "--input", str(tmp_path / "blank.src"), "-n", "64",
                                "--device", "cpu")
    assert code == 0, err
    assert stdout.split("\n") == alone[:3] + [""] + alone[3:] + [""]
    for argv, needle in ((["--input", str(tmp_path / "blank.src"), "--prompt", "a"], "not both"),
                         ([], "or a file of sentences"), (["--input", str(tmp_path / "none.src")], "does not exist")):
        code, _, err = run_cli(capsys, "generate", str(out), *argv, "--device", "cpu")
        assert code == 2 and needle in err, err


def test_translate_lines_names_the_line_of_an_unknown_character():
    from attnlab.data.tokenizers import CharTokenizer
    from attnlab.inference.runs import LoadedRun, translate_lines

    run = LoadedRun(model=None, tokenizer=CharTokenizer(["a", "b", " "]), family="seq2seq", folder=Path("."),
                    data={})
    with pytest.raises(DataError, match=r"src\.txt line 2: 'z' is not in the vocabulary"):
        translate_lines(run, ["a b", "b z"], name="src.txt")


@pytest.mark.parametrize("argv, needle", [
    (["train", "--set", "model.bogus=1"], "unknown setting model.bogus"),
    (["train", "--set", "train.schedul=cosine"], "schedul"),
    (["train", "--set", "train.precision=fp8"], "precision"),
    (["train", "--set", "trian.steps=3"], "did you mean [train]"),
    (["train", "no-such-config.toml"], "not found"),
    (["generate", "no-such-run", "--prompt", "x"], "does not exist"),
    (["evaluate", "no-such-run", "--data", "x.txt"], "does not exist"),
    (["params", "no-such-preset"], "no-such-preset"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, needle):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1, err
    assert needle in lines[0]
    assert "Traceback" not in err


def test_bad_data_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe not utf-8 \xff")
    code, _, err = run_cli(capsys, "train", "--set", f"data.path={json.dumps(str(bad))}", *TINY)
    assert code == 2 and "UTF-8" in err and len(err.strip().splitlines()) == 1
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    code, _, err = run_cli(capsys, "train", "--set", f"data.path={json.dumps(str(empty))}", *TINY)
    assert code == 2 and "empty" in err


def test_corrupt_checkpoint_is_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(capsys, "train", "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=2",
                   "--set", f"train.out_dir={json.dumps(str(out))}", *TINY)[0] == 0
    (out / "checkpoint" / "model.safetensors").write_bytes(b"garbage")
    code, _, err = run_cli(capsys, "generate", str(out), "--prompt", "x", "--device", "cpu")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "model.safetensors" in err


def test_console_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "attnlab", "params", "tutorial-lm"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "1,008,100" in result.stdout
    result = subprocess.run([sys.executable, "-m", "attnlab", "train", "--set", "model.nope=1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1


def test_train_seed_decides_the_initial_weights(tmp_path):
    """The model is built after seeding with train.seed: the same seed gives the same weights in one
    process (runs are reproducible from Python too), another seed other weights."""
    from attnlab.training.recipe import prepare

    def weights(seed):
        run = load_run_config(None, ["model.preset=gpt-char-tiny", f"train.seed={seed}",
                                     f"train.out_dir={json.dumps(str(tmp_path / str(seed)))}"])
        return prepare(run).model.state_dict()

    a, b, c = weights(1), weights(1), weights(2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["embed.token.weight"], c["embed.token.weight"])


def test_a_text_file_streams_into_the_token_files(tmp_path, monkeypatch):
    """A language-model run reads its text file a block at a time (corpora larger than memory train): the
    whole-file reader is never called, no block holds more than a few blocks' bytes, and the token files
    hold exactly the text's ids, the last tenth (cut at a line start) held out."""
    import numpy as np

    import attnlab.data.text_files as text_files
    from attnlab.data.corpus import TokenFile
    from attnlab.training.recipe import prepare

    text = "".join(f"line {i}: the quick brown fox {'é' * (i % 7)}\n" for i in range(3000))
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    streamed = text_files.iter_text_blocks
    largest = []

    def small_blocks(*args, **kwargs):
        for block in streamed(*args, **{**kwargs, "block_bytes": 256}):
            largest.append(len(block))
            yield block

    def whole_file(*args, **kwargs):
        raise AssertionError("the text file was read whole")

    monkeypatch.setattr(text_files, "iter_text_blocks", small_blocks)
    monkeypatch.setattr(text_files, "read_text", whole_file)
    out = tmp_path / "run"
    prep = prepare(load_run_config(None, ["model.preset=gpt-char-tiny", f"data.path={json.dumps(str(path))}",
                                          f"train.out_dir={json.dumps(str(out))}"]))
    assert max(largest) <= 4 * 256 and len(largest) > 100
    cut = text_files.line_split_offset(path, 0.9)
    head, tail = text.encode()[:cut].decode(), text.encode()[cut:].decode()
    assert head.endswith("\n") and len(tail) > len(text) // 20
    for name, part in (("train.bin", head), ("val.bin", tail)):
        ids = np.asarray(TokenFile(out / "data" / name)[:])
        assert ids.tolist() == prep.tokenizer.encode(part), name
