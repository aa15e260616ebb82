"""A run folder that is damaged, mixed up or resumed in unusual ways: every command either works with the files
that belong together or refuses in one line (exit code 2, no traceback) naming the problem and the fix."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
from cli_helpers import one_line_error, run_cli
from cli_helpers import toml_str as _q
from cli_helpers import train_in_process as _train

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu"]
LM = ["--set", "model.preset=gpt-char-tiny", "--set", "train.eval_every=0", *TINY]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A tiny char GPT trained for 3 steps (checkpoint/ and best/)."""
    out = tmp_path_factory.mktemp("lm") / "run"
    _train("--set", "train.steps=3", "--set", f"train.out_dir={_q(out)}", *LM)
    return out


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory):
    """A tiny classifier with labels "0" and "1" (train.tsv), beside flip.tsv: the same sentences labelled a/z."""
    folder = tmp_path_factory.mktemp("cls")
    pairs = [("great", "1"), ("awful", "0"), ("fine", "1"), ("bad", "0")] * 6
    for name, names in (("train.tsv", {"0": "0", "1": "1"}), ("flip.tsv", {"0": "z", "1": "a"})):
        rows = ["sentence\tlabel"] + [f"{w} movie {w}\t{names[lab]}" for w, lab in pairs]
        (folder / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = folder / "run"
    _train(*_classifier(folder / "train.tsv", out))
    return out


def _classifier(data: Path, out: Path, steps: int = 20) -> list[str]:
    return [str(ROOT / "configs" / "encoder-classify.toml"), "--set", f"data.path={_q(data)}",
            "--set", f"data.eval_path={_q(data)}", "--set", "model.d_model=16", "--set", "model.d_ff=16",
            "--set", "model.n_layers=1", "--set", f"train.steps={steps}", "--set", "train.batch_size=8",
            "--set", "train.eval_every=0", "--set", "train.lr=3e-3", "--set", f"train.out_dir={_q(out)}", *TINY]


@pytest.fixture
def lm_copy(tmp_path, lm_run):
    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    return run


def test_resume_from_the_old_checkpoint_a_crash_left(capsys, lm_copy):
    (lm_copy / "checkpoint").rename(lm_copy / ".checkpoint.old")  # a crash between the two renames of a save
    shutil.rmtree(lm_copy / "best")
    code, stdout, err = run_cli(capsys, "train", "--resume", "--set", "train.steps=4",
                                "--set", f"train.out_dir={_q(lm_copy)}", *LM)
    assert code == 0, err
    assert "start_step=3" in stdout
    assert (lm_copy / "checkpoint" / "model.safetensors").is_file() and not (lm_copy / ".checkpoint.old").exists()


@pytest.mark.parametrize("state, needle", [
    ({"step": -3}, "step -3 is negative"),
    ({}, "trainer_state.json has no step; the checkpoint is incomplete"),
])
def test_resume_refuses_a_trainer_state_without_a_usable_step(capsys, lm_copy, state, needle):
    path = lm_copy / "checkpoint" / "trainer_state.json"
    saved = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**saved, **state} if state else {}), encoding="utf-8")
    line = one_line_error(capsys, "train", "--resume", "--set", "train.steps=4",
                          "--set", f"train.out_dir={_q(lm_copy)}", *LM)
    assert needle in line


def test_resume_keeps_the_good_records_of_a_damaged_metrics_log(capsys, lm_copy):
    log = lm_copy / "metrics.jsonl"
    good = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    with open(log, "ab") as f:
        f.write(b'{"step": "x"}\n[1]\n"text"\n{"loss": 1.0}\n{"step": true}\n\xff\xfe not utf-8\n{"step": 2, "lo')
    code, _, err = run_cli(capsys, "train", "--resume", "--set", "train.steps=4",
                           "--set", f"train.out_dir={_q(lm_copy)}", *LM)
    assert code == 0, err
    records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert records[:len(good)] == good and [r["step"] for r in records[len(good):]] == [4, 4]  # train, eval


