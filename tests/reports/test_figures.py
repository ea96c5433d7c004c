"""Figure builders on small literal tables: assert on the drawn layers' data, not on pixels."""

from __future__ import annotations

from pathlib import Path

import duckdb
import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib import pyplot as plt

from analyze import views
from analyze.schema import TABLES
from analyze.views import RunLabel, Timeline
from reports import figures, report
from reports.page import Page
from reports.theme import DEVICE_PHASE_COLORS, DEVICE_PHASE_LABELS, PHASE_COLORS, PHASE_LABELS

matplotlib.use("Agg")
LABEL = RunLabel("bs64 'α'", "pytorch-ddp", 2, {"batch_size": 64})


def drawn(plot):  # type: ignore[no-untyped-def]
    fig = plot.draw()
    plt.close(fig)
    return plot


def legend_labels(plot) -> list[str]:  # type: ignore[no-untyped-def]
    scale = next(s for s in plot.scales if "fill" in s.aesthetics)
    return list(scale.labels)


def test_timeline_bars_carry_their_phase_colour_and_steps_are_marked() -> None:
    bars = pd.DataFrame({
        "rank": [0, 0, 0, 1, 1],
        "start_ms": [0.0, 8.0, 9.0, 0.0, 9.5],
        "end_ms": [8.0, 9.0, 10.0, 9.5, 10.0],
        "phase": pd.Categorical(["compute", "idle", "allreduce", "compute", "allreduce"],
                                categories=figures.PHASE_ORDER),
    })
    steps = pd.DataFrame({"rank": [0, 0, 1, 1], "step": [2, 3, 2, 3], "start_ms": [0.0, 10.0, 0.0, 10.0],
                          "end_ms": [10.0, 20.0, 10.0, 20.0]})
    plot = drawn(figures.timeline(Timeline(bars, steps, (2, 4), 0, len(bars), None), LABEL))
    rects, ticks, tags = plot.layers
    got = set(zip(rects.data["xmin"], rects.data["xmax"], rects.data["fill"], strict=True))
    want = {(s, e, PHASE_COLORS[p]) for s, e, p in zip(bars["start_ms"], bars["end_ms"], bars["phase"], strict=True)}
    assert got == want
    assert len(ticks.data) == 4  # a step-start mark per rank and step
    assert list(tags.data["label"]) == ["step 2", "step 3"]
    assert legend_labels(plot) == ["compute", "allreduce", PHASE_LABELS["idle"]]  # only phases present
    assert plot.labels.title == "bs64 'α' · pytorch-ddp · 2 ranks · batch 64"
    assert "steps 2–3" in plot.labels.subtitle
    assert plot.labels.x == "time since the start of step 2 [ms]"


def test_a_timeline_of_many_ranks_names_every_kth_rank_and_draws_them_all() -> None:
    n = 1024
    bars = pd.DataFrame({"rank": range(n), "start_ms": 0.0, "end_ms": 1.0,
                         "phase": pd.Categorical(["compute"] * n, categories=figures.PHASE_ORDER)})
    steps = pd.DataFrame({"rank": range(n), "step": 0, "start_ms": 0.0, "end_ms": 1.0})
    plot = figures.timeline(Timeline(bars, steps, (0, 1), 0, n, None), LABEL)
    fig = plot.draw()
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    plt.close(fig)
    assert labels == [f"rank {r}" for r in range(0, n, 50)]  # 21 labels, not 1,024 run together
    assert len(plot.layers[0].data) == n  # every rank's row is still drawn
    n = figures.MAX_Y_LABELS
    few = figures.timeline_rows(Timeline(bars[bars["rank"] < n], steps[steps["rank"] < n], (0, 1), 0, n, None))
    assert few[2] == [f"rank {r}" for r in range(n)]


def test_timeline_says_when_it_aggregated() -> None:
    bars = pd.DataFrame({"rank": [0], "start_ms": [0.0], "end_ms": [1.0],
                         "phase": pd.Categorical(["compute"], categories=figures.PHASE_ORDER)})
    steps = pd.DataFrame({"rank": [0], "step": [0], "start_ms": [0.0], "end_ms": [1.0]})
    plot = figures.timeline(Timeline(bars, steps, (0, 1), 0, 2_000_000, 0.5), LABEL)
    assert "aggregated: 2,000,000 phase intervals" in plot.labels.subtitle


def test_step_breakdown_facets_ranks_and_stacks_phases() -> None:
    rows = [(r, s, p, ms) for r in (0, 1, 2) for s in (0, 1)
            for p, ms in (("compute", 10.0 + s), ("allreduce", 2.0), ("idle", 1.0 * r), ("other", 0.0))]
    steps = pd.DataFrame(rows, columns=["rank", "step", "phase", "ms"])
    plot = drawn(figures.step_breakdown(steps, LABEL))
    assert len(plot.layout.layout) == 3  # a panel per rank
    data = plot.layers[0].data
    # each drawn piece: its height is its phase's ms, its colour its phase's colour
    heights = sorted(zip(data["PANEL"].astype(int), data["x"], (data["ymax"] - data["ymin"]).round(9),
                         data["fill"], strict=True))
    expected = sorted((r + 1, s, ms, PHASE_COLORS[p]) for r, s, p, ms in rows if ms > 0)
    assert [h for h in heights if h[2] > 0] == expected
    # zero phases stay out of the legend ("other" is 0 everywhere; idle is 0 on rank 0 only)
    assert legend_labels(plot) == ["compute", "allreduce", PHASE_LABELS["idle"]]


