"""The README's examples work as written: its Python blocks run, and the command transcripts that are quick
to reproduce (parameter accounting, a mistyped setting) print what the README shows."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import run_cli

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def blocks(language: str) -> list[str]:
    """The fenced blocks opened with ```<language> ("" for plain fences), in order."""
    out, current, lang = [], None, ""
    for line in README.splitlines():
        if line.startswith("```"):
            if current is None:
                current, lang = [], line[3:].strip()
            else:
                if lang == language:
                    out.append("\n".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return out


def transcript(command: str) -> list[str]:
    """The lines the README shows after `$ command`, up to the next prompt or the end of the block."""
    for block in blocks(""):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.split("#")[0].strip() == f"$ {command}":
                rest = lines[i + 1:]
                end = next((j for j, s in enumerate(rest) if s.startswith("$ ")), len(rest))
                return [s for s in rest[:end] if s.strip()]
    raise AssertionError(f"the README has no transcript of `{command}`")


def run(capsys, *argv: str) -> tuple[int, str]:
    code, out, err = run_cli(capsys, *argv)
    return code, out + err


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_blocks_run(index):
    exec(compile(blocks("python")[index], f"README.md python block {index}", "exec"), {})


def test_params_transcript_matches(capsys):
    shown = transcript("attnlab params transformer-base")
    code, out = run(capsys, "params", "transformer-base")
    assert code == 0
    produced = [s.rstrip() for s in out.splitlines()]
    # The README elides rows with "..."; every line it does show is printed verbatim.
    for line in shown:
        if line.strip() != "...":
            assert line.rstrip() in produced, line


def test_mistyped_setting_transcript_matches(capsys):
    shown = transcript('attnlab train --set model.postion=rotary; echo "exit code $?"')
    code, out = run(capsys, "train", "--set", "model.postion=rotary")
    assert [s for s in out.splitlines() if s.strip()] + [f"exit code {code}"] == shown
