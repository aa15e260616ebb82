"""The command line found wrong by a third audit: `attnlab run --list knowledge` ran the experiment (over an
earlier run's results) instead of listing or refusing."""

from __future__ import annotations

from cli_helpers import one_line_error


def test_list_with_an_experiment_is_refused_before_anything_runs(capsys, tmp_path):
    out = tmp_path / "knowledge"
    line = one_line_error(capsys, "run", "--list", "knowledge", "-o", str(out))
    assert "give --list or an experiment, not both" in line
    assert not out.exists()


def test_a_folder_of_hf_weights_is_not_offered_as_a_run(tmp_path):
    # An HF save_pretrained folder (config.json and model.safetensors) was named as a run to pick, then refused.
    import pytest

    from attnlab.errors import CheckpointError
    from attnlab.models.registry import build_model, get_preset
    from attnlab.training.checkpoint import find_checkpoint, save_checkpoint

    hf = tmp_path / "models" / "gpt2-hf"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text('{"model_type": "gpt2", "n_embd": 32}', encoding="utf-8")
    (hf / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(CheckpointError) as e:
        find_checkpoint(tmp_path / "models")
    assert "gpt2-hf" not in str(e.value)
    save_checkpoint(tmp_path / "models" / "ours" / "checkpoint", build_model(get_preset("gpt-char-tiny")[1]))
    with pytest.raises(CheckpointError, match=f"holds no model itself but the runs {tmp_path / 'models' / 'ours'};"):
        find_checkpoint(tmp_path / "models")