def test_bottleneck_has_one_bar_per_run_split_by_phase() -> None:
    runs = pd.DataFrame({"run": ["ddp\npytorch-ddp, np 2", "ddp\npytorch-ddp, np 2", "hvd\nhorovod, np 2",
                                 "hvd\nhorovod, np 2"],
                         "phase": ["compute", "idle", "compute", "allreduce"], "ms": [10.0, 2.0, 8.0, 3.0]})
    plot = drawn(figures.bottleneck(runs))
    bars, totals = plot.layers
    # the first run is drawn at the top (x = 2 under coord_flip)
    got = sorted(zip(bars.data["x"], (bars.data["ymax"] - bars.data["ymin"]), bars.data["fill"], strict=True))
    assert got == sorted([(2.0, 10.0, PHASE_COLORS["compute"]), (2.0, 2.0, PHASE_COLORS["idle"]),
                          (1.0, 8.0, PHASE_COLORS["compute"]), (1.0, 3.0, PHASE_COLORS["allreduce"])])
    assert sorted(totals.data["label"].str.strip()) == ["11.0 ms", "12.0 ms"]
    assert plot.labels.x == "time per step [ms]"  # horizontal after coord_flip


def test_bottleneck_gives_gpu_runs_a_bar_for_the_accelerators_too() -> None:
    runs = pd.DataFrame({"run": ["gpu"] * 4 + ["cpu"],
                         "side": ["hosts", "hosts", "accelerators", "accelerators", "hosts"],
                         "phase": ["compute", "idle", "compute", "comm_exposed", "compute"],
                         "ms": [9.0, 1.0, 4.0, 6.0, 7.0]})
    plot = drawn(figures.bottleneck(runs))
    bars, totals = plot.layers
    # top to bottom: the GPU run's hosts, its accelerators, the CPU run (no second bar)
    got = sorted(zip(bars.data["x"], (bars.data["ymax"] - bars.data["ymin"]), bars.data["fill"], strict=True))
    assert got == sorted([(3.0, 9.0, PHASE_COLORS["compute"]), (3.0, 1.0, PHASE_COLORS["idle"]),
                          (2.0, 4.0, PHASE_COLORS["compute"]), (2.0, 6.0, DEVICE_PHASE_COLORS["comm_exposed"]),
                          (1.0, 7.0, PHASE_COLORS["compute"])])
    assert list(plot.data["run"].cat.categories[::-1]) == ["gpu\nhosts", "gpu\naccelerators", "cpu"]
    assert legend_labels(plot) == ["compute", "idle", DEVICE_PHASE_LABELS["comm_exposed"]]


def test_collective_waits_marks_the_straggler() -> None:
    waits = pd.DataFrame({
        "op": ["allreduce"] * 6 + ["bcast"] * 2,
        "rank": [0, 1, 0, 1, 0, 1, 0, 1],
        "comm_id": [0] * 8,
        "seq": [0, 0, 1, 1, 2, 2, 3, 3],
        "wait_ms": [5.0, 0.0, 7.0, 0.0, 0.0, 1.0, 0.0, 2.0],
        "arrived_last": [False, True, False, True, True, False, True, False],
    })
    plot = drawn(figures.collective_waits(waits, views.stragglers(waits), LABEL))
    assert len(plot.layout.layout) == 2  # a panel per op
    points = plot.layers[1].data
    assert (points["color"] == PHASE_COLORS["idle"]).sum() == 4  # the ranks that arrived last
    axis = plot.layout.panel_params[0].x.labels  # allreduce panel: rank 1 was last twice of three
    assert list(axis) == ["rank 0\nlast 1/3", "rank 1\nlast 2/3"]


