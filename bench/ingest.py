"""OTF2 -> tables: the native reader against the ``otf2`` package's Python API, end to end.

    python -m bench.ingest --events 1M --repeat 5                      # both readers, ratio
    python -m bench.ingest --events 10M,100M --readers native --repeat 3

The stages are measured each in its own process, on the same synthetic archive
(``bench.synth``, cached under ~/.cache/dltrace/bench), the readers taking turns:

- ``read``: OTF2 -> the reader's column chunks in memory (``analyze.readers.dispatch.read``), no DuckDB;
- ``ingest``: OTF2 -> Parquet tables: decoding, interval building and writing the rows (the
  intervals table, with exclusive times, and the raw collective and message rows); the first
  stage of ``analyze.tables.database.build`` (its read tasks on the local engine), alone;
- ``build``: ``analyze phases`` end to end on a fresh database (``analyze.tables.database.build``
  with ``force=True``, then the phase summary): ingest, then the SQL and vectorized steps that
  match collectives and messages and derive steps and phases;
- ``causes``: the same with the cause tables too (overlap, delays, critical path, balance:
  what ``analyze causes`` and the report build), so the two columns side by side give their cost.

Reported per archive and reader, as medians: seconds, events per second and the peak RSS of
each stage. Nothing is extrapolated: a reader is only reported on archives it actually read.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench import measure, synth

STAGES = ("read", "ingest", "build", "causes")


def child(stage: str, run: str, reader: str, db: str) -> None:
    """One measured stage; prints JSON with its time, events and peak RSS."""
    import duckdb

    from analyze.readers import dispatch
    from analyze.tables import database, phases

    t0 = time.perf_counter()
    if stage == "read":
        used, _, chunks = dispatch.read(database.resolve(run, db).anchor, 500_000, reader)
        events = sum(c.events for c in chunks)
    elif stage == "ingest":
        # database.build's first stage alone (its stage functions: no public entry point needed)
        from analyze.engine.local import LocalEngine
        from analyze.tables import stages

        used, defs = dispatch.definitions(database.resolve(run, db).anchor, reader)
        engine = LocalEngine()
        plan = stages.plan(defs, used, engine.workers)
        main_locations, main_regions, step_regions = stages.main_of(defs)
        with tempfile.TemporaryDirectory(prefix="bench-ingest-", dir=Path(db).parent) as root:
            spec = stages.Spec(str(database.resolve(run, db).anchor), root, used, defs.global_offset,
                               defs.resolution, plan.buckets, main_locations=main_locations,
                               main_regions=main_regions, step_regions=step_regions,
                               group_starts=plan.group_starts)
            stages.prepare_directories(spec)
            events = sum(s.stats.events for s in engine.run("read", stages.read, plan.read, spec))
            stages.release(root)
    else:
        paths = database.build(run, db=db, force=True, reader=reader, causes=stage == "causes")
        with duckdb.connect(str(paths.db), read_only=True) as con:
            phases.summary(con)
            events, used = con.execute("select events, reader from runs").fetchone()
    print(json.dumps({"seconds": time.perf_counter() - t0, "events": events, "reader": used,
                      "rss_mb": measure.peak_rss_mb()}))


def bench(events: int, readers: list[str], repeat: int, ranks: int, cache: Path) -> list[list[object]]:
    run_dir, n = synth.cached(events, ranks, cache)
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        for i in range(repeat):
            for reader in readers if i % 2 == 0 else readers[::-1]:  # alternate who goes first
                for stage in STAGES:
                    out = measure.run(measure.python("-m", "bench.ingest", "--child", stage, str(run_dir),
                                                     reader, str(Path(tmp) / f"{reader}.duckdb"))).json()
                    assert out["reader"] == reader and out["events"] == n, out
                    results.setdefault((reader, stage), []).append(out)
                    print(f"  {n:,} events, {reader} {stage}: {out['seconds']:.2f} s, "
                          f"peak RSS {out['rss_mb']:.0f} MB", flush=True)
    rows: list[list[object]] = []
    for reader in readers:
        row: list[object] = [f"{n:,}", reader, repeat]
        for stage in STAGES:
            runs = results[(reader, stage)]
            seconds = measure.median([r["seconds"] for r in runs])
            row += [seconds, n / seconds / 1e6, max(r["rss_mb"] for r in runs)]
        rows.append(row)
    if len(rows) == 2 and {"native", "python"} == set(readers):
        nat, py = rows[readers.index("native")], rows[readers.index("python")]
        ratio: list[object] = [f"{n:,}", "python/native", ""]
        for k in range(len(STAGES)):
            ratio += [py[3 + 3 * k] / nat[3 + 3 * k], "", ""]  # type: ignore[operator]
        rows.append(ratio)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", default="1M", help="archive sizes, comma-separated (1M,10M,100M)")
    p.add_argument("--readers", default="native,python", help="native, python or both (default)")
    p.add_argument("--repeat", type=int, default=3, help="runs per reader and size (alternating)")
    p.add_argument("--ranks", type=int, default=2)
    synth.add_cache_option(p)
    p.add_argument("--child", nargs=4, metavar=("STAGE", "RUN", "READER", "DB"), help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.child:
        child(*ns.child)
        return 0
    measure.stop_children_on_sigterm()
    print(measure.machine())
    rows: list[list[object]] = []
    for size in ns.events.split(","):
        rows += bench(synth.parse_count(size), ns.readers.split(","), ns.repeat, ns.ranks, ns.cache)
    print(measure.table(["events", "reader", "runs"] + [f"{stage} {what}" for stage in STAGES
                                                         for what in ("s", "Mev/s", "RSS MB")], rows))
    print(f"load avg at the end: {measure.load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
