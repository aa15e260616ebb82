"""Command-line paths with a leading ~ are the home folder's, as the same paths in a config file or a --set value are:
a shell leaves a ~ after `--out=` (or in quotes) as it is, and `attnlab run knowledge --out=~/x` wrote into a
folder named '~' in the working one, then said it wrote into the home folder's x."""

from __future__ import annotations

import click
import pytest
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


def test_one_entry_of_an_options_table_keeps_the_files_others(tmp_path):
    # The refusal of `--set model.position_options.num_buckets=8` advised an inline table, which replaced the file's
    # table: max_distance = 64 went back to the scheme's default without a word (fifth config audit).
    from attnlab.errors import ConfigError
    from attnlab.training.recipe import load_run_config, model_config

    config = tmp_path / "t5.toml"
    config.write_text('[model]\nfamily = "gpt"\nposition = "t5-bias"\n[model.position_options]\nnum_buckets = 16\n'
                      'max_distance = 64\n', encoding="utf-8")

    def options(*sets, path=config):
        run = load_run_config(path, list(sets))
        return model_config(run.model, vocab_size=50, head="lm").position_options

    assert options() == {"num_buckets": 16, "max_distance": 64}
    assert options("model.position_options.num_buckets=8") == {"num_buckets": 8, "max_distance": 64}
    assert options("model.position_options={num_buckets = 8}") == {"num_buckets": 8}  # a whole table replaces
    assert options("model.position_options={num_buckets = 8}", "model.position_options.max_distance=32") == \
        {"num_buckets": 8, "max_distance": 32}
    # =none drops an entry: the scheme's default
    assert options("model.position_options.max_distance=none") == {"num_buckets": 16}
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nfamily = "gpt"\nposition = "t5-bias"\nposition_options = "oops"\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"model.position_options = 'oops' is not a table of options"):
        options("model.position_options.num_buckets=8", path=bad)
    # without a file: the entry makes the table
    assert options("model.position=\"t5-bias\"", "model.position_options.max_distance=32", path=None) == \
        {"max_distance": 32}
    with pytest.raises(ConfigError, match=r"an options table holds single values; set one entry with --set "
                                          r"model.position_options.NAME=VALUE"):
        load_run_config(config, ["model.position_options.a.b=1"])
    with pytest.raises(ConfigError, match="position 't5-bias' has no option 'num_bucket'; its options: "
                                          "num_buckets, max_distance"):  # as a misspelt entry of a file is
        from attnlab.training.recipe import prepare

        tiny = tmp_path / "tiny.toml"
        tiny.write_text(config.read_text().replace('family = "gpt"', 'preset = "gpt-char-tiny"'), encoding="utf-8")
        prepare(load_run_config(tiny, ["model.position_options.num_bucket=8", f"train.out_dir='{tmp_path / 'run'}'"]))


def test_one_entry_of_an_options_table_beside_init_from_changes_the_pretrained_runs(tmp_path, capsys):
    # init_from leaves the file's [model] table out, so the entry made a table of its own, compared whole with the
    # pretrained one: restating one of its values was refused as a change, naming a table the user never wrote.
    from cli_helpers import toml_str as _q

    from attnlab.training.recipe import load_run_config

    base = ["--set", "train.progress=false", "--set", "train.device=cpu", "--set", "train.warmup_steps=0",
            "--set", "train.steps=1"]
    pre = tmp_path / "pre"
    code, _, err = run_cli(capsys, "train", "--set", "model.preset=gpt-char-tiny", "--set", "model.position=t5-bias",
                           "--set", "model.position_options={num_buckets = 16, max_distance = 64}", *base,
                           "--set", f"train.out_dir={_q(pre)}")
    assert code == 0, err
    sets = [f"model.init_from={_q(pre)}", "model.position_options.max_distance=64"]
    assert load_run_config(None, sets).model["position_options"] == {"num_buckets": 16, "max_distance": 64}
    code, _, err = run_cli(capsys, "train", *base, "--set", sets[0], "--set", sets[1],
                           "--set", f"train.out_dir={_q(tmp_path / 'ft')}")
    assert code == 0, err
    code, _, err = run_cli(capsys, "train", *base, "--set", sets[0], "--set", "model.position_options.max_distance=32",
                           "--set", f"train.out_dir={_q(tmp_path / 'ft2')}")
    assert code == 2 and "max_distance" in err and "model.init_from was trained with" in err, err
    # =none drops the entry (the scheme's default, 128), a change too: it had been merged back silently (mutation
    # audit 11)
    code, _, err = run_cli(capsys, "train", *base, "--set", sets[0],
                           "--set", "model.position_options.max_distance=none",
                           "--set", f"train.out_dir={_q(tmp_path / 'ft3')}")
    assert code == 2 and "position_options = {'num_buckets': 16}, but the model in model.init_from was trained " \
                         "with {'num_buckets': 16, 'max_distance': 64}" in err, err
