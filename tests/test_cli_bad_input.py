"""Bad input on the command line: one line naming the problem and the fix, exit code 2, no traceback, and
nothing in an existing run folder changed by a command that fails."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
from cli_helpers import one_line_error, run_cli, train_in_process
from cli_helpers import toml_str as _q

from attnlab.training.recipe import load_run_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu"]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A tiny char GPT (block 32) trained for 3 steps."""
    out = tmp_path_factory.mktemp("lm") / "run"
    train_in_process("--set", "model.preset=gpt-char-tiny", "--set", "train.steps=3", "--set", "train.eval_every=0",
                     "--set", f"train.out_dir={_q(out)}", *TINY)
    return out


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory):
    """A tiny classifier with labels "0" and "1", and a file whose examples all have label "1"."""
    folder = tmp_path_factory.mktemp("cls")
    rows = ["sentence\tlabel"] + [f"{w} movie {w}\t{lab}" for w, lab in
                                  [("great", "1"), ("awful", "0"), ("fine", "1"), ("bad", "0")] * 6]
    train = folder / "train.tsv"
    train.write_text("\n".join(rows) + "\n", encoding="utf-8")
    (folder / "ones.tsv").write_text("sentence\tlabel\ngreat movie great\t1\nfine movie fine\t1\n", encoding="utf-8")
    out = folder / "run"
    train_in_process(str(ROOT / "configs" / "encoder-classify.toml"), "--set", f"data.path={_q(train)}",
                     "--set", f"data.eval_path={_q(train)}",
                     "--set", "model.d_model=16", "--set", "model.d_ff=16", "--set", "model.n_layers=1",
                     "--set", "train.steps=30", "--set", "train.batch_size=8", "--set", "train.eval_every=0",
                     "--set", "train.lr=3e-3", "--set", f"train.out_dir={_q(out)}", *TINY)
    return out


@pytest.mark.parametrize("argv, needle", [
    (["trian"], "No such command 'trian'"),
    (["run", "nosuch"], "No such command 'nosuch'"),
    (["run", "knowledge", "--set", "foo"], "expected KEY=VALUE"),
    (["run", "knowledge", "--set", " =1"], "the setting's name is missing before '='"),
    (["train", "--set", "model.dropout=1.5"], "model.dropout must be at least 0 and below 1"),
    (["train", "--set", "model.attention_dropout=-0.5"], "attention_dropout must be at least 0"),
    (["train", "--set", "model.d_ff=-4"], "d_ff must be positive"),
    (["run", "knowledge", "--device", "cpu:x"], "'cpu:x' is not a device name"),
])
def test_usage_and_setting_errors(capsys, tmp_path, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)  # the default run folder is relative: runs/gpt-pydoc
    assert needle in one_line_error(capsys, *argv)
    assert list(tmp_path.iterdir()) == []  # a refused setting leaves no folder behind


def test_refused_setting_does_not_warn_about_replacing_a_run(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "gpt-pydoc" / "checkpoint").mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the "already holds a trained run" warning would fail here
        line = one_line_error(capsys, "train", "--set", "model.dropout=1.5")
    assert "model.dropout" in line


def test_generate_refusals(capsys, lm_run):
    common = [str(lm_run), "--device", "cpu", "-n", "3"]
    assert "with --prompt (-p), or a file of sentences to translate with --input (-i)" in one_line_error(
        capsys, "generate", str(lm_run))
    assert "--temperature" in one_line_error(capsys, "generate", *common, "--prompt", "x", "--temperature", "abc")
    for value in ("nan", "inf", "-1"):
        assert "must be a finite number >= 0" in one_line_error(capsys, "generate", *common, "--prompt", "x",
                                                                "--temperature", value)
    assert "not a device name" in one_line_error(capsys, "generate", str(lm_run), "--prompt", "x",
                                                 "--device", "cpu:x")
    # The prompt itself must fit the model's 32 positions (generated tokens slide the window, by design).
    line = one_line_error(capsys, "generate", *common, "--prompt", "the " * 20)
    assert "a prompt of 80 tokens is longer than the model's 32 positions" in line


