"""Command-line paths with a leading ~ are the home folder's, as the same paths in a config file or a --set value are:
a shell leaves a ~ after `--out=` (or in quotes) as it is, and `attnlab run knowledge --out=~/x` wrote into a
folder named '~' in the working one, then said it wrote into the home folder's x."""

from __future__ import annotations

import click
from cli_helpers import run_cli

from attnlab.cli import app

# Every command-line option or argument that names a file or folder, by command.
PATHS = {"params": {"name"}, "convert": {"hf_folder", "run_folder"}, "train": {"config"},
         "generate": {"run_dir", "input_file"}, "evaluate": {"run_dir", "data", "target"},
         "run knowledge": {"corpus", "train", "eval_path", "predict", "out"}}


def _commands():
    import typer

    from attnlab.files import expand_home

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        if hasattr(command, "commands"):  # `run`'s experiments
            for sub, inner in command.commands.items():
                yield f"{name} {sub}", inner, expand_home
        else:
            yield name, command, expand_home


def test_every_path_option_takes_a_leading_tilde_as_the_home_folder():
    seen = set()
    for name, command, expand_home in _commands():
        for param in command.params:
            if name in PATHS and param.name in PATHS[name]:
                seen.add((name, param.name))
                assert param.callback is not None, (name, param.name)
                ctx = click.Context(command)
                assert param.callback(ctx, param, "~/x") == expand_home("~/x") != "~/x", (name, param.name)
                assert param.callback(ctx, param, "runs/~x") == "runs/~x"
                assert param.callback(ctx, param, None) is None
    assert seen == {(name, p) for name, params in PATHS.items() for p in params}


def test_a_run_named_with_a_tilde_on_the_command_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (tmp_path / "text.txt").write_text("the cat sat on the mat\n" * 200, encoding="utf-8")
    (tmp_path / "run.toml").write_text('[model]\npreset = "gpt-char-tiny"\n[data]\npath = "~/text.txt"\n'
                                       '[train]\nsteps = 2\nwarmup_steps = 0\nprogress = false\ndevice = "cpu"\n'
                                       'out_dir = "~/run"\n', encoding="utf-8")
    code, _, err = run_cli(capsys, "train", "~/run.toml")
    assert code == 0, err
    assert (tmp_path / "run" / "checkpoint").is_dir()
    code, out, err = run_cli(capsys, "evaluate", "~/run", "--data=~/text.txt", "--json")
    assert code == 0 and '"loss"' in out, err
    code, out, err = run_cli(capsys, "generate", "~/run", "-p", "the", "-n", "3", "--greedy")
    assert code == 0 and out.startswith("the"), err
    code, out, err = run_cli(capsys, "params", "~/run")
    assert code == 0 and "total" in out.lower(), err
    assert not (work / "~").exists()
