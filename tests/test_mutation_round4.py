"""Behaviour no test pinned, found by the stop-40 mutation audit (classification and text files, the synthetic world,
resume stamps and warnings, init_from refusals, run loading and generation windows): each test fails on the
one-line mutant the audit made and passes on the code."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
from cli_helpers import one_line_error, run_cli, spy_on_generate_context, train_in_process
from cli_helpers import toml_str as _q

from attnlab.data.text_files import iter_text_blocks, read_classification_file, read_lines, read_text
from attnlab.data.world import make_world
from attnlab.errors import ConfigError

CPU = ["--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu",
       "--set", "train.warmup_steps=0", "--set", "train.eval_every=0"]


def _train(*argv: str) -> None:
    """`attnlab train *argv` on the CPU in this process, which must succeed."""
    train_in_process(*argv, *CPU)


def _lines_file(path, n: int = 200) -> str:
    path.write_text("".join(f"line {i} of a short text\n" for i in range(n)), encoding="utf-8")
    return _q(path)


# --- classification files -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cls_run(tmp_path_factory):
    """A tiny word-level classifier (classes neg, pos) trained on the `text` column of a file whose `sentence`
    column holds other words."""
    folder = tmp_path_factory.mktemp("cls4")
    data = folder / "cls.tsv"
    data.write_text("text\tsentence\tlabel\n" + "".join(
        f"{w} film number {i}\tplot summary {i % 3}\t{'pos' if w == 'good' else 'neg'}\n"
        for i in range(10) for w in ("good", "bad")), encoding="utf-8")
    _train("--set", "data.task=\"classification\"", "--set", "model.preset=\"encoder-tiny\"", "--set",
           f"data.path={_q(data)}", "--set", "data.text_column=\"text\"", "--set", "data.tokenizer=\"word\"",
           "--set", "train.steps=1", "--set", f"train.out_dir={_q(folder / 'run')}")
    return folder / "run", data


def test_evaluate_reads_the_text_column_the_run_trained_on(cls_run):
    # Pins: evaluate without --text-column reads the run's data.text_column (stop-40 mutation audit).
    from attnlab.inference.runs import evaluate_file, load_run

    folder, data = cls_run
    run = load_run(folder)
    assert run.data.get("text_column") == "text"
    assert evaluate_file(run, data) == evaluate_file(run, data, text_column="text")
    assert evaluate_file(run, data) != evaluate_file(run, data, text_column="sentence")


def test_class_names_missing_from_the_checkpoint_come_from_run_json(cls_run, tmp_path):
    # Pins: load_run takes run.json's labels where the checkpoint's state has none (stop-40 mutation audit).
    from safetensors import safe_open
    from safetensors.torch import save_file

    from attnlab.inference.runs import evaluate_file, load_run

    folder, data = cls_run
    old = tmp_path / "old"
    shutil.copytree(folder, old)
    state_path = old / "checkpoint" / "trainer_state.json"
    state = json.loads(state_path.read_text(encoding="utf-8"))
    assert state["extra_state"].pop("labels") == ["neg", "pos"] and state["extra_state"].get("data")
    state_path.write_text(json.dumps(state), encoding="utf-8")
    weights = old / "checkpoint" / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    meta.pop("labels", None)
    save_file(tensors, str(weights), metadata=meta)

    run = load_run(old)
    assert run.data["labels"] == ["neg", "pos"]
    assert evaluate_file(run, data)["examples"] == 20


def test_a_sentence_pair_header_with_an_unknown_label_name_is_a_header(tmp_path):
    # Pins: premise/hypothesis names make the first row a header under numbered columns (stop-40 mutation audit).
    path = tmp_path / "nli.tsv"
    rows = [("A man eats.", "Someone eats.", "entailment"), ("A dog runs.", "A cat sleeps.", "neutral"),
            ("It rains.", "It is dry.", "contradiction")]
    path.write_text("premise\thypothesis\tgold_label\n" + "".join("\t".join(r) + "\n" for r in rows),
                    encoding="utf-8")
    data = read_classification_file(path, 0, 2)
    assert data.texts == ["A man eats.", "A dog runs.", "It rains."]
    assert "gold_label" not in data.label_names


def test_a_header_like_first_label_is_warned_about_in_a_file_of_two_examples(tmp_path):
    # Pins: the "only label that is not a number" warning already applies to 3 labels read (stop-40 mutation audit).
    path = tmp_path / "qrels.tsv"
    path.write_text("id\tquery\tpassage\tis_relevant\n0\tHow?\tWhy?\t1\n1\tWhat?\tWho?\t0\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="the label 'is_relevant' is the only one that is not a number"):
        data = read_classification_file(path, 1, 3)
    assert data.labels == ["is_relevant", "1", "0"]


# --- text files ----------------------------------------------------------------------------------------------


def test_as_many_lone_crs_as_line_ends_is_not_a_classic_mac_file(tmp_path):
    # Pins: CR-only line ends need lone CRs to outnumber LFs, not equal them (stop-40 mutation audit).
    path = tmp_path / "progress.txt"
    path.write_bytes(b"a\rb\nc\rd\n")
    assert read_lines(path) == ["a\rb", "c\rd"]


def test_a_byte_order_mark_inside_the_file_is_kept_when_read_from_an_offset(tmp_path):
    # Pins: iter_text_blocks drops a U+FEFF only at byte 0, not at `start` (stop-40 mutation audit).
    path = tmp_path / "joined.txt"
    first = "training line one\ntraining line two\n"
    path.write_text("\ufeff" + first + "\ufeffheld-out line\n", encoding="utf-8")
    cut = len(("\ufeff" + first).encode("utf-8"))
    head = "".join(iter_text_blocks(path, stop=cut))
    tail = "".join(iter_text_blocks(path, start=cut))
    assert head == first and tail == "\ufeffheld-out line\n"
    assert head + tail == read_text(path)


# --- the synthetic world --------------------------------------------------------------------------------------


def test_a_tiny_eval_fraction_still_keeps_one_evaluation_person():
    # Pins: World.split rounds a share below one person up to one (stop-40 mutation audit).
    train, held = make_world(10, seed=0).split(0.04)
    assert (len(train), len(held)) == (9, 1)


def test_an_eval_fraction_of_zero_is_refused():
    # Pins: World.split takes eval_fraction strictly between 0 and 1, as its docstring says (stop-40 mutation audit).
    with pytest.raises(ConfigError, match="eval_fraction must be between 0 and 1"):
        make_world(10, seed=0).split(0.0)


def test_a_world_of_one_person_is_refused():
    # Pins: make_world needs 2 to 200000 people, as its docstring says (stop-40 mutation audit).
    with pytest.raises(ConfigError, match="n_people must be an integer from 2 to 200000, got 1"):
        make_world(1)


# --- resume stamps and unknown characters ---------------------------------------------------------------------


def test_the_data_file_stamp_sees_an_edit_near_the_end_of_a_large_file(tmp_path):
    # Pins: _data_file_stamps hashes a large file's last megabyte too (stop-40 mutation audit).
    from attnlab.training.recipe import DataConfig, _data_file_stamps

    path = tmp_path / "big.txt"
    text = "".join(f"line {i} of a corpus larger than one megabyte\n" for i in range(30000))
    assert len(text.encode()) > 1 << 20
    path.write_text(text, encoding="utf-8")
    before = _data_file_stamps(DataConfig(path=str(path)))
    assert _data_file_stamps(DataConfig(path=str(path))) == before
    path.write_text(text[:-60] + text[-60:].replace("29999", "29998"), encoding="utf-8")
    assert path.stat().st_size == len(text.encode())
    assert _data_file_stamps(DataConfig(path=str(path)))["path"] != before["path"]


def test_the_line_of_an_unknown_character_counts_the_lines_of_earlier_blocks(tmp_path):
    # Pins: _first_line_with counts the lines of the blocks before the token's (stop-40 mutation audit).
    from attnlab.training.recipe import _first_line_with

    lines = [f"line {i} of a text\n" for i in range(80000)]
    lines[70000] = "line 70000 of a text \u00a7\n"
    path = tmp_path / "big.txt"
    path.write_text("".join(lines), encoding="utf-8")
    assert path.stat().st_size > 1 << 20
    assert _first_line_with(str(path), "\u00a7") == 70001


# --- runs started from init_from ------------------------------------------------------------------------------


def test_another_block_size_beside_a_synthesizer_init_from_is_refused_by_name(capsys, tmp_path):
    # Pins: a Synthesizer's per-position tables count as weights bound to model.block_size (stop-40 mutation audit).
    text = _lines_file(tmp_path / "t.txt")
    base = tmp_path / "synth"
    common = ["--set", f"data.path={text}", "--set", "data.block_size=16", "--set", "model.position=\"none\"",
              "--set", "train.steps=1", *CPU]
    code, _, err = run_cli(capsys, "train", "--set", "model.preset=\"gpt-char-tiny\"", "--set",
                           "model.attention=\"synthesizer-dense\"", *common, "--set", f"train.out_dir={_q(base)}")
    assert code == 0, err
    line = one_line_error(capsys, "train", "--set", f"model.init_from={_q(base)}", "--set", "model.block_size=24",
                          *common, "--set", f"train.out_dir={_q(tmp_path / 'ft')}")
    assert "model.block_size = 24, but the model in model.init_from was trained with 32" in line, line
    assert "its 32 positions are weights" in line, line
    assert not (tmp_path / "ft" / "checkpoint").exists()


def test_the_unused_tokenizer_warning_is_not_repeated_on_resume(capsys, tmp_path):
    # Pins: "data.tokenizer ... is not used" is said once, not again on --resume (stop-40 mutation audit).
    text = _lines_file(tmp_path / "t.txt")
    base = tmp_path / "base"
    data = ["--set", f"data.path={text}", "--set", "data.block_size=16", *CPU]
    code, _, err = run_cli(capsys, "train", "--set", "model.preset=\"gpt-char-tiny\"", *data, "--set",
                           "train.steps=1", "--set", f"train.out_dir={_q(base)}")
    assert code == 0, err
    tuned = ["train", "--set", f"model.init_from={_q(base)}", "--set", "data.tokenizer=\"word\"", *data,
             "--set", f"train.out_dir={_q(tmp_path / 'ft')}"]
    with pytest.warns(UserWarning, match="data.tokenizer = 'word' is not used"):
        code, _, err = run_cli(capsys, *tuned, "--set", "train.steps=1")
    assert code == 0, err
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = run_cli(capsys, *tuned, "--set", "train.steps=2", "--resume")
    assert code == 0, err
    said = [str(w.message) for w in caught] + err.splitlines()
    assert not [s for s in said if "is not used" in s], said


# --- generation ------------------------------------------------------------------------------------------------


def test_a_rotary_model_reads_the_whole_prompt_past_its_training_windows(tmp_path, monkeypatch):
    # Pins: computed positions have no table to outrun: no sliding window at data.block_size (stop-40 mutation audit).
    from attnlab.inference.runs import generate_texts, load_run

    text = _lines_file(tmp_path / "t.txt")
    _train("--set", "model.preset=\"gpt-char-tiny\"", "--set", "model.position=\"rotary\"", "--set",
           "data.block_size=8", "--set", f"data.path={text}", "--set", "train.steps=1", "--set",
           f"train.out_dir={_q(tmp_path / 'run')}")
    run = load_run(tmp_path / "run")
    assert run.data["block_size"] == 8
    seen = spy_on_generate_context(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        generate_texts(run, ["line 7 of a short text line 8 of a"], max_new_tokens=4, greedy=True)
    assert seen == [None]
