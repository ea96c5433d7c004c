"""Property: for any segments, the phases of each step partition it (no gap, no overlap)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import analyze
from analyze.tables.phases import (
    N_LEVELS,
    PHASES,
    _mask_codes,
    sweep,
    sweep_intervals,
    sweep_intervals_of_ranks,
    sweep_numpy,
)
from tests.literal import write_literal
from traceio import codec

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


@st.composite
def any_steps(draw):  # type: ignore[no-untyped-def]
    """Steps in any order, some empty, some overlapping (then the native sweep declines)."""
    n = draw(st.integers(0, 8))
    starts = np.array(draw(st.lists(st.integers(-500, 1500), min_size=n, max_size=n)), dtype=np.int64)
    lengths = np.array(draw(st.lists(st.integers(0, 400), min_size=n, max_size=n)), dtype=np.int64)
    return starts, starts + lengths


@pytest.mark.skipif(not codec.available(), reason="the native codec is not built")
@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.integers(-600, 1600), st.integers(-50, 300), st.integers(0, N_LEVELS - 1)),
                max_size=60), st.one_of(steps(), any_steps()), st.sampled_from([0, 1 << 40, -(1 << 62)]))
def test_native_sweep_equals_numpy(segs, step_bounds, shift) -> None:  # type: ignore[no-untyped-def]
    """traceio/native/sweep.c gives what the numpy sweep gives, for disjoint steps in any order,
    empty and negative segments and times far from zero; for overlapping steps it declines."""
    s = np.array([a for a, _, _ in segs], dtype=np.int64) + shift
    e = np.array([a + d for a, d, _ in segs], dtype=np.int64) + shift
    lv = np.array([lv for _, _, lv in segs], dtype=np.int64)
    starts, ends = (x + shift for x in step_bounds)
    order = np.argsort(starts, kind="stable")
    disjoint = bool(np.all(starts[order][1:] >= ends[order][:-1]))
    native = codec.native().phase_sweep(s, e, lv, starts, ends, _mask_codes(), len(PHASES))
    if not disjoint:
        assert native is None
        return
    got = np.frombuffer(native, dtype=np.int64).reshape(len(starts), len(PHASES))
    np.testing.assert_array_equal(got, sweep_numpy(s, e, lv, starts, ends))


@pytest.mark.skipif(not codec.available(), reason="the native codec is not built")
def test_native_sweep_rejects_what_it_cannot_sweep() -> None:
    z = np.zeros(1, dtype=np.int64)
    native = codec.native()
    with pytest.raises(ValueError, match="no bit in the table"):
        native.phase_sweep(z, z + 1, z + N_LEVELS, z, z + 1, _mask_codes(), len(PHASES))
    with pytest.raises(ValueError, match="differ in length"):
        native.phase_sweep(z, np.zeros(2, dtype=np.int64), z, z, z + 1, _mask_codes(), len(PHASES))
    with pytest.raises(TypeError, match="int64"):
        native.phase_sweep(z.astype(np.int32), z + 1, z, z, z + 1, _mask_codes(), len(PHASES))
    # boundaries over 2^58 ns apart do not fit its packed words: it declines, numpy sweeps
    far = np.array([-(1 << 62), 1 << 62], dtype=np.int64)
    level = np.array([3, 5], dtype=np.int64)
    assert native.phase_sweep(far, far + 10, level, far, far + 20, _mask_codes(), len(PHASES)) is None
    np.testing.assert_array_equal(sweep(far, far + 10, level, far, far + 20),
                                  sweep_numpy(far, far + 10, level, far, far + 20))


@pytest.mark.skipif(not codec.available(), reason="the native codec is not built")
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 5000), st.sampled_from(["random", "nested", "parts", "sorted",
                                                                      "reversed", "equal"]))
def test_native_sweep_sorts_any_order_of_segments(seed: int, n: int, shape: str) -> None:
    """The boundaries' merge sort (sweep.c) on orders far from the build's: random, the
    build's (regions after the regions they call, several sorted parts one after another),
    sorted, reversed, all equal; runs of every length and merges of every size."""
    rng = np.random.default_rng(seed)
    start = np.cumsum(rng.integers(0, 50, n)).astype(np.int64)
    end = start + rng.integers(0, 400, n)
    if shape == "random":
        order = rng.permutation(n)
    elif shape == "nested":  # a region's row after its callees': blocks of a few rotated by one
        order = np.concatenate([np.roll(b, 1) for b in np.array_split(np.arange(n), max(1, n // 7))])
    elif shape == "parts":  # several sorted parts, each over the whole time range
        order = np.concatenate([np.arange(n)[k::3] for k in range(3)])
    elif shape == "reversed":
        order = np.arange(n)[::-1]
    else:
        order = np.arange(n)
    if shape == "equal":
        start, end = np.full(n, 5, np.int64), np.full(n, 9, np.int64)
    start, end, level = start[order], end[order], rng.integers(0, N_LEVELS, n)
    step_start = np.arange(-100, int(end.max()) + 200, 300, dtype=np.int64)
    step_end = step_start + 250
    native = codec.native().phase_sweep(start, end, level, step_start, step_end, _mask_codes(), len(PHASES))
    got = np.frombuffer(native, dtype=np.int64).reshape(len(step_start), len(PHASES))
    np.testing.assert_array_equal(got, sweep_numpy(start, end, level, step_start, step_end))


def test_large_sweep_is_the_same_both_ways() -> None:
    """A rank's worth of nested segments (long runs and merges), both sweeps."""
    rng = np.random.default_rng(7)
    n = 200_000
    start = np.cumsum(rng.integers(1, 1 << 20, n)) + (1 << 50)
    end = start + rng.integers(0, 1 << 22, n)
    level = rng.integers(0, N_LEVELS, n)
    step_start = start[::1000]
    step_end = np.append(step_start[1:], end.max())
    expected = sweep_numpy(start, end, level, step_start, step_end)
    np.testing.assert_array_equal(sweep(start, end, level, step_start, step_end), expected)
    assert expected.sum() == step_end[-1] - step_start[0]


