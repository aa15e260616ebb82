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


@app.command()
def params(
    name: str = typer.Argument(..., help="A preset name (see `attnlab params --list`) or a run folder."),
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table."),
) -> None:
    """Exact parameter accounting of a model, per component, with the closed-form formula of each row."""
    from attnlab.analysis.params import params_command

    params_command(name, as_json=as_json)


def main(argv: list[str] | None = None) -> None:
    import click

    try:
        app(args=argv, standalone_mode=False)
    except click.exceptions.Abort:
        print("attnlab: interrupted", file=sys.stderr)
        sys.exit(130)
    except click.exceptions.ClickException as e:
        e.show()
        sys.exit(2)
    except AttnlabError as e:
        code = getattr(e, "exit_code", 2)
        print(f"attnlab: error: {e}", file=sys.stderr)
        sys.exit(code)
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        sys.exit(130)
