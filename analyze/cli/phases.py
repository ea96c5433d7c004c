"""``analyze phases RUN``: build the run's tables and print its phase breakdown per rank."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from analyze.cli.common import add_all_ranks, display, grouping_note, rank_grouping, rank_groups_of

ENGINES = ("local", "dask")  # analyze.engine.choose.ENGINES, without loading the engines


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "phases", help="per rank and step: compute, allreduce, other communication and idle time",
        description="Read RUN's OTF2 archive (ours or Score-P's), or a directory of per-rank Kineto "
        "(torch.profiler) JSON files, into Parquet tables under RUN/tables and the database "
        "RUN/trace.duckdb, and print the phase breakdown per rank (and on the accelerators, where "
        "the trace has device streams).")
    p.add_argument("run", type=Path, metavar="RUN", help="run directory, Score-P experiment, .otf2 file or directory of Kineto files")
    p.add_argument("--force", action="store_true", help="rebuild the database even if it is current")
    p.add_argument("--step-region", metavar="NAME",
                   help="region that delimits steps when the trace has no step markers")
    p.add_argument("--patterns", type=Path, metavar="FILE.toml",
                   help="name patterns tried before the defaults (format: docs/frameworks.md; "
                        "analyze patterns RUN shows what each region got)")
    p.add_argument("--db", type=Path, help="database file (default RUN/trace.duckdb)")
    p.add_argument("--engine", choices=ENGINES, default="local",
                   help="where the work runs: threads of this process (local, the default) or a "
                   "Dask cluster (dask; docs/scale.md)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="with --engine dask: a scheduler address (tcp://host:8786) or scheduler "
                   "file; 'slurm' to start workers as Slurm jobs (dask-jobqueue), 'mpi' inside "
                   "mpirun (dask-mpi); default: a cluster on this machine's cores")
    p.add_argument("--workers", type=int, metavar="N",
                   help="worker threads (local) or processes (dask's own cluster, slurm); "
                   "default: one per core")
    add_all_ranks(p)
    p.set_defaults(command=run)


def read(con: Any, all_ranks: bool = True) -> tuple[Any, ...]:
    """What ``analyze phases`` prints, from a run's database: per rank, or without
    ``all_ranks`` above ``MAX_PRINTED_RANKS`` ranks per group of consecutive ranks (the
    tables' first column is then ``ranks``, a label; the energy stays per rank)."""
    from analyze import background, power
    from analyze.tables import device_phases, phases
    ranks, per = rank_grouping(con, all_ranks)
    table = phases.summary(con, per)
    source = con.execute("SELECT value FROM build_info WHERE key = 'step_source'").fetchone()
    horovod = background.summary(con) if background.available(con) else None
    energy = power.per_rank(con) if power.available(con) else None
    device = device_phases.summary(con, per)
    notes = dict(con.execute("SELECT key, value FROM build_info WHERE list_contains(?, key)",
                             [list(PRINTED_NOTES)]).fetchall())
    return table, source, horovod, energy, device, notes, (ranks, per)


# what the build noted that the summary says: how ranks were numbered (Kineto files), gloo
# collectives imported without the shapes their bytes come from
PRINTED_NOTES = ("ranks_from", "gloo_collectives_without_shapes")


def run(ns: argparse.Namespace) -> int:
    from analyze import power
    from analyze.engine import Engine, make
    from analyze.errors import AnalyzeError
    from analyze.tables import database

    if ns.workers is not None and ns.workers < 1:
        raise AnalyzeError(f"--workers must be at least 1, not {ns.workers}")

    def engine() -> Engine:
        return make(ns.engine, workers=ns.workers, scheduler=ns.scheduler)

    def reader(con: Any) -> tuple[Any, ...]:
        return read(con, ns.all_ranks)

    options = {"db": ns.db, "force": ns.force, "step_region": ns.step_region, "patterns": ns.patterns}
    if ns.scheduler == "mpi":
        # every rank but one becomes the cluster here, before anything else happens
        ready = engine()
        try:
            paths, (table, source, horovod, energy, device, notes, (ranks, per_group)) = database.built(
                ns.run, reader, engine=ready, **options)
        finally:
            ready.close()
    else:  # made only if the tables need building
        paths, (table, source, horovod, energy, device, notes, (ranks, per_group)) = database.built(
            ns.run, reader, engine=engine, **options)
    if energy is not None and len(energy):  # the trace has power: energy columns too
        if per_group == 1:
            per, key = energy.set_index("rank"), table["rank"]
        else:  # a group's mean energy per step and power, on the row of the group of its first rank
            per = rank_groups_of(energy, per_group)
            key = table["ranks"].str.split("-").str[0].astype(int) // per_group
        table["step_J"] = key.map(per["step_j"]).round(2)
        table["W"] = key.map(per["power_w"]).round(1)
    note = grouping_note(ranks, per_group)
    if note:
        print(note)
    print(table.to_string(index=False, na_rep="0.0"))
    if energy is not None and len(energy):
        split = {p: energy[f"{p}_j"].sum() for p in power.PHASE_COLUMNS}
        total = sum(split.values()) or float("nan")
        print("energy by phase (active devices, all ranks): " + ", ".join(
            f"{p} {100 * j / total:.1f}%" for p, j in split.items() if j) + " (analyze energy RUN for devices)")
    if not device.empty:
        print("\nOn the accelerators (union of each rank's streams; docs/gpu.md):")
        print(device.to_string(index=False, na_rep="0.0"))
        print("host_wait%: the main thread in a wait (cudaStreamSynchronize and the like); the hosts' phases above "
              "count a wait for the device as compute")
    if notes.get("ranks_from", "").startswith("file order"):
        print(f"ranks: {notes['ranks_from']}")
    if "gloo_collectives_without_shapes" in notes:
        print(f"bytes: {notes['gloo_collectives_without_shapes']} gloo collectives have none: torch.profiler "
              "recorded no shapes (profile with record_shapes=True to get them)")
    if horovod is not None and not horovod.empty:
        print("\nHorovod's background thread (its timeline; overlapping activities, see docs/horovod.md):")
        print(horovod.to_string(index=False, na_rep="-"))
    if source and source[0] == "whole_run":
        print("steps: no step markers found; each rank's whole trace is one step "
              "(use --step-region NAME to split it)")
    print(f"database: {display(paths.db)}")
    print(f"tables:   {display(paths.tables)}/<table>/ (Parquet)")
    return 0
