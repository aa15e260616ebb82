"""A checkpoint file the user may not read is said to be that, not corrupt or missing: safetensors reports a file
it is refused as "No such file or directory", and the command called it corrupt."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from cli_helpers import toml_str

# As root, files are readable whatever their mode: the command then runs without the two capabilities that allow it.
SETPRIV = shutil.which("setpriv")
AS_USER = [SETPRIV, "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 and SETPRIV else []


@pytest.mark.skipif(os.geteuid() == 0 and not SETPRIV, reason="running as root without setpriv (util-linux)")
def test_a_weights_file_that_may_not_be_read_is_a_permission_error(tmp_path):
    from attnlab.cli import main

    run = tmp_path / "run"
    main(["train", "--set", "model.preset=gpt-char-tiny", "--set", "model.block_size=16", "--set",
          "train.progress=false", "--set", "train.precision=fp32", "--set", "train.device=cpu", "--set",
          "train.steps=1", "--set", "train.warmup_steps=0", "--set", f"train.out_dir={toml_str(run)}"])
    weights = run / "checkpoint" / "model.safetensors"
    weights.chmod(0)
    try:
        done = subprocess.run([*AS_USER, sys.executable, "-m", "attnlab", "generate", str(run), "-p", "a", "-n", "2",
                               "--device", "cpu"], capture_output=True, text=True, timeout=300)
    finally:
        weights.chmod(0o644)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0] == f"attnlab: error: Permission denied: {weights}; check the path and its permissions"
