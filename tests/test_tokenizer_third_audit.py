"""Tokenizer edge cases found by an audit: prompts of unknown words, prompts that are not UTF-8, and what a
tokenizer file must hold to be loaded."""

from __future__ import annotations

import json

import pytest

from attnlab.data.tokenizers import train_tokenizer
from attnlab.errors import DataError
from attnlab.inference.runs import _continuation, _encode_prompt

TEXT = "the quick brown fox jumps over the lazy dog\n" * 50


@pytest.mark.parametrize("kind, size", [("word", None), ("wordpiece", 60), ("bpe", 300)])
def test_a_prompt_of_unknown_words_keeps_its_space_before_the_continuation(kind, size):
    tok = train_tokenizer(kind, TEXT, size) if size else train_tokenizer(kind, TEXT)
    prompt = _encode_prompt(tok, "Zebra")  # unknown to word and WordPiece: one unk ("Zebraquick" before)
    new = tok.encode(" quick fox") + [tok.eos_id]
    assert "Zebra" + _continuation(tok, "Zebra", prompt, new) == "Zebra quick fox"


@pytest.mark.parametrize("kind, size", [("char", None), ("word", None), ("wordpiece", 60), ("bpe", 300)])
def test_a_prompt_that_is_not_utf8_is_one_line_for_every_tokenizer(kind, size):
    tok = train_tokenizer(kind, TEXT, size) if size else train_tokenizer(kind, TEXT)
    # a command-line argument's undecodable byte 0xff reaches Python as the lone surrogate \udcff
    with pytest.raises(DataError, match=r"the prompt is not valid UTF-8 text \(at character 5\)"):
        _encode_prompt(tok, "the \udcff")


def _train(out, *more: str) -> list[str]:
    from cli_helpers import toml_str

    return ["train", "--set", "model.preset=gpt-char-tiny", "--set", "model.block_size=16", "--set",
            "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu", "--set",
            "train.eval_every=0", "--set", f"train.out_dir={toml_str(out)}", *more]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from attnlab.cli import main

    out = tmp_path_factory.mktemp("deep") / "run"
    main(_train(out, "--set", "train.steps=1"))
    return out


DEEP = "[" * 100_000 + "]" * 100_000  # nested deeper than Python's recursion limit: json raises RecursionError


@pytest.mark.parametrize("name", ["tokenizer.json", "config.json", "trainer_state.json"])
def test_a_checkpoint_json_nested_too_deeply_is_one_line(tiny_run, tmp_path, capsys, name):
    import shutil

    from cli_helpers import one_line_error

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (run / "checkpoint" / name).write_text(DEEP, encoding="utf-8")
    if name == "trainer_state.json":  # generate does without it; resuming needs it
        line = one_line_error(capsys, *_train(run, "--set", "train.steps=2", "--resume"))
    else:
        line = one_line_error(capsys, "generate", str(run), "-p", "a", "-n", "2", "--device", "cpu")
    assert name in line


@pytest.mark.parametrize("suffix, opening", [(".toml", "a = "), (".yaml", "a: ")])
def test_a_config_nested_too_deeply_is_one_line(tmp_path, capsys, suffix, opening):
    from cli_helpers import one_line_error

    config = tmp_path / f"deep{suffix}"
    config.write_text(opening + DEEP + "\n", encoding="utf-8")
    assert "nested too deeply" in one_line_error(capsys, "train", str(config))


def test_a_jsonl_line_nested_too_deeply_is_one_line_naming_it(tmp_path):
    from attnlab.data.text_files import read_classification_file

    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "fine", "label": "a"}\n{"text": ' + DEEP + ', "label": "b"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"line 2: JSON nested too deeply"):
        read_classification_file(data, text_column="text", label_column="label")


def _as_word_tokenizer(data: dict) -> dict:
    return {**data, "type": "word", "pattern": None, "lowercase": False}


def _two_characters_swapped(data: dict) -> dict:
    tokens = list(data["tokens"])
    tokens[-1], tokens[-2] = tokens[-2], tokens[-1]
    return {**data, "tokens": tokens}


def _newline_made_the_unknown_token(data: dict) -> dict:
    # The vocabulary is kept: unknown characters then read as line ends (stop-41 audit: a BERT's pad set to null, or
    # its mask and unk swapped, changed evaluate's numbers with no word).
    return {**data, "specials": {**data["specials"], "unk": "\n"}}


@pytest.mark.parametrize("change, says", [(_as_word_tokenizer, "a word tokenizer; they were trained with a char one"),
                                          (_two_characters_swapped, "are not the vocabulary they were trained with"),
                                          (_newline_made_the_unknown_token, "(its special tokens, unk '\\n', are "
                                                                            "not the ones they were trained with)")])
def test_a_tokenizer_of_the_same_size_and_specials_but_not_the_weights_is_refused(tiny_run, tmp_path, capsys,
                                                                                    change, says):
    # Only the size and the pad, bos and eos ids were compared: a word tokenizer with the char run's token list,
    # or the char vocabulary with two characters' ids swapped, was taken, and generate wrote other text.
    import shutil

    from cli_helpers import one_line_error

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    file = run / "checkpoint" / "tokenizer.json"
    file.write_text(json.dumps(change(json.loads(file.read_text(encoding="utf-8")))), encoding="utf-8")
    line = one_line_error(capsys, "generate", str(run), "-p", "a", "-n", "2", "--device", "cpu")
    assert "tokenizer.json does not belong to these weights (" in line and says in line
    assert line.endswith("use the run's own tokenizer.json")


@pytest.mark.parametrize("position, says", [
    ("learned", "weight 'position.embedding.weight' has shape (16, "),
    ("sinusoidal", "config.json describes a model too large for this machine's memory (sequences of 1000000000000 "
                   "tokens, ")])
