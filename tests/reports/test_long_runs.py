"""Per-step figures of runs with many steps: bins of consecutive steps, means per step, a
sample of the waits' points; every step still counts."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib import pyplot as plt

from analyze import views
from analyze.views import RunLabel
from reports import causes, figures
from reports import steps as per_bar

matplotlib.use("Agg")
LABEL = RunLabel("long", "pytorch-ddp", 2, {})


def drawn(plot):  # type: ignore[no-untyped-def]
    fig = plot.draw()
    plt.close(fig)
    return plot


def test_bins_are_means_per_step_and_absent_steps_count_as_zero() -> None:
    df = pd.DataFrame({"step": [0, 1, 2, 3, 4, 6], "rank": 0, "ms": [1.0, 3.0, 5.0, 7.0, 9.0, 12.0]})
    got = per_bar.binned(df, ["rank"], ["ms"], 3)
    # bins 0-2 and 3-5 of three steps each (step 5 has no row: zero), 6 alone
    assert got.to_dict("list") == {"step": [0, 3, 6], "rank": [0, 0, 0], "ms": [3.0, 16 / 3, 12.0]}
    assert per_bar.binned(df, ["rank"], ["ms"], 1) is df
    assert per_bar.steps_per_bar(pd.Series(range(400))) == 1
    assert per_bar.steps_per_bar(pd.Series(range(401))) == 2
    assert per_bar.steps_per_bar(pd.Series(range(10, 100_010))) == 250


def test_a_long_run_draws_at_most_max_bars_a_rank_and_keeps_the_time() -> None:
    n = 10_000
    phases = ["compute", "allreduce", "idle"]
    steps = pd.DataFrame({"rank": np.repeat([0, 1], n * 3), "step": np.tile(np.repeat(np.arange(n), 3), 2),
                          "phase": np.tile(phases, 2 * n), "ms": np.tile([8.0, 1.5, 0.5], 2 * n)})
    steps.loc[(steps["rank"] == 1) & (steps["step"] >= 5000) & (steps["phase"] == "idle"), "ms"] = 4.5
    plot = drawn(figures.step_breakdown(steps, LABEL))
    data = plot.layers[0].data
    assert data.groupby("PANEL")["x"].nunique().max() <= per_bar.MAX_BARS
    # each bar is a mean step: 10 ms on rank 0, 14 ms on rank 1 from step 5000 on
    height = data.groupby(["PANEL", "x"])["ymax"].max().round(6)
    assert set(height.loc[1]) == {10.0} and set(height.loc[2][height.loc[2].index >= 5000]) == {14.0}
    assert "each bar: the mean of 25 consecutive steps" in plot.labels.subtitle
    assert ((data["xmax"] - data["xmin"]).round(6) == 0.85 * 25).all()  # as wide as 25 steps' bars


def test_the_critical_path_page_bins_bars_and_points_alike() -> None:
    n = 2_000
    per_rank = pd.DataFrame({"step": np.repeat(np.arange(n), 2), "rank": np.tile([0, 1], n),
                             "ms": np.tile([6.0, 4.0], n)})
    steps = pd.DataFrame({"step": np.arange(n), "path_ms": 10.0, "balanced_ms": 9.0})
    plot = drawn(causes.critical_path(per_rank, steps, LABEL))
    bars, points = plot.layers
    assert bars.data["x"].nunique() == points.data["x"].nunique() == 400
    assert set(bars.data.groupby("x")["ymax"].max().round(6)) == {10.0}
    assert set(points.data["y"].round(6)) == {9.0}
    assert "imbalance cost 2,000.0 of 20,000.0 ms" in plot.labels.subtitle  # over every step


def test_the_waits_figure_samples_its_points_but_not_its_boxes() -> None:
    n = 5_000
    waits = pd.DataFrame({"op": "allreduce", "rank": np.tile([0, 1], n), "comm_id": 0,
                          "seq": np.repeat(np.arange(n), 2), "wait_ms": np.tile([0.0, 2.0], n),
                          "transfer_ms": 0.1, "arrived_last": np.tile([True, False], n)})
    plot = drawn(figures.collective_waits(waits, views.stragglers(waits), LABEL))
    boxes, points = plot.layers
    assert len(points.data) == figures.MAX_POINTS and len(boxes.data) == 2
    assert "a sample of 2,000 instances per op" in plot.labels.subtitle
    assert set(boxes.data["middle"]) == {0.0, 2.0}  # the medians of all 5,000 instances a rank


def test_the_report_bins_in_sql_as_a_figure_bins_a_frame(tmp_path: Path) -> None:
    """The report reads a long run's steps binned by DuckDB, never every step; the bins are
    the ones a frame of every step gets (reports/steps.py)."""
    import analyze
    from analyze.tables.causes import views as cause_views
    from analyze.tables.steps import step_bins
    from bench import synth

    run, _ = synth.write(200_000, tmp_path / "run")  # about 900 steps of 2 ranks
    db = analyze.open(run)
    bins = step_bins(db, most=100)
    span = (bins.first, bins.last)
    assert bins.per == 9

    def same(sql: pd.DataFrame, frame: pd.DataFrame, keys: list[str], values: list[str]) -> None:
        want = per_bar.binned(frame, keys, values, bins.per, span)
        got, want = (d.sort_values(["step", *keys]).reset_index(drop=True) for d in (sql, want))
        assert got["step"].nunique() <= 100 and len(got) == len(want)
        pd.testing.assert_frame_equal(got[["step", *keys, *values]], want[["step", *keys, *values]],
                                      check_dtype=False, check_categorical=False, rtol=1e-9)

    same(views.step_phases(db, bins), views.step_phases(db), ["rank", "phase"], ["ms"])
    same(cause_views.overlap_steps(db, bins), cause_views.overlap_steps(db), ["rank", "part"], ["ms"])
    causes_binned = cause_views.cause_steps(db, bins=bins)
    assert causes_binned["ms"].sum() > 0
    same(causes_binned, cause_views.cause_steps(db), ["cause"], ["ms"])
    (per_rank, steps), (all_rank, all_steps) = cause_views.path_steps(db, bins), cause_views.path_steps(db)
    same(per_rank, all_rank, ["rank"], ["ms"])
    same(steps, all_steps, [], ["path_ms", "balanced_ms"])
    # the critical path page's totals are the run's, from the bins and their step counts
    a = causes.critical_path(per_rank, steps, LABEL, per=bins.per).labels.subtitle
    b = causes.critical_path(all_rank, all_steps, LABEL).labels.subtitle
    assert a.splitlines()[2] == b.splitlines()[2] and a.splitlines()[2].startswith("imbalance cost")


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize("fixture", ["scorep/sstelements-bcast4", "kineto/hta_sampled_2rank", "synthetic"])
def test_the_waits_summed_in_sql_are_those_of_every_instance(fixture: str, tmp_path: Path) -> None:
    import shutil

    import analyze
    from bench import synth

    if fixture == "synthetic":
        run, _ = synth.write(50_000, tmp_path / "run")
    else:
        run = shutil.copytree(FIXTURES / fixture, tmp_path / "run")
    db = analyze.open(run)
    every = views.collective_waits(db)
    assert len(every)
    sample, boxes, counts = views.waits_summary(db, 25)
    pd.testing.assert_frame_equal(counts, views.stragglers(every), check_dtype=False)
    pd.testing.assert_frame_equal(boxes.reset_index(drop=True), figures._boxes(every).reset_index(drop=True),
                                  check_dtype=False, rtol=1e-9)
    assert (sample.groupby("op").size() <= 25).all() and set(sample["op"]) == set(every["op"])
    key = ["op", "comm_id", "seq", "rank"]
    assert len(sample.merge(every, on=[*key, "wait_ms", "arrived_last"])) == len(sample)  # rows of the run
    assert views.waits_summary(db, 25)[0].equals(sample)  # the same sample each time
    assert not db.execute("SELECT * FROM duckdb_tables() WHERE temporary").fetchall()  # its table is gone
    drawn(figures.collective_waits(sample, counts, LABEL, boxes))


def test_many_ranks_share_panels_and_boxes_as_means_of_their_ranks(tmp_path: Path) -> None:
    import numpy as np

    import analyze
    from analyze.tables.causes import views as cause_views
    from analyze.tables.steps import rank_groups
    from bench import synth

    run, _ = synth.write(40_000, tmp_path / "run", 40)
    db = analyze.open(run)
    groups = rank_groups(db)
    assert (groups.per, groups.ranks, groups.label(39), groups.label(36, short=True)) == (3, 40, "rank 39", "36-38")

    def by_group(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
        n = df.groupby(df["rank"] // 3)["rank"].transform("nunique")
        out = df.assign(rank=df["rank"] // 3 * 3, ms=df["ms"] / n)
        return out.groupby(["rank", *keys], as_index=False)["ms"].sum()

    for sql, every, keys in ((views.step_phases(db, None, groups), views.step_phases(db), ["step", "phase"]),
                             (cause_views.overlap_steps(db, None, groups), cause_views.overlap_steps(db), ["step", "part"])):
        want = by_group(every, keys).sort_values(["rank", *keys]).reset_index(drop=True)
        got = sql.sort_values(["rank", *keys]).reset_index(drop=True)[["rank", *keys, "ms"]]
        pd.testing.assert_frame_equal(got, want, check_dtype=False, rtol=1e-9)
    plot = drawn(figures.step_breakdown(views.step_phases(db, None, groups), LABEL, None, groups))
    assert plot.layers[0].data["PANEL"].nunique() == 14 and "the mean of 3 consecutive ranks" in plot.labels.subtitle
    # the waits: a box over each group's instances, its times last summed
    every = views.collective_waits(db)
    _, boxes, counts = views.waits_summary(db, 25, groups)
    grouped = every.assign(rank=every["rank"] // 3 * 3)
    pd.testing.assert_frame_equal(boxes.reset_index(drop=True), figures._boxes(grouped).reset_index(drop=True),
                                  check_dtype=False, rtol=1e-9)
    per_rank = views.stragglers(every)
    want = per_rank.assign(rank=per_rank["rank"] // 3 * 3).groupby(["op", "rank"], as_index=False).agg(
        times_last=("times_last", "sum"), instances=("instances", "first"))
    pd.testing.assert_frame_equal(counts, want, check_dtype=False)
    assert np.isclose(counts["times_last"].sum(), per_rank["times_last"].sum())
    # the points: the same instances as without groups (a hash of the group's first rank drew
    # whole groups' instances and left others without a point)
    alone = views.waits_summary(db, 200)[0]
    grouped_sample = views.waits_summary(db, 200, groups)[0]
    pd.testing.assert_frame_equal(grouped_sample, alone.assign(rank=alone["rank"] // 3 * 3))
    assert grouped_sample["rank"].nunique() == 14
    # the boxes side by side in rank order (as text, "10-14" came before "5-9")
    boxes_of = rank_groups(db, figures.MAX_BOXES)
    sample, boxes, counts = views.waits_summary(db, figures.MAX_POINTS, boxes_of)
    plot = drawn(figures.collective_waits(sample, counts, LABEL, boxes, boxes_of))
    firsts = [int(str(t).split("-")[0]) for t in plot.layout.panel_params[0].x.labels]
    assert firsts == list(range(0, 40, 5))


def test_panels_of_four_digit_ranks_drop_the_word() -> None:
    """'ranks 1024-1279' ran into the next panel's name: with rank numbers of four digits a
    panel is named by its range alone (the subtitle says what a panel holds)."""
    from analyze.tables.steps import RankGroups

    assert RankGroups(256, 4096).panel(1024) == "1024-1279"
    assert RankGroups(64, 1000).panel(0) == "ranks 0-63"
    assert RankGroups(1, 4096).panel(7) == "rank 7"


@pytest.mark.parametrize("n, first", [(3, 0), (12, 5), (40, 0), (900, 1)])
def test_the_step_axis_marks_whole_steps_only(n: int, first: int) -> None:
    steps = pd.DataFrame({"rank": 0, "step": np.arange(first, first + n), "phase": "compute", "ms": 1.0})
    fig = figures.step_breakdown(steps, LABEL).draw()
    ticks = [t for t in fig.axes[0].get_xticks() if first - 1 < t < first + n]
    plt.close(fig)
    assert ticks and all(float(t).is_integer() for t in ticks)
    if n <= 12:  # few steps: every one of them
        assert [int(t) for t in ticks] == list(range(first, first + n))


def test_many_ranks_hold_the_steps_in_memory_for_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above HOLD_RANKS ranks the report reads the steps from a copy in memory (each read of
    the view opens every rank's file), with the same rows, and leaves no table behind."""
    import analyze
    from analyze.tables import database
    from bench import synth

    run, _ = synth.write(20_000, tmp_path / "run", 12)
    db = analyze.open(run)
    temporary = "SELECT table_name FROM duckdb_tables() WHERE temporary"
    every = "SELECT * FROM steps ORDER BY ALL"
    want, phases = db.execute(every).fetchall(), views.step_phases(db)
    with database.held(db, "steps"):  # 12 ranks: the view, as before
        assert not db.execute(temporary).fetchall()
    monkeypatch.setattr(database, "HOLD_RANKS", 8)
    with database.held(db, "steps"):
        assert db.execute(temporary).fetchall() == [("steps",)]
        assert db.execute(every).fetchall() == want and len(want) > 12
        pd.testing.assert_frame_equal(views.step_phases(db), phases)
    assert not db.execute(temporary).fetchall()
    monkeypatch.setattr(database, "HOLD_ROWS", len(want) - 1)  # too many rows: the view
    with database.held(db, "steps"):
        assert not db.execute(temporary).fetchall() and db.execute(every).fetchall() == want
