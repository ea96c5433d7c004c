"""``analyze diff``: the change per step with confidence intervals, on literal runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyze.errors import AnalyzeError
from analyze.experiments import diff
from analyze.tables import names
from reports.causes import diff_plot
from tests.kineto_literal import kernel, memcpy, step, write_rank
from tests.literal import write_literal

MS = 1_000_000
JITTER = [0, 1, 2, 1, 0, 2, 1, 0]  # ms added to forward at each step, so steps vary


def run(path: Path, forward: int, steps: int = 8, ranks: int = 2) -> Path:
    items = []
    for s in range(steps):
        base = 300 * s
        fwd = forward + JITTER[s]
        for rank in range(ranks):
            t = base
            items += [(rank, "dltrace.step", t * MS, (t + 10 + fwd + 80 + 10) * MS),
                      (rank, "dltrace.dataloader", t * MS, (t + 10) * MS),
                      (rank, "dltrace.forward", (t + 10) * MS, (t + 10 + fwd) * MS),
                      (rank, "dltrace.backward", (t + 10 + fwd) * MS, (t + 10 + fwd + 80) * MS),
                      (rank, "dltrace.optimizer", (t + 10 + fwd + 80) * MS, (t + 10 + fwd + 90) * MS)]
    write_literal(path, items)
    return path


def test_one_region_doubled(tmp_path: Path) -> None:
    a = run(tmp_path / "a", forward=50)
    b = run(tmp_path / "b", forward=100)
    df, sa, sb = diff.diff(a, b)
    assert (sa.label, sb.label) == ("a", "b")
    changed = df[df["delta_ms"].abs() > 1e-9]
    # the forward pass, the compute phase and the step each grew by 50 ms, nothing else moved
    assert sorted(zip(changed["kind"], changed["name"], strict=True)) == [
        ("phase", "compute"), ("phase", "step"), ("region", "dltrace.forward")]
    fwd = df[df["name"] == "dltrace.forward"].iloc[0]
    assert fwd["a_ms"] == pytest.approx(np.mean(JITTER[1:]) + 50)  # steps 1-7: step 0 is warm-up
    assert fwd["delta_ms"] == pytest.approx(50.0)
    assert fwd["change_pct"] == pytest.approx(100 * 50 / fwd["a_ms"])
    assert fwd["n_a"] == fwd["n_b"] == 7 and fwd["over"] == "steps" and fwd["significant"]
    # equal jitter on both sides: the interval is centered on 50 and holds it
    assert fwd["ci_low"] < 50 < fwd["ci_high"] and fwd["ci_high"] - 50 == pytest.approx(50 - fwd["ci_low"])
    assert list(df.index[:3]) == [0, 1, 2] and set(df["name"][:3]) == {"compute", "step", "dltrace.forward"}
    text = diff.text(df, sa, sb)
    assert "dltrace.forward" in text and "over steps" in text


def test_replications_make_the_interval_over_runs(tmp_path: Path) -> None:
    for name, fwd in (("r1", 50), ("r2", 52), ("s1", 60), ("s2", 61)):
        path = run(tmp_path / ("A" if name[0] == "r" else "B") / name, fwd)
        (path / "run.json").write_text(json.dumps({"status": "ok", "params": {}}))
    df, sa, sb = diff.diff(tmp_path / "A", tmp_path / "B")
    fwd = df[df["name"] == "dltrace.forward"].iloc[0]
    assert fwd["over"] == "runs" and fwd["n_a"] == fwd["n_b"] == 2
    assert fwd["delta_ms"] == pytest.approx(60.5 - 51)


def test_sweep_configuration_and_bad_sides(tmp_path: Path) -> None:
    for name, config in (("run-1", 1), ("run-2", 2)):
        path = run(tmp_path / "sweep" / name, 50 + 10 * config)
        (path / "run.json").write_text(json.dumps({"status": "ok", "sweep": {"config": config}}))
    assert diff.side(f"{tmp_path}/sweep@2").runs == [tmp_path / "sweep" / "run-2"]
    with pytest.raises(AnalyzeError, match="configuration 3 of .* has no successful traced run"):
        diff.side(f"{tmp_path}/sweep@3")
    with pytest.raises(AnalyzeError, match="no such run or directory"):
        diff.side(tmp_path / "nothing")


def test_welch_interval() -> None:
    d, lo, hi = diff.welch(np.array([1.0, 2.0, 3.0]), np.array([2.0, 3.0, 4.0]))
    # equal variances 1, n 3: se = sqrt(2/3), dof 4, t(0.975; 4) = 2.776
    assert d == 1.0 and hi - d == pytest.approx(2.7764 * np.sqrt(2 / 3), rel=1e-4) and lo == pytest.approx(2 - hi)


def test_kineto_traces_with_unnamed_kernels(tmp_path: Path) -> None:
    # a directory of per-rank Kineto JSON is a run like an OTF2 archive; 10 of its NCCL kernels
    # a rank name no operation (collectives.op NULL), which the diff calls "other"
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "kineto" / "hta_sampled_2rank"
    a = shutil.copytree(fixture, tmp_path / "a")
    b = shutil.copytree(fixture, tmp_path / "b")
    assert diff.side(a).runs == [a]
    table, _, _ = diff.diff(a, b)
    assert ("collective", "other") in set(zip(table["kind"], table["name"], strict=True))
    assert (table["delta_ms"] == 0).all()  # the same trace on both sides
    assert diff.text(table, diff.side(a), diff.side(b)).endswith(
        f"no change: all {len(table)} items took the same time per step in A and B")


def test_a_long_run_summed_a_few_steps_at_a_time_gives_the_same_table(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    a = run(tmp_path / "a", forward=50)
    b = run(tmp_path / "b", forward=60)
    whole, _, _ = diff.diff(a, b)
    seen = []
    chunk = diff._chunk_stats

    def recording(con, lo, hi, device):  # type: ignore[no-untyped-def]
        seen.append(hi - lo)
        return chunk(con, lo, hi, device)

    monkeypatch.setattr(diff, "CHUNK_INTERVALS", 10)  # 2 steps a statement (5 intervals a rank-step)
    monkeypatch.setattr(diff, "_chunk_stats", recording)
    chunked, _, _ = diff.diff(a, b, force=True)
    assert max(seen) < 7 and len(seen) > 2  # the 7 steady steps of each side in pieces
    cols = ["a_ms", "b_ms", "delta_ms", "ci_low", "ci_high"]
    key = ["kind", "name"]
    x, y = whole.sort_values(key).reset_index(drop=True), chunked.sort_values(key).reset_index(drop=True)
    assert (x[key] == y[key]).all().all() and (x[["n_a", "n_b", "significant"]] == y[["n_a", "n_b", "significant"]]).all().all()
    np.testing.assert_allclose(x[cols].to_numpy(float), y[cols].to_numpy(float), rtol=1e-9, atol=1e-9)


def kineto_run(path: Path, gemm_us: int, steps: int = 6) -> Path:
    """One rank's Kineto trace: steps of 100 us, each with a kernel "gemm" of ``gemm_us`` at
    its start and a copy of 5 us at 80 us; the rest of the step the GPU idles."""
    events = []
    for s in range(steps):
        t = 100 * s
        events += [step(s + 1, t, t + 100), kernel("gemm", t + 10, t + 10 + gemm_us), memcpy(t + 80, t + 85)]
    write_rank(path, 0, events, world=1)
    return path


def test_kineto_runs_diff_the_device_phases_and_kernels(tmp_path: Path) -> None:
    # B's gemm takes 50 us a step where A's takes 30: the device computes 20 us more and idles
    # 20 us less; the host's step and phases do not change
    table, _, _ = diff.diff(kineto_run(tmp_path / "a", 30), kineto_run(tmp_path / "b", 50))
    got = {(k, n): (round(a, 6), round(b, 6)) for k, n, a, b in
           table[["kind", "name", "a_ms", "b_ms"]].itertuples(index=False)}
    assert got[("kernel", "gemm")] == (0.03, 0.05)
    assert got[("device", "compute")] == (0.03, 0.05)
    assert got[("device", "idle")] == (0.065, 0.045)
    assert got[("device", "memory")] == got[("kernel", "Memcpy HtoD (Pageable -> Device)")] == (0.005, 0.005)
    assert got[("phase", "step")] == (0.1, 0.1)
    changed = table[table["delta_ms"].abs() > 1e-9]
    assert sorted(zip(changed["kind"], changed["name"], changed["delta_ms"].round(6), strict=True)) == [
        ("device", "compute", 0.02), ("device", "idle", -0.02), ("kernel", "gemm", 0.02)]


def test_long_kernel_names_are_shortened_for_the_table() -> None:
    name = ("void split_embedding_backward_kernel<float, float, 5ul>(at::GenericPackedTensorAccessor<float, 2ul, "
            "at::RestrictPtrTraits, int>, long, float)")
    assert names.short_name(name) == "split_embedding_backward_kernel<...>(...)"
    assert names.short_name("aten::addmm") == "aten::addmm"
    # CUPTI's mangled kernel names in Score-P traces (casita-2_cuda_simple) are demangled
    assert names.short_name("_Z11copy_kernelPfPKfii") == "copy_kernel(float*, float const*, int, int)"
    assert names.short_name("x" * 100, 20) == "x" * 17 + "..."
    # unbalanced brackets: cut as it is
    assert names.short_name("f(" + "a" * 80, 20) == "f(" + "a" * 15 + "..."
    # names that shorten alike stay apart: the template instances of a kernel keep their
    # arguments, cut in the middle where too long; names still alike are numbered
    other = name.replace("5ul", "6ul")
    assert names.short_names([name, other, "aten::addmm", name]) == [
        "split_embedding_backward_kernel<float, float, 5ul>(...)",
        "split_embedding_backward_kernel<float, float, 6ul>(...)", "aten::addmm",
        "split_embedding_backward_kernel<float, float, 5ul>(...)"]
    assert names.short_names([name, other], 30) == ["split_embeddi...oat, 5ul>(...)", "split_embeddi...oat, 6ul>(...)"]
    twin = name.replace("long, float", "int, float")  # the same template arguments
    assert names.short_names([name, twin], 30) == ["split_embeddi...oat, 5ul>(...)", "split_embeddi...oat, 5ul>(...) #2"]
    table = pd.DataFrame({"kind": ["kernel", "kernel"], "name": [name, other],
                          "a_ms": [1.0, 2.0], "b_ms": [2.0, 1.0], "delta_ms": [1.0, -1.0], "ci_low": [0.5, -1.5],
                          "ci_high": [1.5, -0.5], "change_pct": [100.0, -50.0], "over": ["steps", "steps"]})
    labels = list(diff_plot(table, "a", "b").data["item"])
    assert labels == ["kernel: split_embedding_\nback...oat, float, 5ul>(...)",
                      "kernel: split_embedding_\nback...oat, float, 6ul>(...)"]
    # a second line too long keeps its end, where the instances differ, and their numbers
    long = ["ncclDevKernel_AllReduce_Sum_f32_RING_LL_with_a_long_tail<float, 5ul>(args)",
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL_with_a_long_tail<float, 6ul>(args)",
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL_with_a_long_tail<float, 5ul>(other)"]
    table = pd.DataFrame({"kind": ["kernel"] * 3, "name": long, "a_ms": [1.0] * 3, "b_ms": [2.0] * 3,
                          "delta_ms": [1.0] * 3, "ci_low": [0.5] * 3, "ci_high": [1.5] * 3,
                          "change_pct": [100.0] * 3, "over": ["steps"] * 3})
    labels = list(diff_plot(table, "a", "b").data["item"])
    assert labels == ["kernel: ncclDevKernel_\nAllRed...tail<float, 5ul>(...)",
                      "kernel: ncclDevKernel_\nAllRed...tail<float, 6ul>(...)",
                      "kernel: ncclDevKernel_\nAllRed...tail<...t, 5ul>(...) #2"]  # (was "<float, 5ul>(......")
    assert all(len(line) <= 32 for label in labels for line in label.split("\n"))
