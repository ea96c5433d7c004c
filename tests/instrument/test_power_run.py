"""``instrument run`` with power, end to end: a fake powercap tree (DLTRACE_POWERCAP_ROOT)
whose counters this test advances in real time, as the kernel would, while a 2-rank DDP run
samples it; and a host without any source."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import duckdb
import pytest

import analyze
from tests.conftest import instrument_run
from tests.instrument.fake_power import FakePowercap

ZONES = {"intel-rapl:0": ("package-0", 60.0), "intel-rapl:0:0": ("dram", 10.0)}


@pytest.mark.slow
def test_run_with_a_fake_powercap_tree(tmp_path: Path) -> None:
    t0 = time.monotonic()
    tree = FakePowercap(tmp_path / "powercap", ZONES, lambda: time.monotonic() - t0)
    stop = tree.run()
    try:
        run = instrument_run(tmp_path / "runs", "-np", "2", "--power-interval", "0.05", "runs/ddp_resnet.py",
                             "--steps", "4", "--batch-size", "8",
                             env={"DLTRACE_POWERCAP_ROOT": str(tmp_path / "powercap")})
    finally:
        stop()
    assert run.proc.returncode == 0, run.output
    # said once: what was sampled (and nothing about NVML, which is in run.json)
    lines = [line for line in run.output.splitlines() if line.startswith("power:")]
    assert lines == ["power: sampled every 0.05 s on 1 host(s): cpu_package 0 energy, dram 0 energy"]
    power = run.info["power"]["hosts"]
    (host,) = power.values()
    assert host["rank"] == 0 and host["sampled"] and host["read_errors"] == []
    assert [u["source"] for u in host["unavailable"]] == ["NVML"]
    assert "NVMLError_LibraryNotFound" in host["unavailable"][0]["reason"]

    anchor = run.run_dir / "traces.otf2"
    defs = subprocess.run([shutil.which("otf2-print") or "otf2-print", "-G", str(anchor)], capture_output=True,
                          text=True, timeout=60, check=True).stdout
    assert re.search(r'LOCATION\s+\d+\s+Name: "power [^"]+" <\d+>, Type: METRIC, # Events: \d+', defs)
    events = subprocess.run(["otf2-print", str(anchor)], capture_output=True, text=True, timeout=60,
                            check=True).stdout
    samples = [line for line in events.splitlines() if line.startswith("METRIC ")]
    assert len(samples) >= 2 * 10 and all("INT64" in line for line in samples)

    with analyze.open(run.run_dir) as db:
        devices = dict(db.execute("SELECT name, mean_power_w FROM energy_devices").fetchall())
        assert devices.keys() == {"cpu_package 0 energy", "dram 0 energy"}
        # the tree's counters advance at 60 W and 10 W of wall time; the samples are
        # stamped with the tracer's clock (the same host clock), read within ~1 ms
        assert devices["cpu_package 0 energy"] == pytest.approx(60.0, rel=0.03)
        assert devices["dram 0 energy"] == pytest.approx(10.0, rel=0.03)
        steps = db.execute("SELECT count(DISTINCT (rank, step)), sum(energy_j) FROM energy_steps").fetchone()
        assert steps[0] == 8 and steps[1] > 0  # 2 ranks x 4 steps, each with its share of the host's
        assert db.execute("SELECT count(*) FROM energy_phases WHERE phase = 'compute'").fetchone()[0] > 0


@pytest.mark.slow
def test_run_on_a_host_without_power_says_why_once(tmp_path: Path) -> None:
    run = instrument_run(tmp_path / "runs", "-np", "1", "runs/ddp_resnet.py", "--steps", "2", "--batch-size", "4",
                         env={"DLTRACE_POWERCAP_ROOT": str(tmp_path / "no-such-dir")})
    assert run.proc.returncode == 0, run.output
    (line,) = [line for line in run.output.splitlines() if line.startswith("power:")]
    assert "not sampled on" in line and "RAPL: no RAPL zones under" in line and "NVMLError_LibraryNotFound" in line
    with duckdb.connect(str(analyze.build(run.run_dir).db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM metrics").fetchone() == (0,)  # never zeros
