"""``analyze report``: page counts read back from the PDF, PNGs, errors."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pypdf import PdfReader

from tests.conftest import ROOT, SCOREP_FIXTURES, Run
from tests.literal import write_literal

MS = 1_000_000


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "analyze.cli", "report", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def pages(pdf: Path) -> int:
    return len(PdfReader(pdf).pages)


@pytest.mark.slow
def test_report_of_a_ddp_run_and_a_scorep_trace(ddp_run: Run, tmp_path: Path) -> None:
    out = tmp_path / "cmp.pdf"
    scorep = shutil.copytree(SCOREP_FIXTURES / "pipit-pingpong", tmp_path / "pipit-pingpong")
    proc = report(str(ddp_run.run_dir), str(scorep), "-o", str(out), "--png")
    assert proc.returncode == 0, proc.stderr
    # bottleneck comparison + DDP (timeline, steps, collective waits, overlap, root causes,
    # critical path) + ping-pong (the same but waits: it has no collectives)
    assert pages(out) == 1 + 6 + 5
    assert "(12 pages)" in proc.stdout
    pngs = sorted(p.name for p in tmp_path.glob("cmp-*.png"))
    assert pngs == ["cmp-01-ddp-causes.png", "cmp-01-ddp-critical-path.png", "cmp-01-ddp-overlap.png",
                    "cmp-01-ddp-steps.png", "cmp-01-ddp-timeline.png", "cmp-01-ddp-waits.png",
                    "cmp-02-pipit-pingpong-causes.png", "cmp-02-pipit-pingpong-critical-path.png",
                    "cmp-02-pipit-pingpong-overlap.png", "cmp-02-pipit-pingpong-steps.png",
                    "cmp-02-pipit-pingpong-timeline.png", "cmp-bottleneck.png"]
    assert all((tmp_path / p).stat().st_size > 10_000 for p in pngs)


@pytest.mark.slow
def test_steps_window_and_its_errors(ddp_run: Run, tmp_path: Path) -> None:
    ok = report(str(ddp_run.run_dir), "-o", str(tmp_path / "w.pdf"), "--steps", "1:3")
    assert ok.returncode == 0, ok.stderr
    assert pages(tmp_path / "w.pdf") == 7
    for bad, words in (("3:1", "B must be larger"), ("x", "expected A:B"), ("50:52", "has no steps 50:52")):
        proc = report(str(ddp_run.run_dir), "-o", str(tmp_path / "bad.pdf"), "--steps", bad)
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
        assert words in proc.stderr
    assert not (tmp_path / "bad.pdf").exists()


def test_hostile_run_names_and_a_missing_run(tmp_path: Path) -> None:
    run = tmp_path / "größe 'α' \"q\" $(x)"
    write_literal(run, [(0, "dltrace.step", 0, 10 * MS), (1, "dltrace.step", 0, 12 * MS),
                        (0, "MPI_Allreduce", 2 * MS, 4 * MS, {"op": "allreduce", "bytes": 8}),
                        (1, "MPI_Allreduce", 3 * MS, 4 * MS, {"op": "allreduce", "bytes": 8})])
    out = tmp_path / "out" / "r.pdf"
    proc = report(str(run), "-o", str(out), "--png")
    assert proc.returncode == 0, proc.stderr
    # bottleneck, timeline, steps, waits, overlap, root causes (rank 0 waits 1 ms), critical path
    assert pages(out) == 7
    assert sorted(p.name for p in out.parent.glob("*.png"))[0] == "r-01-gr_e_q_x-causes.png"
    missing = report(str(tmp_path / "nope"), "-o", str(tmp_path / "n.pdf"))
    assert missing.returncode != 0 and "no such run directory" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_output_must_be_a_pdf(tmp_path: Path) -> None:
    proc = report(str(tmp_path / "whatever"), "-o", str(tmp_path / "r.png"))
    assert proc.returncode != 0 and "must end in .pdf" in proc.stderr


def test_the_same_run_gives_the_same_report_bytes(tmp_path: Path) -> None:
    """A report is reproducible: no creation date in the PDF, the waits' jitter seeded (two
    reports of one run differed in both)."""
    records = []
    for step in range(6):
        t = step * 20 * MS
        for rank in (0, 1):
            records.append((rank, "dltrace.step", t, t + 15 * MS))
            records.append((rank, "MPI_Allreduce", t + (5 + 3 * rank + step % 2) * MS, t + 12 * MS,
                            {"op": "allreduce", "bytes": 8}))
    run = tmp_path / "run"
    write_literal(run, records)
    outs = []
    for name in ("a", "b"):
        proc = report(str(run), "-o", str(tmp_path / f"{name}.pdf"), "--png")
        assert proc.returncode == 0, proc.stderr
        outs.append(tmp_path / f"{name}.pdf")
    assert outs[0].read_bytes() == outs[1].read_bytes()
    pngs = sorted(p.name[2:] for p in tmp_path.glob("a-*.png"))
    assert "01-run-waits.png" in pngs
    for name in pngs:
        assert (tmp_path / f"a-{name}").read_bytes() == (tmp_path / f"b-{name}").read_bytes(), name
