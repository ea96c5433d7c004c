"""Statistics on synthetic tables with known answers."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from analyze.experiments import scaling


def test_mean_and_t_confidence_interval() -> None:
    m, lo, hi, n = scaling.mean_ci([1, 2, 3, 4, 5, np.nan])
    # sd = sqrt(2.5); t[0.975; 4] = 2.7764 (tables); half width = 2.7764 * 1.5811 / sqrt(5)
    assert (m, n) == (3.0, 5)
    assert hi - m == pytest.approx(2.7764 * np.sqrt(2.5) / np.sqrt(5), rel=1e-4)
    assert m - lo == pytest.approx(hi - m)
    one = scaling.mean_ci([7.0])
    assert one[0] == 7.0 and np.isnan(one[1]) and one[3] == 1


def test_summarize_per_group() -> None:
    runs = pd.DataFrame({"c": [1, 1, 2, 2], "y": [10.0, 12.0, 5.0, 5.0]})
    out = scaling.summarize(runs, ["c"], ["y"]).set_index("c")
    assert out.loc[1, "y"] == 11.0 and out.loc[2, "n"] == 2
    # t[0.975; 1] = 12.706, sd = sqrt(2), n = 2: half width 12.706
    assert out.loc[1, "y_ci_high"] == pytest.approx(11 + 12.7062, rel=1e-4)
    assert out.loc[2, "y_ci_low"] == out.loc[2, "y_ci_high"] == 5.0


def test_speedup_and_efficiency_against_fewest_ranks_and_a_named_baseline() -> None:
    configs = pd.DataFrame({
        "device": ["cpu", "cpu", "cpu", "gpu", "gpu"],
        "bs": [32, 32, 32, 32, 32],
        "ranks": [1, 2, 4, 1, 4],
        "throughput_sps": [100.0, 180.0, 300.0, 400.0, 1200.0],
    })
    out = scaling.speedup(configs, ["device", "bs", "ranks"])
    assert list(out["speedup"]) == pytest.approx([1, 1.8, 3, 1, 3])
    assert list(out["efficiency"]) == pytest.approx([1, 0.9, 0.75, 1, 0.75])
    assert list(out["baseline_index"]) == [0, 0, 0, 3, 3]
    cpu = scaling.speedup(configs, ["device", "bs", "ranks"], baseline={"device": "cpu", "ranks": 1})
    assert list(cpu["speedup"]) == pytest.approx([1, 1.8, 3, 4, 12])
    assert list(cpu["efficiency"]) == pytest.approx([1, 0.9, 0.75, 4, 3])
    missing = scaling.speedup(configs.iloc[1:], ["device", "bs", "ranks"], baseline={"device": "cpu", "ranks": 1})
    assert missing["speedup"].isna().all()


def jain_18_1() -> pd.DataFrame:
    """Jain, The Art of Computer Systems Performance Analysis, Example 18.1: a 2^2 3 design
    (memory size A, cache size B), three replications per cell."""
    cells = {(-1, -1): (15, 18, 12), (1, -1): (45, 48, 51), (-1, 1): (25, 28, 19), (1, 1): (75, 75, 81)}
    return pd.DataFrame([{"A": a, "B": b, "y": y} for (a, b), ys in cells.items() for y in ys])


def test_2kr_reproduces_jains_example() -> None:
    out = scaling.allocation_2kr(jain_18_1(), ["A", "B"], "y").set_index("term")
    # Jain: q0 = 41, qA = 21.5, qB = 9.5, qAB = 5; SSA = 5547, SSB = 1083, SSAB = 300, SSE = 102,
    # SST = 7032; A explains 78.88%, B 15.40%, AB 4.27%, error 1.45%
    assert out.attrs["mean"] == 41
    assert list(out.loc[["A", "B", "A:B"], "effect"]) == pytest.approx([21.5, 9.5, 5.0])
    assert list(out["ss"]) == pytest.approx([5547, 1083, 300, 102])
    assert list(out["percent"]) == pytest.approx([78.88, 15.40, 4.27, 1.45], abs=0.01)
    assert out["percent"].sum() == pytest.approx(100)
    # s_e = sqrt(102 / 8), s_q = s_e / sqrt(12); 95%: t[0.975; 8] = 2.306
    half = 2.306 * np.sqrt(102 / 8) / np.sqrt(12)
    assert out.loc["A", "effect_ci_high"] - 21.5 == pytest.approx(half, rel=1e-3)


def test_full_factorial_with_known_effects() -> None:
    # y = 10 + a_i + b_j + ab_ij + e: effects sum to zero over each index, so each SS is
    # (observations per level) x sum of squared effects; the errors sum to zero per cell.
    a = {"a1": -2.0, "a2": 0.0, "a3": 2.0}
    b = {"b1": -1.0, "b2": 1.0}
    ab = {("a1", "b1"): 0.5, ("a1", "b2"): -0.5, ("a2", "b1"): 0.0, ("a2", "b2"): 0.0,
          ("a3", "b1"): -0.5, ("a3", "b2"): 0.5}
    noise = [0.3, -0.3]
    rows = [{"A": i, "B": j, "y": 10 + a[i] + b[j] + ab[(i, j)] + e}
            for i, j in itertools.product(a, b) for e in noise]
    out = scaling.allocation_anova(pd.DataFrame(rows), ["A", "B"], "y").set_index("term")
    r = len(noise)
    assert out.loc["A", "ss"] == pytest.approx(len(b) * r * sum(v * v for v in a.values()))  # 32
    assert out.loc["B", "ss"] == pytest.approx(len(a) * r * sum(v * v for v in b.values()))  # 12
    assert out.loc["A:B", "ss"] == pytest.approx(r * sum(v * v for v in ab.values()))  # 2
    assert out.loc["error", "ss"] == pytest.approx(6 * 2 * 0.09)
    assert list(out["dof"]) == [2, 1, 2, 6]
    assert out["percent"].sum() == pytest.approx(100)
    assert out.loc["A", "f_value"] == pytest.approx((32 / 2) / (1.08 / 6))


def test_anova_equals_2kr_on_two_levels_and_three_factors() -> None:
    rng = np.random.default_rng(5)
    rows = [{"A": a, "B": b, "C": c, "y": 5 * (a == "hi") + 2 * (b == "y") * (c == "q") + rng.normal()}
            for a, b, c in itertools.product(["lo", "hi"], ["x", "y"], ["p", "q"]) for _ in range(3)]
    df = pd.DataFrame(rows)
    two = scaling.allocation_2kr(df, ["A", "B", "C"], "y")
    full = scaling.allocation_anova(df, ["A", "B", "C"], "y")
    assert list(two["term"]) == list(full["term"]) == ["A", "B", "C", "A:B", "A:C", "B:C", "A:B:C", "error"]
    assert list(two["ss"]) == pytest.approx(list(full["ss"]))
    assert two["percent"].sum() == pytest.approx(100) and full["percent"].sum() == pytest.approx(100)
    combined = scaling.allocation(df, ["A", "B", "C"], "y")
    assert set(combined["method"]) == {"2k_r"} and combined["p_value"].iloc[0] < 1e-6


def test_unbalanced_and_missing_cells() -> None:
    df = jain_18_1()
    extra = pd.DataFrame([{"A": -1, "B": -1, "y": 99}])
    # a fourth replication in one cell is dropped: the answer is the balanced one
    out = scaling.allocation_2kr(pd.concat([df, extra], ignore_index=True), ["A", "B"], "y")
    assert list(out["ss"]) == pytest.approx([5547, 1083, 300, 102])
    with pytest.raises(ValueError, match="1 of 4 combinations of levels have no successful run"):
        scaling.allocation(df[(df["A"] != 1) | (df["B"] != 1)], ["A", "B"], "y")


def test_polynomial_fits_recover_known_coefficients() -> None:
    x = np.array([1, 2, 4, 8, 1, 2, 4, 8], float)
    quad = scaling.fit_poly(x, 3 + 2 * x + 0.5 * x * x, 2)
    assert quad is not None and quad.coef == pytest.approx((3, 2, 0.5)) and quad.r2 == pytest.approx(1)
    line = scaling.fit_poly(x, 7 - 1.5 * x, 1)
    assert line is not None and line.coef == pytest.approx((7, -1.5)) and line(10) == pytest.approx(-8)
    noisy = scaling.fit_poly([1, 2, 3, 4], [1, 3, 2, 4], 1)
    # by hand: slope 0.8, intercept 0.5; SSE = 1.8, SST = 5 -> R^2 = 0.64
    assert noisy is not None and noisy.coef == pytest.approx((0.5, 0.8)) and noisy.r2 == pytest.approx(0.64)
    assert scaling.fit_poly([1, 1, 2, 2], [1, 2, 3, 4], 2) is None  # two x values: no quadratic


def test_allreduce_model_recovers_latency_and_bandwidth() -> None:
    latency, per_byte = 0.05, 1 / 1e6  # 50 us, 1 GB/s = 1e6 bytes per ms
    pts = pd.DataFrame([{"ranks": p, "bytes": b} for p in (1, 2, 4, 8) for b in (1e5, 1e6, 4e6)])
    assert list(scaling.ring_bytes([1000, 1000, 1000], [1, 2, 4])) == [0, 1000, 1500]
    pts["transfer_ms"] = latency + per_byte * 2 * (pts["ranks"] - 1) / pts["ranks"] * pts["bytes"]
    model = scaling.fit_allreduce(pts)
    assert model is not None
    assert model.latency_ms == pytest.approx(latency) and model.ms_per_byte == pytest.approx(per_byte)
    assert model.bandwidth_gbs == pytest.approx(1.0) and model.r2 == pytest.approx(1)
    assert scaling.fit_allreduce(pts[pts["ranks"] == 1]) is None  # ring bytes all zero


def test_holdout_prediction_error_is_computed_on_the_left_out_configuration() -> None:
    # configs 1-3 follow t = 1 + 0.001 x exactly; config 4 measured 1.5 x the model
    def point(run: str, config: int, ranks: int, nbytes: float, calls: float, factor: float = 1.0) -> dict:
        t = (1 + 0.001 * 2 * (ranks - 1) / ranks * nbytes) * factor
        return {"run_name": run, "config": config, "ranks": ranks, "bytes": nbytes,
                "calls_per_step": calls, "transfer_ms": t}

    pts = pd.DataFrame([point("a", 1, 1, 1000, 2), point("b", 2, 2, 1000, 2), point("c", 3, 2, 3000, 1),
                        point("d1", 4, 4, 2000, 3, 1.5), point("d2", 4, 4, 2000, 3, 1.5)])
    out = scaling.holdout_allreduce(pts, {"config 4": pts["config"] == 4, "ranks=1": pts["ranks"] == 1,
                                          "all but one": pts["config"] != 2})
    c4 = out[out["holdout"] == "config 4"].iloc[0]
    model_ms = 3 * (1 + 0.001 * 1.5 * 2000)  # 3 calls x 4 ms
    assert c4["predicted_ms"] == pytest.approx(model_ms) and c4["measured_ms"] == pytest.approx(1.5 * model_ms)
    assert c4["error_pct"] == pytest.approx(100 * (1 / 1.5 - 1))  # -33.3%
    # holding out rank count 1 leaves configs 2-4: determined, though config 4 pulls the fit
    r1 = out[out["holdout"] == "ranks=1"].iloc[0]
    assert r1["config"] == 1 and np.isfinite(r1["predicted_ms"])
    left = out[out["holdout"] == "all but one"]
    assert len(left) == 1 and np.isnan(left["predicted_ms"].iloc[0]) and "not determined" in left["note"].iloc[0]


def test_holdout_fit_extrapolates_to_the_largest_rank_count() -> None:
    x = [1, 1, 2, 2, 4, 4]
    y = [10, 10, 12, 12, 20, 22]  # the line through ranks 1 and 2 predicts 16 at 4
    assert scaling.holdout_fit(x, y, 1) == pytest.approx((4, 16, 21))
    assert scaling.holdout_fit(x, y, 2) is None  # two remaining rank counts: no quadratic
