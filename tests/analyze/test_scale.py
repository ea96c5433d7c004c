"""Thousands of ranks on a local Dask cluster: the tables are right, and a worker's peak memory
does not grow with the number of ranks (docs/scale.md says why it should not).

Archives from the benchmark's generator (bench/synth.py: DDP-like steps, 112 events per step
and rank, ranks after the first starting a little late), three steps per rank, 1,024 and
4,096 ranks (2,048 and 8,192 locations). Each is built on a fresh cluster of two
single-threaded worker processes, whose peak resident memory is read at the end. Writing the
archives takes most of the time (the OTF2 writer zeroes a 1 MB buffer per location); they are
kept under ~/.cache/dltrace/bench between runs.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

import analyze
from bench import synth

STEPS = 3
# a worker's peak memory may differ by this much between the two sizes (what a task holds at
# once is the same; allocator and DuckDB caches are not exactly)
SLACK_MB = 150
BOUND_MB = 1500  # and stays under this (1 GB of it DuckDB's cap)


def build_on_fresh_cluster(run: Path, db: Path) -> float:
    """Build ``run``'s tables on a new 2-worker cluster; the larger worker peak RSS in MB."""
    from analyze.engine.on_dask import DaskEngine

    engine = DaskEngine.connect(None, workers=2)
    try:
        analyze.build(run, db=db, engine=engine)
        return max(engine.peak_rss_mb().values())
    finally:
        engine.close()


@pytest.mark.slow
def test_thousands_of_ranks_with_bounded_worker_memory(tmp_path: Path) -> None:
    peaks = {}
    for ranks in (1024, 4096):
        run, events = synth.cached(ranks * STEPS * synth.events_per_step(), ranks)
        db = tmp_path / f"r{ranks}.duckdb"
        peaks[ranks] = build_on_fresh_cluster(run, db)
        with duckdb.connect(str(db), read_only=True) as con:
            assert con.execute("select ranks, events from runs").fetchone() == (ranks, events)
            # every rank has its steps, split into phases that add up to each step exactly
            assert con.execute("""select count(distinct rank), count(*) from steps""").fetchone() == (
                ranks, ranks * STEPS)
            assert con.execute("""select count(*) from steps s join (select rank, step, sum(duration_ns) ns
                                  from phases group by all) p using (rank, step)
                                  where p.ns = s.duration_ns""").fetchone() == (ranks * STEPS,)
            # each step's allreduces (one blocking, four bucket ones) found every rank
            assert con.execute("select count(*), min(ranks_matched), max(ranks_matched) from collectives"
                               ).fetchone() == (ranks * STEPS * 5, ranks, ranks)
            # the late ranks waited (rank 0 starts first, so it waits for the others)
            assert con.execute("select sum(duration_ns) > 0 from phases where rank = 0 and phase = 'idle'"
                               ).fetchone() == (True,)
    print(f"worker peak RSS: {peaks}")  # shown with pytest -s
    assert peaks[4096] < peaks[1024] + SLACK_MB, peaks
    assert max(peaks.values()) < BOUND_MB, peaks