@st.composite
def ranks_of(draw):  # type: ignore[no-untyped-def]
    """Segments and steps of a few ranks (numbers not consecutive), rows in any rank order."""
    numbers = draw(st.lists(st.integers(0, 5000), min_size=1, max_size=5, unique=True))
    seg_rows, step_rows = [], []
    for rank in numbers:
        for a, d, lv in draw(st.lists(segment, max_size=15)):
            seg_rows.append((rank, a, a + d, lv))
        starts, ends = draw(steps())
        step_rows += [(rank, int(a), int(b)) for a, b in zip(starts, ends, strict=True)]
    seg_rows = draw(st.permutations(seg_rows))
    segs = pd.DataFrame(seg_rows or np.zeros((0, 4), np.int64), columns=["rank", "start", "end", "level"])
    step_df = pd.DataFrame(step_rows or np.zeros((0, 3), np.int64), columns=["rank", "start_ns", "end_ns"])
    return segs, step_df.sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)


def _rank_by_rank(segs: pd.DataFrame, step_df: pd.DataFrame) -> pd.DataFrame:
    parts = [sweep_intervals(*(segs.loc[segs["rank"] == rank, c].to_numpy(np.int64) for c in ("start", "end", "level")),
                             rs["start_ns"].to_numpy(np.int64), rs["end_ns"].to_numpy(np.int64)).assign(rank=rank)
             for rank, rs in step_df.groupby("rank")]
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["start_ns", "end_ns", "phase", "rank"])
    return out[["start_ns", "end_ns", "phase", "rank"]]


@settings(max_examples=300, deadline=None)
@given(ranks_of())
def test_one_sweep_of_every_rank_is_each_ranks_own(data) -> None:  # type: ignore[no-untyped-def]
    """The timeline's single sweep over all ranks (each moved to a span of its own) gives
    each rank's pieces exactly as a sweep of that rank alone; so does its rank-by-rank way
    for spans too long to share int64."""
    segs, step_df = data
    if step_df.empty:
        return
    t0, t1 = int(step_df["start_ns"].min()), int(step_df["end_ns"].max())
    want = _rank_by_rank(segs, step_df)
    for lo, hi in ((t0, t1), (t0 - (1 << 62), t1)):  # the second: too long a span for one sweep
        got = sweep_intervals_of_ranks(segs, step_df, lo, hi)
        pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True), check_dtype=False)
