"""Killed ranks, interrupted jobs, full disks, concurrent starts and hostile names."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import analyze
from instrument.tracer.spill import SpillError, read_rank
from tests.conftest import ROOT, instrument_run
from tests.literal import write_literal
from traceio.records import STEP, Kind

SCRIPTS = Path(__file__).parent / "scripts"
MS = 1_000_000


def cli(*args: str, **kw) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    return subprocess.Popen([sys.executable, "-m", "instrument.cli", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def wait_for_steps(run_dir: Path, rank: int, steps: int, timeout: float = 120) -> dict:
    """The rank's metadata once its spill file holds ``steps`` step enters."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            spill = read_rank(run_dir / "ranks", rank)
        except SpillError:
            time.sleep(0.05)
            continue
        step = [i for i, r in enumerate(spill.meta["regions"]) if r["name"] == STEP]
        recs = spill.records
        if step and ((recs["kind"] == Kind.ENTER) & (recs["region"] == step[0])).sum() >= steps:
            assert spill.meta["status"] == "running"
            return spill.meta
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} did not reach {steps} steps in {timeout} s")


def test_eight_concurrent_runs_get_eight_directories(tmp_path: Path) -> None:
    procs = [cli("run", "--out", str(tmp_path), "--tracer", "none", str(SCRIPTS / "regions.py"))
             for _ in range(8)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    dirs = sorted(p.name for p in tmp_path.iterdir())
    assert dirs == [f"run-{i:04d}" for i in range(1, 9)]
    assert all(json.loads((tmp_path / d / "run.json").read_text())["status"] == "ok" for d in dirs)


def test_concurrent_analyses_of_one_run_leave_a_whole_database(tmp_path: Path) -> None:
    run = tmp_path / "run"
    items = [(r, "dltrace.step", s * 10 * MS, (s + 1) * 10 * MS) for r in (0, 1) for s in range(20)]
    write_literal(run, items)
    for _ in range(3):
        procs = [subprocess.Popen([sys.executable, "-m", "analyze.cli", "phases", "--force", str(run)],
                                  cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(2)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        db = analyze.open(run)
        assert db.execute("select count(*) from steps").fetchone() == (40,)
        db.close()
    assert not list(run.glob(".*tmp*"))  # no temporary database left behind


def test_hostile_run_and_region_names_end_to_end(tmp_path: Path) -> None:
    names = ["'; DROP TABLE regions; --", 'say "hi"', "a/b\\c", "two\nlines", "größe ∂ 名前", "tab\there"]
    name = "run 'q' \"dq\" ü"
    run = instrument_run(tmp_path, "-np", "2", str(SCRIPTS / "regions.py"), "--names", json.dumps(names),
                         name=name)
    assert run.proc.returncode == 0, run.output
    assert run.run_dir == tmp_path / name and run.run_dir.is_dir()
    db = analyze.open(run.run_dir)
    got = {r[0] for r in db.execute("select name from regions").fetchall()}
    assert set(names) <= got
    counts = db.execute("""select r.name, count(*) from intervals i join regions r using (region_id)
                           where r.name in (select unnest($names)) group by r.name""",
                        {"names": names}).fetchall()
    assert sorted(counts) == sorted((n, 2 * 3) for n in names)  # 2 ranks x 3 repeats
    assert db.execute("select run_name from runs").fetchone() == (name,)
    db.close()
    # and through to a PDF
    pdf = tmp_path / "out.pdf"
    proc = subprocess.run([sys.executable, "-m", "analyze.cli", "report", str(run.run_dir), "-o", str(pdf)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert pdf.stat().st_size > 10_000


def test_unwritable_output_directory_is_one_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    p = cli("run", "--out", str(blocker / "traces"), str(SCRIPTS / "regions.py"))
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0
    assert err.strip().splitlines() == [err.strip()] and "Traceback" not in err
    assert "cannot create the output directory" in err and str(blocker / "traces") in err


def test_a_full_disk_stops_tracing_not_training(tmp_path: Path) -> None:
    """A file-size limit stands in for a full disk: writes beyond it fail with EFBIG."""
    code = f"""
import resource, signal, sys
from pathlib import Path
from instrument.tracer.builtin import Tracer
from traceio.records import FORWARD
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
tr = Tracer(0, 1, Path({str(tmp_path)!r}), capacity=256, flush_interval_s=None)
rid = tr.region_id(FORWARD)
for i in range(20_000):
    tr.enter(rid)
    tr.leave(rid)
tr.finalize("ok")
print("training went on", tr.buffer.dropped)
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "training went on" in proc.stdout
    assert "cannot write the trace to" in proc.stderr and str(tmp_path / "ranks") in proc.stderr
    assert proc.stderr.count("dltrace:") == 1  # one message, not one per failed write
    spill = read_rank(tmp_path / "ranks", 0)  # what was written stays readable
    assert 1000 < len(spill.records) <= 100_000 // 48
    assert np.all(np.diff(spill.records["time"]) >= 0)


@pytest.mark.slow
def test_a_rank_dying_after_its_script_finished_keeps_a_complete_trace(tmp_path: Path) -> None:
    """As PyTorch gloo programs sometimes do (runs/gloo_exit.py): the run fails, but says the
    script had finished and the trace is whole."""
    run = instrument_run(tmp_path, "-np", "2", str(SCRIPTS / "regions.py"), "--abort-at-exit")
    assert run.proc.returncode != 0
    assert "failed: rank 0 (killed by SIGABRT after its script finished; its trace is complete)" \
        in run.proc.stderr or "failed: rank 1 (killed by SIGABRT after its script finished" in run.proc.stderr
    assert "trace written:" in run.proc.stderr and "[incomplete" not in run.proc.stderr, run.output
    info = run.info
    assert info["status"] == "failed" and info["complete"] is True
    assert {e["status"] for e in info["rank_info"]} == {"died_at_exit"}
    assert analyze.open(run.run_dir).execute(
        "SELECT count(*) FROM intervals JOIN regions USING (region_id) WHERE name = 'outer'").fetchone() == (6,)


def test_sigkill_of_one_rank_keeps_its_trace_up_to_the_last_flush(tmp_path: Path) -> None:
    interval = 0.2
    p = cli("run", "--out", str(tmp_path), "--name", "kill", "-np", "2", "--grace", "3",
            "runs/ddp_resnet.py", "--steps", "400", "--batch-size", "8",
            env=dict(os.environ, DLTRACE_FLUSH_INTERVAL_S=str(interval)))
    run_dir = tmp_path / "kill"
    meta = wait_for_steps(run_dir, 1, 6)
    killed_at = time.perf_counter_ns()  # CLOCK_MONOTONIC, the ranks' clock on this machine
    os.kill(meta["pid"], signal.SIGKILL)
    out, err = p.communicate(timeout=180)
    assert p.returncode != 0
    assert "failed: rank 1 (killed by SIGKILL; trace ends at its last flush)" in err, out + err
    info = json.loads((run_dir / "run.json").read_text())
    r0, r1 = info["rank_info"]
    assert r1["status"] == "killed" and r1["complete"] is False
    assert r0["status"] in ("exception", "signal", "exit")  # lost its peer, but flushed everything
    # rank 1's events reach to within one flush interval (plus one step) of the kill
    lost_ns = killed_at - r1["last_time_ns"]
    assert 0 <= lost_ns < (interval + 1.0) * 1e9, lost_ns
    db = analyze.open(run_dir)
    steps = dict(db.execute("select rank, count(*) from steps group by rank").fetchall())
    assert steps[1] >= 5 and steps[0] >= steps[1] - 1  # rank 0 fails in the step rank 1 died in


@pytest.mark.slow
def test_sigterm_to_the_launcher_flushes_every_rank(tmp_path: Path) -> None:
    # The steps are seen after the first periodic flush, 30 s in (a step is about 20 records:
    # the buffer does not fill first), so the run must outlast it: 400 steps took 17 s on a
    # quick machine and ended first; 2,000 take 40-90 s (the data, 400 MB a rank, is made up
    # front), and the signal ends the run. It comes 4 s after that flush, so the records
    # within 2 s of it (below) are only in memory unless the signal's flush writes them.
    p = cli("run", "--out", str(tmp_path), "--name", "term", "-np", "2", "runs/ddp_resnet.py",
            "--steps", "2000", "--batch-size", "8", env=dict(os.environ, DLTRACE_FLUSH_INTERVAL_S="30"))
    run_dir = tmp_path / "term"
    wait_for_steps(run_dir, 0, 4)
    time.sleep(4)
    sent_at = time.perf_counter_ns()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 128 + signal.SIGTERM, out + err
    assert "interrupted by SIGTERM" in err
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "interrupted" and info["complete"] is False
    assert [r["status"] for r in info["rank_info"]] == ["signal", "signal"]
    # every rank wrote its records up to the signal, not just up to its last periodic flush
    # (every 30 s here; the default is 0.5 s)
    assert all(abs(r["last_time_ns"] - sent_at) < 2e9 for r in info["rank_info"]), info["rank_info"]
    db = analyze.open(run_dir)
    assert db.execute("select count(distinct rank) from steps").fetchone() == (2,)
