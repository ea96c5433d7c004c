"""The innermost-region pieces the cause analyses sum over, against a stack-based reference."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from analyze.tables.causes.window import NO_REGION, Pieces, pieces_of


@st.composite
def nested(draw: st.DrawFn) -> list[tuple[int, int, int, int, int, int]]:
    """Properly nested intervals on one location: (idx, parent, depth, region, start, end),
    idx in enter order; zero-length ones included."""
    out: list[tuple[int, int, int, int, int, int]] = []

    def fill(parent: int, depth: int, lo: int, hi: int) -> None:
        t = lo
        for _ in range(draw(st.integers(0, 3 if depth < 3 else 0))):
            if t >= hi:
                return
            a = draw(st.integers(t, hi))
            b = draw(st.integers(a, hi))
            idx = len(out)
            out.append((idx, parent, depth, draw(st.integers(0, 4)), a, b))
            fill(idx, depth + 1, a, b)
            t = b

    fill(-1, 0, 0, 60)
    return out


def reference(items: list[tuple[int, int, int, int, int, int]], horizon: int = 60) -> list[int]:
    """Region of the deepest interval covering each nanosecond [t, t+1)."""
    label = [NO_REGION] * horizon
    for _, _, _depth, region, a, b in sorted(items, key=lambda i: i[2]):  # deeper paint later
        for t in range(a, b):
            label[t] = region
    return label


def expand(p: Pieces, horizon: int = 60) -> list[int]:
    label = [NO_REGION] * horizon
    for a, b, r in zip(p.start.tolist(), p.end.tolist(), p.region.tolist(), strict=True):
        for t in range(a, b):
            label[t] = r
    return label


def arrays(items: list, shift: int = 0) -> list[np.ndarray]:
    cols = list(zip(*items, strict=True)) if items else [()] * 6
    out = [np.asarray(c, np.int64) for c in cols]
    out[4] = out[4] + shift
    out[5] = out[5] + shift
    return out


@settings(max_examples=200, deadline=None)
@given(nested())
def test_pieces_are_the_innermost_region_at_every_instant(items: list) -> None:
    p = pieces_of(*arrays(items))
    assert expand(p) == reference(items)
    assert (np.diff(p.start) > 0).all() and (p.end[:-1] <= p.start[1:]).all()  # sorted, disjoint


@settings(max_examples=50, deadline=None)
@given(nested())
def test_the_long_trace_sort_gives_the_same_pieces(items: list) -> None:
    """Times past 2^47 ns take the three-key sort instead of the packed key."""
    shift = 1 << 50
    p = pieces_of(*arrays(items, shift))
    q = pieces_of(*arrays(items))
    assert (p.start - shift).tolist() == q.start.tolist() and p.region.tolist() == q.region.tolist()


def test_time_in_splits_a_query_over_regions_and_no_region() -> None:
    p = Pieces(np.array([0, 10, 30]), np.array([10, 20, 40]), np.array([7, 8, 7]))
    got = p.time_in(np.array([5, 0]), np.array([35, 5]))
    rows = sorted(map(tuple, got[["q", "region", "ns"]].to_numpy().tolist()))
    # query 0: 5 ns of region 7 before 10, 10 of region 8, 5 of 7 again, 10 in no region
    assert rows == [(0, NO_REGION, 10), (0, 7, 10), (0, 8, 10), (1, 7, 5)]


def test_windows_of_a_step_or_two_give_the_same_tables(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Long traces are analyzed a few steps at a time; the windows must not show."""
    import duckdb

    import analyze
    from analyze.tables.causes import window
    from bench import synth

    run, _ = synth.write(10_000, tmp_path / "run")  # 45 of the benchmark's DDP-like steps, 2 ranks
    whole = analyze.build(run, db=tmp_path / "whole.duckdb").db
    monkeypatch.setattr(window, "WINDOW_INTERVALS", 400)  # windows of 4 steps
    windowed = analyze.build(run, db=tmp_path / "windowed.duckdb").db
    for table in ("overlap", "delays", "delay_totals", "critical_path", "critical_path_regions",
                  "step_balance", "rank_balance"):
        query = f"SELECT * FROM {table} ORDER BY ALL"
        a = duckdb.connect(str(whole), read_only=True).execute(query).fetchall()
        b = duckdb.connect(str(windowed), read_only=True).execute(query).fetchall()
        assert a == b and len(a) > 0, table


def test_sums_by_query_and_region_dense_and_sparse(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from analyze.tables.causes import window

    q = np.array([0, 1, 0, 1, 0])
    region = np.array([3, -1, 3, 7, 2])
    ns = np.array([5, 6, 7, 8, 9])
    want = [(0, 2, 9), (0, 3, 12), (1, -1, 6), (1, 7, 8)]
    dense = window._sum_by(q, region, ns, 2)
    assert sorted(map(tuple, dense.to_numpy().tolist())) == want
    monkeypatch.setattr(window, "DENSE_BINS", 1)  # as for region ids too large for a dense array
    assert sorted(map(tuple, window._sum_by(q, region, ns, 2).to_numpy().tolist())) == want
