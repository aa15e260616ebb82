"""Running the `attnlab` command in-process, for the CLI and README tests."""

from __future__ import annotations

from attnlab.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `attnlab *argv`, run in this process."""
    try:
        main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err
