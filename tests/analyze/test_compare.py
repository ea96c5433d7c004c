"""``analyze compare`` on a synthetic sweep whose every number is known.

Two factors: model (small: one 1000-byte allreduce per step; big: one of 3000 bytes) and
ranks (1, 2), two replications each. Every step ends with a synchronous allreduce which all
ranks enter together (no waiting). Step 0 is a 500 ms warm-up, left out as analyze phases does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest

from analyze.experiments import compare, scaling
from analyze.schema import SWEEP_TABLES
from tests.conftest import ROOT
from tests.literal import write_literal

MS = 1_000_000
BATCH = 8
# (model, ranks) -> (step ms, allreduce ms, bytes); small/1 replication 2 computes 10 ms longer
CONFIGS = {("small", 1): (100, 10, 1000), ("small", 2): (80, 20, 1000),
           ("big", 1): (150, 10, 3000), ("big", 2): (130, 44, 3000)}


def synthetic_sweep(root: Path, steps: int = 3) -> Path:
    """Write the sweep described in the module docstring under ``root``; return its directory."""
    plan = []
    for config, ((model, ranks), (step, ar, nbytes)) in enumerate(CONFIGS.items(), start=1):
        for rep in (1, 2):
            name = f"model={model},ranks={ranks},rep={rep}"
            length = step + (10 if (model, ranks, rep) == ("small", 1, 2) else 0)
            items, t = [], 0
            for s in range(steps):
                span = 500 if s == 0 else length
                for r in range(ranks):
                    items.append((r, "dltrace.step", t * MS, (t + span) * MS))
                    items.append((r, "MPI_Allreduce", (t + span - ar) * MS, (t + span) * MS,
                                  {"op": "allreduce", "bytes": nbytes}))
                t += span + 1
            write_literal(root / name, items)
            info = {"name": name, "status": "ok", "ranks": ranks, "framework": "pytorch-ddp",
                    "params": {"batch_size": BATCH, "model": model}, "complete": True,
                    "factors": {"model": model, "ranks": ranks},
                    "sweep": {"name": "synthetic", "config": config, "replication": rep,
                              "order": len(plan) + 1}}
            (root / name / "run.json").write_text(json.dumps(info))
            plan.append({"name": name, "config": config, "replication": rep})
    failed = root / "model=big,ranks=2,rep=3"
    failed.mkdir()
    (failed / "run.json").write_text(json.dumps({
        "status": "failed", "ranks": 2, "factors": {"model": "big", "ranks": 2},
        "sweep": {"config": 4, "replication": 3}, "params": {"batch_size": BATCH}}))
    meta = {"name": "synthetic", "factors": [{"name": "model", "levels": ["small", "big"]},
                                             {"name": "ranks", "levels": [1, 2]}],
            "baselines": {}, "plan": plan}
    (root / "sweep.json").write_text(json.dumps(meta))
    return root


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> compare.Comparison:
    return compare.compare(synthetic_sweep(tmp_path_factory.mktemp("sweep")), predict_ranks=[4])


def test_per_run_means_leave_out_warm_up(result: compare.Comparison) -> None:
    runs = result.runs.set_index("run_name")
    r = runs.loc["model=big,ranks=2,rep=1"]
    assert (r["step_ms"], r["compute_ms"], r["allreduce_ms"], r["idle_ms"]) == pytest.approx((130, 86, 44, 0))
    assert r["steps"] == 2 and r["samples_per_step"] == 2 * BATCH
    assert r["throughput_sps"] == pytest.approx(16 / 0.130)
    assert (r["allreduce_calls"], r["allreduce_bytes"], r["allreduce_transfer_ms"]) == pytest.approx((1, 3000, 44))
    assert runs.loc["model=big,ranks=2,rep=3", "status"] == "failed"
    assert np.isnan(runs.loc["model=big,ranks=2,rep=3", "step_ms"])
    assert any("1 of 9 runs left out (failed)" in n for n in result.notes)
    assert result.factors == ["model", "ranks"]


def test_configurations_confidence_intervals_and_speedup(result: compare.Comparison) -> None:
    cfg = result.configs.set_index("config_label")
    assert list(result.configs["config_label"]) == [  # design order: small before big
        "model=small, ranks=1", "model=small, ranks=2", "model=big, ranks=1", "model=big, ranks=2"]
    small1 = cfg.loc["model=small, ranks=1"]
    assert small1["n"] == 2 and small1["step_ms"] == pytest.approx(105)
    # sd of (100, 110) = 7.071, t[0.975; 1] = 12.706: half width 12.706 x 7.071 / sqrt(2) = 63.53
    assert small1["step_ms_ci_high"] - 105 == pytest.approx(63.53, rel=1e-3)
    big2 = cfg.loc["model=big, ranks=2"]
    assert big2["n"] == 2 and big2["step_ms_ci_low"] == pytest.approx(130)
    # speedup = throughput ratio: (16 / 0.130) / (8 / 0.150) = 2.3077; efficiency = half of it
    assert big2["speedup"] == pytest.approx((16 / 0.130) / (8 / 0.150))
    assert big2["efficiency"] == pytest.approx(big2["speedup"] / 2)
    assert cfg.loc["model=big, ranks=1", "speedup"] == pytest.approx(1)
    assert big2["baseline_config"] == 3
    small2 = cfg.loc["model=small, ranks=2"]
    assert small2["speedup"] == pytest.approx((16 / 0.080) / (8 / np.mean([0.100, 0.110])), rel=1e-2)


def test_variation_and_fits(result: compare.Comparison) -> None:
    v = result.variation
    assert set(v["method"]) == {"2k_r"} and set(v["response"]) == {"step_ms", "throughput_sps"}
    for _, g in v.groupby("response"):
        assert g["percent"].sum() == pytest.approx(100)
    step = v[v["response"] == "step_ms"].set_index("term")
    # cell means 105, 80, 150, 130: q_model = (-105 - 80 + 150 + 130) / 4 = 23.75
    assert step.loc["model", "effect"] == pytest.approx(23.75)
    assert step.loc["ranks", "effect"] == pytest.approx((-105 + 80 - 150 + 130) / 4)
    fits = result.fits.set_index(["response", "group_label", "model"])
    lin = fits.loc[("step_ms", "model=big", "linear")]
    assert (lin["intercept"], lin["slope"], lin["r2"], lin["n"]) == pytest.approx((170, -20, 1, 4))
    assert not (result.fits["model"] == "quadratic").any()  # two rank counts do not determine one
    assert any("a quadratic one 3" in n for n in result.notes)


def test_allreduce_model_and_holdouts(result: compare.Comparison) -> None:
    pts = result.allreduce_points
    assert len(pts) == 8 and set(pts["ring_bytes"]) == {0, 1000, 3000}
    expected = scaling.fit_poly(pts["ring_bytes"], pts["transfer_ms"], 1)
    m = result.allreduce_model.iloc[0]
    assert (m["latency_ms"], m["ms_per_byte"]) == pytest.approx(expected.coef)
    p = result.predictions.set_index(["holdout", "config"])
    # without the big model: small gives t = 10 + 0.01 x exactly; at 3000 bytes, 2 ranks: 40 ms
    big2 = p.loc[("model=big", 4)]
    assert big2["predicted_ms"] == pytest.approx(40) and big2["measured_ms"] == pytest.approx(44)
    assert big2["error_pct"] == pytest.approx(100 * (40 - 44) / 44)
    assert p.loc[("model=big", 3), "error_pct"] == pytest.approx(0)
    assert {"config 1", "config 4", "ranks=1", "ranks=2", "model=small"} <= set(result.predictions["holdout"])
    no_slope = result.predictions[result.predictions["holdout"] == "ranks=2"]  # ranks 1 alone left
    assert len(no_slope) == 1 and no_slope["note"].iloc[0].startswith("the other runs")
    extra = result.predictions[result.predictions["holdout"] == "extrapolation"]
    assert list(extra["ranks"]) == [4, 4] and extra["measured_ms"].isna().all()


def test_the_database_holds_the_declared_tables(result: compare.Comparison) -> None:
    with duckdb.connect(str(result.db), read_only=True) as con:
        for table in SWEEP_TABLES:
            cols = [r[0] for r in con.execute(f"DESCRIBE {table.name}").fetchall()]
            assert cols == table.names
        assert con.execute("SELECT count(*) FROM comparison").fetchone()[0] == 9
        by_model = dict(con.execute("""SELECT model, avg(step_ms) FROM comparison_wide
                                       WHERE status = 'ok' GROUP BY model""").fetchall())
        assert by_model == pytest.approx({"small": (100 + 110 + 80 + 80) / 4, "big": 140})
        assert con.execute("""SELECT factors->>'$.model' FROM configurations WHERE config = 4""").fetchone()[0] == "big"
        total = con.execute("SELECT sum(percent) FROM variation WHERE response = 'step_ms'").fetchone()[0]
        assert total == pytest.approx(100)


def test_runs_made_by_hand_are_compared_by_what_differs(tmp_path: Path) -> None:
    for name, ranks, bs in (("a", 1, 8), ("b", 2, 8), ("c", 2, 16)):
        items = [(r, "dltrace.step", s * 100 * MS, (s * 100 + 90) * MS) for r in range(ranks) for s in range(3)]
        write_literal(tmp_path / name, items)
        (tmp_path / name / "run.json").write_text(json.dumps(
            {"status": "ok", "ranks": ranks, "framework": "pytorch-ddp",
             "params": {"batch_size": bs, "steps": 3}}))
    c = compare.compare(tmp_path)
    assert c.factors == ["ranks", "batch_size"]
    assert list(c.configs["config_label"]) == ["ranks=1, batch_size=8", "ranks=2, batch_size=8",
                                               "ranks=2, batch_size=16"]
    assert any("allocation of variation" in n and "no successful run" in n for n in c.notes)


def test_cli_errors_and_output(tmp_path: Path, result: compare.Comparison) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "analyze.cli", "compare", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)

    ok = cli(str(result.directory), "--predict-ranks", "8")
    assert ok.returncode == 0, ok.stderr
    assert "variation of step_ms (2^k r): model" in ok.stdout
    assert "hold-out predictions of allreduce_ms" in ok.stdout
    assert "predicted allreduce time per step at 8 ranks" in ok.stdout
    empty = cli(str(tmp_path))
    assert empty.returncode == 1 and "holds no runs" in empty.stderr and "Traceback" not in empty.stderr
    bad = cli(str(result.directory), "--predict-ranks", "x")
    assert bad.returncode == 2 and "expected rank counts" in bad.stderr
