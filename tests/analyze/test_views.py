"""The report tables' choices: which steps are steady state."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyze import views
from analyze.tables.phases import PHASES
from analyze.views import _coverage, warmup_end


def test_first_step_and_first_tenth_are_warm_up() -> None:
    assert warmup_end(np.array([])) == 0
    assert warmup_end(np.array([5.0])) == 0
    assert warmup_end(np.full(5, 1.0)) == 1
    assert warmup_end(np.full(40, 1.0)) == 4


def test_a_late_compile_extends_warm_up() -> None:
    # a custom loop synchronizing every 4th micro-step: its sync step is traced and compiled on
    # first use (step 3), later sync steps are only twice as long as the others
    d = np.array([30.0, 1, 1, 20.0] + [1, 1, 1, 2] * 4)
    assert warmup_end(d) == 4
    # a slow step late in the run is not warm-up
    d = np.array([30.0] + [1.0] * 10 + [20.0] + [1.0] * 8)
    assert warmup_end(d) == 2


interval = st.tuples(st.floats(0, 40, allow_nan=False), st.floats(0, 12, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(st.lists(interval, max_size=30), st.integers(1, 50))
def test_bin_coverage_is_exact_where_nothing_is(pieces, n) -> None:  # type: ignore[no-untyped-def]
    """Each bin gets the length of the intervals inside it; a bin no interval reaches gets
    exactly 0 (an integral of the indicator left 1e-11 there: bars where a rank had nothing)."""
    s = np.array([min(a, n) for a, _ in pieces], dtype=float)
    e = np.array([min(a + d, n) for a, d in pieces], dtype=float)
    got = _coverage(s, e, n)
    want = np.array([sum(max(0.0, min(b, j + 1) - max(a, j)) for a, b in zip(s, e, strict=True))
                     for j in range(n)])
    assert got == pytest.approx(want, abs=1e-9)
    touched = np.zeros(n, bool)
    for a, b in zip(s, e, strict=True):
        if b > a:
            touched[int(np.floor(a)):int(np.ceil(b))] = True
    assert (got[~touched] == 0).all()


def _phase_bars(rng: np.random.Generator, ranks: int) -> pd.DataFrame:
    rows = []
    for rank in rng.choice(10_000, ranks, replace=False):
        t = 0.0
        for _ in range(rng.integers(0, 40)):
            t += rng.exponential(3e4)
            d = rng.exponential(5e4)
            rows.append((int(rank), t, min(t + d, 1e6), str(PHASES[rng.integers(0, len(PHASES))])))
            t += d
    bars = pd.DataFrame(rows, columns=["rank", "start_ns", "end_ns", "phase"])
    return bars[bars["start_ns"] < 1e6].sort_values(["rank", "start_ns"], kind="stable").reset_index(drop=True)


def test_ranks_binned_in_batches_are_binned_as_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Binning many ranks a batch at a time gives each rank the bins it gets alone, and no
    bin where the rank has nothing."""
    bars = _phase_bars(np.random.default_rng(7), 40)
    monkeypatch.setattr(views, "BIN_CELLS", 3 * len(PHASES) * 101)  # batches of 3 ranks
    got, width = views._binned(bars, 0, 1_000_000, 100)
    assert width == 10_000
    alone = pd.concat([views._binned(b, 0, 1_000_000, 100)[0] for _, b in bars.groupby("rank")], ignore_index=True)
    pd.testing.assert_frame_equal(got, alone, check_dtype=False)
    assert got["rank"].nunique() == bars["rank"].nunique()
    for rank, mine in got.groupby("rank"):  # every binned bar overlaps one of the rank's bars
        raw = bars[bars["rank"] == rank]
        for a, b in zip(mine["start_ns"], mine["end_ns"], strict=True):
            assert ((raw["start_ns"] < b) & (raw["end_ns"] > a)).any()