def _resave(path: Path, **metadata: str) -> None:
    """Rewrite a safetensors file with some header metadata entries replaced."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
        saved = dict(f.metadata() or {})
    save_file(tensors, str(path), metadata={**saved, **metadata})


@pytest.mark.parametrize("aliases", ["[1, 2]", '{"embed.token.weight": 1}', '"x"'])
def test_model_header_aliases_must_be_an_object_of_names(capsys, lm_copy, aliases):
    _resave(lm_copy / "checkpoint" / "model.safetensors", aliases=aliases)
    line = one_line_error(capsys, "generate", str(lm_copy), "-p", "The", "-n", "3", "--device", "cpu")
    assert "header entry 'aliases' is not an object of strings; use another checkpoint" in line


@pytest.mark.parametrize("entry, value, needle", [
    ("scalars", "[1, 2]", "header entry 'scalars' is not an object"),
    ("param_groups", "[1, 2]", "has no parameter groups"),
])
def test_optimizer_header_entries_must_have_their_types(capsys, lm_copy, entry, value, needle):
    _resave(lm_copy / "checkpoint" / "optimizer.safetensors", **{entry: value})
    line = one_line_error(capsys, "train", "--resume", "--set", "train.steps=4",
                          "--set", f"train.out_dir={_q(lm_copy)}", *LM)
    assert needle in line


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_weights_with_nan_or_inf_are_refused(capsys, lm_copy, tmp_path, bad):
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = lm_copy / "checkpoint" / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
        metadata = f.metadata()
    tensors["embed.token.weight"][0, 0] = bad  # also the output layer's (tied)
    save_file(tensors, str(path), metadata=metadata)
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox.\n" * 4, encoding="utf-8")
    for argv in (["generate", str(lm_copy), "-p", "The", "-n", "3"], ["evaluate", str(lm_copy), "-d", str(text)]):
        line = one_line_error(capsys, *argv, "--device", "cpu")
        assert "contains NaN or inf (a diverged run?); use another checkpoint, e.g. best/" in line
    code, _, err = run_cli(capsys, "generate", str(lm_copy), "--best", "-p", "The", "-n", "3", "--device", "cpu")
    assert code == 0, err


def test_a_tokenizer_of_another_size_is_refused(capsys, lm_copy, tmp_path):
    from attnlab.data.tokenizers import load_tokenizer, train_tokenizer

    own = load_tokenizer(lm_copy / "checkpoint").vocab_size
    text = tmp_path / "text.txt"
    text.write_text("The quick brown fox.\n" * 4, encoding="utf-8")
    for chars in ("ab", "".join(map(chr, range(32, 32 + own + 10)))):  # fewer tokens, then more than the model
        other = train_tokenizer("char", [chars])
        assert other.vocab_size != own
        other.save(lm_copy / "checkpoint" / "tokenizer.json")
        for argv in (["generate", str(lm_copy), "-p", "a", "-n", "3"], ["evaluate", str(lm_copy), "-d", str(text)]):
            line = one_line_error(capsys, *argv, "--device", "cpu")
            assert (f"tokenizer.json does not belong to these weights ({other.vocab_size} tokens, {own} embeddings); "
                    "use the run's own tokenizer.json") in line


def test_a_misspelt_best_metric_is_refused_before_training(capsys, tmp_path):
    out = tmp_path / "bm"
    line = one_line_error(capsys, "train", "--set", "train.steps=20", "--set", "train.best_metric=acuracy",
                          "--set", f"train.out_dir={_q(out)}", *LM)
    assert ("train.best_metric 'acuracy' is not a metric that data.task = 'lm' evaluates; "
            "choose one of: loss, perplexity") in line
    assert not out.exists()
    line = one_line_error(capsys, "train", str(ROOT / "configs" / "encoder-classify.toml"),
                          "--set", "train.best_metric=perplexity", "--set", f"train.out_dir={_q(out)}", *TINY)
    assert "choose one of: loss, accuracy" in line
    line = one_line_error(capsys, "train", str(ROOT / "configs" / "bert-mlm.toml"), "--set", "train.best_metric=acc",
                          "--set", f"train.out_dir={_q(out)}", *TINY)
    assert "choose one of: loss, perplexity, mlm_accuracy, nsp_accuracy" in line
    code, _, err = run_cli(capsys, "train", "--set", "train.steps=1", "--set", "train.best_metric=perplexity",
                           "--set", "train.best_mode=min", "--set", f"train.out_dir={_q(out)}", *LM)
    assert code == 0, err
    assert (out / "best" / "model.safetensors").is_file()


@pytest.mark.filterwarnings("ignore:.*already holds a trained run")
def test_a_failed_run_over_a_classifier_does_not_lend_it_its_class_names(capsys, monkeypatch, tmp_path, cls_run):
    from attnlab.errors import DataError
    from attnlab.training.trainer import Trainer

    run = tmp_path / "run"
    shutil.copytree(cls_run, run)
    train, flip = cls_run.parent / "train.tsv", cls_run.parent / "flip.tsv"
    argv = ["evaluate", str(run), "-d", str(train), "--json", "--device", "cpu"]
    code, before, err = run_cli(capsys, *argv)
    assert code == 0, err

    def fails(self, step):
        raise DataError("the training data went away")

    monkeypatch.setattr(Trainer, "_train_step", fails)
    assert "went away" in one_line_error(capsys, "train", *_classifier(flip, run))
    assert json.loads((run / "run.json").read_text(encoding="utf-8"))["labels"] == ["a", "z"]  # the failed run's
    # The checkpoint keeps scoring with its own class names: the same numbers, and labels a/z are unknown to it.
    code, after, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert json.loads(after) == json.loads(before)
    line = one_line_error(capsys, "evaluate", str(run), "-d", str(flip), "--device", "cpu")
    assert "labels ['a', 'z'] were not in the training data (known: ['0', '1'])" in line


def test_a_resumed_run_saves_its_data_settings_in_the_checkpoint(capsys, tmp_path, cls_run):
    run = tmp_path / "run"
    shutil.copytree(cls_run, run)
    code, _, err = run_cli(capsys, "train", "--resume", *_classifier(cls_run.parent / "train.tsv", run, steps=21),
                           "--set", "data.max_length=32")
    assert code == 0, err
    described = json.loads((run / "run.json").read_text(encoding="utf-8"))
    saved = json.loads((run / "checkpoint" / "trainer_state.json").read_text(encoding="utf-8"))["extra_state"]
    assert set(saved["data_files"]) == {"path", "eval_path"}  # stamps of the files read (see test_cli_glue)
    del saved["data_files"]
    assert saved == {"data": described["data"], "labels": described["labels"], "batches_by_length": True,
                     "classification_sep": True}
    assert saved["data"]["max_length"] == 32


def test_resuming_a_classifier_on_other_classes_is_refused(capsys, tmp_path, cls_run):
    # The same number of classes under other names trained on silently: output 0 went on meaning "0" to the
    # weights and became "a" to the run.
    run = tmp_path / "run"
    shutil.copytree(cls_run, run)
    line = one_line_error(capsys, "train", "--resume", *_classifier(cls_run.parent / "flip.tsv", run, steps=21))
    assert "--resume: " in line
    assert "has other classes than the run was trained on ('0', '1' missing, 'a', 'z' new)" in line


def test_params_of_a_corrupt_config_says_what_to_give(capsys, lm_copy):
    (lm_copy / "checkpoint" / "config.json").write_text("{not json", encoding="utf-8")
    line = one_line_error(capsys, "params", str(lm_copy))
    assert "not a readable JSON config" in line and "attnlab params --list" in line
    (lm_copy / "checkpoint" / "config.json").write_text("[1, 2]", encoding="utf-8")
    assert "a preset name" in one_line_error(capsys, "params", str(lm_copy))


def test_resuming_with_another_architecture_says_how_to_continue(capsys, lm_copy):
    line = one_line_error(capsys, "train", "--resume", "--set", "train.steps=4", "--set", "model.position=rotary",
                          "--set", f"train.out_dir={_q(lm_copy)}", *LM)
    assert "holds a model with other settings (position 'learned' → 'rotary'); resume with" in line  # not the
    # loader's own advice first ("load it into a model built from its config.json"; stop-39 README audit)
    assert line.endswith("(the config it was trained from, without model.* --set values that change them), or "
                         "train into another train.out_dir")


@pytest.fixture(scope="module")
def mt_run(tmp_path_factory):
    """A tiny translation run (2 steps)."""
    folder = tmp_path_factory.mktemp("mt")
    (folder / "train.src").write_text("a b c\nb c a\n" * 4, encoding="utf-8")
    (folder / "train.tgt").write_text("c b a\na c b\n" * 4, encoding="utf-8")
    out = folder / "run"
    _train(str(ROOT / "configs" / "translate.toml"), "--set", f"data.src_path={_q(folder / 'train.src')}",
           "--set", f"data.tgt_path={_q(folder / 'train.tgt')}", "--set", "data.tokenizer=word",
           "--set", "data.vocab_size=100", "--set", "model.d_model=16", "--set", "model.d_ff=16",
           "--set", "model.n_heads=2", "--set", "model.n_encoder_layers=1", "--set", "model.n_decoder_layers=1",
           "--set", "train.steps=2", "--set", "train.batch_size=4", "--set", f"train.out_dir={_q(out)}", *TINY)
    return out


def test_a_pretrained_translation_model_with_computed_positions_takes_longer_sentences(capsys, mt_run, tmp_path):
    # Its max_len (66) was derived from its run's data.max_length (64), and bounds no weight: a fine-tuning run of
    # data.max_length 100 was refused ("set data.max_length to at most 66").
    folder = mt_run.parent
    code, _, err = run_cli(capsys, "train", "--set", f"model.init_from={_q(mt_run)}", "--set",
                           "data.task=\"translation\"", "--set", f"data.src_path={_q(folder / 'train.src')}",
                           "--set", f"data.tgt_path={_q(folder / 'train.tgt')}", "--set", "data.max_length=100",
                           "--set", "train.steps=1", "--set", "train.batch_size=4",
                           "--set", f"train.out_dir={_q(tmp_path / 'ft')}", *TINY)
    assert code == 0, err


def test_generate_refuses_decoding_options_it_would_ignore(capsys, mt_run, lm_run):
    mt = ["generate", str(mt_run), "-p", "a b c", "-n", "4", "--device", "cpu"]
    code, _, err = run_cli(capsys, *mt)
    assert code == 0, err
    for option in (["--top-k", "3"], ["--top-p", "0.9"]):
        line = one_line_error(capsys, *mt, *option)
        assert f"translation decodes greedily or with --beam-size; drop {option[0]}" in line
    line = one_line_error(capsys, "generate", str(lm_run), "-p", "The", "-n", "3", "--device", "cpu", "--greedy",
                          "--top-k", "5", "--top-p", "0.9")
    assert "--greedy always takes the most likely token; drop --top-k, --top-p, or drop --greedy to sample" in line
    # The options a caller can mark as not given (None), such as temperature and seed.
    from attnlab.errors import ConfigError
    from attnlab.inference.runs import check_decoding_options

    with pytest.raises(ConfigError, match="translation decodes greedily .*; drop --temperature, --seed$"):
        check_decoding_options("seq2seq", greedy=True, temperature=0.5, seed=1)
    with pytest.raises(ConfigError, match="drop --temperature, or drop --greedy"):
        check_decoding_options("gpt", greedy=True, temperature=0.5)
    check_decoding_options("gpt", temperature=0.5, top_k=3, top_p=0.9, seed=1)
    with pytest.raises(ConfigError, match="drop --seed, or drop --greedy"):  # greedy decoding draws nothing
        check_decoding_options("gpt", greedy=True, seed=1)
    check_decoding_options("seq2seq", greedy=True)


def test_cli_temperature_and_seed(capsys, mt_run, lm_run):
    mt = ["generate", str(mt_run), "-p", "a b c", "-n", "4", "--device", "cpu"]
    assert "drop --temperature, --seed" in one_line_error(capsys, *mt, "--temperature", "0.8", "--seed", "0")
    line = one_line_error(capsys, "generate", str(lm_run), "-p", "The", "-n", "3", "--device", "cpu", "--greedy",
                          "--temperature", "0.5")
    assert "drop --temperature, or drop --greedy" in line
    line = one_line_error(capsys, "generate", str(lm_run), "-p", "The", "-n", "3", "--device", "cpu", "--greedy",
                          "--seed", "3")
    assert "drop --seed, or drop --greedy" in line


# ----------------------------------------------------------------------------------------------------
# Second audit: options that fell back or were ignored, and folders that were not the user's choice


def test_best_without_a_best_checkpoint_is_refused(capsys, mt_run, lm_copy):
    # --best fell back to the latest weights when the run kept no best/ (it never evaluated).
    assert not (mt_run / "best").exists()
    line = one_line_error(capsys, "evaluate", str(mt_run), "-d", str(mt_run.parent / "train.src"),
                          "--target", str(mt_run.parent / "train.tgt"), "--best", "--device", "cpu")
    assert "has no best/ checkpoint" in line and "drop --best" in line
    assert "data.eval_path" not in line  # a translation run's held-out files are data.eval_src_path and eval_tgt_path
    assert "has no best/" in one_line_error(capsys, "generate", str(mt_run), "-p", "a b", "--best", "--device", "cpu")
    # A run with best/, or the best/ folder itself, is fine.
    for path in (lm_copy, lm_copy / "best"):
        code, _, err = run_cli(capsys, "generate", str(path), "-p", "The", "-n", "2", "--best", "--device", "cpu")
        assert code == 0, err
    # As for the latest checkpoint, the .best.old a crash between the two renames of a save left is read.
    argv = ["generate", str(lm_copy), "-p", "The", "-n", "4", "--greedy", "--best", "--device", "cpu"]
    code, before, err = run_cli(capsys, *argv)
    assert code == 0, err
    (lm_copy / "best").rename(lm_copy / ".best.old")
    code, after, err = run_cli(capsys, *argv)
    assert code == 0, err
    assert after == before


def test_translation_refuses_options_of_other_models(capsys, mt_run):
    data = ["-d", str(mt_run.parent / "train.src"), "--target", str(mt_run.parent / "train.tgt"), "--device", "cpu"]
    assert "--text-column and --label-column are for classifiers" in one_line_error(
        capsys, "evaluate", str(mt_run), *data, "--text-column", "0")
    for n in ("0", "-5"):  # -5 was a traceback from torch.zeros, 0 an empty translation
        line = one_line_error(capsys, "generate", str(mt_run), "-p", "a b", "-n", n, "--device", "cpu")
        assert "-n is the longest translation in tokens" in line


def test_empty_out_folders_are_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # "" was the working directory: the run's files landed among the user's
    assert "out_dir is empty" in one_line_error(capsys, "train", "--set", "train.out_dir=", *LM)
    assert "--out is empty" in one_line_error(capsys, "run", "knowledge", "--out", "")
    assert list(tmp_path.iterdir()) == []


def test_config_file_with_a_byte_order_mark_or_in_yaml(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf[model]\npreset = \"gpt-char-tiny\"\n[train]\nstepz = 3\n")
    # Read past the mark (it was 'invalid TOML' at line 1): the unknown key is what gets reported.
    assert "unknown setting train.stepz" in one_line_error(capsys, "train", str(bom))
    yaml = tmp_path / "run.yaml"  # read as YAML: its unknown key is reported as the TOML file's
    yaml.write_text("model:\n  preset: gpt-char-tiny\ntrain:\n  stepz: 3\n", encoding="utf-8")
    assert "unknown setting train.stepz" in one_line_error(capsys, "train", str(yaml))
    yaml.write_text("model:\n  preset: [gpt\n", encoding="utf-8")
    assert "run.yaml: invalid YAML (line 3, column 1)" in one_line_error(capsys, "train", str(yaml))
    yaml.write_text("- model\n- data\n", encoding="utf-8")
    assert "a YAML config is a mapping of sections" in one_line_error(capsys, "train", str(yaml))
    yaml.write_text("model: gpt\n", encoding="utf-8")
    assert "write a 'model:' line with one indented" in one_line_error(capsys, "train", str(yaml))


def test_knowledge_out_folder_rules(capsys, tmp_path, lm_run):
    from attnlab.experiments.knowledge import parse_variants

    assert "holds a training run or checkpoint" in one_line_error(capsys, "run", "knowledge", "--out", str(lm_run))
    with pytest.raises(Exception, match="names the position scheme none twice; name it once"):
        parse_variants("none+none")  # "none,none" would mean the no-pretraining row twice


@pytest.mark.filterwarnings("ignore:.*already holds a trained run")
def test_a_run_over_another_does_not_keep_its_best_checkpoint(capsys, monkeypatch, lm_copy):
    # A from-scratch run without evaluations left the replaced run's best/ beside its own checkpoint, and
    # `generate --best` then sampled from the other run's weights.
    from attnlab.errors import DataError
    from attnlab.training.trainer import Trainer

    assert (lm_copy / "best" / "model.safetensors").is_file()
    argv = ["--set", "train.steps=2", "--set", "data.val_fraction=0", "--set", f"train.out_dir={_q(lm_copy)}", *LM]
    original = Trainer._train_step

    def fails(self, step):
        raise DataError("the training data went away")

    monkeypatch.setattr(Trainer, "_train_step", fails)
    assert "went away" in one_line_error(capsys, "train", *argv)
    assert (lm_copy / "best" / "model.safetensors").is_file()  # a run that saved nothing leaves the old one whole
    monkeypatch.setattr(Trainer, "_train_step", original)
    (lm_copy / ".best.old").mkdir()  # as a crash between the two renames of a save leaves it
    _train(*argv)
    assert not (lm_copy / "best").exists() and not (lm_copy / ".best.old").exists()
    line = one_line_error(capsys, "generate", str(lm_copy), "--best", "--prompt", "a", "-n", "2")
    assert "best" in line


@pytest.mark.parametrize("saved, given, warned", [("absent", None, True), (None, "true", False),
                                                  (None, "false", True), (False, None, True),
                                                  ("recorded", None, False), ("recorded", "false", True)])
def test_resuming_warns_when_length_batching_changes(capsys, tmp_path, cls_run, saved, given, warned):
    """A checkpoint from before `data.bucket_by_length` (no such key) trained on random batches: resumed under
    today's default it continues on other batches than it would have, and says so. Unset and true are the same.
    Checkpoints now record what their run did ("recorded")."""
    run = tmp_path / "run"
    shutil.copytree(cls_run, run)
    state_file = run / "checkpoint" / "trainer_state.json"
    state = json.loads(state_file.read_text(encoding="utf-8"))
    assert state["extra_state"]["batches_by_length"] is True
    if saved != "recorded":  # a checkpoint from before the record
        del state["extra_state"]["batches_by_length"]
    if saved == "absent":
        del state["extra_state"]["data"]["bucket_by_length"]
    elif saved != "recorded":
        state["extra_state"]["data"]["bucket_by_length"] = saved
    state_file.write_text(json.dumps(state), encoding="utf-8")
    extra = [] if given is None else ["--set", f"data.bucket_by_length={given}"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = run_cli(capsys, "train", "--resume",
                               *_classifier(cls_run.parent / "train.tsv", run, steps=21), *extra)
    assert code == 0, err
    said = " ".join(str(w.message) for w in caught) + err
    assert ("data.bucket_by_length" in said) is warned


@pytest.mark.parametrize("extra, sorted_", [
    ({"data": {"task": "translation"}}, False),  # before data.bucket_by_length
    ({"data": {"task": "translation", "bucket_by_length": None}}, True),
    ({"data": {"task": "classification", "bucket_by_length": False}}, False),
    ({"data": {"task": "mlm", "bucket_by_length": None}}, False),  # before mlm pairs were sorted
    ({"data": {"task": "mlm", "bucket_by_length": None}, "batches_by_length": True}, True),
    ({"data": {"task": "translation", "bucket_by_length": None}, "batches_by_length": False}, False),
])
def test_what_a_checkpoints_run_did_with_batch_lengths(extra, sorted_):
    from attnlab.training.recipe import _saved_batches_by_length

    assert _saved_batches_by_length(extra) is sorted_


def test_a_classifier_checkpoint_without_its_class_names(capsys, tmp_path, cls_run):
    # Copied without trainer_state.json (and away from run.json), the classifier took the evaluation file's own
    # labels, sorted, for its classes: a file of class-1 examples alone scored as class 0, 100 % for a 0 % model.
    # The weights file now carries the class names; one written before that (no names anywhere) takes numeric
    # labels as the output numbers, with a warning, and refuses others.
    from safetensors import safe_open
    from safetensors.torch import save_file

    bare = tmp_path / "bare"
    shutil.copytree(cls_run / "checkpoint", bare)
    (bare / "trainer_state.json").unlink()
    ones = tmp_path / "ones.tsv"
    ones.write_text("sentence\tlabel\n" + "great movie great\t1\nfine movie fine\t1\n", encoding="utf-8")
    other = tmp_path / "other.tsv"
    other.write_text("sentence\tlabel\ngreat movie great\tpos\nbad movie bad\tneg\n", encoding="utf-8")
    scores = {}
    for folder in (cls_run, bare):
        code, out, err = run_cli(capsys, "evaluate", str(folder), "-d", str(ones), "--json", "--device", "cpu")
        assert code == 0, err
        scores[folder] = json.loads(out)["accuracy"]
    assert scores[bare] == scores[cls_run]
    assert "were not in the training data (known: ['0', '1'])" in one_line_error(
        capsys, "evaluate", str(bare), "-d", str(other), "--device", "cpu")
    with safe_open(str(bare / "model.safetensors"), framework="pt") as f:  # as written before the names
        tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())
    metadata.pop("labels")
    save_file(tensors, str(bare / "model.safetensors"), metadata=metadata)
    with pytest.warns(UserWarning, match="keeps no class names: label i of .* is scored as output i"):
        code, out, err = run_cli(capsys, "evaluate", str(bare), "-d", str(ones), "--json", "--device", "cpu")
    assert code == 0 and json.loads(out)["accuracy"] == scores[cls_run]
    line = one_line_error(capsys, "evaluate", str(bare), "-d", str(other), "--device", "cpu")
    assert "keeps no class names" in line and "class numbers 0 to 1" in line


def test_a_prompt_character_outside_the_vocabulary_says_to_remove_it(capsys, lm_run):
    # The tokenizer's own message told the user to retrain the tokenizer "or add an unk", which no setting does.
    line = one_line_error(capsys, "generate", str(lm_run), "-p", "Th\u00e9 \u2603", "-n", "2", "--device", "cpu")
    assert "the prompt's '\u00e9' is not in the vocabulary" in line and "remove it from the prompt" in line


def test_a_bare_classifier_checkpoint_cuts_long_texts_to_its_positions(capsys, tmp_path, cls_run):
    # Without the run's data.max_length, evaluation cut texts to 128 tokens and a model of fewer positions failed:
    # "sequence of 128 tokens is longer than the model allows (16)", after a warning that training cut them so.
    run = tmp_path / "run"
    _train(*_classifier(cls_run.parent / "train.tsv", run, steps=2), "--set", "model.max_len=16", "--set",
           "model.position=learned", "--set", "data.max_length=16")
    bare = tmp_path / "bare"
    shutil.copytree(run / "checkpoint", bare)
    (bare / "trainer_state.json").unlink()
    long = tmp_path / "long.tsv"
    long.write_text("sentence\tlabel\n" + " ".join(["great movie"] * 100) + "\t1\nbad movie\t0\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="cut to what the model's positions hold"):
        code, out, err = run_cli(capsys, "evaluate", str(bare), "-d", str(long), "--json", "--device", "cpu")
    assert code == 0, err
    assert json.loads(out)["examples"] == 2


def test_a_damaged_run_json_does_not_block_a_checkpoint_that_has_its_data(capsys, tmp_path, lm_copy):
    (lm_copy / "run.json").write_text("{bad", encoding="utf-8")
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat\n" * 10, encoding="utf-8")
    code, out, err = run_cli(capsys, "evaluate", str(lm_copy), "-d", str(text), "--json", "--device", "cpu")
    assert code == 0, err
    assert json.loads(out)["loss"] > 0


@pytest.mark.parametrize("entry", ['"data": 5', '"data": "xy"', '"labels": 5', '"labels": [{"a": 1}]'])
def test_a_run_json_of_wrong_types_is_one_line_where_it_is_read(capsys, tmp_path, lm_copy, entry):
    # Read when trainer_state.json is gone: dict() and list() of these values were tracebacks (stop-32 audit).
    (lm_copy / "checkpoint" / "trainer_state.json").unlink()
    (lm_copy / "run.json").write_text("{" + entry + "}", encoding="utf-8")
    line = one_line_error(capsys, "generate", str(lm_copy), "-p", "the", "-n", "2", "--device", "cpu")
    assert line.endswith("run.json is not a valid run description; re-run training or remove the file")


def test_a_bare_bert_checkpoint_cuts_long_pairs_to_its_positions(capsys, tmp_path):
    # The masked-LM evaluation of a checkpoint without data.max_length cut pairs to 128 tokens: "sequence of 128
    # tokens is longer than the model allows (24)".
    run = tmp_path / "run"
    _train(str(ROOT / "configs" / "bert-mlm.toml"), "--set", "model.max_len=24", "--set", "data.max_length=24",
           "--set", "data.vocab_size=300", "--set", "model.d_model=16", "--set", "model.n_layers=1", "--set",
           "model.d_ff=16", "--set", "train.steps=1", "--set", "train.eval_every=0", "--set",
           f"train.out_dir={_q(run)}", *TINY)
    bare = tmp_path / "bare"
    shutil.copytree(run / "checkpoint", bare)
    (bare / "trainer_state.json").unlink()
    documents = tmp_path / "docs.txt"
    sentence = " ".join(["the class of the object is a type"] * 10)
    documents.write_text("\n\n".join(f"{sentence} {i}.\n{sentence} again.\n{sentence} more." for i in range(4)),
                         encoding="utf-8")
    with pytest.warns(UserWarning, match="cut to what the model's positions hold"):
        code, out, err = run_cli(capsys, "evaluate", str(bare), "-d", str(documents), "--json", "--device", "cpu")
    assert code == 0, err
    assert json.loads(out)["sentence_pairs"] > 0


def test_a_bare_translation_checkpoint_cuts_as_its_training_did(capsys, tmp_path):
    # Without data.max_length, a translation's sentences are cut to the model's positions less two (training
    # sized them as data.max_length + 2, past 16, for bos and eos): the bare checkpoint scores a file as its run
    # folder does.
    src, tgt = tmp_path / "train.src", tmp_path / "train.tgt"
    src.write_text("a b c\nb c a\n" * 4, encoding="utf-8")
    tgt.write_text("c b a\na c b\n" * 4, encoding="utf-8")
    run = tmp_path / "run"
    _train(str(ROOT / "configs" / "translate.toml"), "--set", f"data.src_path={_q(src)}", "--set",
           f"data.tgt_path={_q(tgt)}", "--set", "data.tokenizer=word", "--set", "data.vocab_size=100",
           "--set", "data.max_length=20", "--set", "model.position=learned",
           "--set", "model.d_model=16", "--set", "model.d_ff=16", "--set", "model.n_heads=2",
           "--set", "model.n_encoder_layers=1", "--set", "model.n_decoder_layers=1", "--set", "train.steps=1",
           "--set", "train.batch_size=4", "--set", f"train.out_dir={_q(run)}", *TINY)
    bare = tmp_path / "bare"
    shutil.copytree(run / "checkpoint", bare)
    (bare / "trainer_state.json").unlink()
    long_src, long_tgt = tmp_path / "long.src", tmp_path / "long.tgt"
    long_src.write_text(" ".join(["a b c"] * 9) + "\nb c a\n", encoding="utf-8")
    long_tgt.write_text(" ".join(["c b a"] * 9) + "\na c b\n", encoding="utf-8")
    losses = {}
    for folder in (run, bare):
        with pytest.warns(UserWarning, match="cut"):
            code, out, err = run_cli(capsys, "evaluate", str(folder), "-d", str(long_src), "--target", str(long_tgt),
                                     "--json", "--device", "cpu")
        assert code == 0, err
        losses[folder] = json.loads(out)["loss"]
    assert losses[bare] == pytest.approx(losses[run], abs=1e-6)
    # generate cuts a long source as evaluate does (it failed the whole file: "source sequence of 27 tokens is
    # longer than the model allows (22)", naming no line), and translates the bare checkpoint as its run folder
    mixed = tmp_path / "mixed.src"
    mixed.write_text("a b c\n" + " ".join(["a b c"] * 9) + "\nb c a\n", encoding="utf-8")
    outputs = {}
    for folder in (run, bare):
        with pytest.warns(UserWarning, match="1 of 3 source sentences are longer than"):
            code, out, err = run_cli(capsys, "generate", str(folder), "--input", str(mixed), "-n", "5", "--device",
                                     "cpu")
        assert code == 0, err
        outputs[folder] = out
    assert outputs[bare] == outputs[run] and len(outputs[run].splitlines()) == 3


def test_a_bare_checkpoint_of_an_unbounded_translation_model_names_the_default_it_cuts_to():
    # With no data.max_length kept, a model nothing bounds (sinusoidal positions) had its sources cut to 128 tokens
    # with a warning blaming "the model's position table", which it does not have; generate and evaluate cut alike.
    import types

    from attnlab.inference.runs import _cut_sources

    long, short = list(range(300)), list(range(5))
    unbounded = types.SimpleNamespace(data={}, model=types.SimpleNamespace(max_len=None))
    with pytest.warns(UserWarning, match=r"longer than data.max_length's default allows .*cut to that setting's "
                                         r"default, 128") as caught:
        assert [len(s) for s in _cut_sources(unbounded, [long, short])] == [128, 5]
    assert "position" not in str(caught[0].message)
    bounded = types.SimpleNamespace(data={}, model=types.SimpleNamespace(max_len=64))
    with pytest.warns(UserWarning, match="longer than the model's position table allows"):
        assert [len(s) for s in _cut_sources(bounded, [long, short])] == [62, 5]
    trained = types.SimpleNamespace(data={"max_length": 20}, model=types.SimpleNamespace(max_len=None))
    with pytest.warns(UserWarning, match="the run's data.max_length"):
        assert [len(s) for s in _cut_sources(trained, [long, short])] == [20, 5]


@pytest.mark.parametrize("replaced", ["model.safetensors", "config.json"])
def test_a_resume_from_weights_and_config_of_two_runs_names_them_not_the_tokenizer(capsys, lm_copy, tmp_path,
                                                                                replaced):
    """It had blamed the run's own, untouched tokenizer.json ("use the run's own tokenizer.json")."""
    text = tmp_path / "small.txt"
    text.write_text("abc defg hij\n" * 200, encoding="utf-8")
    other = tmp_path / "other"
    _train("--set", "train.steps=1", "--set", f"data.path={_q(text)}", "--set", f"train.out_dir={_q(other)}", *LM)
    shutil.copy(other / "checkpoint" / replaced, lm_copy / "checkpoint" / replaced)
    for argv in (["--set", f"train.out_dir={_q(lm_copy)}", "--resume", *LM],
                 ["--set", f"model.init_from={_q(lm_copy)}", "--set", f"train.out_dir={_q(tmp_path / 'new')}", *TINY]):
        line = one_line_error(capsys, "train", "--set", "train.steps=6", *argv)
        assert "checkpoint/model.safetensors and " in line
        assert "checkpoint/config.json are not of one model (weight 'embed.token.weight': shape [" in line
        assert line.endswith("one of them was replaced by another run's: restore the run's own files")


