"""The pages on why a step is slow, and the timeline's lanes: the drawn layers' data."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib import pyplot as plt

import analyze
from analyze import views
from analyze.tables.causes import device as device_waits
from analyze.tables.causes import views as cause_views
from analyze.tables.steps import StepBins
from analyze.views import RunLabel
from reports import causes, figures
from reports.theme import LANE_COLORS, PHASE_COLORS
from tests.analyze.test_delays import step
from tests.literal import write_literal

matplotlib.use("Agg")
LABEL = RunLabel("run", "pytorch-ddp", 3, {})
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MS = 1_000_000


def drawn(plot):  # type: ignore[no-untyped-def]
    fig = plot.draw()
    plt.close(fig)
    return plot


def straggler_run(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Three ranks, four steps; rank 2's data loading is 30 ms slow at steps 1-2."""
    items = []
    for s in range(4):
        for rank in range(3):
            items += step(rank, 200 * s, 40 if rank == 2 and s in (1, 2) else 10, 50, 50)
    write_literal(tmp_path / "run", items)
    return analyze.open(tmp_path / "run")


def test_root_causes_page_stacks_idle_by_cause(tmp_path: Path) -> None:
    db = straggler_run(tmp_path)
    per_step = cause_views.cause_steps(db)
    assert per_step.to_dict("list") == {"step": [1, 2], "cause": ["rank 2: dltrace.dataloader"] * 2,
                                        "ms": [60.0, 60.0]}  # two ranks waited 30 ms each
    plot = drawn(causes.root_causes(per_step, cause_views.delay_lines(db), LABEL))
    data = plot.layers[0].data
    assert sorted(zip(data["x"], data["ymax"] - data["ymin"], strict=True)) == [(1, 60.0), (2, 60.0)]
    assert "rank 2's dltrace.dataloader at steps 1-2 caused 120.0 ms" in plot.labels.subtitle


def test_critical_path_page_shows_ranks_and_the_balanced_time(tmp_path: Path) -> None:
    db = straggler_run(tmp_path)
    per_rank, steps = cause_views.path_steps(db)
    plot = drawn(causes.critical_path(per_rank, steps, LABEL))
    bars, points = plot.layers
    # steps 1 and 2: the path runs on rank 2 until the allreduce, then on the rank that ended
    heights = bars.data.groupby("x")["ymax"].max().round(6).to_dict()
    assert heights == {0: 160.0, 1: 160.0, 2: 160.0, 3: 160.0}
    # balanced: the two ranks that waited 30 ms work 130, rank 2 160: mean 140
    assert dict(zip(points.data["x"], points.data["y"].round(6), strict=True)) == {0: 160.0, 1: 140.0, 2: 140.0,
                                                                               3: 160.0}
    assert "imbalance cost 40.0 of 640.0 ms" in plot.labels.subtitle


def test_overlap_page_splits_hidden_and_exposed() -> None:
    steps = pd.DataFrame({"rank": [0, 0, 0, 0], "step": [0, 0, 1, 1], "part": ["hidden", "exposed"] * 2,
                          "ms": [20.0, 5.0, 10.0, 10.0]})
    summary = pd.DataFrame({"rank": [0], "kind": ["all"], "overlap": [0.6]})
    plot = drawn(causes.overlap(steps, summary, RunLabel("r", None, 1, {})))
    data = plot.layers[0].data
    got = sorted(zip(data["x"], (data["ymax"] - data["ymin"]).round(6), data["fill"], strict=True))
    assert got == sorted([(0, 5.0, PHASE_COLORS["allreduce"]), (0, 20.0, PHASE_COLORS["compute"]),
                          (1, 10.0, PHASE_COLORS["allreduce"]), (1, 10.0, PHASE_COLORS["compute"])])
    assert "rank 0: 60%" in plot.labels.subtitle


def test_diff_page_puts_the_largest_change_on_top() -> None:
    table = pd.DataFrame({
        "kind": ["region", "phase", "collective"], "name": ["dltrace.forward", "compute", "allreduce"],
        "a_ms": [50.0, 100.0, 5.0], "b_ms": [100.0, 150.0, 4.0], "delta_ms": [50.0, 50.0, -1.0],
        "ci_low": [48.0, 47.0, -1.5], "ci_high": [52.0, 53.0, -0.5], "change_pct": [100.0, 50.0, -20.0],
        "n_a": [7] * 3, "n_b": [7] * 3, "over": ["steps"] * 3, "significant": [True] * 3})
    page = causes.diff_page(table, "a", "b")
    plot = drawn(page.plot)
    assert page.slug == "diff"
    items = list(plot.data["item"].cat.categories)
    assert items[-1] == "region: dltrace.forward"  # drawn from the top
    bars = plot.layers[1].data
    assert sorted(zip(bars["xmin"], bars["xmax"], strict=True)) == [(-1.5, -0.5), (47.0, 53.0), (48.0, 52.0)]


