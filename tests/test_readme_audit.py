"""Found while auditing the README: `attnlab run knowledge` over an earlier run's folder warned that it
replaces that run, then refused its files (missing --train/--eval, an unreadable corpus) and replaced
nothing. The warning must come only once the run's data is accepted, as `attnlab train` does for a refused
setting (tests/test_cli_bad_input.py::test_refused_setting_does_not_warn_about_replacing_a_run)."""

from __future__ import annotations

import json
import warnings

import pytest

from attnlab.errors import AttnlabError
from attnlab.experiments.knowledge import run_knowledge


@pytest.mark.parametrize("files", [
    {"corpus": "wiki.txt"},  # --train and --eval missing
    {"corpus": "missing.txt", "train": "missing.tsv", "eval_path": "missing.tsv"},  # files that do not exist
])
def test_refused_data_does_not_warn_about_replacing_an_earlier_run(tmp_path, files):
    out = tmp_path / "knowledge"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"experiment": "knowledge"}))
    files = {key: str(tmp_path / name) for key, name in files.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the "already holds the results of a knowledge run" warning would fail here
        with pytest.raises(AttnlabError):
            run_knowledge(out, device="cpu", progress=False, echo=lambda *a: None, **files)
    assert (out / "results.json").is_file()  # the earlier run is left as it was
