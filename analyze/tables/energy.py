"""Energy tables from the metric samples: power over time, energy per device, agreement of
counters and power readings, and energy per rank, step and phase.

Each energy or power channel recorded on a location is a *series*: its running total
(:func:`analyze.energy.series.running_energy`) gives ``power`` (mean power between samples)
and its ``energy_devices`` row. A device with both a counter and power readings is compared in
``energy_agreement``; the counter is what counts. The counted series are then attributed to
ranks: a series charged to a rank (a GPU pinned to it) to that rank, a host-wide one (CPU
packages, DRAM) in equal shares to the ranks of its host; and within a rank to its steps and to
the phase pieces of :mod:`analyze.tables.phases` (running totals linear between samples, so
pieces shorter than the sampling interval get energy in proportion to their time).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import duckdb
import numpy as np
import pandas as pd

from analyze.energy import attribution, series
from analyze.schema import (
    ENERGY_AGREEMENT,
    ENERGY_DEVICES,
    ENERGY_PHASES,
    ENERGY_STEPS,
    POWER,
    EnergySource,
)
from analyze.tables.phases import WINDOW_SEGMENTS, segments, split_by_rank, sweep_intervals
from traceio.records import Device

# Device kinds whose energy adds up to a host's: the others contain them (node, platform) or
# are part of them (cores, uncore), or are sensors that may mirror them (hwmon).
PRIMARY = (Device.CPU_PACKAGE, Device.DRAM, Device.GPU)
FALLBACK = (Device.NODE, Device.PLATFORM, Device.OTHER, Device.SENSOR)


@dataclass
class Series:
    channel_id: int
    location_id: int
    name: str
    host: str | None
    device: str
    index: int | None
    source: EnergySource
    rank: int | None
    t: np.ndarray
    total: np.ndarray
    active: bool = True
    counted: bool = False

    @property
    def interval_ns(self) -> float:
        return series.median_interval_ns(self.t)


def load_series(con: duckdb.DuckDBPyConnection, ours: bool) -> list[Series]:
    """Every energy or power channel with a known unit, per recording location. A channel
    scoped to a system tree node above the hosts (Score-P's `once` plugins get the root) is
    charged to the host of the process that recorded it."""
    rows = con.execute("""
        SELECT c.channel_id, m.location_id, c.name,
               CASE WHEN c.host IN (SELECT host FROM hosts) THEN c.host ELSE coalesce(h.host, c.host) END AS host,
               c.device,
               c.device_index, c.quantity, c.mode,
               CASE WHEN c.scope IS NULL THEN m.rank ELSE c.rank END AS charged,
               list(m.time_ns ORDER BY m.time_ns) AS t, list(m.value * c.to_si ORDER BY m.time_ns) AS v
        FROM metrics m JOIN metric_channels c USING (channel_id) LEFT JOIN hosts h ON h.rank = m.rank
        WHERE c.quantity IN ('energy', 'power') AND c.to_si IS NOT NULL
        GROUP BY ALL ORDER BY c.channel_id, m.location_id
    """).fetchall()
    out = []
    for channel, location, name, host, device, index, quantity, mode, rank, t, v in rows:
        t = np.asarray(t, dtype=np.int64)
        total = series.running_energy(t, np.asarray(v, dtype=np.float64), quantity, mode)
        source = EnergySource.COUNTER if quantity == "energy" else EnergySource.POWER
        out.append(Series(channel, location, name, host, device, index, source, rank, t, total))
    pinned = any(s.device == Device.GPU and s.rank is not None for s in out)
    for s in out:
        # our traces say which GPUs a rank is pinned to: the others are idle; elsewhere unknown
        s.active = s.rank is not None or s.device != Device.GPU or not (ours or pinned)
    _mark_counted(out)
    return out


def _mark_counted(all_series: list[Series]) -> None:
    """The preferred series of each device (a counter over power readings), of the device
    kinds whose energies add up (PRIMARY; on a host without any, the first FALLBACK kind)."""
    by_host: dict[str | None, list[Series]] = {}
    for s in all_series:
        by_host.setdefault(s.host, []).append(s)
    for mine in by_host.values():
        kinds = {s.device for s in mine}
        use = set(PRIMARY) & kinds or next(({k} for k in FALLBACK if k in kinds), set())
        if Device.GPU not in kinds and Device.SENSOR in kinds and Device.NODE in kinds:
            # accelerators measured only as sensors (Cray PM's accelN, beside its cpu and
            # memory): the node's total is the one that includes them
            use = {Device.NODE}
        best: dict[tuple[str, int | None], Series] = {}
        # a counter over power readings; among a channel's locations, the one with the most
        # energy (Score-P's x86_energy_sync plugin writes zeros on all threads but one)
        for s in sorted(mine, key=lambda s: (s.source != EnergySource.COUNTER, s.channel_id,
                                             -(s.total[-1] if len(s.total) else 0.0))):
            # one series per device of the host, whichever rank's location recorded it (a
            # counter on the host's METRIC location and synchronous readings on a thread)
            key = (s.device, s.index)
            if s.device in use and len(s.t) > 1 and key not in best:
                best[key] = s
        for s in best.values():
            s.counted = True


def _insert(con: duckdb.DuckDBPyConnection, table: str, columns: list[str], frame: pd.DataFrame) -> None:
    if len(frame):
        con.register("energy_rows", frame[columns])
        con.execute(f"INSERT INTO {table} SELECT * FROM energy_rows")
        con.unregister("energy_rows")


def _power_rows(s: Series) -> pd.DataFrame:
    dt = np.diff(s.t)
    energy = np.diff(s.total)
    with np.errstate(divide="ignore", invalid="ignore"):
        power = np.where(dt > 0, energy / (dt / 1e9), np.nan)
    return pd.DataFrame({"channel_id": s.channel_id, "location_id": s.location_id, "start_ns": s.t[:-1],
                         "end_ns": s.t[1:], "energy_j": energy, "power_w": power})


def _device_row(s: Series) -> dict:
    span = int(s.t[-1] - s.t[0]) if len(s.t) else 0
    energy = float(s.total[-1]) if len(s.total) else 0.0
    return {"channel_id": s.channel_id, "location_id": s.location_id, "name": s.name, "host": s.host,
            "device": s.device, "device_index": s.index, "source": str(s.source), "rank": s.rank,
            "active": s.active, "counted": s.counted, "samples": len(s.t),
            "start_ns": int(s.t[0]) if len(s.t) else None, "end_ns": int(s.t[-1]) if len(s.t) else None,
            "interval_ms": s.interval_ns / 1e6, "energy_j": energy,
            "mean_power_w": energy / (span / 1e9) if span else None,
            "integrated_reading": s.source == EnergySource.POWER}


def family(name: str) -> str:
    """What a channel's name says about where it comes from: a PAPI-based Score-P plugin's
    prefix (``A2rocm_smi``, ``A3coretemp``), so a device's counter is compared first with power
    readings of the same origin."""
    return name.split(":::", 1)[0] if ":::" in name else ""


def _agreement_rows(all_series: list[Series]) -> list[dict]:
    rows = []
    devices: dict[tuple, dict[EnergySource, list[Series]]] = {}
    for s in all_series:
        devices.setdefault((s.host, s.device, s.index), {}).setdefault(s.source, []).append(s)
    for (host, device, index), found in devices.items():
        if len(found) < 2 or device == Device.OTHER:
            continue
        # the counter that counts (on the location that recorded the most), against every
        # kind of power reading of the device (a plugin may give current and average power),
        # those of the counter's origin first
        c = max(found[EnergySource.COUNTER], key=lambda s: (s.counted, s.total[-1] if len(s.total) else 0.0))
        for p in sorted(_by_channel(found[EnergySource.POWER]), key=lambda p: family(p.name) != family(c.name)):
            row = _agreement_row(host, device, index, c, p)
            if row is not None:
                rows.append(row)
    return rows


def _by_channel(power: list[Series]) -> list[Series]:
    """One series per channel: the one recorded on the location with the most samples."""
    best: dict[int, Series] = {}
    for s in power:
        if s.channel_id not in best or len(s.t) > len(best[s.channel_id].t):
            best[s.channel_id] = s
    return [best[k] for k in sorted(best)]


def _agreement_row(host: str | None, device: str, index: int | None, c: Series, p: Series) -> dict | None:
    a = attribution.agreement(c.t, c.total, p.t, p.total)
    if a is None:
        return None
    return {"host": host, "device": device, "device_index": index, "counter_channel": c.channel_id,
            "power_channel": p.channel_id, "start_ns": a.start_ns, "end_ns": a.end_ns,
            "counter_j": a.counter_j, "power_j": a.power_j,
            "difference_pct": a.pct(a.power_j, a.counter_j), "lag_ms": a.lag_ns / 1e6,
            "aligned_counter_j": a.aligned_counter_j, "aligned_power_j": a.aligned_power_j,
            "aligned_difference_pct": a.pct(a.aligned_power_j, a.aligned_counter_j)}


def _windows(con: duckdb.DuckDBPyConnection, ranks: list[int]
             ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray, pd.DataFrame]]:
    """(rank, step ids, starts, ends, phase pieces) of each of ``ranks`` in windows of whole
    steps, as build_phases sweeps them (bounded memory for long traces).

    The ranks go in batches of about :data:`WINDOW_SEGMENTS` main-thread intervals, and each
    window of a batch is one query for all its ranks: a query per rank and window read every
    rank's files each time (256 ranks with power: 30 s; 4,096 ranks: hours). A batch's window
    spans its ranks' steps ``a..b-1``; each rank's sweep counts only what lies in its own."""
    wanted = set(ranks)
    st = con.execute("SELECT rank, step, start_ns, end_ns FROM steps ORDER BY rank, start_ns").fetchnumpy()
    steps_of = {r: c for r, c in split_by_rank({k: np.asarray(v, np.int64) for k, v in st.items()}).items()
                if r in wanted}
    counts = dict(con.execute("""SELECT i.rank, count(*) FROM intervals i JOIN locations l USING (location_id)
                                 WHERE l.is_main GROUP BY i.rank""").fetchall())
    batch: list[int] = []
    total = 0
    for rank in [r for r in ranks if r in steps_of]:
        n = int(counts.get(rank, 0))
        if batch and total + n > WINDOW_SEGMENTS:
            yield from _batch_windows(con, batch, steps_of, total)
            batch, total = [], 0
        batch.append(rank)
        total += n
    if batch:
        yield from _batch_windows(con, batch, steps_of, total)


def _batch_windows(con: duckdb.DuckDBPyConnection, batch: list[int], steps_of: dict[int, dict[str, np.ndarray]],
                   total: int) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray, pd.DataFrame]]:
    most = max(len(steps_of[r]["step"]) for r in batch)
    per_window = max(1, most * WINDOW_SEGMENTS // max(1, total))
    for a in range(0, most, per_window):
        b = a + per_window
        here = [r for r in batch if len(steps_of[r]["step"]) > a]
        lo = min(int(steps_of[r]["start_ns"][a:b].min()) for r in here)
        hi = max(int(steps_of[r]["end_ns"][a:b].max()) for r in here)
        seg = segments(con, lo, hi, ranks=range(min(here), max(here) + 1))  # a range: ranks without power too
        columns = {c: seg[c].to_numpy(np.int64) for c in ("rank", "start", "end", "level")}
        seg_of = split_by_rank(columns)
        for rank in here:
            mine, st = seg_of.get(rank, {c: v[:0] for c, v in columns.items()}), steps_of[rank]
            starts, ends = st["start_ns"][a:b], st["end_ns"][a:b]
            pieces = sweep_intervals(mine["start"], mine["end"], mine["level"], starts, ends)
            yield rank, st["step"][a:b].astype(np.int32), starts, ends, pieces


FLUSH_PIECES = 1_000_000  # phase pieces held before they are summed (memory bounded on long runs)


def _attribute(con: duckdb.DuckDBPyConnection, counted: list[Series]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """energy_steps and energy_phases rows for every rank with steps."""
    hosts = dict(con.execute("SELECT rank, host FROM hosts").fetchall())
    ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM steps ORDER BY rank").fetchall()]
    on_host: dict[str | None, int] = {}
    for r in ranks:
        on_host[hosts.get(r)] = on_host.get(hosts.get(r), 0) + 1
    series_of: dict[int, list[tuple[Series, float]]] = {}
    for rank in ranks:
        mine = [(s, 1.0) for s in counted if s.rank == rank]
        mine += [(s, 1.0 / on_host[s.host]) for s in counted if s.rank is None and s.host == hosts.get(rank)]
        if mine:
            series_of[rank] = mine
    # columns gathered per (rank, series) pair ``k`` and made into frames once: a frame and a
    # groupby per pair and window cost 14 ms each (256 ranks: 3.5 s)
    bases: list[dict] = []
    key_of: dict[tuple[int, int], int] = {}
    step_cols: dict[str, list[np.ndarray]] = {c: [] for c in ("k", "step", "share", "energy_j", "covered_ns")}
    piece_cols: dict[str, list[np.ndarray]] = {c: [] for c in ("k", "step", "phase", "energy_j", "duration_ns",
                                                               "short_ns")}
    summed: list[pd.DataFrame] = []  # the pieces summed per (k, step, phase), a window's worth at a time

    def flush() -> None:
        if piece_cols["k"]:
            frame = pd.DataFrame({c: np.concatenate(v) for c, v in piece_cols.items()})
            summed.append(frame.groupby(["k", "step", "phase"], as_index=False, sort=True).sum())
            for v in piece_cols.values():
                v.clear()

    held = 0
    for rank, ids, starts, ends, pieces in _windows(con, list(series_of)):
        if held > FLUSH_PIECES:  # a (k, step) lies in one window: summed parts never share a key
            flush()
            held = 0
        held += len(pieces) * len(series_of[rank])
        p_start, p_end = pieces["start_ns"].to_numpy(np.int64), pieces["end_ns"].to_numpy(np.int64)
        p_step = ids[pieces["step"].to_numpy(np.int64)] if len(pieces) else np.zeros(0, np.int32)
        for i, (s, share) in enumerate(series_of[rank]):
            k = key_of.setdefault((rank, i), len(bases))
            if k == len(bases):
                bases.append({"rank": rank, "channel_id": s.channel_id, "location_id": s.location_id,
                              "device": s.device, "device_index": s.index, "active": s.active})
            n = len(ids)
            step_cols["k"].append(np.full(n, k))
            step_cols["step"].append(ids)
            step_cols["share"].append(np.full(n, share))
            step_cols["energy_j"].append(share * attribution.window_energy(s.t, s.total, starts, ends))
            step_cols["covered_ns"].append(attribution.covered_ns(s.t, starts, ends))
            if not len(pieces):
                continue
            length = p_end - p_start
            piece_cols["k"].append(np.full(len(pieces), k))
            piece_cols["step"].append(p_step)
            piece_cols["phase"].append(pieces["phase"].to_numpy(object))
            piece_cols["energy_j"].append(share * attribution.window_energy(s.t, s.total, p_start, p_end))
            piece_cols["duration_ns"].append(length)
            piece_cols["short_ns"].append(np.where(length < s.interval_ns, length, 0))
    if not bases:
        return pd.DataFrame(columns=ENERGY_STEPS.names), pd.DataFrame(columns=ENERGY_PHASES.names)
    base = pd.DataFrame(bases)
    steps = pd.DataFrame({c: np.concatenate(v) for c, v in step_cols.items()})
    steps = base.iloc[steps.pop("k").to_numpy()].reset_index(drop=True).join(steps)
    flush()
    if not summed:
        return steps, pd.DataFrame(columns=ENERGY_PHASES.names)
    agg = pd.concat(summed, ignore_index=True).sort_values(["k", "step", "phase"], kind="stable",
                                                           ignore_index=True)
    phases = agg.drop(columns="k").join(base.iloc[agg["k"].to_numpy()].reset_index(drop=True))
    return steps, phases


def build_energy(con: duckdb.DuckDBPyConnection, ours: bool = False) -> None:
    """Fill power, energy_devices, energy_agreement, energy_steps and energy_phases (nothing
    when the trace has no energy or power channel with a known unit). ``ours``: the trace was
    written by dltrace, whose GPUs without a rank are idle ones."""
    found = load_series(con, ours)
    if not found:
        return
    _insert(con, "power", POWER.names, pd.concat([_power_rows(s) for s in found], ignore_index=True))
    _insert(con, "energy_devices", ENERGY_DEVICES.names, pd.DataFrame([_device_row(s) for s in found]))
    _insert(con, "energy_agreement", ENERGY_AGREEMENT.names, pd.DataFrame(_agreement_rows(found)))
    steps, phases = _attribute(con, [s for s in found if s.counted])
    _insert(con, "energy_steps", ENERGY_STEPS.names, steps)
    _insert(con, "energy_phases", ENERGY_PHASES.names, phases)
