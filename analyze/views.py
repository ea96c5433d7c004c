"""Tables the figures are drawn from: each function takes a run's connection, returns a DataFrame.

All numbers the report shows come from here (the figure builders in ``reports/`` only draw).
Times are in milliseconds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from analyze.tables.phases import PHASE_NAMES, PHASES, segments, sweep_intervals_of_ranks
from analyze.tables.steps import RankGroups, StepBins

NS_PER_MS = 1e6


# Characters of a figure's title on one line: 5 inches at the theme's title size hold about 58
# ("param_dlrm_v100_8rank · PyTorch profiler (Kineto) · 8 ranks", 60, lost its last letter)
TITLE_WIDTH = 50


@dataclass
class RunLabel:
    name: str
    framework: str | None
    ranks: int
    params: dict[str, Any]
    creator: str | None = None  # the program that wrote the trace (runs.creator)

    @property
    def batch_size(self) -> Any:
        return self.params.get("batch_size")

    @property
    def source(self) -> str:
        """The framework, or for a trace without one (Score-P's, a Kineto file) what wrote it."""
        if self.framework:
            return self.framework
        return self.creator.split(",")[0] if self.creator else "unknown framework"

    def title(self) -> str:
        """name · source · ranks (· batch), broken before a part that would take a line past
        :data:`TITLE_WIDTH` characters (a page's title is one figure wide)."""
        parts = [self.name, self.source, f"{self.ranks} rank{'' if self.ranks == 1 else 's'}"]
        if self.batch_size is not None:
            parts.append(f"batch {self.batch_size}")
        lines = [parts[0]]
        for part in parts[1:]:
            if len(lines[-1]) + len(" · ") + len(part) > TITLE_WIDTH:
                lines.append(part)
            else:
                lines[-1] += " · " + part
        return "\n".join(lines)

    def short(self) -> str:
        bs = f", bs {self.batch_size}" if self.batch_size is not None else ""
        return f"{self.name}\n{self.source}, np {self.ranks}{bs}"


def run_label(con: duckdb.DuckDBPyConnection) -> RunLabel:
    name, framework, ranks, params, creator = con.execute(
        "SELECT run_name, framework, ranks, params, creator FROM runs").fetchone()  # type: ignore[misc]
    return RunLabel(name, framework, int(ranks), json.loads(params) if params else {}, creator)


def step_phases(con: duckdb.DuckDBPyConnection, bins: StepBins | None = None,
                groups: RankGroups | None = None, source: str = "phases") -> pd.DataFrame:
    """rank, step, phase, ms: every step of every rank (with ``bins``, every bin's mean step;
    with ``groups``, ``rank`` is a group's first rank and ms the mean over its ranks).
    ``source``: a table of rank, step, phase, duration_ns (the phases, by default)."""
    bins, groups = bins or StepBins(0, 0, 1), groups or RankGroups(1, 0)
    if bins.per == 1 and groups.per == 1:
        return con.execute(f"""
            SELECT rank, step, phase, duration_ns / 1e6 AS ms FROM {source} ORDER BY rank, step, phase
        """).df()
    return con.execute(f"""
        WITH p AS (SELECT {groups.start()} AS g, {bins.start()} AS b, rank, phase, duration_ns FROM {source}),
        {groups.sizes("p")}
        SELECT g AS rank, b AS step, phase, sum(duration_ns) / 1e6 / {bins.width('b')} / any_value(n.n) AS ms
        FROM p JOIN n USING (g) GROUP BY g, b, phase ORDER BY rank, step, phase
    """).df()


def device_step_phases(con: duckdb.DuckDBPyConnection, bins: StepBins | None = None,
                       groups: RankGroups | None = None) -> pd.DataFrame:
    """rank, step, phase, ms of the devices' phases (``device_phases``, whatever the host did
    meanwhile), as :func:`step_phases`; empty without accelerator streams."""
    return step_phases(con, bins, groups, "(SELECT rank, step, phase, sum(duration_ns) AS duration_ns "
                                          "FROM device_phases GROUP BY ALL)")


WARMUP_OUTLIER = 4.0  # a step this many times the typical step, early in the run, is warm-up


def warmup_end(durations: np.ndarray) -> int:
    """Index of the first steady-state step, given each step's duration in order.

    Warm-up is the first step and, in longer runs, the first tenth; it extends past any step
    in the first half of the run that took more than :data:`WARMUP_OUTLIER` times the median
    step of the second half (a graph compiled on first use: TensorFlow traces a custom loop's
    synchronizing step only when it first runs, K steps in).
    """
    n = len(durations)
    if n <= 1:
        return 0
    start = max(1, n // 10)
    typical = float(np.median(durations[n // 2:]))
    slow = np.flatnonzero(durations[: n // 2] > WARMUP_OUTLIER * typical)
    return max(start, int(slow[-1]) + 1) if len(slow) else start


def steady_steps(con: duckdb.DuckDBPyConnection) -> tuple[int, int]:
    """The steady-state steps of a run, half-open (see :func:`warmup_end`); durations are
    the median over ranks of each step."""
    d = con.execute("SELECT median(duration_ns) FROM steps GROUP BY step ORDER BY step").fetchnumpy()
    durations = next(iter(d.values())) if d else np.zeros(0)
    return warmup_end(np.asarray(durations, dtype=np.float64)), len(durations)


def breakdown(con: duckdb.DuckDBPyConnection, device: bool = False) -> pd.DataFrame:
    """One row per phase: mean ms per step over steady-state steps and all ranks. ``device``:
    of the devices' phases (``device_phases``; over the ranks with accelerator streams, and
    empty without them)."""
    a, b = steady_steps(con)
    df = con.execute(f"""
        SELECT phase, sum(duration_ns) / 1e6 / count(DISTINCT (rank, step)) AS ms
        FROM {'device_phases' if device else 'phases'} WHERE step >= $a AND step < $b GROUP BY phase
    """, {"a": a, "b": b}).df()
    df["steps"] = f"{a}-{b - 1}" if b > a else ""
    return df


def default_window(con: duckdb.DuckDBPyConnection, count: int = 3) -> tuple[int, int]:
    """A few steady-state steps after warm-up (half-open)."""
    a, b = steady_steps(con)
    return a, min(b, a + count)


@dataclass
class Timeline:
    bars: pd.DataFrame  # rank, start_ms, end_ms, phase
    steps: pd.DataFrame  # rank, step, start_ms, end_ms
    window: tuple[int, int]  # steps shown, half-open
    origin_ns: int  # 0 ms on the x axis
    intervals: int  # phase intervals in the window before any aggregation
    bin_ms: float | None  # set when bars are aggregated into bins
    lanes: pd.DataFrame | None = None  # region and communication lanes (see region_lanes)

    @property
    def note(self) -> str | None:
        if self.bin_ms is None:
            return None
        return (f"aggregated: {self.intervals:,} phase intervals shown as the dominant phase "
                f"of each {self.bin_ms:.3g} ms bin")


def timeline(
    con: duckdb.DuckDBPyConnection, steps: tuple[int, int] | None = None, max_bars: int = 20_000,
    bins: int = 1500,
) -> Timeline:
    """Phase intervals of every rank for the steps ``steps`` (half-open; default: a few
    steady-state steps). Above ``max_bars`` intervals, each rank's time is cut into ``bins``
    equal bins drawn as their dominant phase, so a million intervals still render quickly
    (where that halves the bars at least)."""
    window = steps or default_window(con)
    st = con.execute("""SELECT rank, step, start_ns, end_ns FROM steps
                        WHERE step >= $a AND step < $b ORDER BY rank, step""",
                     {"a": window[0], "b": window[1]}).df()
    if st.empty:
        raise ValueError(f"no steps {window[0]}:{window[1]} in this run")
    t0, t1 = int(st["start_ns"].min()), int(st["end_ns"].max())
    bars = sweep_intervals_of_ranks(segments(con, t0, t1), st, t0, t1)
    n_intervals = len(bars)
    bin_ms = None
    if n_intervals > max_bars:
        binned, bin_ns = _binned(bars, t0, t1, bins)
        # many ranks of few intervals each (4,096 ranks, 6 a rank): bins of each rank draw about
        # as many bars and lose the exact times, so they are drawn only if they halve the bars
        if len(binned) <= n_intervals // 2:
            bars, bin_ms = binned, bin_ns / NS_PER_MS
    out = pd.DataFrame({
        "rank": bars["rank"].astype(int),
        "start_ms": (bars["start_ns"] - t0) / NS_PER_MS,
        "end_ms": (bars["end_ns"] - t0) / NS_PER_MS,
        "phase": pd.Categorical(bars["phase"], categories=[str(p) for p in PHASES]),
    })
    steps_ms = pd.DataFrame({"rank": st["rank"].astype(int), "step": st["step"].astype(int),
                             "start_ms": (st["start_ns"] - t0) / NS_PER_MS,
                             "end_ms": (st["end_ns"] - t0) / NS_PER_MS})
    many = st["rank"].nunique() > MAX_LANE_RANKS
    lanes = region_lanes(con, t0, t1, max_bars) if bin_ms is None and not many else None
    if lanes is not None and len(lanes) > max_bars:
        lanes = None  # too many to see one by one; the phase rows still show the window
    return Timeline(out, steps_ms, window, t0, n_intervals, bin_ms, lanes)


# Above this many ranks the timeline has no lanes: a rank's rows would be thinner than a
# line on the page (and at 4,096 ranks their query took 3 s, to be dropped above max_bars).
MAX_LANE_RANKS = 64
LANE_CATEGORIES = ("dataloader", "forward", "backward", "optimizer", "wait", "user")
MAX_COMM_LANES = 3  # a rank with more communication lanes gets them all in one row
# A rank's accelerator streams get a row each up to this many streams and this many such rows
# in all (eight ranks of four streams each: one row a rank, "device streams")
MAX_DEVICE_LANES = 6
MAX_DEVICE_ROWS = 24


def region_lanes(con: duckdb.DuckDBPyConnection, t0: int, t1: int, max_rows: int = 20_000) -> pd.DataFrame:
    """What the timeline draws under each rank's phases, between ``t0`` and ``t1`` [ns]:

    - lane 1, ``regions``: the main thread's data loading, forward, backward, optimizer,
      waits for communication and user regions (``fill`` is the region's category; user
      covers Score-P's ``user:`` regions and, in our own traces, ``instrument.region``);
    - lanes 2..: each communication lane of the host (or one row for them all past
      :data:`MAX_COMM_LANES`), every asynchronous collective (DDP bucket, Horovod reduction)
      as ``fill`` allreduce or other_comm, and its waiting for the last rank as ``waiting``
      (``part`` wait);
    - then each accelerator stream (or one row for them all past :data:`MAX_DEVICE_LANES`
      streams, or :data:`MAX_DEVICE_ROWS` rows of them in all):
      its collective kernels as on the host's lanes, its other kernels as ``compute`` and its
      copies and sets as ``memory`` (``part`` device; the device phases' activity), activities
      closer than a thousandth of the window merged; left out when the lanes would be more
      than ``max_rows`` rows with them.

    Columns: rank, lane, label, start_ms, end_ms (from ``t0``), fill, part (region, op,
    wait, device), depth (nested regions are drawn over their parents).
    """
    from analyze.tables.device_phases import COMM, MEMORY, device_activity

    rows = con.execute("SELECT creator FROM runs").fetchall()
    ours = bool(rows and rows[0][0] and str(rows[0][0]).startswith("dltrace"))
    cats = [*LANE_CATEGORIES, *(["function"] if ours else [])]  # our tracer records no functions
    regions = con.execute(f"""
        SELECT i.rank, 1 AS lane, 'regions' AS label, i.start_ns, i.end_ns,
               CASE WHEN r.category = 'function' THEN 'user' ELSE r.category END AS fill,
               'region' AS part, i.depth
        FROM intervals i JOIN regions r USING (region_id) JOIN locations l USING (location_id)
        WHERE l.is_main AND r.category IN ({", ".join(f"'{c}'" for c in cats)})
          AND i.end_ns > $lo AND i.start_ns < $hi
    """, {"lo": t0, "hi": t1}).df()
    comm = con.execute("""
        SELECT c.rank, c.location_id, l.kind = 'accelerator_stream' AS device, c.enter_ns AS start_ns,
               c.leave_ns AS end_ns, CASE WHEN c.op = 'allreduce' THEN 'allreduce' ELSE 'other_comm' END AS fill,
               'op' AS part, 0 AS depth
        FROM collectives c JOIN locations l USING (location_id)
        WHERE c.is_async AND c.leave_ns > $lo AND c.enter_ns < $hi
        UNION ALL
        SELECT c.rank, c.location_id, l.kind = 'accelerator_stream', c.enter_ns, c.enter_ns + c.wait_ns,
               'waiting', 'wait', 1
        FROM collectives c JOIN locations l USING (location_id)
        WHERE c.is_async AND c.leave_ns > $lo AND c.enter_ns < $hi AND c.wait_ns > 0
    """, {"lo": t0, "hi": t1}).df()
    act = device_activity(con, window=(t0, t1))
    act = act[act["kind"] != COMM]  # the collective kernels: from the collectives, with their waiting
    device = pd.DataFrame({"rank": act["rank"], "location_id": act["location_id"], "device": True,
                           "start_ns": act["start_ns"], "end_ns": act["end_ns"],
                           "fill": np.where(act["kind"] == MEMORY, "memory", "compute"), "part": "device",
                           "depth": 0})
    lanes = _stream_lanes(comm, device, (t1 - t0) / 1000)
    if len(regions) + len(lanes) > max_rows:  # (counted merged: a compute stream's kernels merge ten to one)
        lanes = _stream_lanes(comm, device.iloc[:0], (t1 - t0) / 1000)
    df = pd.concat([regions, lanes], ignore_index=True)
    return pd.DataFrame({
        "rank": df["rank"].astype(int), "lane": df["lane"].astype(int), "label": df["label"].astype(str),
        "start_ms": (df["start_ns"].clip(lower=t0) - t0) / NS_PER_MS,
        "end_ms": (df["end_ns"].clip(upper=t1) - t0) / NS_PER_MS,
        "fill": df["fill"].astype(str), "part": df["part"].astype(str), "depth": df["depth"].astype(int),
    }).sort_values(["rank", "lane", "depth", "start_ms"], kind="stable").reset_index(drop=True)


def _stream_lanes(comm: pd.DataFrame, device: pd.DataFrame, gap_ns: float) -> pd.DataFrame:
    """The rows of :func:`region_lanes`' lanes 2..: ``comm`` (the asynchronous collectives and
    their waiting) and ``device`` (the streams' other activity) with lane and label, each rank's
    host lanes first, then its streams; every rank gets as many rows of each as the rank with
    the most, or one row for all of them (see :func:`region_lanes`). Device activities of one
    fill less than ``gap_ns`` apart on a row are merged (a kernel a few microseconds long is no
    wider than a line at the page's width)."""
    rows = pd.concat([comm, device], ignore_index=True)
    if rows.empty:
        return rows.assign(lane=pd.Series(dtype=int), label=pd.Series(dtype=str))
    rows["device"] = rows["device"].astype(bool)
    streams = rows[["rank", "location_id", "device"]].drop_duplicates().sort_values(["rank", "device", "location_id"])
    streams["k"] = streams.groupby(["rank", "device"]).cumcount()
    most = streams.groupby(["rank", "device"]).size().groupby(level="device").max()
    hosts, devices = int(most.get(False, 0)), int(most.get(True, 0))
    host_rows = 1 if hosts > MAX_COMM_LANES else hosts
    one_row = devices > MAX_DEVICE_LANES or devices * streams["rank"].nunique() > MAX_DEVICE_ROWS
    streams["lane"] = np.where(streams["device"], 2 + host_rows + np.where(one_row, 0, streams["k"]),
                               2 + np.where(hosts > MAX_COMM_LANES, 0, streams["k"]))
    streams["label"] = np.where(
        streams["device"], np.where(one_row, "device streams", "device stream " + streams["k"].astype(str)),
        np.where(hosts > MAX_COMM_LANES, "comm lanes", "comm lane " + streams["k"].astype(str)))
    rows = rows.merge(streams[["rank", "location_id", "lane", "label"]], on=["rank", "location_id"])
    rows.loc[rows["part"] == "wait", "label"] = ""
    activity = rows["part"] == "device"
    return pd.concat([rows[~activity], _merged(rows[activity], gap_ns)], ignore_index=True)


def _merged(rows: pd.DataFrame, gap_ns: float) -> pd.DataFrame:
    """``rows`` (rank, lane, fill, start_ns, end_ns, ...) with those of one rank, lane and fill
    that overlap or lie less than ``gap_ns`` apart as one row."""
    if rows.empty:
        return rows
    rows = rows.sort_values(["rank", "lane", "fill", "start_ns"], kind="stable").reset_index(drop=True)
    key = rows[["rank", "lane", "fill"]]
    same = (key == key.shift()).all(axis=1).to_numpy()
    reach = rows.groupby(["rank", "lane", "fill"], sort=False)["end_ns"].cummax()
    new = ~same | (rows["start_ns"].to_numpy() > reach.shift().to_numpy() + gap_ns)
    group = np.cumsum(new)
    first = rows[new].reset_index(drop=True)
    first["end_ns"] = reach.groupby(group).max().to_numpy()
    return first


def _binned(bars: pd.DataFrame, t0: int, t1: int, bins: int) -> tuple[pd.DataFrame, float]:
    """Per rank and bin, the phase covering most of the bin; runs of equal bins merged.

    The ranks are binned a batch at a time (:data:`BIN_CELLS` cells of phase and bin at
    most), each rank's bins after the previous one's: one pass per batch, not per rank."""
    width = max(1.0, (t1 - t0) / bins)
    n = bins + 1  # bins per rank (the last holds what ends exactly at t1)
    rank = bars["rank"].to_numpy(np.int64)
    code = pd.Categorical(bars["phase"], categories=PHASE_NAMES).codes
    ranks, row = np.unique(rank, return_inverse=True)
    s = (bars["start_ns"].to_numpy() - t0) / width
    e = (bars["end_ns"].to_numpy() - t0) / width
    per_batch = max(1, BIN_CELLS // (len(PHASES) * n))
    out = []
    for first in range(0, len(ranks), per_batch):
        last = min(len(ranks), first + per_batch)
        mine = (row >= first) & (row < last)
        offset = (row[mine] - first) * n
        cells = (last - first) * n
        cover = np.zeros((len(PHASES), cells))
        for k in range(len(PHASES)):
            m = code[mine] == k
            if m.any():
                cover[k] = _coverage(s[mine][m] + offset[m], e[mine][m] + offset[m], cells)
        idx = np.flatnonzero(cover.sum(axis=0) > 0)
        if len(idx) == 0:
            continue
        dominant = cover.argmax(axis=0)[idx]
        new = np.ones(len(idx), dtype=bool)
        new[1:] = (dominant[1:] != dominant[:-1]) | (idx[1:] != idx[:-1] + 1) | (idx[1:] // n != idx[:-1] // n)
        starts = idx[new]
        ends = np.append(idx[np.flatnonzero(new)[1:] - 1], idx[-1]) + 1
        at = starts % n
        out.append(pd.DataFrame({
            "rank": ranks[first + starts // n], "start_ns": t0 + at * width,
            "end_ns": np.minimum(t0 + (at + ends - starts) * width, t1),
            "phase": np.array(PHASE_NAMES, dtype=object)[dominant[new]]}))
    if not out:
        return pd.DataFrame({"rank": [], "start_ns": [], "end_ns": [], "phase": []}), width
    return pd.concat(out, ignore_index=True), width


BIN_CELLS = 4_000_000  # phase x bin cells of one batch of ranks in _binned (32 MB)


def _coverage(s: np.ndarray, e: np.ndarray, n: int) -> np.ndarray:
    """Length of [s, e) (in bin units, 0 <= s <= e <= n) falling into each of ``n`` unit bins.

    Each interval adds its part of its first and last bins, and 1 to every bin between (a
    running count): bins no interval touches are exactly 0. (An integral of the indicator
    left rounding noise of 1e-11 there, drawn as bars where a rank had nothing.)"""
    first = np.minimum(np.floor(s).astype(np.int64), n - 1)
    last = np.minimum(np.floor(e).astype(np.int64), n - 1)
    alone = first == last
    cover = np.zeros(n)
    cover += np.bincount(first[alone], weights=(e - s)[alone], minlength=n)
    first, last, s, e = first[~alone], last[~alone], s[~alone], e[~alone]
    cover += np.bincount(first, weights=first + 1 - s, minlength=n)
    cover += np.bincount(last, weights=e - last, minlength=n)
    between = np.cumsum(np.bincount(first + 1, minlength=n + 1) - np.bincount(last, minlength=n + 1))[:n]
    return cover + between


def collective_waits(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """One row per collective instance per rank: op, rank, seq, wait_ms, and whether this
    rank arrived last (the straggler everyone waited for)."""
    return con.execute("""
        WITH c AS (
            SELECT *, max(enter_ns) OVER (PARTITION BY comm_id, seq) AS last_enter,
                      count(*) OVER (PARTITION BY comm_id, seq) AS n
            FROM collectives
        )
        -- a Kineto NCCL kernel whose operation its trace does not say has a NULL op
        SELECT coalesce(op, 'unknown') AS op, rank, comm_id, seq, wait_ns / 1e6 AS wait_ms,
               transfer_ns / 1e6 AS transfer_ms,
               enter_ns = last_enter AND n > 1 AS arrived_last
        FROM c ORDER BY op, comm_id, seq, rank
    """).df()


def waits_summary(con: duckdb.DuckDBPyConnection, points: int, groups: RankGroups | None = None
                  ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """What the waits figure draws, summed by DuckDB over every instance (a long run has
    millions): (points, boxes, stragglers). ``points``: the rows of :func:`collective_waits`
    for at most ``points`` instances of each op, a fixed sample (by a hash of communicator,
    sequence and rank: the same instances with or without groups); ``boxes``: op, rank, n,
    lower, middle, upper (quartiles, interpolated as numpy's percentiles), ymin, ymax (Tukey's
    whiskers: the most extreme waits within 1.5 IQR of the box); ``stragglers``: as
    :func:`stragglers`. With ``groups``, ``rank`` is a group's first rank: boxes over its
    ranks' instances, times last summed over them."""
    groups = groups or RankGroups(1, 0)
    c = f"""
        SELECT op, {groups.start()} AS rank, rank AS member, comm_id, seq, wait_ms, transfer_ms, arrived_last FROM (
            SELECT coalesce(op, 'unknown') AS op, rank, comm_id, seq, wait_ns / 1e6 AS wait_ms,
                   transfer_ns / 1e6 AS transfer_ms,
                   enter_ns = max(enter_ns) OVER (PARTITION BY comm_id, seq)
                       AND count(*) OVER (PARTITION BY comm_id, seq) > 1 AS arrived_last
            FROM collectives)"""
    # the instances once, in a temporary table the three queries read (each read every
    # rank's files and ran the window again: 4.3 -> 1.6 s at 4,096 ranks)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {_WAITS} AS {c}")
    try:
        return _waits_summary(con, points)
    finally:
        con.execute(f"DROP TABLE IF EXISTS temp.{_WAITS}")


_WAITS = "_dltrace_report_waits"


def _waits_summary(con: duckdb.DuckDBPyConnection, points: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    c = f"SELECT * FROM temp.{_WAITS}"
    sample = con.execute(f"""
        SELECT op, rank, comm_id, seq, wait_ms, transfer_ms, arrived_last FROM ({c})
        QUALIFY row_number() OVER (PARTITION BY op ORDER BY hash(comm_id, seq, member), comm_id, seq, member) <= $n
        ORDER BY op, comm_id, seq, member""", {"n": points}).df()
    boxes = con.execute(f"""
        WITH c AS ({c}),
        q AS (SELECT op, rank, count(wait_ms) AS n, quantile_cont(wait_ms, 0.25) AS lower,
                     quantile_cont(wait_ms, 0.5) AS middle, quantile_cont(wait_ms, 0.75) AS upper
              FROM c WHERE wait_ms IS NOT NULL GROUP BY op, rank)
        SELECT q.op, q.rank, any_value(q.n) AS n, any_value(lower) AS lower, any_value(middle) AS middle,
               any_value(upper) AS upper,
               min(c.wait_ms) FILTER (WHERE c.wait_ms >= lower - 1.5 * (upper - lower)) AS ymin,
               max(c.wait_ms) FILTER (WHERE c.wait_ms <= upper + 1.5 * (upper - lower)) AS ymax
        FROM q JOIN c USING (op, rank) GROUP BY q.op, q.rank ORDER BY q.op, q.rank""").df()
    counts = con.execute(f"""
        WITH c AS ({c}),
        ops AS (SELECT op, count(DISTINCT (comm_id, seq)) AS instances FROM c GROUP BY op),
        last AS (SELECT op, rank, count(*) AS times_last FROM c WHERE arrived_last GROUP BY op, rank)
        SELECT o.op, r.rank, coalesce(l.times_last, 0) AS times_last, o.instances
        FROM ops o CROSS JOIN (SELECT DISTINCT rank FROM c) r LEFT JOIN last l ON l.op = o.op AND l.rank = r.rank
        ORDER BY o.op, r.rank""").df()
    return sample, boxes, counts


def stragglers(waits: pd.DataFrame) -> pd.DataFrame:
    """op, rank, times_last, instances: how often each rank was the last to arrive, out of
    how many instances of the op (distinct communicator and sequence number)."""
    last = waits[waits["arrived_last"]]
    counts = last.groupby(["op", "rank"]).size().rename("times_last").reset_index()
    ranks = sorted(waits["rank"].unique())
    ops = sorted(waits["op"].unique())
    full = pd.MultiIndex.from_product([ops, ranks], names=["op", "rank"]).to_frame(index=False)
    out = full.merge(counts, on=["op", "rank"], how="left").fillna({"times_last": 0})
    out["times_last"] = out["times_last"].astype(int)
    instances = waits.drop_duplicates(["op", "comm_id", "seq"]).groupby("op").size()
    out["instances"] = out["op"].map(instances).astype(int)
    return out
