"""`--help` is where a user without the README learns what a command reads: `evaluate` scores BERT pre-training runs
(masked LM and next sentence, from documents separated by blank lines) and its help had not said so — a user gave it
a classifier's TSV and was told that random next sentences need two documents."""

from __future__ import annotations

import typer

from attnlab.cli import app


def _command(name: str):
    return typer.main.get_command(app).commands[name]


def test_evaluate_help_names_what_each_kind_of_run_reads_and_reports():
    command = _command("evaluate")
    data = next(p for p in command.params if p.name == "data").help
    for kind in ("LM:", "classifier:", "translation:", "BERT pre-training: documents separated by blank lines"):
        assert kind in data
    summary = " ".join(command.help.split())
    for reported in ("perplexity", "BLEU", "accuracy (classifiers)", "masked-LM", "next-sentence accuracy"):
        assert reported in summary


def test_none_for_an_options_table_says_how_to_give_none(capsys, tmp_path):
    """`--set model.position_options=none` is refused (a table's entries are dropped one by one with =none); the
    message now says how to give no entries at all."""
    from cli_helpers import one_line_error, toml_str

    line = one_line_error(capsys, "train", "--set", "model.position_options=none", "--set",
                          f"train.out_dir={toml_str(tmp_path / 'run')}")
    assert line == ("attnlab: error: model.position_options: expected a table/dict, got 'none'; for no entries, give "
                    "an empty table: --set model.position_options={}")


def test_convert_help_says_what_a_headless_bert_is_for():
    command = _command("convert")
    assert "without a head" in command.help and "model.init_from" in command.help
    assert "vocab.txt" in next(p for p in command.params if p.name == "hf_folder").help
