"""The energy pages: power over time per device with the phases shaded underneath (from the
injected-power trace of tests/analyze/test_energy.py), and energy / EDP across a sweep."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pandas as pd
import pytest
from matplotlib import pyplot as plt

import analyze
from analyze import power, views
from analyze.experiments import energy as sweep_energy
from reports import energy
from reports.report import build_report
from reports.theme import PHASE_COLORS
from tests.analyze.test_compare_energy import published_rows
from tests.analyze.test_energy import trace

matplotlib.use("Agg")


def drawn(plot):  # type: ignore[no-untyped-def]
    plt.close(plot.draw())
    return plot


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trace(tmp_path_factory.mktemp("energy-pages"), interval_ns=100_000_000)


def test_one_power_page_per_device_with_its_ranks_phases(run: Path, tmp_path: Path) -> None:
    with analyze.open(run) as con:
        label = views.run_label(con)
        pages = energy.run_pages(con, "01-run", label)
        pwr, phases, _ = power.timeline(con)
    assert [p.slug for p in pages] == [f"01-run-power-{i}" for i in (1, 2, 3, 4)]
    assert list(dict.fromkeys(pwr["device"])) == ["cpu_package 0 · host", "gpu 0 · rank 0", "gpu 1 · rank 1",
                                                  "gpu 2 · host"]
    gpu0 = drawn(pages[1].plot)
    shades, level, rises = gpu0.layers
    # rank 0's phases underneath: compute, idle and allreduce every 8 s step, in their colours
    assert set(shades.data["fill"]) == {PHASE_COLORS["compute"], PHASE_COLORS["idle"], PHASE_COLORS["allreduce"]}
    assert len(shades.data) == 3 * 3
    # the counter's mean power between samples: 200, 50 and 80 W away from the phase edges
    assert {200.0, 50.0, 80.0} <= {round(w, 6) for w in level.data["y"]}
    assert "gpu 0 · rank 0" in gpu0.labels.subtitle and "rank 0's phases" in gpu0.labels.subtitle
    report = build_report([run], tmp_path / "r.pdf")
    assert [s for s in report.pages if "power" in s] == [f"01-{run.name}-power-{i}" for i in (1, 2, 3, 4)]
    assert (tmp_path / "r.pdf").stat().st_size > 0


def test_sweep_energy_page_shows_energy_and_normalized_edp() -> None:
    configs = sweep_energy.configurations(published_rows(), ["setup"], {"setup": "gpu1"})
    plot = drawn(energy.sweep_energy(configs))
    bars = plot.layers[0].data
    assert len(bars) == 4 * 2 * 2  # configurations x (active, incl. idle) x (energy, EDP)
    edp = dict(zip(plot.data.loc[plot.data["panel"] == "EDP / baseline's", "config"].astype(str),
                   plot.data.loc[plot.data["panel"] == "EDP / baseline's", "value"], strict=False))
    assert edp["setup=cpu"] == pytest.approx(86.65) and edp["setup=gpu1"] == pytest.approx(1)
    assert "energy [kJ]" in set(plot.data["panel"].astype(str))
    assert "normalized to setup=gpu1" in plot.labels.subtitle
    assert isinstance(plot.data, pd.DataFrame)