def test_collective_waits_axes_start_at_zero_even_when_nobody_waited() -> None:
    """A broadcast's waits are all 0 (its root is unknown in a torch.profiler trace): its panel
    runs from 0 up, not from -0.5 to 0.5 around its points."""
    waits = pd.DataFrame({"op": ["allreduce"] * 4 + ["bcast"] * 4, "rank": [0, 1] * 4, "comm_id": 0,
                          "seq": [0, 0, 1, 1, 0, 0, 1, 1], "wait_ms": [5.0, 0.0, 7.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                          "arrived_last": [False, True] * 4})
    plot = drawn(figures.collective_waits(waits, views.stragglers(waits), LABEL))
    (lo_a, hi_a), (lo_b, hi_b) = (p.y.range for p in plot.layout.panel_params)
    assert -0.5 < lo_a <= 0 and hi_a >= 7  # (the scale's expansion below 0: a few percent)
    assert -0.1 < lo_b <= 0 and hi_b >= 1


def test_collective_waits_jitters_the_same_way_each_time() -> None:
    """The points are spread sideways at random, from a fixed seed: the same run draws the
    same figure (two reports of one run gave different waits pages before)."""
    rng = np.random.default_rng(1)
    waits = pd.DataFrame({"op": "allreduce", "rank": np.tile([0, 1, 2, 3], 50), "comm_id": 0,
                          "seq": np.repeat(np.arange(50), 4), "wait_ms": rng.random(200),
                          "arrived_last": np.tile([False, False, False, True], 50)})
    xs = [drawn(figures.collective_waits(waits, views.stragglers(waits), LABEL)).layers[1].data["x"].to_numpy()
          for _ in range(2)]
    assert not np.allclose(xs[0], np.round(xs[0]))  # jittered
    assert np.array_equal(xs[0], xs[1])


def test_stragglers_count_instances_per_op() -> None:
    waits = pd.DataFrame({"op": ["allreduce"] * 4, "rank": [0, 1, 0, 1], "comm_id": [0, 0, 0, 0],
                          "seq": [0, 0, 1, 1], "arrived_last": [True, False, True, False]})
    got = views.stragglers(waits)
    assert got.to_dict("records") == [{"op": "allreduce", "rank": 0, "times_last": 2, "instances": 2},
                                      {"op": "allreduce", "rank": 1, "times_last": 0, "instances": 2}]


def synthetic_db(n_steps: int, per_step: int, ranks: int = 1) -> duckdb.DuckDBPyConnection:
    """A database with the schema's tables: ``ranks`` ranks, each with ``per_step``
    alternating forward and all-reduce regions per 1 ms step (built in SQL, no archive)."""
    con = duckdb.connect()
    for t in TABLES:
        con.execute(t.ddl())
    con.execute(f"INSERT INTO runs (run_name, ranks, params) VALUES ('big', {ranks}, '{{}}')")
    con.execute(f"INSERT INTO locations SELECT r, r, 0, 'main', 'cpu_thread', true, 0 FROM range({ranks}) t(r)")
    con.execute("""INSERT INTO regions (region_id, name, canonical_name, paradigm, role, category, source_file,
                   begin_line) VALUES (0, 'dltrace.forward', '', 'user', 'function', 'forward', NULL, NULL),
                   (1, 'MPI_Allreduce', '', 'mpi', 'coll_all2all', 'collective', NULL, NULL)""")
    width = 1_000_000 // per_step
    con.execute(f"""
        INSERT INTO intervals SELECT r, r, i, NULL, 0, i % 2, i * {width}, (i + 1) * {width} - 1,
                                     {width} - 1, {width} - 1, false
        FROM range({ranks}) a(r), range({n_steps * per_step}) t(i)""")
    con.execute(f"""INSERT INTO steps SELECT r, s, s * 1000000, (s + 1) * 1000000, 1000000, 'marker'
                    FROM range({ranks}) a(r), range({n_steps}) t(s)""")
    return con


def test_timeline_aggregates_above_max_bars() -> None:
    con = synthetic_db(n_steps=4, per_step=200)
    tl = views.timeline(con, (0, 4), max_bars=100, bins=50)
    assert tl.bin_ms == pytest.approx(4.0 / 50)
    assert tl.intervals > 100 and len(tl.bars) <= 50
    assert tl.note and "aggregated" in tl.note
    full = views.timeline(con, (0, 4), max_bars=10_000)
    assert full.bin_ms is None and full.intervals == len(full.bars) > 100
    # many ranks of a few intervals each: bins of each rank would draw no fewer bars
    many = views.timeline(synthetic_db(n_steps=4, per_step=1, ranks=300), (0, 4), max_bars=1_000, bins=50)
    assert many.bin_ms is None and many.note is None and many.intervals == len(many.bars) > 1_000
    assert sorted(many.bars["rank"].unique()) == list(range(300))


def test_a_timeline_of_many_ranks_has_no_lanes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lanes are drawn up to MAX_LANE_RANKS ranks; beyond, their query is not even run."""
    con = synthetic_db(n_steps=4, per_step=2, ranks=8)
    assert views.timeline(con, (0, 4)).lanes is not None
    monkeypatch.setattr(views, "MAX_LANE_RANKS", 7)
    monkeypatch.setattr(views, "region_lanes", lambda *a: pytest.fail("lanes queried"))
    assert views.timeline(con, (0, 4)).lanes is None


def test_a_timeline_of_many_bars_draws_them_as_an_image(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Past RASTER_BARS phase bars the PDF holds them as one image at the PNG resolution
    (labels stay text); fewer stay rectangles."""
    tl = views.timeline(synthetic_db(n_steps=4, per_step=50), (0, 4), max_bars=10_000)
    assert not figures.timeline(tl, LABEL).layers[0].raster
    monkeypatch.setattr(figures, "RASTER_BARS", len(tl.bars) - 1)
    plot = figures.timeline(tl, LABEL)
    assert plot.layers[0].raster
    out = tmp_path / "t.pdf"
    report.write([Page("timeline", plot)], out)
    assert out.read_bytes().count(b"/Subtype /Image") == 1