def test_best_asked_of_a_checkpoint_folder_says_where_best_is(capsys, lm_copy):
    """It had said the run kept no best/ checkpoint (and why runs keep none), with best/ right beside it."""
    assert (lm_copy / "best").is_dir()
    line = one_line_error(capsys, "generate", str(lm_copy / "checkpoint"), "--best", "-p", "a", "-n", "2",
                          "--device", "cpu")
    assert line == (f"attnlab: error: {lm_copy / 'checkpoint'} is the run's latest checkpoint, and --best asks for "
                    f"its best one: give the run folder {lm_copy} with --best, or {lm_copy / 'checkpoint'} without it")


def test_params_reads_what_generate_reads(capsys, lm_copy, tmp_path):
    """params had refused the .old copy a crash between a save's renames leaves (which generate, evaluate and resume
    read) as "the runs .checkpoint.old", and counted a config.json of another run over weights of other shapes."""
    shutil.rmtree(lm_copy / "best")
    (lm_copy / "checkpoint").rename(lm_copy / ".checkpoint.old")
    code, out, err = run_cli(capsys, "params", str(lm_copy), "--json")
    assert code == 0, err
    from attnlab.training.checkpoint import load_model

    assert json.loads(out)["total"] == sum(p.numel() for p in load_model(lm_copy).parameters())
    (lm_copy / ".checkpoint.old").rename(lm_copy / "checkpoint")
    config = json.loads((lm_copy / "checkpoint" / "config.json").read_text(encoding="utf-8"))
    (lm_copy / "checkpoint" / "config.json").write_text(json.dumps({**config, "d_model": 64}), encoding="utf-8")
    line = one_line_error(capsys, "params", str(lm_copy))
    assert "checkpoint/config.json are not of one model (weight " in line


