"""``analyze energy RUN``: energy and mean power per device, rank, step and phase."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from analyze.cli import common
from analyze.cli.common import (
    add_all_ranks,
    display,
    grouping_note,
    rank_grouping,
    rank_groups_of,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "energy", help="energy and mean power per device, rank, step and phase",
        description="Read RUN's OTF2 archive (ours, with the power sampler's channels, or Score-P's "
        "with metric plugins) into RUN/trace.duckdb and print energy per device (with counter vs "
        "power readings where a device has both), per rank and step, and per phase (docs/energy.md).")
    p.add_argument("run", type=Path, metavar="RUN", help="run directory, Score-P experiment or .otf2 file")
    p.add_argument("--all-devices", action="store_true",
                   help="per-rank numbers over idle devices too (GPUs pinned to no rank)")
    p.add_argument("--force", action="store_true", help="rebuild the database even if it is current")
    p.add_argument("--step-region", metavar="NAME",
                   help="region that delimits steps when the trace has no step markers")
    p.add_argument("--db", type=Path, help="database file (default RUN/trace.duckdb)")
    add_all_ranks(p)
    p.set_defaults(command=run)


def device_kinds(devices: Any) -> Any:
    """The devices table of a run with many: a row per kind of device (device, source,
    counted, active) with how many, on how many hosts, their total energy and mean power."""
    return devices.assign(ranked=devices["rank"].notna()).groupby(
        ["device", "source", "counted", "active"], as_index=False, sort=True).agg(
        devices=("device", "size"), hosts=("host", "nunique"), with_rank=("ranked", "sum"),
        samples=("samples", "median"), interval_ms=("interval_ms", "median"), seconds=("seconds", "median"),
        energy_j=("energy_j", "sum"), mean_power_w=("mean_power_w", "mean"))


def _why_none(run_dir: Path) -> str:
    """Why a run of ours has no power, from its run.json."""
    try:
        info = json.loads((run_dir / "run.json").read_text(encoding="utf-8")).get("power") or {}
    except (OSError, ValueError):
        return ""
    if "reason" in info:
        return f" ({info['reason']})"
    reasons = [f"{h}: " + (p.get("reason") or "; ".join(f"{u['source']}: {u['reason']}"
                                                    for u in p.get("unavailable", [])))
               for h, p in (info.get("hosts") or {}).items() if not p.get("sampled")]
    return f" ({' | '.join(reasons)})" if reasons else ""


def run(ns: argparse.Namespace) -> int:
    import pandas as pd

    from analyze import power
    from analyze.errors import AnalyzeError
    from analyze.tables import database

    def read(con: Any) -> tuple[Any, ...] | None:
        if not power.available(con):
            return None
        return (power.devices(con), power.agreement(con), power.per_rank(con, active_only=not ns.all_devices),
                power.notes(con), rank_grouping(con, ns.all_ranks))

    paths, found = database.built(ns.run, read, db=ns.db, force=ns.force, step_region=ns.step_region)
    if found is None:
        raise AnalyzeError(f"{ns.run} has no energy or power samples{_why_none(paths.run_dir)}; "
                           "record a run on a machine with RAPL or an NVIDIA GPU (docs/energy.md)")
    devices, agreement, ranks, notes, (n_ranks, per) = found
    fmt = {"interval_ms": "{:.1f}".format, "seconds": "{:.2f}".format, "energy_j": "{:.1f}".format,
           "mean_power_w": "{:.1f}".format}
    many = not ns.all_ranks and len(devices) > common.MAX_PRINTED_RANKS
    shown = device_kinds(devices) if many else devices.drop(columns=["name"]).copy()
    for col, f in fmt.items():
        shown[col] = shown[col].map(lambda v, f=f: "" if pd.isna(v) else f(v))
    if not many:
        shown["rank"] = shown["rank"].map(lambda v: "host" if pd.isna(v) else str(int(v)))
    print("devices (energy from the first to the last sample; counted: in the totals below):")
    if many:
        print(f"{len(devices):,} devices, a row per kind: how many, total energy, mean power; median "
              "samples, interval and seconds (--all-ranks prints each)")
    print(shown.to_string(index=False))
    if len(agreement):
        a = agreement.copy()
        for col in a.columns[3:]:
            digits = 2 if col.endswith("pct") else 1
            a[col] = a[col].map(lambda v, d=digits: "" if pd.isna(v) else f"{v:.{d}f}")
        print("\ncounter vs integrated power readings (aligned: readings shifted back by their lag):")
        print(a.to_string(index=False))
    which = "all devices" if ns.all_devices else "active devices"
    print(f"\nper rank, over its steps ({which}; host-wide devices shared by the host's ranks):")
    r = ranks.copy() if per == 1 else rank_groups_of(ranks, per).reset_index(drop=True)
    for col in r.columns[2:]:
        r[col] = r[col].map(lambda v: "" if pd.isna(v) else f"{v:.1f}")
    note = grouping_note(n_ranks, per)
    if note:
        print(note)
    print(r.to_string(index=False))
    for note in notes:
        print(f"note: {note}")
    print(f"database: {display(paths.db)}")
    return 0
