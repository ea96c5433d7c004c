"""The reader's metric rows into ``metric_channels`` and ``metrics``; ranks' hosts into ``hosts``.

A channel is one member of one metric (MetricClass or MetricInstance): Score-P's asynchronous
plugins define an instance per host and metric, its PAPI counters one class with several
members recorded on every thread; our sampler an instance per device. Each channel is
classified once (:mod:`analyze.energy.channels`); samples keep the member's name, unit and
mode next to the value, so a query needs no join to read them.

In the build (analyze/tables/stages.py) the read tasks keep the raw samples and say which
metrics they reference; the channels follow from the whole trace's (:func:`channels`); the
finish tasks write their ranks' ``metrics`` (:data:`METRIC_ROWS`), and the channels' rows
count them at the end (:func:`fill_channels`).
"""

from __future__ import annotations

from typing import Any

import duckdb
import pandas as pd

from analyze.energy.channels import classify
from analyze.readers.columns import Definitions


def channel_rows(defs: Definitions, used_through_instances: set[int] | None = None) -> pd.DataFrame:
    """One row per (metric, member position), leaving out ``used_through_instances`` (classes
    whose samples all reference their instances): the metric_channels columns but ``samples``,
    plus ``member_index`` and ``scale`` (base ** exponent) to join and convert the raw rows."""
    members = {m.member_id: m for m in defs.metric_members}
    used_through_instances = used_through_instances or set()
    rows: list[dict[str, Any]] = []
    for metric in defs.metrics:
        if metric.metric_id in used_through_instances:
            continue
        for position, member_id in enumerate(metric.member_ids):
            m = members.get(member_id)
            if m is None:
                continue
            c = classify(m.name, m.unit)
            rows.append({
                "channel_id": len(rows), "metric_id": metric.metric_id, "member_id": member_id,
                "name": m.name, "description": m.description, "unit": m.unit, "base": m.base,
                "exponent": m.exponent, "mode": m.mode, "value_type": m.value_type,
                "occurrence": metric.occurrence, "scope": metric.scope, "scope_name": metric.scope_name,
                "host": metric.host, "rank": metric.scope_rank, "quantity": str(c.quantity),
                "device": None if c.device is None else str(c.device), "device_index": c.index,
                "to_si": c.to_si, "unit_from": c.unit_from,
                "member_index": position,
                "scale": (2.0 if m.base == "binary" else 10.0) ** m.exponent,
            })
    out = pd.DataFrame(rows, columns=[
        "channel_id", "metric_id", "member_id", "name", "description", "unit", "base", "exponent", "mode",
        "value_type", "occurrence", "scope", "scope_name", "host", "rank", "quantity", "device",
        "device_index", "to_si", "unit_from", "member_index", "scale"])
    return out.astype({"rank": "Int32", "device_index": "Int32", "to_si": "Float64"})


def host_rows(defs: Definitions) -> pd.DataFrame:
    """The ``hosts`` rows: each rank's system tree node, by rank."""
    return pd.DataFrame({"rank": list(defs.hosts), "host": list(defs.hosts.values())}) \
        .sort_values("rank", kind="stable").reset_index(drop=True)


def channels(defs: Definitions, sampled: set[int]) -> pd.DataFrame | None:
    """The channels (:func:`channel_rows`) given the metrics that samples reference
    (``sampled``, from the whole trace): a class that instances use is recorded through them
    (Score-P's plugins, our sampler); it is a channel of its own only if some sample
    references the class itself. None when there are none: a trace without metric
    definitions (most) gets no frame at all (a process's first such pandas frame costs 10 ms)."""
    if not defs.metrics:
        return None
    through = {m.class_id for m in defs.metrics if m.class_id is not None} - sampled
    found = channel_rows(defs, through)
    return None if found.empty else found


# The ``metrics`` rows of some locations: their raw samples (view raw_metrics, the reader's
# rows) with their channels (view channel_rows, :func:`channels`).
METRIC_ROWS = """
    SELECT r.location_id, r.rank, c.channel_id, c.name AS member, c.unit, c.mode, r.time_ns,
           r.value * c.scale AS value
    FROM raw_metrics r JOIN channel_rows c
      ON r.metric_id = c.metric_id AND r.member_index = c.member_index
"""


def fill_channels(con: duckdb.DuckDBPyConnection, found: pd.DataFrame) -> None:
    """Fill ``metric_channels`` from the channels (:func:`channels`) and the samples in ``metrics``."""
    con.register("channel_rows", found)
    try:
        con.execute("""
            INSERT INTO metric_channels
            SELECT c.channel_id, c.metric_id, c.member_id, c.name, c.description, c.unit, c.base, c.exponent,
                   c.mode, c.value_type, c.occurrence, c.scope, c.scope_name, c.host, c.rank, c.quantity,
                   c.device, c.device_index, c.to_si, c.unit_from, count(m.time_ns)
            FROM channel_rows c LEFT JOIN metrics m USING (channel_id)
            GROUP BY ALL ORDER BY c.channel_id
        """)
    finally:
        con.unregister("channel_rows")
