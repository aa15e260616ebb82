"""A rerun of the knowledge experiment took a data/ of the user's own corpus.txt, train.tsv and dev.tsv for an
earlier run's world (and deleted it) whenever the results of any synthetic run lay beside it: an unmarked data/
is the earlier run's only when it holds exactly the world those results describe."""

from __future__ import annotations

import pytest
from test_knowledge_experiment import TINY

from attnlab.data.world import WORLD_MARK
from attnlab.errors import ConfigError
from attnlab.experiments.knowledge import run_knowledge

ARGS = dict(variants="none", device="cpu", overrides=TINY, progress=False, echo=lambda *_: None)


def test_the_users_files_beside_a_synthetic_runs_results_are_kept(tmp_path):
    out = tmp_path / "out"
    run_knowledge(out, **ARGS)
    world = {p.name: p.read_bytes() for p in (out / "data").iterdir() if p.name != WORLD_MARK}
    (out / "data" / WORLD_MARK).unlink()  # a world from before the mark: replaced by a rerun, as before
    with pytest.warns(UserWarning, match="already holds the results of a knowledge run"):
        run_knowledge(out, **ARGS)
    assert {p.name: p.read_bytes() for p in (out / "data").iterdir() if p.name != WORLD_MARK} == world
    mine = {name: f"my own {name}\n" for name in ("corpus.txt", "train.tsv", "dev.tsv")}
    (out / "data" / WORLD_MARK).unlink()
    for name, text in mine.items():  # the user's files in its place, under the world's names
        (out / "data" / name).write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match="data' holds files that are not an earlier knowledge run's synthetic"):
        run_knowledge(out, **ARGS)
    assert {p.name: p.read_text(encoding="utf-8") for p in (out / "data").iterdir()} == mine


def test_the_users_files_put_in_a_marked_worlds_place_are_kept(tmp_path):
    """The mark alone had made a data/ the earlier run's world: the user's own files put there (and read by a run
    with --corpus/--train/--eval) were replaced by the next synthetic run without a word."""
    out = tmp_path / "out"
    run_knowledge(out, **ARGS)
    mine = {name: f"my own {name}\n" for name in ("corpus.txt", "train.tsv", "dev.tsv")}
    world = {name: (out / "data" / name).read_bytes() for name in mine}
    for name, text in mine.items():
        (out / "data" / name).write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match="data' holds files that are not an earlier knowledge run's synthetic"):
        run_knowledge(out, **ARGS)
    assert {name: (out / "data" / name).read_text(encoding="utf-8") for name in mine} == mine
    assert (out / "results.json").is_file()  # refused before the earlier run's outputs were replaced
    for name, data in world.items():  # the world the mark describes, as written: replaced by a rerun as before
        (out / "data" / name).write_bytes(data)
    with pytest.warns(UserWarning, match="already holds the results of a knowledge run"):
        run_knowledge(out, **ARGS)