def test_run_labels_name_what_wrote_a_trace_without_a_framework() -> None:
    ddp = views.RunLabel("bs64", "pytorch-ddp", 2, {"batch_size": 64}, "dltrace 0.1")
    assert (ddp.title(), ddp.short()) == ("bs64 · pytorch-ddp · 2 ranks · batch 64", "bs64\npytorch-ddp, np 2, bs 64")
    scorep = views.RunLabel("bcast4", None, 4, {}, "Score-P 8.4")
    assert (scorep.title(), scorep.short()) == ("bcast4 · Score-P 8.4 · 4 ranks", "bcast4\nScore-P 8.4, np 4")
    kineto = views.RunLabel("mi300", None, 1, {}, "PyTorch profiler (Kineto), schema 1")
    assert kineto.short() == "mi300\nPyTorch profiler (Kineto), np 1"
    assert views.RunLabel("x", None, 1, {}).title() == "x · unknown framework · 1 rank"
    # a long title goes on in a second line, before the part that would run past the figure
    dlrm = views.RunLabel("param_dlrm_v100_8rank", None, 8, {}, "PyTorch profiler (Kineto)")
    assert dlrm.title() == "param_dlrm_v100_8rank · PyTorch profiler (Kineto)\n8 ranks"
    assert all(len(line) <= views.TITLE_WIDTH for line in dlrm.title().split("\n"))


def _streams_run(tmp_path, streams: int, ranks: int = 1):  # type: ignore[no-untyped-def]
    """``ranks`` ranks of one 1000 us step: on stream 7 kernels at [100, 110) and [110.5, 130)
    (half a microsecond apart, under a thousandth of the window: drawn as one) and at [500,
    600); a copy at [200, 260) on stream 8; one kernel on each further stream."""
    import analyze
    from tests.kineto_literal import kernel, memcpy, step, write_rank

    for rank in range(ranks):
        write_rank(tmp_path / "run", rank, [
            step(1, 0, 1000), kernel("gemm", 100, 110), kernel("gemm", 110.5, 130), kernel("relu", 500, 600),
            memcpy(200, 260, stream=8), *(kernel("add", 300, 310 + s, stream=9 + s) for s in range(streams - 2))],
            world=ranks)
    db = analyze.open(tmp_path / "run")
    ((t0, t1),) = db.execute("SELECT min(start_ns), max(end_ns) FROM steps").fetchall()
    return db, t0, t1


def test_timeline_draws_each_stream_of_a_device_without_collectives(tmp_path) -> None:  # type: ignore[no-untyped-def]
    db, t0, t1 = _streams_run(tmp_path, streams=3)
    lanes = views.region_lanes(db, t0, t1)
    got = [(r.label, r.fill, round(r.start_ms * 1e3, 1), round(r.end_ms * 1e3, 1))
           for r in lanes.sort_values(["lane", "start_ms"]).itertuples()]
    assert got == [("device stream 0", "compute", 100.0, 130.0), ("device stream 0", "compute", 500.0, 600.0),
                   ("device stream 1", "memory", 200.0, 260.0), ("device stream 2", "compute", 300.0, 310.0)]
    assert set(lanes["lane"]) == {2, 3, 4} and set(lanes["part"]) == {"device"}
    # kernels further apart than a thousandth of the window stay apart
    narrow = views.region_lanes(db, t0, t0 + 300_000)  # 300 us: 0.3 us is the gap merged
    assert len(narrow[narrow["label"] == "device stream 0"]) == 2
    # too many rows with them (counted merged: five kernels and copies, four rows): the
    # device's activity is left out, the rest stays
    assert len(views.region_lanes(db, t0, t1, max_rows=4)) == 4
    assert views.region_lanes(db, t0, t1, max_rows=3).empty


def test_timeline_draws_many_streams_as_one_row(tmp_path) -> None:  # type: ignore[no-untyped-def]
    db, t0, t1 = _streams_run(tmp_path, streams=views.MAX_DEVICE_LANES + 1)
    lanes = views.region_lanes(db, t0, t1)
    assert set(zip(lanes["lane"], lanes["label"], strict=True)) == {(2, "device streams")}
    # the kernels of every stream at [300, 310 + s): merged into one, as long as the longest
    adds = lanes[(lanes["start_ms"] >= 0.3) & (lanes["start_ms"] < 0.4)]
    assert adds[["start_ms", "end_ms"]].round(6).values.tolist() == [[0.3, 0.31 + (views.MAX_DEVICE_LANES - 2) * 1e-3]]
    # a few streams on many ranks: one row per rank too
    db, t0, t1 = _streams_run(tmp_path / "many", streams=3, ranks=views.MAX_DEVICE_ROWS // 3 + 1)
    lanes = views.region_lanes(db, t0, t1)
    assert set(lanes["label"]) == {"device streams"}
