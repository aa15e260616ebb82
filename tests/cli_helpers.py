"""Running the `attnlab` command in-process, for the CLI and README tests."""

from __future__ import annotations

import json
import warnings

from attnlab.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `attnlab *argv`, run in this process."""
    capsys.readouterr()  # what ran before it (an in-process training prints its evaluations) is not its output
    try:
        main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err


def run_cli_warned(capsys, *argv: str, about: str) -> tuple[int, str, list[str]]:
    """(exit code, stderr, the messages of the warnings that mention `about`) of `attnlab *argv`, run in this process
    with every warning recorded (each said as often as it is given)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = run_cli(capsys, *argv)
    return code, err, [str(w.message) for w in caught if about in str(w.message)]


def train_in_process(*argv: str) -> None:
    """`attnlab train *argv` in this process, which must succeed: for module-wide fixtures, which have no capsys."""
    try:
        main(["train", *argv])
    except SystemExit as e:
        assert not e.code, f"training failed (exit {e.code}): {argv}"


def one_line_error(capsys, *argv: str) -> str:
    """The one stderr line of `attnlab *argv`, which must exit with code 2 and print no traceback."""
    code, _, err = run_cli(capsys, *argv)
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def toml_str(path) -> str:
    """A path as a TOML string, for `--set key=value` and override lists."""
    return json.dumps(str(path))


def spy_on_generate_context(monkeypatch) -> list:
    """The `context` each later call of attnlab's `generate` is given (the calls still run), as a list that fills."""
    import attnlab.inference.generate as module

    seen = []
    real = module.generate

    def spy(*args, **kwargs):
        seen.append(kwargs.get("context"))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "generate", spy)
    return seen
