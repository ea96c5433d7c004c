"""Bad input gives one clear error and no half-written database; rebuilding is idempotent."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import analyze
from analyze.errors import AnalyzeError
from tests.conftest import ROOT
from tests.literal import write_literal

MS = 1_000_000


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "analyze.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=None if env is None else {**os.environ, **env})


def small_run(path: Path) -> Path:
    write_literal(path, [(0, "dltrace.step", 0, 10 * MS), (1, "dltrace.step", 0, 12 * MS),
                         (0, "MPI_Allreduce", 2 * MS, 4 * MS, {"op": "allreduce", "bytes": 8}),
                         (1, "MPI_Allreduce", 3 * MS, 4 * MS, {"op": "allreduce", "bytes": 8})])
    return path


def assert_clean_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for w in words:
        assert w in lines[0]


def test_missing_directory(tmp_path: Path) -> None:
    assert_clean_error(cli("phases", str(tmp_path / "nope")), "no such run directory", "nope")


def test_directory_without_anchor(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert_clean_error(cli("phases", str(tmp_path / "empty")), "no OTF2 archive", "empty")


def test_truncated_event_file(tmp_path: Path) -> None:
    run = small_run(tmp_path / "run")
    evt = sorted((run / "traces").glob("*.evt"))[0]
    evt.write_bytes(evt.read_bytes()[:7])
    proc = cli("phases", str(run))
    assert_clean_error(proc, str(run / "traces.otf2"))
    assert not list(run.glob("*.duckdb*")) and not list(run.glob(".*.duckdb*"))


def test_corrupt_anchor(tmp_path: Path) -> None:
    run = small_run(tmp_path / "run")
    (run / "traces.otf2").write_bytes(b"\x00garbage" * 10)
    assert_clean_error(cli("phases", str(run)), "traces.otf2")


def test_missing_definitions(tmp_path: Path) -> None:
    run = small_run(tmp_path / "run")
    (run / "traces.def").unlink()
    assert_clean_error(cli("phases", str(run)), "traces.otf2")


@pytest.mark.parametrize(("memory", "words"), [
    ("lots", ["DLTRACE_BUILD_MEMORY='lots' is not a memory size"]),
    ("1MB", ["ran out of memory", "raise DLTRACE_BUILD_MEMORY (now 1MB"]),
])
def test_build_memory_cap_errors_are_clean(tmp_path: Path, memory: str, words: list[str]) -> None:
    run = small_run(tmp_path / "run")
    assert_clean_error(cli("phases", str(run), env={"DLTRACE_BUILD_MEMORY": memory}), *words)
    assert not list(run.glob("*.duckdb*")) and not list(run.glob(".*.duckdb*"))
    ok = cli("phases", str(run), env={"DLTRACE_BUILD_MEMORY": "default"})
    assert ok.returncode == 0, ok.stderr


def test_a_verb_reading_a_built_run_under_the_cap_says_what_to_raise(tmp_path: Path) -> None:
    run = small_run(tmp_path / "run")
    assert cli("phases", str(run)).returncode == 0
    assert_clean_error(cli("patterns", str(run), env={"DLTRACE_BUILD_MEMORY": "1MB"}),
                       f"reading {run / 'trace.duckdb'} ran out of memory", "raise DLTRACE_BUILD_MEMORY (now 1MB")
    assert cli("patterns", str(run)).returncode == 0  # the database is as it was


def test_rebuild_is_idempotent_and_force_rebuilds(tmp_path: Path) -> None:
    run = small_run(tmp_path / "run")
    first = cli("phases", str(run))
    assert first.returncode == 0, first.stderr
    assert "database:" in first.stdout
    db = run / "trace.duckdb"
    stamp = db.stat().st_mtime_ns
    again = cli("phases", str(run))
    assert again.stdout == first.stdout
    assert db.stat().st_mtime_ns == stamp  # reused, not rebuilt
    forced = cli("phases", "--force", str(run))
    assert forced.stdout == first.stdout
    assert db.stat().st_mtime_ns != stamp


def test_archive_change_triggers_rebuild(tmp_path: Path) -> None:
    run = small_run(tmp_path / "run")
    assert analyze.open(run).execute("select count(*) from steps").fetchone() == (2,)
    shutil.rmtree(run)
    write_literal(run, [(0, "dltrace.step", 0, 10 * MS), (0, "dltrace.step", 20 * MS, 30 * MS)])
    assert analyze.open(run).execute("select count(*) from steps").fetchone() == (2,)
    assert analyze.open(run).execute("select count(distinct rank) from steps").fetchone() == (1,)


def test_library_raises_analyze_error(tmp_path: Path) -> None:
    with pytest.raises(AnalyzeError, match="no such run directory"):
        analyze.open(tmp_path / "missing")


def test_unbalanced_archive_gives_truncated_intervals(tmp_path: Path) -> None:
    """A rank whose Leave records are missing (crash): intervals are closed, flagged, counted."""
    import numpy as np

    from traceio.archive import ArchiveSpec, LocationSpec, RankSpec
    from traceio.otf2_writer import write_archive
    from traceio.records import EVENT_DTYPE, Kind

    def rec(t: int, kind: int, region: int) -> tuple:
        return (t, 0, 0, 0, region, -1, -1, 0, kind, 0)

    records = np.array([rec(0, Kind.ENTER, 0), rec(5, Kind.ENTER, 1), rec(7, Kind.LEAVE, 2),
                        rec(9, Kind.ENTER, 2)], dtype=EVENT_DTYPE)
    spec = ArchiveSpec([("dltrace.step", "function"), ("a", "function"), ("b", "function")], [],
                       [RankSpec(0, "h", [], [LocationSpec(0, 0, "main", "main", records)])])
    (tmp_path / "run").mkdir()
    write_archive(spec, tmp_path / "run")
    db = analyze.open(tmp_path / "run")
    rows = db.execute("select region_id, start_ns, end_ns, truncated from intervals order by start_ns").fetchall()
    assert rows == [(0, 0, 9, True), (1, 5, 9, True), (2, 9, 9, True)]
    assert db.execute("select value from build_info where key = 'unmatched_leaves'").fetchone() == ("1",)
