"""Each benchmark script runs once on a tiny size, so the scripts keep working.

Benchmarks are not tests: nothing here checks a speed, only that every script completes and
prints its table.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def bench(*args: str, timeout: float = 600) -> str:
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_synth(tmp_path: Path) -> None:
    out = bench("bench.synth", "--events", "5k", "--out", str(tmp_path / "run"))
    assert "events in" in out and (tmp_path / "run" / "traces.otf2").is_file()


def test_ingest(tmp_path: Path) -> None:
    out = bench("bench.ingest", "--events", "5k", "--repeat", "1", "--cache", str(tmp_path))
    assert "python/native" in out and "ingest Mev/s" in out and "build RSS MB" in out


def test_merge(tmp_path: Path) -> None:
    out = bench("bench.merge", "--events", "5k", "--repeat", "1", "--cache", str(tmp_path))
    assert "python/native" in out and "Mev/s" in out


@pytest.mark.slow
def test_overhead() -> None:
    out = bench("bench.overhead", "--workload", "small-ops", "--repeat", "1", "--steps", "3", "--threads", "1")
    assert "ratio to none" in out and "torch.profiler" in out and "builtin+device" in out
    assert "runs/ddp_small_ops.py --steps 3" in out


def test_power_sampler() -> None:
    out = bench("bench.power_sampler", "--samples", "20")
    assert "CPU us/sample" in out and "% of a core" in out


def test_perrank(tmp_path: Path) -> None:
    out = bench("bench.perrank", "--events", "5k", "--ranks", "2", "--repeat", "1", "--cache", str(tmp_path))
    assert "end step merged/per-rank" in out and "flush us" in out


def test_scale_ratios(tmp_path: Path) -> None:
    out = bench("bench.scale", "ratios", "--events", "20k", "--python-events", "5k", "--rounds", "1",
                "--ours-runs", "3", "--cache", str(tmp_path))
    assert "analyze phases (native, local)" in out and "otf2 Python API, extrapolated" in out
    assert re.search(r"analyze phases \(native, local\) +20,160 +1x3 ", out)  # a round's median of 3 runs
    assert out.count("  ours: 20,160 events") == 3
    assert re.search(r"Ours with one run per round \(the round's first of 3\).*: [\d.]+x otf2 Python API", out)
    assert "matching across ranks" in out and "x ours per round" in out
    assert "OTF2 library decoding alone (no rows)" in out
    assert re.search(r"if everything after its decoding were free .*: \d+x otf2 Python API", out)


def test_scale_ratios_without_pipit_says_where_to_get_it(tmp_path: Path) -> None:
    """A directory without Pipit's package stops the bench before any run, in one sentence
    (not with a child's traceback after the other tools' runs)."""
    proc = subprocess.run([sys.executable, "-m", "bench.scale", "ratios", "--events", "20k", "--pipit",
                           str(tmp_path), "--cache", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and not proc.stdout
    assert f"--pipit {tmp_path}: no pipit package there" in proc.stderr and "hpcgroup/pipit" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_scale_dask(tmp_path: Path) -> None:
    out = bench("bench.scale", "dask", "--events", "20k", "--workers", "1,2", "--repeat", "1",
                "--cache", str(tmp_path))
    assert "predicted with 64 workers" in out and "4 locations and 2 ranks bound the tasks" in out
