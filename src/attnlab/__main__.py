"""`python -m attnlab` and the `attnlab` command."""

import sys


def run() -> None:
    """Load the command line and run it; Ctrl-C while it loads (typer, rich) stops with the same one line
    and exit code 130 as Ctrl-C later on."""
    from attnlab.allocator import bound_onednn_cache, keep_freed_memory

    keep_freed_memory()  # this process is the command's own: training steps reuse freed memory (see there)
    bound_onednn_cache()  # and batches of many shapes do not fill memory with oneDNN's compiled products
    try:
        from attnlab.cli import main
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        exec("")  # noqa: S102 - see attnlab.cli._forget_escaped_interrupt
        sys.exit(130)
    main()


if __name__ == "__main__":
    run()