def test_timeline_lanes_show_regions_and_bucket_waits(tmp_path: Path) -> None:
    items = []
    for rank, issue in ((0, 40), (1, 55)):
        items += [
            (rank, "dltrace.step", 0, 100 * MS), (rank, "dltrace.forward", 0, 10 * MS),
            (rank, "dltrace.backward", 10 * MS, 60 * MS),
            (rank, "ddp.wait_for_buckets", max(issue, 50) * MS, 60 * MS, {"role": "wait"}),
            (rank, "torch.distributed.all_reduce", issue * MS, 58 * MS,
             {"op": "allreduce", "bytes": 100, "lane": True}),
            (rank, "dltrace.optimizer", 60 * MS, 70 * MS),
        ]
    write_literal(tmp_path / "run", items)
    db = analyze.open(tmp_path / "run")
    tl = views.timeline(db, (0, 1))
    lanes = tl.lanes
    assert lanes is not None
    r0 = lanes[lanes["rank"] == 0]
    assert set(zip(r0["lane"], r0["label"], r0["fill"], strict=True)) == {
        (1, "regions", "forward"), (1, "regions", "backward"), (1, "regions", "wait"),
        (1, "regions", "optimizer"), (2, "comm lane 0", "allreduce"), (2, "", "waiting")}
    wait = r0[r0["part"] == "wait"].iloc[0]
    assert (wait["start_ms"], wait["end_ms"]) == (40.0, 55.0)  # rank 0 waits for rank 1's issue
    plot = drawn(figures.timeline(tl, views.run_label(db)))
    phases, lane_rects = plot.layers[:2]
    assert set(lane_rects.data["fill"]) >= {LANE_COLORS["backward"], LANE_COLORS["waiting"],
                                            PHASE_COLORS["allreduce"]}
    ticks = dict(zip(plot.scales.get_scales("y").breaks, plot.scales.get_scales("y").labels, strict=True))
    assert list(ticks.values()) == ["rank 0", "regions", "comm lane 0", "rank 1", "regions", "comm lane 0"]


def test_device_causes_page_stacks_kernel_waiting_by_the_late_rank(tmp_path: Path) -> None:
    from tests.kineto_literal import late_kernels

    # rank 1's allreduce kernel starts 20 us after rank 0's at step 0 (it computed first);
    # rank 0's starts 40 us after rank 1's at step 1 (its device idled)
    db = analyze.open(late_kernels(tmp_path / "run"))
    per_step = device_waits.device_wait_steps(db)
    assert per_step.to_dict("list") == {"step": [0, 1], "cause": ["rank 1", "rank 0"], "ms": [0.02, 0.04]}
    assert list(per_step["cause"].cat.categories) == ["rank 0", "rank 1"]  # the larger first
    plot = drawn(causes.device_causes(per_step, cause_views.device_wait_lines(db, 1), LABEL))
    data = plot.layers[0].data
    assert sorted(zip(data["x"], (data["ymax"] - data["ymin"]).round(9), strict=True)) == [(0, 0.02), (1, 0.04)]
    assert "rank 0 started its collective kernels last 1 time at step 1" in plot.labels.subtitle
    # the run's pages: the device causes page, and no host causes page (no host idle)
    slugs = [p.slug for p in causes.run_pages(db, "01-run", LABEL)]
    assert "01-run-device-causes" in slugs and "01-run-causes" not in slugs


def test_device_critical_path_page_stacks_each_step_by_rank(tmp_path: Path) -> None:
    from tests.kineto_literal import late_kernels

    # late_kernels, rank 0 beginning step 1 10 us late: step 0's path runs 60 us on rank 1, then
    # 40 us on rank 0, whose kernel waited for rank 1's; step 1's 90 us on rank 0 alone
    db = analyze.open(late_kernels(tmp_path / "run", second_step_start=110))
    per_rank, lengths = cause_views.device_path_steps(db)
    assert per_rank.values.round(9).tolist() == [[0, 0, 0.04], [0, 1, 0.06], [1, 0, 0.09]]
    assert lengths.values.round(9).tolist() == [[0, 0.1, 1], [1, 0.09, 1]]
    plot = drawn(causes.critical_path(per_rank, lengths, LABEL))
    data = plot.layers[0].data
    assert sorted(zip(data["x"], (data["ymax"] - data["ymin"]).round(9), strict=True)) == [
        (0, 0.04), (0, 0.06), (1, 0.09)]
    assert len(plot.layers) == 1  # no perfect-balance points: the devices have no such time
    assert plot.labels.subtitle.startswith("the accelerators' critical path") and "0.2 ms in all" in plot.labels.subtitle
    # binned two steps a bar: the mean step of the bin
    binned, bin_lengths = cause_views.device_path_steps(db, StepBins(0, 1, 2))
    assert binned.values.round(9).tolist() == [[0, 0, 0.065], [0, 1, 0.03]]
    assert bin_lengths.values.round(9).tolist() == [[0, 0.095, 2]]
    slugs = [p.slug for p in causes.run_pages(db, "01-run", LABEL)]
    assert "01-run-device-critical-path" in slugs
    # a run without accelerator streams has none
    assert "01-run-device-critical-path" not in [p.slug for p in causes.run_pages(
        straggler_run(tmp_path / "cpu"), "01-run", LABEL)]


