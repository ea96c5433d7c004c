"""Property: for any segments, the phases of each step partition it (no gap, no overlap)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import analyze
from analyze.tables.phases import N_LEVELS, sweep
from tests.literal import write_literal

MS = 1_000_000

segment = st.tuples(st.integers(0, 1000), st.integers(0, 300), st.integers(0, N_LEVELS - 1))


@st.composite
def steps(draw):  # type: ignore[no-untyped-def]
    cuts = sorted(set(draw(st.lists(st.integers(0, 1200), min_size=2, max_size=12))))
    starts, ends = [], []
    for a, b in zip(cuts[::2], cuts[1::2], strict=False):
        starts.append(a)
        ends.append(b)
    return np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(st.lists(segment, max_size=40), steps())
def test_sweep_partitions_every_step(segs, step_bounds) -> None:  # type: ignore[no-untyped-def]
    s = np.array([a for a, _, _ in segs], dtype=np.int64)
    e = np.array([a + d for a, d, _ in segs], dtype=np.int64)
    lv = np.array([lv for _, _, lv in segs], dtype=np.int64)
    starts, ends = step_bounds
    out = sweep(s, e, lv, starts, ends)
    assert (out >= 0).all()
    assert (out.sum(axis=1) == ends - starts).all()


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(1, 80), st.integers(1, 15)), min_size=1, max_size=8))
def test_generated_traces_partition_steps_end_to_end(tmp_path_factory, colls) -> None:  # type: ignore[no-untyped-def]
    """Random collectives inside steps, through the real writer, reader and SQL."""
    items = []
    for rank in (0, 1):
        items += [(rank, "dltrace.step", 0, 100 * MS), (rank, "dltrace.step", 100 * MS, 200 * MS)]
    for i, (rank, start, length) in enumerate(colls):
        base = 100 * MS * (i % 2)
        items.append((rank, "MPI_Allreduce", base + start * MS // 10 * 10 + i, base + start * MS // 10 * 10 + i + length * MS // 10,
                      {"op": "allreduce", "bytes": 8}))
    # keep each rank's collectives disjoint so they nest
    by_rank: dict[int, list] = {}
    for it in items[4:]:
        by_rank.setdefault(it[0], []).append(it)
    kept = items[:4]
    for its in by_rank.values():
        end = -1
        for it in sorted(its, key=lambda x: x[2]):
            step_end = 100 * MS if it[2] < 100 * MS else 200 * MS
            if it[2] > end and it[3] <= step_end:
                kept.append(it)
                end = it[3]
    path: Path = tmp_path_factory.mktemp("gen")
    write_literal(path / "run", kept)
    db = analyze.open(path / "run")
    bad = db.execute("""select s.rank, s.step from steps s join phases p using (rank, step)
                        group by s.rank, s.step, s.duration_ns having sum(p.duration_ns) <> s.duration_ns""").fetchall()
    assert bad == []
    assert db.execute("select min(duration_ns) >= 0 from phases").fetchone() == (True,)
