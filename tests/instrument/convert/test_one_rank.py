"""A converted script on one rank is the original: every rule is the identity at
``hvd.size() == 1`` (Horovod initializes a single process without a launcher)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from instrument.convert import convert

if os.environ.get("DLTRACE_SKIP_HOROVOD") == "1":  # the setup was told not to build Horovod
    pytest.skip("DLTRACE_SKIP_HOROVOD=1", allow_module_level=True)

pytestmark = pytest.mark.slow  # two PyTorch processes: about 15 s of CPU
SCRIPT = Path(__file__).parent / "scripts" / "torch_mnist_style.py"


def test_the_converted_pytorch_script_prints_the_original_losses(tmp_path: Path) -> None:
    converted = tmp_path / "train_hvd.py"
    converted.write_text(convert(SCRIPT.read_text()).output)
    outputs = []
    for script in (SCRIPT, converted):
        proc = subprocess.run([sys.executable, str(script), "--epochs", "1"], capture_output=True, text=True,
                              timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout)
    losses = [re.findall(r"loss ([0-9.]+)", out) for out in outputs]
    assert len(losses[0]) == 8 and losses[1] == losses[0]  # 128 samples in batches of 16
    assert re.findall(r"sha256 (\w+)", outputs[1]) == re.findall(r"sha256 (\w+)", outputs[0])
