"""The `attnlab` command line. Thin: it parses, calls the library, and turns known errors into one
line on stderr with exit code 2 (130 for an interrupted run)."""

from __future__ import annotations

import sys

import typer

from attnlab.errors import AttnlabError

app = typer.Typer(
    name="attnlab",
    help="Attention and Transformer models: build, train, compare and look inside them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Attention and Transformer models: build, train, compare and look inside them."""


@app.command()
def params(
    name: str | None = typer.Argument(None, help="A preset name (see `--list`) or a run folder."),
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table."),
    list_all: bool = typer.Option(False, "--list", help="List every preset with its parameter count."),
) -> None:
    """Exact parameter accounting of a model, per component, with the closed-form formula of each row."""
    from attnlab.analysis.params import params_command

    params_command(name, as_json=as_json, list_all=list_all)


def _click_exceptions():
    """typer >= 0.24 bundles its own copy of click; older versions use click itself."""
    try:
        from typer._click import exceptions
    except ImportError:  # pragma: no cover - older typer
        from click import exceptions
    return exceptions


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app; known errors become one line on stderr and exit code 2."""
    exceptions = _click_exceptions()
    try:
        result = app(args=argv, standalone_mode=False)
    except (typer.Abort, KeyboardInterrupt):
        print("attnlab: interrupted", file=sys.stderr)
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(getattr(e, "exit_code", 0))
    except exceptions.ClickException as e:
        e.show()
        sys.exit(2)
    except AttnlabError as e:
        print(f"attnlab: error: {e}", file=sys.stderr)
        sys.exit(getattr(e, "exit_code", 2))
    if isinstance(result, int) and result:
        sys.exit(result)