def test_a_rank_has_one_colour_on_the_pages_that_colour_ranks(tmp_path: Path) -> None:
    # labels coloured in the order they first appear, each with the first colour none of the
    # labels it shares a page with has: rank 4, alone on the second page, is not rank 7's
    # colour, which it meets on the third
    q = causes.QUALITATIVE
    assert causes.rank_palette([["rank 7", "rank 5", "other ranks"], ["rank 4"], ["rank 4", "rank 5", "rank 7"]]) == {
        "other ranks": causes.OTHER_COLOR, "rank 7": q[0], "rank 5": q[1], "rank 4": q[2]}
    # ranks that never share a page may share a colour
    assert causes.rank_palette([["rank 1"], ["rank 2"]]) == {"other ranks": causes.OTHER_COLOR, "rank 1": q[0],
                                                            "rank 2": q[0]}
    # param's DLRM step: rank 7 caused most of the devices' waiting (first on the device-causes
    # page), the critical-path pages list their ranks by number (rank 4 alone on the hosts')
    db = analyze.open(FIXTURES / "kineto" / "param_dlrm_v100_8rank", db=tmp_path / "t.duckdb")
    pages = {p.slug.removeprefix("01-run-"): p.plot for p in causes.run_pages(db, "01-run", LABEL)}
    scales = {slug: next(sc for sc in pages[slug].scales if "fill" in sc.aesthetics)
              for slug in ("device-causes", "critical-path", "device-critical-path")}

    def colour(slug: str, rank: str) -> str:
        return str(scales[slug].map([rank])[0])

    assert colour("device-causes", "rank 7") == q[0]  # the first cause keeps the first colour
    for rank in ("rank 4", "rank 5", "rank 7"):
        assert colour("device-causes", rank) == colour("device-critical-path", rank), rank
    assert colour("critical-path", "rank 4") == colour("device-critical-path", "rank 4")
    assert len({colour("device-critical-path", r) for r in ("rank 4", "rank 5", "rank 7")}) == 3


def test_device_steps_page_stacks_each_step_by_device_phase(tmp_path: Path) -> None:
    from reports import report
    from tests.kineto_literal import late_kernels

    db = analyze.open(late_kernels(tmp_path / "run"))
    got = views.device_step_phases(db)
    assert [(r, s, p, round(ms * 1000)) for r, s, p, ms in got.itertuples(index=False)] == [  # us
        (0, 0, "comm_exposed", 40), (0, 0, "idle", 60), (0, 1, "comm_exposed", 20), (0, 1, "idle", 80),
        (1, 0, "comm_exposed", 20), (1, 0, "compute", 50), (1, 0, "idle", 30), (1, 1, "comm_exposed", 60),
        (1, 1, "idle", 40)]
    plot = drawn(figures.step_breakdown(got, LABEL, device=True))
    assert plot.labels.subtitle.startswith("on the devices")
    _, pages, _ = report.run_pages(db, 1, None, "run")
    assert "01-run-device-steps" in [p.slug for p in pages]
    # a run without accelerator streams has no such page
    assert views.device_step_phases(straggler_run(tmp_path / "cpu")).empty


def test_timeline_draws_device_streams_without_outlines(tmp_path: Path) -> None:
    # a stream's kernels filled to their edges (an outline on bars a few pixels wide would pale
    # them), the regions and collectives outlined to tell neighbours apart
    from tests.analyze.test_views import _streams_run

    db, _, _ = _streams_run(tmp_path, streams=3)
    plot = drawn(figures.timeline(views.timeline(db, (0, 1)), views.run_label(db)))
    rects = [layer for layer in plot.layers if type(layer.geom).__name__ == "geom_rect"]
    assert len(rects) == 3  # the phases, the outlined lanes (none here), the device's
    phases, outlined, device = rects
    assert outlined.geom.aes_params["color"] == "white" and "color" not in device.geom.aes_params
    assert len(outlined.data) == 0 and len(device.data) == 4
    assert set(device.data["fill"]) == {PHASE_COLORS["compute"], LANE_COLORS["memory"]}
