"""Energy per device, rank, step and phase from injected power: a literal 2-rank trace whose
devices draw known power in each phase, sampled as running totals the way the power sampler
records them.

Steps are 8 s. Rank 0 computes for 4 s, then waits 2 s in MPI_Allreduce for rank 1 (idle)
and transfers for 2 s; rank 1 computes for 6 s and transfers for 2 s. GPU 0 is pinned to
rank 0 and draws 200 W computing, 50 W idle and 80 W in the allreduce; GPU 1 (rank 1) 200 W
computing and 80 W in the allreduce; GPU 2 is pinned to no rank (idle, 30 W); the CPU package
draws 60 W, shared by the two ranks of the host.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

import analyze
from analyze.energy import attribution, series
from analyze.energy.channels import classify
from tests.literal import write_literal

S = 1_000_000_000
T0, STEP, STEPS = 1 * S, 8 * S, 3
GPU0 = [(0, 4, 200.0), (4, 6, 50.0), (6, 8, 80.0)]  # (from s, to s, watts) within a step
GPU1 = [(0, 6, 200.0), (6, 8, 80.0)]


def energy_uj(profile: list[tuple[float, float, float]], outside: float, t: np.ndarray) -> np.ndarray:
    """Exact running total (uJ) at times ``t`` (ns) of a device following ``profile`` in every
    step and drawing ``outside`` watts outside the steps."""
    edges = [(T0 + k * STEP + a * S, T0 + k * STEP + b * S, w) for k in range(STEPS) for a, b, w in profile]
    end = T0 + STEPS * STEP
    pieces = [(0, T0, outside), *edges, (end, end + 10 * S, outside)]
    out = np.zeros(len(t))
    for a, b, w in pieces:
        out += w * np.clip(t - a, 0, b - a) / S
    return np.round(out * 1e6).astype(np.int64)


def trace(tmp: Path, interval_ns: int = 10_000_000) -> Path:
    items = []
    for k in range(STEPS):
        s = T0 + k * STEP
        for rank, arrive in ((0, 4), (1, 6)):
            items.append((rank, "dltrace.step", s, s + STEP))
            items.append((rank, "MPI_Allreduce", s + arrive * S, s + STEP, {"op": "allreduce", "bytes": 4096}))
    t = np.arange(T0 - S // 2 + 3_000_000, T0 + STEPS * STEP + S // 2, interval_ns)
    metrics = [
        {"name": "gpu 0 energy", "rank": 0, "samples": list(zip(t.tolist(), energy_uj(GPU0, 40, t).tolist(), strict=True))},
        {"name": "gpu 1 energy", "rank": 1, "samples": list(zip(t.tolist(), energy_uj(GPU1, 40, t).tolist(), strict=True))},
        {"name": "gpu 2 energy", "rank": None, "samples": list(zip(t.tolist(), energy_uj([(0, 8, 30.0)], 30, t).tolist(), strict=True))},
        {"name": "cpu_package 0 energy", "rank": None,
         "samples": list(zip(t.tolist(), energy_uj([(0, 8, 60.0)], 60, t).tolist(), strict=True))},
    ]
    write_literal(tmp, items, metrics=metrics)
    return tmp


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> duckdb.DuckDBPyConnection:
    run = trace(tmp_path_factory.mktemp("energy"))
    return analyze.open(run)


def per_phase(db: duckdb.DuckDBPyConnection, rank: int, device: str) -> dict[str, float]:
    return dict(db.execute("""SELECT phase, sum(energy_j) FROM energy_phases e JOIN metric_channels c USING (channel_id)
                              WHERE e.rank = $r AND c.name = $d GROUP BY phase""", {"r": rank, "d": device}).fetchall())


def test_injected_power_per_phase_within_one_percent(db: duckdb.DuckDBPyConnection) -> None:
    # rank 0's GPU: 4 s x 200 W computing, 2 s x 50 W idle, 2 s x 80 W transferring, per step
    got = per_phase(db, 0, "gpu 0 energy")
    expected = {"compute": 800 * STEPS, "idle": 100 * STEPS, "allreduce": 160 * STEPS}
    assert got.keys() >= expected.keys()
    for phase, joules in expected.items():
        assert got[phase] == pytest.approx(joules, rel=0.01), phase
    assert got.get("other_comm", 0) == pytest.approx(0, abs=1e-6)
    got1 = per_phase(db, 1, "gpu 1 energy")
    assert got1["compute"] == pytest.approx(1200 * STEPS, rel=0.01)
    assert got1["allreduce"] == pytest.approx(160 * STEPS, rel=0.01)
    # the host's package, 60 W, half to each rank: 30 W x 4 s of rank 0's compute
    assert per_phase(db, 0, "cpu_package 0 energy")["compute"] == pytest.approx(120 * STEPS, rel=0.01)
    # the phases here are seconds long, sampled every 10 ms: nothing is split by time alone
    assert db.execute("SELECT sum(short_ns) FROM energy_phases").fetchone() == (0,)


def test_steps_sum_their_phases_and_devices_are_charged(db: duckdb.DuckDBPyConnection) -> None:
    steps = db.execute("""SELECT rank, step, channel_id, energy_j FROM energy_steps ORDER BY ALL""").fetchall()
    phases = dict(((r, s, c), e) for r, s, c, e in db.execute(
        "SELECT rank, step, channel_id, sum(energy_j) FROM energy_phases GROUP BY ALL").fetchall())
    for rank, step, channel, energy in steps:
        assert phases[(rank, step, channel)] == pytest.approx(energy, rel=1e-9)
    devices = {name: (rank, active, counted) for name, rank, active, counted in db.execute(
        "SELECT name, rank, active, counted FROM energy_devices").fetchall()}
    assert devices == {"gpu 0 energy": (0, True, True), "gpu 1 energy": (1, True, True),
                       "gpu 2 energy": (None, False, True),  # pinned to no rank in our trace: idle
                       "cpu_package 0 energy": (None, True, True)}
    # every step of rank 0 gets its GPU's 1060 J, a half of the package's 480 J and of GPU 2's 240 J
    per_step = db.execute("SELECT sum(energy_j) FROM energy_steps WHERE rank = 0 AND step = 1").fetchone()
    assert per_step[0] == pytest.approx(1060 + 240 + 120, rel=0.01)


def test_running_energy_modes() -> None:
    t = np.array([0, 1, 2, 3]) * S
    # a counter; one that restarted (ACCUMULATED_START); per-interval amounts (LAST / NEXT)
    assert list(series.running_energy(t, [5, 7, 9, 12], "energy", "absolute_point")) == [0, 2, 4, 7]
    assert list(series.running_energy(t, [5, 7, 1, 4], "energy", "accumulated_start")) == [0, 2, 3, 6]
    assert list(series.running_energy(t, [1, 2, 1, 3], "energy", "accumulated_last")) == [0, 2, 3, 6]
    assert list(series.running_energy(t, [1, 2, 1, 3], "energy", "accumulated_next")) == [0, 1, 3, 4]
    # declared relative: amounts since the previous sample, even where they happen to grow
    assert list(series.running_energy(t, [1, 2, 3, 4], "energy", "relative_last")) == [0, 2, 5, 9]
    # a running total that drops once in 20+ steps restarted there (any mode); a drop of read
    # noise (one part in 10^9) counts as nothing, so the rebound after it counts 1 unit twice
    t21 = np.arange(22) * S
    restarted = np.concatenate([100.0 + np.arange(11), np.arange(11) * 1.0])
    assert series.running_energy(t21, restarted, "energy", "absolute_point")[-1] == 10 + 0 + 10
    noisy = 1e9 + np.arange(22.0)
    noisy[5] -= 2.0
    assert series.running_energy(t21, noisy, "energy", "absolute_point")[-1] == 21 + 1
    # power readings: trapezoid, held since the previous sample (LAST), until the next (NEXT)
    assert list(series.running_energy(t, [10, 20, 20, 0], "power", "absolute_point")) == [0, 15, 35, 45]
    assert list(series.running_energy(t, [10, 20, 20, 0], "power", "absolute_last")) == [0, 20, 40, 40]
    assert list(series.running_energy(t, [10, 20, 20, 0], "power", "absolute_next")) == [0, 10, 30, 50]


def test_window_energy_is_linear_between_samples() -> None:
    t = np.array([0, 10, 20]) * S
    total = np.array([0.0, 100.0, 300.0])
    assert list(attribution.window_energy(t, total, np.array([5 * S, 0]), np.array([15 * S, 30 * S]))) == [150, 300]
    assert list(attribution.covered_ns(t, np.array([-5 * S]), np.array([5 * S]))) == [5 * S]


def test_a_trailing_power_reading_is_aligned_by_its_lag() -> None:
    """A reading that averages the last second trails the counter by about half a second."""
    t = np.arange(0, 20 * S, 50_000_000)
    watts = np.where((t > 5 * S) & (t < 12 * S), 300.0, 100.0)
    counter = np.concatenate([[0], np.cumsum(watts[1:] * np.diff(t) / S)])
    window = int(1 * S / 50_000_000)
    averaged = np.convolve(watts, np.ones(window) / window)[: len(t)]
    averaged[:window] = 100.0
    readings = series.running_energy(t, averaged, "power", "absolute_point")
    a = attribution.agreement(t, counter, t, readings)
    assert a is not None and 400_000_000 <= a.lag_ns <= 600_000_000
    assert abs(a.pct(a.aligned_power_j, a.aligned_counter_j)) < 0.5


@pytest.mark.parametrize(("name", "unit", "expected"), [
    ("gpu 1 energy", "J", ("energy", "gpu", 1, 1.0)),
    ("Intel RAPL PCKG[0]", "J", ("energy", "cpu_package", 0, 1.0)),  # x86_energy plugin
    ("sysfs-powercap-rapl/Intel RAPL DRAM[1]", "J", ("energy", "dram", 1, 1.0)),
    ("x86_energy/BLADE/E", "J", ("energy", "node", None, 1.0)),
    ("PACKAGE0/P", "mW", ("power", "cpu_package", 0, 1e-3)),  # the old C x86_energy plugin
    ("DRAM1/E", "Joule", ("energy", "dram", 1, 1.0)),
    ("power_usage on CUDA: 3", "mW", ("power", "gpu", 3, 1e-3)),  # nvml plugin
    ("ID2::energy_count", "J", ("energy", "gpu", 2, 1.0)),  # rocm_smi plugin
    ("ID0::socket_power", "W", ("power", "gpu", 0, 1.0)),
    ("A2rocm_smi:::energy_count:device=1", "#", ("energy", "gpu", 1, 1e-6)),  # the MI300 fixture's
    ("A2rocm_smi:::current_socket_power:device=1", "#", ("power", "gpu", 1, 1e-6)),
    ("A2coretemp:::hwmon3:power1_input", "#", ("power", "sensor", 3, 1e-6)),
    ("elab.ariel.s1.package.power.100Hz", "W", ("power", "cpu_package", 1, 1.0)),  # metricq
    ("powercap:::ENERGY_UJ:ZONE0", "#", ("energy", "other", None, 1e-6)),
    # Cray PM through the coretemp plugin and x86_energy's per-core counters (Frontier traces
    # of adam-mcdaniel/hpc-energy-trace-analysis)
    ("A3coretemp:::craypm:accel0_energy", "#", ("energy", "sensor", 0, 1.0)),
    ("A3coretemp:::craypm:accel0_power", "#", ("power", "sensor", 0, 1.0)),
    ("A3coretemp:::craypm:energy", "#", ("energy", "node", None, 1.0)),
    ("A2coretemp:::craypm:cpu_energy", "#", ("energy", "cpu_package", None, 1.0)),
    ("A2coretemp:::craypm:memory_power", "#", ("power", "dram", None, 1.0)),
    ("A2coretemp:::craypm:accel0_energy_timestamp", "#", ("other", None, None, None)),
    ("A2coretemp:::craypm:freshness", "#", ("other", None, None, None)),
    ("AMD RAPL SINGLE_CORE[12]", "J", ("energy", "cpu_core", 12, 1.0)),
    # PAPI's nvml, amd_smi and rapl components (icl-utk-edu/papi src/components/*), through apapi
    ("A2nvml:::NVIDIA_A100-SXM4-40GB:device_1:power", "#", ("power", "gpu", 1, 1e-3)),
    ("A2nvml:::NVIDIA_A100-SXM4-40GB:device_1:total_energy_consumption", "#", ("energy", "gpu", 1, 1e-3)),
    ("A2nvml:::NVIDIA_A100-SXM4-40GB:device_0:gpu_memory_avg_power", "#", ("power", "sensor", 0, 1e-3)),
    ("A2amd_smi:::energy_consumed:device=3", "#", ("energy", "gpu", 3, 1e-6)),
    ("A2amd_smi:::power_average:device=3", "#", ("power", "gpu", 3, 1.0)),
    ("A2amd_smi:::power_sensor_socket_microwatts_sensor=0:device=2", "#", ("power", "gpu", 2, 1e-6)),
    ("A2amd_smi:::energy_socket=1", "#", ("energy", "cpu_package", 1, 1e-6)),
    ("A2amd_smi:::energy_socket=1_core=7", "#", ("energy", "cpu_core", 1, 1e-6)),
    ("Arapl:::DRAM_ENERGY:PACKAGE1", "#", ("energy", "dram", 1, 1e-9)),
    ("Arapl:::PACKAGE_ENERGY:PACKAGE0", "#", ("energy", "cpu_package", 0, 1e-9)),
    ("A2rocm_smi:::power_average:device=6:sensor=0", "#", ("power", "gpu", 6, 1e-6)),
    ("node energy", "kWh", ("energy", "other", None, 3.6e6)),
    # settings are not readings, whatever their unit
    ("A2nvml:::NVIDIA_A100-SXM4-40GB:device_0:power_management_limit", "#", ("other", None, None, None)),
    ("power_management_limit on CUDA: 0", "mW", ("other", None, None, None)),
    ("A2rocm_smi:::power_cap:device=0:sensor=0", "#", ("other", None, None, None)),
    ("A2rocm_smi:::power_cap_range_max:device=0:sensor=0", "#", ("other", None, None, None)),
    ("A2amd_smi:::energy_resolution:device=0", "#", ("other", None, None, None)),
    ("powercap:::POWER_LIMIT_A_UW:ZONE0", "#", ("other", None, None, None)),
    ("powercap:::MAX_ENERGY_RANGE_UJ:ZONE0", "#", ("other", None, None, None)),
    ("A2coretemp:::hwmon2:power1_average_interval", "#", ("other", None, None, None)),
    ("some_energy_counter", "#", ("energy", "other", None, None)),  # unknown scale: listed, not converted
    ("A2rocm_smi:::busy_percent:device=0", "#", ("other", None, None, None)),
    ("PAPI_TOT_CYC", "#", ("other", None, None, None)),
    ("HIP Memory", "bytes", ("other", None, None, None)),
    ("ru_utime", "s", ("other", None, None, None)),
])
def test_channels_are_classified_by_unit_else_name(name: str, unit: str, expected: tuple) -> None:
    c = classify(name, unit)
    assert (str(c.quantity), None if c.device is None else str(c.device), c.index, c.to_si) == expected


def test_analyze_energy_and_phases_print_energy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Steps of 60 ms (40 ms computing, 20 ms in an allreduce) sampled every 100 ms: the
    phases are shorter than the sampling interval, and the output says so."""
    from analyze.cli import main

    items, ms = [], 1_000_000
    for k in range(20):
        s = S + k * 60 * ms
        items += [(0, "dltrace.step", s, s + 60 * ms),
                  (0, "MPI_Allreduce", s + 40 * ms, s + 60 * ms, {"op": "allreduce", "bytes": 8})]
    t = np.arange(S - 200 * ms, S + 1400 * ms, 100 * ms)
    write_literal(tmp_path, items, metrics=[
        {"name": "cpu_package 0 energy", "samples": [(int(x), int(50 * (x - t[0]) / 1000)) for x in t]}])
    assert main(["energy", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cpu_package 0" in out and "counter" in out
    assert "shorter than the sampling interval (100 ms)" in out
    assert main(["phases", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "step_J" in out and "energy by phase" in out
    # 50 W over 60 ms steps: 3 J a step
    assert " 3.0 " in out or " 3.00 " in out, out


def test_analyze_energy_without_power_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from analyze.cli import main

    write_literal(tmp_path, [(0, "dltrace.step", 0, S)])
    (tmp_path / "run.json").write_text('{"power": {"hosts": {"h0": {"sampled": false, "unavailable": '
                                       '[{"source": "RAPL", "reason": "no RAPL zones under /x"}]}}}}')
    assert main(["energy", str(tmp_path)]) == 1
    assert "has no energy or power samples (h0: RAPL: no RAPL zones under /x)" in capsys.readouterr().err
    # a run recorded with --power off says so (as the sampler writes it into run.json)
    (tmp_path / "run.json").write_text('{"power": {"hosts": {"h0": {"sampled": false, "reason": "--power off"}}}}')
    assert main(["energy", str(tmp_path)]) == 1
    assert "has no energy or power samples (h0: --power off)" in capsys.readouterr().err


def test_phase_pieces_with_nothing_inside_a_step() -> None:
    """A rank whose only step has no length (a damaged or odd trace) has no phase pieces."""
    from analyze.tables.phases import sweep_intervals

    pieces = sweep_intervals(np.array([0]), np.array([10]), np.array([5]), np.array([20]), np.array([20]))
    assert len(pieces) == 0 and list(pieces.columns) == ["start_ns", "end_ns", "phase", "step"]


def test_ranks_are_attributed_in_batches_with_the_same_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The energy of every rank comes from one segments query per window of steps, not one
    per rank (which read every rank's files each time: 30 s at 256 ranks); batches of one
    rank and windows of one step give the same rows."""
    from analyze.tables import energy

    run = trace(tmp_path / "run")
    tables = ("energy_steps", "energy_phases")

    def rows(db: duckdb.DuckDBPyConnection) -> dict[str, list[tuple]]:
        return {t: db.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in tables}

    calls = []
    counted = energy.segments
    monkeypatch.setattr(energy, "segments", lambda *a, **k: calls.append(k.get("ranks")) or counted(*a, **k))
    whole = rows(analyze.open(run, force=True))
    assert len(calls) == 1 and list(calls[0]) == [0, 1]  # both ranks in one query
    assert all(whole.values())
    calls.clear()
    monkeypatch.setattr(energy, "FLUSH_PIECES", 0)  # the pieces summed after every rank's window
    assert rows(analyze.open(run, force=True)) == whole
    calls.clear()
    monkeypatch.setattr(energy, "WINDOW_SEGMENTS", 1)  # a rank per batch, a step per window
    assert rows(analyze.open(run, force=True)) == whole
    assert len(calls) == 2 * STEPS and all(len(r) == 1 for r in calls)


def test_many_ranks_print_as_groups_of_consecutive_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Above MAX_PRINTED_RANKS ranks ``analyze phases`` prints groups of consecutive ranks, each
    row their mean (phase shares of the group's time, mean energy per step); --all-ranks
    prints every rank. Both ranks of the literal trace here in one group of 2."""
    from analyze.cli import common, main

    run = trace(tmp_path / "run")
    assert main(["phases", str(run)]) == 0
    each = capsys.readouterr().out
    assert each.splitlines()[0].split()[:2] == ["rank", "steps"]
    monkeypatch.setattr(common, "MAX_PRINTED_RANKS", 1)
    monkeypatch.setattr(common, "GROUPS", 1)
    assert main(["phases", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("2 ranks in groups of 2 consecutive ranks")
    assert lines[1].split()[:2] == ["ranks", "steps/rank"]
    row = dict(zip(lines[1].split(), lines[2].split(), strict=True))
    # rank 0 enters the allreduce at 4 s of each 8 s step and waits for rank 1 (6 s): the
    # group idles 2 s of 16, 12.5% (rank 0 25%, rank 1 0%)
    assert row["ranks"] == "0-1" and row["steps/rank"] == "3.0" and row["idle%"] == "12.5"
    db = analyze.open(run)
    per_step = db.execute("SELECT avg(step_j) FROM (SELECT rank, sum(energy_j) / 3 AS step_j FROM energy_steps "
                          "WHERE active GROUP BY rank)").fetchone()[0]
    db.close()
    assert float(row["step_J"]) == pytest.approx(per_step, abs=0.01)
    assert main(["phases", str(run), "--all-ranks"]) == 0
    assert capsys.readouterr().out == each


def test_many_devices_print_a_row_per_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`analyze energy` of a run with many devices prints a row per kind of device (how many,
    total energy, mean power) and the ranks in groups; --all-ranks prints each."""
    from analyze.cli import common, main
    from analyze.cli.common import rank_groups_of
    from analyze.cli.energy import device_kinds

    run = trace(tmp_path / "run")
    assert main(["energy", str(run)]) == 0
    each = capsys.readouterr().out
    monkeypatch.setattr(common, "MAX_PRINTED_RANKS", 1)
    monkeypatch.setattr(common, "GROUPS", 1)
    assert main(["energy", str(run)]) == 0
    out = capsys.readouterr().out
    assert "4 devices, a row per kind" in out and "2 ranks in groups of 2" in out
    assert main(["energy", str(run), "--all-ranks"]) == 0
    assert capsys.readouterr().out == each

    devices = pd.DataFrame({"device": ["gpu 0", "gpu 0", "gpu 1"], "source": "counter", "counted": True,
                            "active": True, "host": ["a", "b", "a"], "rank": [0.0, 8.0, None],
                            "samples": [10, 20, 30], "interval_ms": 100.0, "seconds": 1.0,
                            "energy_j": [100.0, 300.0, 50.0], "mean_power_w": [100.0, 300.0, 50.0]})
    kinds = device_kinds(devices).set_index("device")
    assert kinds.loc["gpu 0", "devices"] == 2 and kinds.loc["gpu 0", "hosts"] == 2
    assert kinds.loc["gpu 0", "energy_j"] == 400.0 and kinds.loc["gpu 0", "mean_power_w"] == 200.0
    assert kinds.loc["gpu 1", "with_rank"] == 0
    ranks = pd.DataFrame({"rank": [0, 1, 2], "steps": [3, 3, 3], "step_j": [1.0, 3.0, 5.0]})
    groups = rank_groups_of(ranks, 2)
    assert list(groups["ranks"]) == ["0-1", "2"] and list(groups["step_j"]) == [2.0, 5.0]
