"""The tables ``analyze energy``, ``analyze phases`` and the power pages show: each function
takes a run's connection and returns a DataFrame (or notes), from the energy tables of
:mod:`analyze.tables.energy`. Energies in J, power in W, times in ms or s as named.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd

from analyze.energy.attribution import window_energy
from analyze.tables.phases import segments, sweep_intervals
from analyze.views import steady_steps

PHASE_COLUMNS = ("compute", "allreduce", "other_comm", "idle", "other")


def available(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the run has energy (an energy or power channel with a known unit)."""
    row = con.execute("SELECT count(*) FROM energy_devices").fetchone()
    return bool(row and row[0])


def devices(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """One row per energy or power series: what it measured, over how long, how much."""
    return con.execute("""
        SELECT host, device || ' ' || coalesce(device_index::VARCHAR, '?') AS device, rank, source,
               samples, interval_ms, (end_ns - start_ns) / 1e9 AS seconds, energy_j, mean_power_w,
               counted, active, name
        FROM energy_devices ORDER BY host, device, device_index, source, name
    """).df()


def agreement(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Devices with both a counter and power readings: the energy of each, as read and aligned
    (a row per power channel of the device, named in ``readings``)."""
    return con.execute("""
        SELECT a.host, a.device || ' ' || coalesce(a.device_index::VARCHAR, '?') AS device, c.name AS readings,
               (a.end_ns - a.start_ns) / 1e9 AS seconds, a.counter_j, a.power_j, a.difference_pct, a.lag_ms,
               a.aligned_counter_j, a.aligned_power_j, a.aligned_difference_pct
        FROM energy_agreement a LEFT JOIN metric_channels c ON c.channel_id = a.power_channel
        ORDER BY a.host, a.device, a.device_index, a.power_channel
    """).df()


def per_rank(con: duckdb.DuckDBPyConnection, active_only: bool = True) -> pd.DataFrame:
    """Per rank: steps, energy per step, mean power over its steps, and energy per phase
    (total over the steps), over its own devices and its share of its host's."""
    where = "WHERE active" if active_only else ""
    pivot = ", ".join(f"sum(energy_j) FILTER (phase = '{p}') AS {p}_j" for p in PHASE_COLUMNS)
    return con.execute(f"""
        WITH st AS (SELECT rank, count(*) AS steps, sum(duration_ns) AS ns FROM steps GROUP BY rank),
             e AS (SELECT rank, sum(energy_j) AS j FROM energy_steps {where} GROUP BY rank),
             p AS (SELECT rank, {pivot} FROM energy_phases {where} GROUP BY rank)
        SELECT st.rank, st.steps, e.j / st.steps AS step_j, e.j / (st.ns / 1e9) AS power_w, e.j AS energy_j,
               {", ".join(f"p.{c}_j" for c in PHASE_COLUMNS)}
        FROM st JOIN e USING (rank) LEFT JOIN p USING (rank) ORDER BY st.rank
    """).df()


def window(con: duckdb.DuckDBPyConnection, start_ns: int, end_ns: int, active_only: bool = True) -> float:
    """Energy (J) of the counted series between two times, whatever the ranks' steps."""
    total = 0.0
    rows = con.execute(f"""
        SELECT channel_id, location_id, list(p.end_ns ORDER BY p.end_ns), list(p.energy_j ORDER BY p.end_ns),
               min(p.start_ns)
        FROM power p JOIN energy_devices d USING (channel_id, location_id)
        WHERE d.counted {"AND d.active" if active_only else ""} GROUP BY ALL
    """).fetchall()
    for _, _, ends, energy, first in rows:
        t = np.concatenate([[first], np.asarray(ends, dtype=np.int64)])
        cum = np.concatenate([[0.0], np.cumsum(energy)])
        total += float(window_energy(t, cum, np.array([start_ns]), np.array([end_ns]))[0])
    return total


def notes(con: duckdb.DuckDBPyConnection) -> list[str]:
    """What a reader of the energy numbers should know about this run."""
    out = []
    short = con.execute("""
        SELECT sum(short_ns) / nullif(sum(duration_ns), 0), median(d.interval_ms)
        FROM energy_phases p JOIN energy_devices d USING (channel_id, location_id)
    """).fetchone()
    if short and short[0]:
        out.append(f"{100 * short[0]:.0f}% of the phase time is in pieces shorter than the sampling "
                   f"interval ({short[1]:.0f} ms): there a sample's energy is split between phases in "
                   "proportion to time, so per-phase energy shows time shares, not different power. "
                   "Sample faster (instrument run --power-interval) or read the per-step energy.")
    readings = con.execute("""SELECT count(*) FROM energy_devices
                              WHERE counted AND integrated_reading""").fetchone()
    if readings and readings[0]:
        out.append(f"{readings[0]} device(s) have no energy counter: their energy is integrated from "
                   "power readings, which NVML averages over the last second on recent GPUs: do not "
                   "read their per-phase energy for phases shorter than that.")
    uncovered = con.execute("""
        SELECT count(*) FROM (SELECT rank, step, min(covered_ns) AS c FROM energy_steps GROUP BY ALL) e
        JOIN steps USING (rank, step) WHERE e.c < steps.duration_ns
    """).fetchone()
    if uncovered and uncovered[0]:
        out.append(f"{uncovered[0]} rank-step(s) lie partly outside the power samples; energy there is not counted.")
    unknown = con.execute("""SELECT list(name) FROM metric_channels
                             WHERE quantity IN ('energy', 'power') AND to_si IS NULL""").fetchone()
    if unknown and unknown[0]:
        out.append("energy or power channels with an unknown unit, left out: " + ", ".join(unknown[0][:5]))
    return out


def timeline(con: duckdb.DuckDBPyConnection, max_pieces: int = 2000) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(power, phases, note) for the power-over-time pages, one page per ``device`` label
    (``gpu 1 · rank 0``, ``cpu_package 0 · vm``): every series' mean power per sampling
    interval (``device``, ``source``: counter or power readings, ``start_s``, ``end_s``,
    ``power_w``), and the phases of the rank the device is charged to (host-wide: the host's
    first rank; ``device``, ``rank``, ``start_s``, ``end_s``, ``phase``). Seconds from the
    first step. Long runs show their steady-state steps only, so the phases stay legible."""
    series = con.execute("""
        SELECT d.channel_id, d.location_id,
               d.device || ' ' || coalesce(d.device_index::VARCHAR, '?')
               || coalesce(' · rank ' || d.rank::VARCHAR, ' · ' || d.host) AS device,
               CASE WHEN d.source = 'power' THEN 'power readings' ELSE 'counter' END AS source,
               coalesce(d.rank, (SELECT min(h.rank) FROM hosts h WHERE h.host = d.host)) AS shade_rank
        FROM energy_devices d ORDER BY d.host, d.device, d.device_index, d.source
    """).df()
    t0 = con.execute("SELECT min(start_ns) FROM steps").fetchone()[0] or 0  # type: ignore[index]
    pieces = int(con.execute("SELECT count(*) FROM phases WHERE duration_ns > 0").fetchone()[0])  # type: ignore[index]
    a, b = steady_steps(con) if pieces > max_pieces else (0, 1 << 30)
    lo, hi = con.execute("SELECT min(start_ns), max(end_ns) FROM steps WHERE step >= $a AND step < $b",
                         {"a": a, "b": b}).fetchone() or (None, None)
    note = "" if pieces <= max_pieces else f"steps {a}-{b - 1} of a long run"
    power = con.execute("""
        SELECT channel_id, location_id, start_ns, end_ns, power_w FROM power
        WHERE end_ns >= $lo AND start_ns <= $hi ORDER BY start_ns
    """, {"lo": lo, "hi": hi}).df()
    power = power.merge(series[["channel_id", "location_id", "device", "source"]], on=["channel_id", "location_id"])
    pages = series.drop_duplicates("device")
    order = {d: i for i, d in enumerate(pages["device"])}
    power = power.assign(start_s=(power["start_ns"] - t0) / 1e9, end_s=(power["end_ns"] - t0) / 1e9,
                         page=power["device"].map(order)).sort_values(["page", "source", "start_s"], kind="stable")
    shades = []
    for rank in sorted(set(pages["shade_rank"].dropna().astype(int))):
        st = con.execute("SELECT start_ns, end_ns FROM steps WHERE rank = $r AND step >= $a AND step < $b "
                         "ORDER BY start_ns", {"r": rank, "a": a, "b": b}).fetchnumpy()
        if not len(st["start_ns"]):
            continue
        starts, ends = np.asarray(st["start_ns"], np.int64), np.asarray(st["end_ns"], np.int64)
        seg = segments(con, int(starts.min()), int(ends.max()), ranks=[rank])
        mine = sweep_intervals(seg["start"].to_numpy(), seg["end"].to_numpy(), seg["level"].to_numpy(),
                               starts, ends)
        for device in pages.loc[pages["shade_rank"] == rank, "device"]:
            shades.append(mine.assign(device=device, rank=rank))
    phases = pd.concat(shades, ignore_index=True) if shades else pd.DataFrame(
        columns=["start_ns", "end_ns", "phase", "step", "device", "rank"])
    phases = phases.assign(start_s=(phases["start_ns"] - t0) / 1e9, end_s=(phases["end_ns"] - t0) / 1e9)
    return (power[["device", "source", "start_s", "end_s", "power_w"]],
            phases[["device", "rank", "start_s", "end_s", "phase"]], note)
