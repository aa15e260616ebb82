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
