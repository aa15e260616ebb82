"""A precision refusal or warning names the setting as the user wrote it: `train.precision = "bf16"` for a run's
config, `--precision bf16` for `attnlab evaluate` (which was told to set `precision = "auto"`, a config setting it
has none of)."""

from __future__ import annotations

import warnings

import pytest
import torch

from attnlab.training import device


@pytest.mark.parametrize(("setting", "said", "instead"), [
    ("train.precision", 'train.precision = "bf16"', 'use train.precision = "auto" or "fp32"'),
    ("--precision", "--precision bf16", "use --precision auto or fp32"),
    ("precision", 'precision = "bf16"', 'use precision = "auto" or "fp32"'),
])
def test_bf16_on_a_cpu_without_it_is_said_in_the_users_words(monkeypatch, setting, said, instead):
    monkeypatch.setattr(device, "cpu_has_bf16", lambda: False)
    with pytest.warns(device.SlowPrecisionWarning) as caught:
        assert device.resolve_precision("bf16", torch.device("cpu"), setting=setting) is torch.bfloat16
    message = str(caught[0].message)
    assert message.startswith(f"{said} on a CPU without bf16 instructions") and message.endswith(instead), message
    with pytest.raises(Exception, match=f"^{setting}: unknown value 'bf17'"):
        device.resolve_precision("bf17", torch.device("cpu"), setting=setting)


def test_evaluate_and_train_name_their_own_setting(monkeypatch, tmp_path, capsys):
    from cli_helpers import run_cli
    from cli_helpers import toml_str as _q

    monkeypatch.setattr(device, "cpu_has_bf16", lambda: False)
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = run_cli(capsys, "train", "--set", "model.preset=gpt-char-tiny", "--set", "train.steps=1",
                               "--set", "train.warmup_steps=0", "--set", "train.progress=false", "--set",
                               "train.device=cpu", "--set", "train.precision=bf16", "--set", f"train.out_dir={_q(out)}")
    assert code == 0, err
    said = {str(w.message).split(" on a CPU")[0] for w in caught if "on a CPU without bf16" in str(w.message)}
    assert said == {'train.precision = "bf16"'}, said
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat\n" * 40, encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = run_cli(capsys, "evaluate", str(out), "--data", str(text), "--precision", "bf16")
    assert code == 0, err
    said = {str(w.message).split(" on a CPU")[0] for w in caught if "on a CPU without bf16" in str(w.message)}
    assert said == {"--precision bf16"}, said
