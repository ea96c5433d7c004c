"""A sweep's report: the pages and what they draw, and a real sweep from design to PDF."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
from matplotlib import pyplot as plt
from pypdf import PdfReader

from analyze.errors import AnalyzeError
from analyze.experiments import compare
from reports import scaling
from reports.report import build_report
from tests.analyze.test_compare import synthetic_sweep
from tests.conftest import ROOT

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def comparison(tmp_path_factory: pytest.TempPathFactory) -> compare.Comparison:
    return compare.compare(synthetic_sweep(tmp_path_factory.mktemp("sweep")))


def drawn(plot):  # type: ignore[no-untyped-def]
    """Render (the layers' data below are what the builder passed; drawing replaces them)."""
    plt.close(copy.deepcopy(plot).draw())
    return plot


def test_scaling_curves_draw_configuration_means_and_runs(comparison: compare.Comparison) -> None:
    step = drawn(scaling.scaling(comparison.configs, comparison.runs[comparison.runs["status"] == "ok"],
                                 "step_ms", comparison.factors))
    assert sorted(zip(step.data["model"], step.data["ranks"], step.data["step_ms"], strict=True)) == [
        ("big", 1, 150), ("big", 2, 130), ("small", 1, 105), ("small", 2, 80)]
    assert len(step.layers[0].geom.data) == 8  # the runs' dots (the failed run is not drawn)
    assert step.labels.y == "time per step [ms]" and step.labels.subtitle.endswith("colour: model")
    speed = drawn(scaling.scaling(comparison.configs, comparison.runs, "speedup", comparison.factors))
    assert speed.layers[0].geom.data["slope"].iloc[0] == 1  # the linear-speedup line
    eff = drawn(scaling.scaling(comparison.configs, comparison.runs, "efficiency", comparison.factors))
    assert eff.layers[0].geom.data["yintercept"].iloc[0] == 1.0


def test_phases_fits_model_predictions_and_variation(comparison: compare.Comparison) -> None:
    ph = drawn(scaling.phases(comparison.configs, comparison.factors))
    big2 = ph.data[(ph.data["panel"] == "model=big") & (ph.data["x"] == "2")]
    assert dict(zip(big2["phase"].astype(str), big2["ms"], strict=True)) == pytest.approx(
        {"compute": 86, "allreduce": 44, "other_comm": 0, "idle": 0, "other": 0})
    fit = drawn(scaling.fits(comparison.runs[comparison.runs["status"] == "ok"], comparison.curves,
                             comparison.fits, "step_ms", comparison.factors))
    line = fit.layers[1].geom.data
    assert set(line["group_label"]) == {"model=small", "model=big"} and set(line["model"]) == {"linear"}
    big = line[line["group_label"] == "model=big"]
    assert big["value"].iloc[0] == pytest.approx(150) and big["value"].iloc[-1] == pytest.approx(130)
    ar = drawn(scaling.allreduce_model(comparison.allreduce_points, comparison.allreduce_model))
    assert ar.layers[1].geom.data["intercept"].iloc[0] == pytest.approx(comparison.allreduce_model["latency_ms"][0])
    assert "bandwidth" in ar.labels.subtitle
    pred = drawn(scaling.predictions(comparison.predictions))
    assert pred.data["measured_ms"].notna().all() and "mean |error|" in pred.labels.subtitle
    var = drawn(scaling.variation(comparison.variation))
    for _, g in var.data.groupby("response"):
        assert g["percent"].sum() == pytest.approx(100)


def test_a_sweep_directory_gets_the_sweep_pages(comparison: compare.Comparison, tmp_path: Path) -> None:
    report = build_report([comparison.directory], tmp_path / "s.pdf", png=True)
    assert report.pages == ["bottleneck-1", "scaling-step", "scaling-speedup", "scaling-efficiency",
                            "phases", "fit-step", "fit-comm", "allreduce-model", "predictions", "variation"]
    assert len(PdfReader(report.pdf).pages) == len(report.pages)
    assert len(report.pngs) == len(report.pages)
    assert any("no per-run pages" in n for n in report.notes)
    one_run = comparison.directory / "model=big,ranks=1,rep=1"
    with pytest.raises(AnalyzeError, match="is a sweep directory: report it alone"):
        build_report([one_run, comparison.directory], tmp_path / "mixed.pdf")


def test_many_configurations_split_the_bottleneck_page() -> None:
    configs = pd.DataFrame({"config_label": [f"bs={i}, ranks=1" for i in range(20)], "ranks": 1,
                            **{c: 1.0 for c in compare.PHASE_COLUMNS.values()}})
    empty = pd.DataFrame()
    c = compare.Comparison(Path("."), Path("x"), ["bs"], configs.assign(bs=range(20), status="ok", step_ms=5.0),
                           configs.assign(bs=range(20), speedup=float("nan"), step_ms=5.0,
                                          step_ms_ci_low=5.0, step_ms_ci_high=5.0),
                           empty, pd.DataFrame(columns=["response"]),
                           pd.DataFrame(columns=["response"]), empty, pd.DataFrame(), pd.DataFrame(),
                           pd.DataFrame(columns=["measured_ms"]))
    slugs = [p.slug for p in scaling.sweep_pages(c)]
    assert slugs[:2] == ["bottleneck-1", "bottleneck-2"] and "scaling-speedup" not in slugs


@pytest.mark.slow
def test_a_tiny_real_sweep_end_to_end(tmp_path: Path) -> None:
    """runs/designs/tiny.toml (1 and 2 ranks x 2 replications) -> compare -> PDF."""
    def cli(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", f"{tool}.cli", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=900)

    t0 = time.monotonic()
    swept = cli("instrument", "sweep", "runs/designs/tiny.toml", "--out", str(tmp_path))
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert "4 of 4 runs complete, 0 failed" in swept.stdout
    sweep_dir = tmp_path / "tiny"
    infos = [json.loads(p.read_text()) for p in sweep_dir.glob("*/run.json")]
    assert sorted((i["factors"]["ranks"], i["sweep"]["replication"]) for i in infos) == [
        (1, 1), (1, 2), (2, 1), (2, 2)]
    assert all(i["status"] == "ok" and i["framework"] == "pytorch-ddp" for i in infos)
    compared = cli("analyze", "compare", str(sweep_dir))
    assert compared.returncode == 0, compared.stderr
    assert "allreduce model: latency" in compared.stdout
    out = tmp_path / "tiny.pdf"
    reported = cli("analyze", "report", str(sweep_dir), "-o", str(out))
    assert reported.returncode == 0, reported.stderr
    assert len(PdfReader(out).pages) == 9  # no predictions page: 2 configurations determine no hold-out
    with __import__("duckdb").connect(str(sweep_dir / "compare.duckdb"), read_only=True) as con:
        n, speedup = con.execute("SELECT sum(n), max(speedup) FROM configurations").fetchone()
    assert n == 4 and speedup > 0
    print(f"tiny sweep end to end: {time.monotonic() - t0:.0f} s")