def test_a_classifier_replacing_a_language_model_takes_its_token_files_away(lm_copy, cls_run):
    """They had stayed (a corpus's worth of disk) beside a run that never reads them; a file of the user's stays."""
    assert (lm_copy / "data" / "train.bin").is_file()
    (lm_copy / "data" / "notes.txt").write_text("mine\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="already holds a trained run; training from scratch replaces it"):
        _train(*_classifier(cls_run.parent / "train.tsv", lm_copy, steps=2))
    assert sorted(p.name for p in (lm_copy / "data").iterdir()) == ["notes.txt"]


def test_token_files_of_another_tool_in_the_run_folder_are_left_as_they_are(capsys, tmp_path, lm_copy, cls_run):
    # train.out_dir naming a folder of the user's with a nanoGPT-style data/train.bin and val.bin: a language model
    # wrote its own over them, a classifier replacing a run there deleted them (stop-41 config audit). Ours carry a
    # sidecar (train.bin.json); theirs do not.
    mine = tmp_path / "mine"
    (mine / "data").mkdir(parents=True)
    for name in ("train.bin", "val.bin"):
        (mine / "data" / name).write_bytes(b"\x01\x02" * 50)
    line = one_line_error(capsys, "train", "--set", "train.steps=1", "--set", f"train.out_dir={_q(mine)}", *LM)
    assert "train.out_dir: " in line and "data/train.bin' is not a token file an attnlab run wrote (no " \
        "train.bin.json of ours beside it)" in line and "move it, or choose another train.out_dir" in line
    assert all((mine / "data" / name).read_bytes() == b"\x01\x02" * 50 for name in ("train.bin", "val.bin"))
    assert sorted(p.name for p in (mine / "data").iterdir()) == ["train.bin", "val.bin"]  # no staging left
    # a classifier replacing a language model takes away that model's token files only
    (lm_copy / "data" / "val.bin").unlink()
    (lm_copy / "data" / "val.bin").write_bytes(b"theirs")
    (lm_copy / "data" / "val.bin.json").write_text('{"format": "another tool"}', encoding="utf-8")
    with pytest.warns(UserWarning, match="already holds a trained run"):
        _train(*_classifier(cls_run.parent / "train.tsv", lm_copy, steps=2))
    assert sorted(p.name for p in (lm_copy / "data").iterdir()) == ["val.bin", "val.bin.json"]


def test_evaluate_gives_a_loss_past_700_an_infinite_perplexity_null_in_json(capsys, lm_copy, tmp_path):
    # evaluate wrote exp(min(loss, 700)), a finite 1.01e304 whatever the loss, where training's evaluation gives
    # inf (null in metrics.jsonl) (stop-41 evaluate audit). The final norm's gain scaled up: finite weights, huge loss.
    from safetensors import safe_open
    from safetensors.torch import save_file

    weights = lm_copy / "checkpoint" / "model.safetensors"
    with safe_open(str(weights), framework="pt") as f:
        tensors = {key: f.get_tensor(key) * (5000.0 if key == "blocks.norm.weight" else 1.0) for key in f.keys()}
        metadata = dict(f.metadata() or {})
    save_file(tensors, str(weights), metadata=metadata)
    text = tmp_path / "text.txt"
    text.write_text("while the quick brown fox jumps over the lazy dog, " * 20, encoding="utf-8")
    code, out, err = run_cli(capsys, "evaluate", str(lm_copy), "--data", str(text), "--json", "--device", "cpu")
    metrics = json.loads(out)
    assert code == 0 and metrics["loss"] > 700 and metrics["perplexity"] is None, (out, err)
    code, out, err = run_cli(capsys, "evaluate", str(lm_copy), "--data", str(text), "--device", "cpu")
    assert "perplexity  inf" in out


def test_a_checkpoint_without_its_trainer_state_keeps_the_runs_seed(tmp_path):
    # Only trainer_state.json's seed was read: a checkpoint copied without it (a layout load_run serves from run.json)
    # drew a BERT's evaluation masks and sentence pairs with seed 0, not the run's train.seed (stop-41 audit).
    from attnlab.inference.runs import load_run

    out = tmp_path / "run"
    _train("--set", "train.steps=1", "--set", "train.seed=3", "--set", f"train.out_dir={_q(out)}", *LM)
    assert load_run(out, "cpu").seed == 3
    (out / "checkpoint" / "trainer_state.json").unlink()
    assert load_run(out, "cpu").seed == 3


@pytest.mark.parametrize("name, kind", [("checkpoint", "folder"), ("best", "folder"), ("checkpoint", "file")])
def test_a_checkpoint_or_best_of_another_tool_in_the_run_folder_is_refused(capsys, tmp_path, name, kind):
    # Each save replaces checkpoint/ and best/: another tool's were deleted, and a file (TensorFlow writes one named
    # `checkpoint`) was hidden as .checkpoint.old and failed the run at its next save (stop-41 checkpoint audit).
    mine = tmp_path / "proj"
    mine.mkdir()
    if kind == "file":
        (mine / name).write_text('model_checkpoint_path: "model.ckpt-1000"\n', encoding="utf-8")
    else:
        (mine / name).mkdir()
        (mine / name / "epoch=3.ckpt").write_text("weights of my own\n", encoding="utf-8")
    for resume in ([], ["--resume"]):
        line = one_line_error(capsys, "train", "--set", "train.steps=1", "--set", f"train.out_dir={_q(mine)}", *LM,
                              *resume)
        held = "a file" if kind == "file" else "it holds 'epoch=3.ckpt'"
        assert f"{name}' is not a checkpoint an attnlab run wrote ({held}), and each save of this run replaces " \
            "it; move it, or choose another train.out_dir" in line
    assert sorted(str(p.relative_to(mine)) for p in mine.rglob("*") if p.name != ".attnlab.lock") == \
        ([name] if kind == "file" else [name, f"{name}/epoch=3.ckpt"])


def test_a_runs_checkpoint_folder_is_no_run_folder(capsys, lm_copy):
    # A run made inside run/checkpoint was deleted by the run's next save, without a word.
    for resume in ([], ["--resume"]):
        line = one_line_error(capsys, "train", "--set", "train.steps=1", "--set",
                              f"train.out_dir={_q(lm_copy / 'checkpoint')}", *LM, *resume)
        assert "checkpoint' is a checkpoint folder (a model's weights and config); give the run folder that " \
            "holds it to --resume it, or another folder" in line
    assert sorted(p.name for p in (lm_copy / "checkpoint").iterdir()) == [
        "config.json", "model.safetensors", "optimizer.safetensors", "tokenizer.json", "trainer_state.json"]


def test_a_run_left_as_checkpoint_old_by_a_crash_is_said_to_be_replaced(lm_copy):
    # A crash between a save's two renames leaves checkpoint/ as .checkpoint.old, which generate, evaluate and
    # --resume take: a run from scratch replaced it without the warning an intact run gets.
    (lm_copy / "checkpoint").rename(lm_copy / ".checkpoint.old")
    with pytest.warns(UserWarning, match="already holds a trained run; training from scratch replaces it"):
        _train("--set", "train.steps=1", "--set", f"train.out_dir={_q(lm_copy)}", *LM)


def test_a_link_to_a_folder_that_is_gone_is_named(capsys, tmp_path):
    # "cannot create the folder 'out' (File exists)" named a folder that does not exist (stop-41 checkpoint audit).
    (tmp_path / "out").symlink_to(tmp_path / "unmounted" / "run")
    line = one_line_error(capsys, "train", "--set", "train.steps=1", "--set", f"train.out_dir={_q(tmp_path / 'out')}",
                          *LM)
    assert f"out' is a link to '{tmp_path / 'unmounted' / 'run'}', which does not exist); choose another path" in line