def test_a_config_json_with_a_huge_block_size_is_refused_before_it_is_built(tiny_run, tmp_path, capsys, position,
                                                                             says):
    # The model was built at the damaged size first: a (10**12, d) position table, "out of memory; use a smaller
    # model", or for a size that fits, gigabytes allocated before the weights' shapes refused it.
    import shutil

    from cli_helpers import one_line_error

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    file = run / "checkpoint" / "config.json"
    config = json.loads(file.read_text(encoding="utf-8"))
    file.write_text(json.dumps({**config, "block_size": 10**12, "position": position}), encoding="utf-8")
    line = one_line_error(capsys, "generate", str(run), "-p", "a", "-n", "2", "--device", "cpu")
    assert says in line and "out of memory" not in line


@pytest.fixture(scope="module")
def translation_run(tmp_path_factory):
    from cli_helpers import toml_str

    from attnlab.cli import main

    root = tmp_path_factory.mktemp("tr")
    words = "the cat sat on a mat and a dog ran".split()
    src = [" ".join(words[(i + j) % len(words)] for j in range(5)) for i in range(20)]
    (root / "s.txt").write_text("\n".join(src) + "\n", encoding="utf-8")
    (root / "t.txt").write_text("\n".join(s.upper() for s in src) + "\n", encoding="utf-8")
    out = root / "run"
    main(["train", "--set", 'model.family="seq2seq"', "--set", "model.d_model=16", "--set", "model.n_heads=2",
          "--set", "model.d_ff=32", "--set", "model.n_encoder_layers=1", "--set", "model.n_decoder_layers=1",
          "--set", 'data.task="translation"', "--set", f"data.src_path={toml_str(root / 's.txt')}",
          "--set", f"data.tgt_path={toml_str(root / 't.txt')}", "--set", 'data.tokenizer="word"',
          "--set", "data.max_length=8", "--set", "train.steps=1", "--set", "train.batch_size=4",
          "--set", "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu",
          "--set", "train.eval_every=0", "--set", f"train.out_dir={toml_str(out)}"])
    return out


def _swap_pad_and_eos(folder) -> None:
    """The same vocabulary with pad and eos at each other's ids: a tokenizer of the same size, not the weights'."""
    import json

    file = folder / "checkpoint" / "tokenizer.json"
    data = json.loads(file.read_text(encoding="utf-8"))
    tokens = data["tokens"]
    i, j = tokens.index("<pad>"), tokens.index("<eos>")
    tokens[i], tokens[j] = tokens[j], tokens[i]
    file.write_text(json.dumps(data), encoding="utf-8")


def test_a_tokenizer_of_the_same_size_with_other_special_ids_is_refused(translation_run, tmp_path, capsys):
    import shutil

    from cli_helpers import one_line_error

    run = tmp_path / "run"
    shutil.copytree(translation_run, run)
    _swap_pad_and_eos(run)
    line = one_line_error(capsys, "generate", str(run), "-p", "the cat", "--device", "cpu")
    assert "tokenizer.json does not belong to these weights (its pad token is id 6, the model's is 0)" in line


def test_model_init_from_with_a_tokenizer_not_its_weights_is_one_line_before_the_run_starts(
        translation_run, tmp_path, capsys):
    import shutil

    from cli_helpers import one_line_error, toml_str

    pretrained = tmp_path / "pretrained"
    shutil.copytree(translation_run, pretrained)
    _swap_pad_and_eos(pretrained)
    config = json.loads((translation_run / "run.json").read_text(encoding="utf-8"))
    out = tmp_path / "ft"
    line = one_line_error(capsys, "train", "--set", 'model.family="seq2seq"', "--set",
                          f"model.init_from={toml_str(pretrained)}", "--set", 'data.task="translation"',
                          "--set", f"data.src_path={toml_str(config['data']['src_path'])}",
                          "--set", f"data.tgt_path={toml_str(config['data']['tgt_path'])}",
                          "--set", "data.max_length=8", "--set", "train.steps=1", "--set", "train.device=cpu",
                          "--set", f"train.out_dir={toml_str(out)}")
    assert "does not belong to these weights" in line
    assert not out.exists()  # refused before the run replaced anything


@pytest.mark.parametrize("kind", [[], {}, ["char"]])
def test_a_tokenizer_type_that_is_not_a_name_is_refused_in_words(kind):
    # A JSON array or object was looked up in the registry: "unhashable type" (stop-32 bad-input audit).
    from attnlab.data.tokenizers import tokenizer_from_dict

    with pytest.raises(DataError, match=r"unknown tokenizer type .*; expected one of: char, word"):
        tokenizer_from_dict({"type": kind, "version": 1})


def test_a_vocabulary_size_above_what_the_text_gives_is_said(tmp_path):
    # 100,000 asked on a short text gave a vocabulary of a few hundred tokens without a word; run.json keeps the size
    # asked for (stop-41 audit).
    from cli_helpers import toml_str

    from attnlab.cli import main

    text = tmp_path / "t.txt"
    text.write_text(TEXT, encoding="utf-8")
    with pytest.warns(UserWarning, match=r"data.vocab_size = 100,000 is far more than the text gives: the bpe "
                                         r"vocabulary has \d+ tokens, and the model is sized to them"):
        main(_train(tmp_path / "run", "--set", "train.steps=1", "--set", f"data.path={toml_str(text)}", "--set",
                    "data.tokenizer=bpe", "--set", "data.vocab_size=100000"))
    assert json.loads((tmp_path / "run" / "checkpoint" / "config.json").read_text())["vocab_size"] < 1000
