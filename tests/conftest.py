"""Shared test helpers: running ``instrument run`` as a user would, and paths to fixtures."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs"
# Real Score-P archives written by other projects (sources and licences in their README).
SCOREP_FIXTURES = ROOT / "tests" / "fixtures" / "scorep"


@dataclass
class Run:
    proc: subprocess.CompletedProcess[str]
    run_dir: Path

    @property
    def info(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "run.json").read_text())

    @property
    def output(self) -> str:
        return self.proc.stdout + self.proc.stderr

    def number(self, label: str) -> int:
        """The integer the example printed after ``label`` ("gradient bytes 701032")."""
        m = re.search(re.escape(label) + r" (\d+)", self.output)
        assert m, self.output
        return int(m.group(1))

    @property
    def losses(self) -> list[float]:
        """The per-step losses the example printed (runs/step_clock.py)."""
        m = re.search(r"losses (\[.*\])", self.output)
        assert m, self.output
        return json.loads(m.group(1))


def instrument_run(out: Path, *args: str, name: str = "t", timeout: float = 600,
                   env: dict[str, str] | None = None) -> Run:
    """``instrument run --out OUT --name NAME ARGS...`` in a subprocess, as a user runs it."""
    cmd = [sys.executable, "-m", "instrument.cli", "run", "--out", str(out), "--name", name, *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))
    return Run(proc, out / name)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under ``make test`` (what CI runs), everything the setup installs must be there: a
    test that skips for want of it would hide a broken setup."""
    if os.environ.get("DLTRACE_REQUIRE_ALL") != "1":
        return
    from analyze.readers import otf2_native

    missing = [] if otf2_native.available() else [
        f"the native OTF2 reader ({otf2_native.unavailable_reason()})"]
    missing += [m for m in ("tensorflow", "horovod", "mpi4py") if importlib.util.find_spec(m) is None]
    missing += [t for t in ("mpirun", "otf2-print") if shutil.which(t) is None]
    if os.environ.get("DLTRACE_SKIP_HOROVOD") == "1":
        missing.append("Horovod (DLTRACE_SKIP_HOROVOD=1 is set)")
    if missing:
        pytest.exit("make test needs what `make setup` installs; missing: " + ", ".join(missing), returncode=3)


@pytest.fixture(scope="session")
def scorep_fixtures() -> Path:
    return SCOREP_FIXTURES


DDP_STEPS = 4


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One output directory for the multi-rank runs of a test session."""
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def ddp_run(runs_dir: Path) -> Run:
    """A traced 2-rank run of runs/ddp_resnet.py (DDP_STEPS steps), shared by the tests that
    read it (instrument, analyze and report tests)."""
    run = instrument_run(runs_dir, "-np", "2", "runs/ddp_resnet.py", "--steps", str(DDP_STEPS),
                         "--batch-size", "16", name="ddp")
    assert run.proc.returncode == 0, run.output
    return run
