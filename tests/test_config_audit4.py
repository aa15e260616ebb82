"""Configs, fourth audit (stop 43): a text setting a config file set can be unset from the command line. The
columns of a classification table take `=""` (a file's column could be named "none"), best_mode takes `=none`
(its only values are min and max); both were refused or read as a column named "none"."""

from __future__ import annotations

import pytest

from attnlab.errors import ConfigError
from attnlab.training.recipe import load_run_config


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "cls.toml"
    path.write_text('[model]\nfamily = "encoder"\n[data]\ntask = "classification"\npath = "t.tsv"\n'
                    'text_column = "sentence"\nlabel_column = "label"\n[train]\nbest_mode = "max"\n'
                    f'out_dir = "{tmp_path.as_posix()}/run"\n', encoding="utf-8")
    return path


def test_a_files_columns_are_unset_by_an_empty_value(config):
    run = load_run_config(config, ['data.text_column=""', "data.label_column=''"])
    assert (run.data.text_column, run.data.label_column) == (None, None)
    kept = load_run_config(config, ['data.text_column="none"'])  # a column of that name, as before
    assert (kept.data.text_column, kept.data.label_column) == ("none", "label")


@pytest.mark.parametrize("value", ["none", "null", "None"])
def test_a_files_best_mode_is_unset_by_none(config, value):
    run = load_run_config(config, [f"train.best_mode={value}"])
    assert run.train.best_mode is None and run.train.direction == "min"
    assert load_run_config(config).train.best_mode == "max"


def test_version_and_device_names_on_the_command_line(capsys):
    from cli_helpers import run_cli

    import attnlab

    code, out, _ = run_cli(capsys, "--version")
    assert (code, out.strip()) == (0, f"attnlab {attnlab.__version__}")
    code, out, _ = run_cli(capsys, "evaluate", "--help")
    assert code == 0 and "cuda:N" in out
    from attnlab.training.device import select_device

    with pytest.raises(ConfigError, match=r"^device: unknown device 'gpu'; choose one of: auto, cpu, cuda, mps, "
                                          r"cuda:N$"):
        select_device("gpu")