def test_output_folder_that_cannot_be_made(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    line = one_line_error(capsys, "train", "--set", f"train.out_dir={_q(blocker / 'run')}", *TINY)
    assert "train.out_dir: cannot create the folder" in line
    line = one_line_error(capsys, "run", "knowledge", "--out", str(blocker), "--variants", "none", "--quiet")
    assert "--out: " in line and "is a file, not a folder" in line


def test_knowledge_checks_its_settings_before_writing(tmp_path, capsys):
    missing = str(tmp_path / "missing.txt")
    for argv in (["--seed", "-1"], ["--set", "precision=fp16"], ["--device", "tpu"],
                 ["--corpus", missing, "--train", missing, "--eval", missing]):
        one_line_error(capsys, "run", "knowledge", "--out", str(tmp_path / "k"), "--quiet", *argv)
        assert not (tmp_path / "k").exists(), argv


def test_config_file_errors_and_defaults(tmp_path, capsys):
    assert "is a folder" in one_line_error(capsys, "train", str(tmp_path))
    config = tmp_path / "mine.toml"
    config.write_text("[train]\nsteps = 5\n")
    assert load_run_config(config).train.out_dir == str(Path("runs") / "mine")  # named after the file
    # A column number may be given unquoted.
    assert load_run_config(None, ["data.task=classification", "model.family=encoder",
                                  "data.path=x.tsv", "data.label_column=1"]).data.label_column == "1"


@pytest.mark.filterwarnings("ignore:.*already holds a trained run")
def test_block_size_beyond_the_model_is_refused_before_the_run_folder_changes(tmp_path, capsys, lm_run):
    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    before = {name: (run / name).read_bytes() for name in ("run.json", "metrics.jsonl")}
    line = one_line_error(capsys, "train", "--set", "model.preset=gpt-char-tiny", "--set", "data.block_size=1000",
                          "--set", f"train.out_dir={_q(run)}", *TINY)
    assert "data.block_size 1000 is longer than the model's 32 positions" in line
    assert {name: (run / name).read_bytes() for name in before} == before


def test_a_failed_resume_leaves_the_run_folder_as_it_was(tmp_path, capsys, cls_run):
    run = tmp_path / "run"
    shutil.copytree(cls_run, run)
    files = ("run.json", "metrics.jsonl", "checkpoint/model.safetensors", "checkpoint/trainer_state.json")
    before = {name: (run / name).read_bytes() for name in files}
    # The default run is a GPT: the checkpoint holds an encoder classifier.
    line = one_line_error(capsys, "train", "--resume", "--set", "train.steps=40",
                          "--set", f"train.out_dir={_q(run)}", *TINY)
    assert "holds an 'encoder' model" in line
    assert {name: (run / name).read_bytes() for name in files} == before
    # Resuming a run that does not exist creates nothing.
    missing = tmp_path / "never-trained"
    assert "no checkpoint" in one_line_error(capsys, "train", "--resume", "--set", f"train.out_dir={_q(missing)}",
                                             *TINY)
    assert not missing.exists()


@pytest.mark.parametrize("config", ["bert-mlm.toml", "translate.toml"])
def test_resuming_a_run_of_another_family_names_the_families(tmp_path, capsys, lm_run, config):
    # The GPT checkpoint's char vocabulary met the config's data first: "sentence pairs need a tokenizer with cls
    # and sep tokens; set specials.cls" (a setting that does not exist), found by the stop-32 bad-input audit.
    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    (tmp_path / "s.txt").write_text("ein mann\nein hund\n")
    data = ["--set", f"data.src_path={_q(tmp_path / 's.txt')}", "--set", f"data.tgt_path={_q(tmp_path / 's.txt')}"] \
        if config == "translate.toml" else []
    line = one_line_error(capsys, "train", str(ROOT / "configs" / config), "--resume", *data,
                          "--set", f"train.out_dir={_q(run)}", *TINY)
    family = "bert" if config == "bert-mlm.toml" else "seq2seq"
    assert f"holds a 'gpt' model, and this config trains a {family!r} one; resume with the config" in line


def test_a_checkpoint_folder_alone_keeps_the_class_names(tmp_path, capsys, cls_run):
    data = cls_run.parent / "ones.tsv"  # only label "1": numbering the file's own labels would call it class 0
    code, stdout, err = run_cli(capsys, "evaluate", str(cls_run), "--data", str(data), "--json", "--device", "cpu")
    assert code == 0, err
    in_run = json.loads(stdout)
    alone = tmp_path / "ckpt"
    shutil.copytree(cls_run / "checkpoint", alone)
    code, stdout, err = run_cli(capsys, "evaluate", str(alone), "--data", str(data), "--json", "--device", "cpu")
    assert code == 0, err
    assert json.loads(stdout) == in_run and in_run["accuracy"] == 100.0


def test_classifier_runs_refuse_an_lm_task_and_a_single_class(tmp_path, capsys, cls_run):
    line = one_line_error(capsys, "train", "--set", f"model.init_from={_q(cls_run)}",
                          "--set", f"train.out_dir={_q(tmp_path / 'lm')}", *TINY)
    assert "needs causal attention" in line and "model.causal = true" in line
    single = tmp_path / "single.tsv"
    single.write_text("sentence\tlabel\ngood\tpos\nfine\tpos\n", encoding="utf-8")
    line = one_line_error(capsys, "train", str(ROOT / "configs" / "encoder-classify.toml"),
                          "--set", f"data.path={_q(single)}", "--set", f"data.eval_path={_q(single)}",
                          "--set", f"train.out_dir={_q(tmp_path / 'c')}", *TINY)
    assert "every example has the label 'pos'" in line


def test_params_reads_a_run_folder(capsys, lm_run):
    code, stdout, err = run_cli(capsys, "params", str(lm_run), "--json")
    assert code == 0, err
    assert json.loads(stdout)["total"] > 0
    assert "describes a run, not a model" in one_line_error(capsys, "params", str(lm_run / "run.json"))
    # Also when its [model] table names the family: it was counted with the default vocabulary of 65, not the run's.
    run = json.loads((lm_run / "run.json").read_text(encoding="utf-8"))
    run["model"] = {"family": "gpt", "d_model": 16}
    family_named = lm_run.parent / "family-run.json"
    family_named.write_text(json.dumps(run), encoding="utf-8")
    assert "describes a run, not a model" in one_line_error(capsys, "params", str(family_named))
    # Another JSON file of the run: not a model config (it was told to add a 'family' key to the tokenizer)
    line = one_line_error(capsys, "params", str(lm_run / "checkpoint" / "tokenizer.json"))
    assert "tokenizer.json is not a model config" in line and "add family" not in line


def test_an_experiment_folder_lists_its_runs(tmp_path, capsys, lm_run):
    """`attnlab run knowledge` writes a run per phase into its folder: given the folder, the commands name them."""
    for phase in ("pretrain-dot", "finetune-dot"):
        shutil.copytree(lm_run / "checkpoint", tmp_path / "exp" / phase / "checkpoint")
    (tmp_path / "exp" / "data").mkdir()
    runs = f"the runs {tmp_path / 'exp' / 'finetune-dot'}, {tmp_path / 'exp' / 'pretrain-dot'}; give one of them"
    assert runs in one_line_error(capsys, "generate", str(tmp_path / "exp"), "-p", "x")
    assert runs in one_line_error(capsys, "params", str(tmp_path / "exp"))
    assert "no model.safetensors in" in one_line_error(capsys, "generate", str(tmp_path / "exp" / "data"), "-p", "x")


def test_ctrl_c_outside_training_says_so(capsys, monkeypatch, lm_run):
    import attnlab.inference.runs as runs

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(runs, "load_run", interrupted)
    code, _, err = run_cli(capsys, "generate", str(lm_run), "--prompt", "x")
    assert code == 130 and err.strip() == "attnlab: interrupted"


def test_ctrl_c_inside_imported_code_still_exits_130(tmp_path):
    """A Ctrl-C that lands while torch imports (in code its dataclasses run through exec) is one CPython
    marks as unhandled even once we have handled it; the process must still end with 130 after its one line,
    not be killed by SIGINT at exit (status -2)."""
    import subprocess
    import sys

    (tmp_path / "interrupted_in_exec.py").write_text(
        "import attnlab.analysis.params as params\n"
        "from attnlab.__main__ import run\n"
        "def stopped(*args, **kwargs):\n"
        "    exec('raise KeyboardInterrupt')\n"
        "params.params_command = stopped\n"
        "import sys\n"
        "sys.argv = ['attnlab', 'params', 'gpt-char-tiny']\n"
        "run()\n", encoding="utf-8")
    # -m, as `python -m attnlab` and the `attnlab` script run: that is where CPython acts on the mark
    done = subprocess.run([sys.executable, "-m", "interrupted_in_exec"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "attnlab: interrupted"


def test_evaluate_names_the_line_of_an_unknown_character(tmp_path, capsys, lm_run):
    data = tmp_path / "text.txt"
    data.write_text("def f():\n    return 1 \u2603\n", encoding="utf-8")  # a snowman: not in pydoc's characters
    line = one_line_error(capsys, "evaluate", str(lm_run), "--data", str(data), "--device", "cpu")
    assert f"{data}: line 2: '\u2603' is not in the vocabulary the model was trained with" in line


def test_a_compressed_file_is_named_as_such(tmp_path, capsys, lm_run):
    """A .gz passed by mistake: the fix is to unpack it, not to re-encode it from latin-1."""
    import gzip

    data = tmp_path / "text.txt.gz"
    data.write_bytes(gzip.compress(b"def f():\n    return 1\n" * 50))
    fix = f"data file '{data}' is gzip-compressed, not text; unpack it first (gunzip -k '{data}')"
    line = one_line_error(capsys, "train", "--set", f"data.path={_q(data)}",
                          "--set", f"train.out_dir={_q(tmp_path / 'run')}", *TINY)
    assert fix in line
    assert fix in one_line_error(capsys, "evaluate", str(lm_run), "--data", str(data), "--device", "cpu")


def test_a_text_too_short_to_split(tmp_path, capsys):
    data = tmp_path / "one.txt"
    data.write_text("a", encoding="utf-8")
    line = one_line_error(capsys, "train", "--set", f"data.path={_q(data)}",
                          "--set", f"train.out_dir={_q(tmp_path / 'run')}", *TINY)
    assert "too short to hold out data.val_fraction" in line


def test_windows_line_ends_in_a_character_lm_text_are_pointed_out(tmp_path, capsys):
    """'\r\n' line ends make '\r' a character of the model's own: said, with the fix; plain text says nothing."""
    text = "line one of the text\nline two of the text\n" * 60
    for name, content, warned in (("crlf.txt", text.replace("\n", "\r\n"), True), ("lf.txt", text, False)):
        (tmp_path / name).write_bytes(content.encode("utf-8"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            code, _, err = run_cli(capsys, "train", "--set", f"data.path={_q(tmp_path / name)}", "--set",
                                   "model.preset=gpt-char-tiny", "--set", "model.block_size=16", "--set",
                                   "train.steps=1", "--set", f"train.out_dir={_q(tmp_path / (name + '.run'))}", *TINY)
        assert code == 0, err
        said = [str(w.message) for w in caught if "carriage returns" in str(w.message)]
        assert len(said) == int(warned) and (not said or "dos2unix" in said[0]), said


def test_evaluate_reads_other_column_names(tmp_path, capsys, cls_run):
    other = tmp_path / "other.tsv"
    other.write_text("id\treview\tstars\n1\tgreat movie great\t1\n2\tbad movie bad\t0\n", encoding="utf-8")
    line = one_line_error(capsys, "evaluate", str(cls_run), "--data", str(other), "--device", "cpu")
    # the text column is found by its name ("review"), the label column ("stars") is not
    assert "(evaluate: --label-column)" in line
    code, stdout, err = run_cli(capsys, "evaluate", str(cls_run), "--data", str(other), "--text-column", "review",
                                "--label-column", "2", "--json", "--device", "cpu")
    assert code == 0, err
    assert json.loads(stdout)["examples"] == 2
    for flag in ("--text-column", "--label-column"):  # "" had been read as "the training file's column"
        line = one_line_error(capsys, "evaluate", str(cls_run), "--data", str(other), flag, "", "--device", "cpu")
        assert line.endswith(f"{flag} is empty; give a column's header name or 0-based number, or leave {flag} out")


def test_training_over_a_finished_run_warns_in_one_line(tmp_path, capsys, lm_run):
    import warnings

    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    with pytest.warns(UserWarning, match="already holds a trained run; training from scratch replaces it"):
        code, _, err = run_cli(capsys, "train", "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=1",
                               "--set", f"train.out_dir={_q(run)}", *TINY)
    assert code == 0, err
    # The command line shows a warning as one line, without Python's source line.
    assert warnings.formatwarning("it is so", UserWarning, "x.py", 1) == "attnlab: warning: it is so\n"


def test_a_resumed_run_keeps_its_saved_tokenizer(tmp_path, capsys, monkeypatch, cls_run):
    """--resume reads the vocabulary from the checkpoint instead of training a tokenizer again (HF's WordPiece
    trainer can give another vocabulary from the same text: huggingface/tokenizers#1794)."""
    import attnlab.data.tokenizers as tokenizers

    run = tmp_path / "run"
    shutil.copytree(cls_run, run)
    saved = (run / "checkpoint" / "tokenizer.json").read_bytes()

    def no_training(*args, **kwargs):
        raise AssertionError("a resumed run trained a new tokenizer")

    monkeypatch.setattr(tokenizers, "train_tokenizer", no_training)
    train = cls_run.parent / "train.tsv"
    code, stdout, err = run_cli(capsys, "train", str(ROOT / "configs" / "encoder-classify.toml"), "--resume",
                                "--set", f"data.path={_q(train)}", "--set", f"data.eval_path={_q(train)}",
                                "--set", "model.d_model=16", "--set", "model.d_ff=16", "--set", "model.n_layers=1",
                                "--set", "train.steps=32", "--set", "train.batch_size=8", "--set", "train.eval_every=0",
                                "--set", "train.lr=3e-3", "--set", f"train.out_dir={_q(run)}", *TINY)
    assert code == 0, err
    assert "start_step=30" in stdout
    assert (run / "checkpoint" / "tokenizer.json").read_bytes() == saved


def test_processes_of_one_run_share_the_first_process_tokenizer(monkeypatch):
    import attnlab.training.distributed as distributed
    from attnlab.data.tokenizers import train_tokenizer
    from attnlab.training.recipe import _from_first_process

    mine = train_tokenizer("word", ["a b c"])
    first = train_tokenizer("word", ["x y z w"])
    monkeypatch.setattr(distributed, "env_world", lambda: distributed.World(rank=1, size=2))
    monkeypatch.setattr(distributed, "init_distributed", lambda device: None)
    monkeypatch.setattr(distributed, "all_gather_bytes",
                        lambda data: [json.dumps(first.to_dict()).encode(), data])
    assert _from_first_process(mine, "cpu").to_dict() == first.to_dict()


def test_knowledge_help_names_every_scale_setting():
    from attnlab.cli import KNOWLEDGE_SETTINGS
    from attnlab.experiments.knowledge import KnowledgeScale

    assert KNOWLEDGE_SETTINGS == tuple(KnowledgeScale.field_names())


# P2, P4
def test_params_refuses_a_run_description_without_its_data_section(capsys, lm_run, tmp_path):
    run = json.loads((lm_run / "run.json").read_text(encoding="utf-8"))
    # A run.json is a run's description by its name alone, its [model] table naming the family or not.
    named = tmp_path / "copy" / "run.json"
    named.parent.mkdir()
    named.write_text(json.dumps({"model": {"family": "gpt", "d_model": 16}, "train": run["train"]}), encoding="utf-8")
    assert "describes a run, not a model" in one_line_error(capsys, "params", str(named))
    # Under another name, a {"model": ...} table without a family (a preset) is a run's too, not "not a model config".
    other = tmp_path / "saved.json"
    other.write_text(json.dumps({"model": {"preset": "gpt-char-tiny"}, "train": run["train"]}), encoding="utf-8")
    assert "describes a run, not a model" in one_line_error(capsys, "params", str(other))


def test_generate_input_on_a_model_that_generates_nothing_says_what_takes_it(tmp_path, capsys, cls_run, lm_run):
    # It advised --prompt, which a classifier refuses in turn ("does not generate text"; stop-39 CLI audit).
    lines = tmp_path / "lines.txt"
    lines.write_text("great movie\n", encoding="utf-8")
    line = one_line_error(capsys, "generate", str(cls_run), "-i", str(lines), "--device", "cpu")
    assert "does not generate text; `attnlab evaluate` scores it on a file" in line
    # Given neither, it asked for a prompt, which it then refused (fifth classification audit).
    line = one_line_error(capsys, "generate", str(cls_run), "--device", "cpu")
    assert "does not generate text; `attnlab evaluate` scores it on a file" in line
    line = one_line_error(capsys, "generate", str(lm_run), "-i", str(lines), "--device", "cpu")
    assert "this run is a 'gpt' model: give its prompts with --prompt (-p)" in line


@pytest.mark.parametrize("argv, says", [
    (["evaluate", "RUN", "-d", "a.txt", "--data", "b.txt"], "--data (-d) is given twice; give it once"),
    (["generate", "RUN", "-p", "-n", "-n", "20", "--max-new-tokens=0"], "--max-new-tokens (-n) is given twice"),
    (["run", "knowledge", "--scale", "quick", "--scale=full"], "--scale is given twice; give it once")])
def test_an_option_of_one_value_given_twice_is_refused(capsys, argv, says):
    # click kept the last silently: `-d a.txt -d b.txt` scored b.txt alone, and a second --scale ran hours of the
    # full scale (stop-38/39 CLI audits). "-n" as the value of -p is a prompt, not the option.
    line = one_line_error(capsys, *argv)
    assert line.startswith("attnlab: error: ") and says in line


def test_options_that_gather_values_and_switches_may_repeat(capsys, lm_run):
    code, out, err = run_cli(capsys, "generate", str(lm_run), "-p", "ab", "-p", "cd", "-n", "2", "--greedy",
                             "--greedy", "--device", "cpu")
    assert code == 0, err
    assert out.count("\n\n") == 1  # two texts


def test_a_later_set_of_one_setting_wins():
    # As README says: a base list of --set items can be overridden by a later one (`$COMMON --set train.steps=5`),
    # on a config, on the default run and for an experiment's settings.
    from attnlab.cli import _parse_sets

    assert load_run_config(None, ["train.steps=100", "train.lr=1e-3", " train.steps =1"]).train.steps == 1
    assert _parse_sets(["n_people=40", "pretrain_epochs=2", "n_people =50"]) == {"n_people": 50, "pretrain_epochs": 2}


def test_a_label_spelling_the_number_of_a_known_class_says_so(tmp_path, capsys, cls_run):
    # pandas writes an integer column with gaps as 0.0/1.0: a JSONL file reads 1.0 as class "1", a CSV keeps "1.0",
    # and the refusal only said "not one of the known labels" (stop-40 corpus audit).
    from attnlab.data.text_files import ClassificationData
    from attnlab.errors import DataError

    data = ClassificationData(texts=["great movie"], labels=["1.0"], line_numbers=[2], path="dev.csv")
    # (the same 0.0/1.0 written in a JSONL training file and a CSV dev file differ too: the advice names both ways)
    with pytest.raises(DataError, match=r"line 2: label '1\.0' is not one of the known labels \['0', '1'\] \('1\.0' "
                                        r"spells the number of class '1', but labels are read as text: a JSON Lines "
                                        r"number by its value, 1\.0 as '1', a TSV or CSV cell as written; write the "
                                        r"classes as whole numbers \(1\), or as the same text, in both files\); fix "
                                        r"the label"):
        data.label_ids(["0", "1"])
    dev = tmp_path / "dev.csv"
    dev.write_text("sentence,label\ngreat movie great,1.0\nawful movie,0.0\n", encoding="utf-8")
    line = one_line_error(capsys, "evaluate", str(cls_run), "--data", str(dev), "--device", "cpu")
    assert "labels ['0.0', '1.0'] were not in the training data (known: ['0', '1']) ('0.0' spells the number of " \
           "class '0', but labels are read as text" in line


def test_a_column_named_by_a_digit_that_is_not_ascii_is_a_name(tmp_path, capsys):
    # "²".isdigit() is True but int("²") fails: training and evaluate ended in a ValueError traceback (stop-40
    # mutation audit). Only ASCII digits number a column; "²" is a name the file then lacks.
    from attnlab.training.recipe import parse_column

    assert (parse_column("²"), parse_column("12"), parse_column("label")) == ("²", 12, "label")
    data = tmp_path / "t.tsv"
    data.write_text("text\tlabel\n" + "good film\t1\nbad film\t0\n" * 4, encoding="utf-8")
    line = one_line_error(capsys, "train", str(ROOT / "configs" / "encoder-classify.toml"), "--set",
                          f"data.path={_q(data)}", "--set", f"data.eval_path={_q(data)}", "--set",
                          'data.label_column="²"', "--set",
                          f"train.out_dir={_q(tmp_path / 'run')}")
    assert line.startswith("attnlab: error: ") and "'²'" in line


@pytest.mark.parametrize("prompt", ["", "\u2603 not in its vocabulary"])
def test_a_model_that_generates_nothing_says_so_before_judging_the_prompt(capsys, cls_run, prompt):
    # An empty prompt was refused as empty ("give a non-empty prompt"), and only a real one then got the line that
    # a classifier generates no text (fourth generation audit).
    line = one_line_error(capsys, "generate", str(cls_run), "-p", prompt, "--device", "cpu")
    assert "does not generate text; `attnlab evaluate` scores it on a file" in line, line
