"""Merge and write our own traces: per-rank spill files -> one OTF2 archive.

    python -m bench.merge --events 200k --paths native,python --repeat 3   # ratio
    python -m bench.merge --events 10M --paths native --repeat 3

The spill files hold what the built-in tracer records for ``bench.synth``'s steps (Enter,
Leave and COLL_END records on the main thread, ASYNC_COLL records for the bucket
allreduces). Each run is ``instrument.tracer.merge.collect`` plus ``write_archive`` in its own
process: ``native`` with the extension (C replay, lanes and OTF2 writer), ``python`` as
without it (the extension hidden: Python loops and the ``otf2`` package's writer). Reported
as medians: events written per second of the whole merge, and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import measure, synth
from instrument.tracer.spill import SpillWriter
from traceio.records import NO_LOC, Kind

BLOCK_STEPS = 50_000


def tracer_templates() -> tuple[np.ndarray, np.ndarray]:
    """One step as the tracer records it: main-thread records without the collective begins
    (the merge adds them), and the lane's collectives as ASYNC_COLL records."""
    main, lane = synth.templates(20, 4)
    main = main[main["kind"] != Kind.COLL_BEGIN]
    enters = lane[lane["kind"] == Kind.ENTER]
    ends = lane[lane["kind"] == Kind.COLL_END]
    asyncs = ends.copy()
    asyncs["time"], asyncs["aux"], asyncs["region"] = enters["time"], ends["time"], enters["region"]
    asyncs["kind"], asyncs["loc"] = Kind.ASYNC_COLL, NO_LOC
    return main, asyncs


def write_spills(run_dir: Path, events: int, ranks: int = 2) -> int:
    """Per-rank spill files of about ``events`` records in ``run_dir/ranks``; returns records."""
    main, asyncs = tracer_templates()
    step = np.concatenate([main, asyncs])
    step = step[np.argsort(step["time"], kind="stable")]
    steps = max(1, -(-events // (ranks * len(step))))
    regions = [{"name": n, "role": str(r)} for n, r in synth.regions(20)]
    for rank in range(ranks):
        writer = SpillWriter(run_dir / "ranks", rank)
        start = synth.T0 + rank * 7 * synth.US
        for s0 in range(0, steps, BLOCK_STEPS):
            s1 = min(steps, s0 + BLOCK_STEPS)
            block = np.repeat(step[None, :], s1 - s0, axis=0)
            shift = start + np.arange(s0, s1, dtype=np.int64)[:, None] * synth.STEP_NS
            block["time"] += shift
            block["aux"] += np.where(block["kind"] == Kind.ASYNC_COLL, shift, 0)
            writer.append(block.reshape(-1).tobytes())
        writer.write_meta({"rank": rank, "world_size": ranks, "host": "synth-host", "status": "ok",
                           "regions": regions, "comms": [{"name": "WORLD", "members": list(range(ranks))}],
                           "threads": ["main thread"], "thread_kinds": ["main"], "clock_samples": [],
                           "start_realtime_ns": 1_700_000_000 * 10**9})
        writer.close()
    return steps * ranks * len(step)


def child(spills: str, path: str) -> None:
    """One measured merge of a copy of ``spills``; prints JSON."""
    from instrument.tracer import merge
    from traceio import codec
    from traceio.otf2_writer import write_archive

    if path == "python":
        codec._native = None  # as if not built: merge and writer take their Python paths

    with tempfile.TemporaryDirectory(prefix="bench-merge-", dir=Path(spills).parent) as tmp:
        run = Path(tmp)
        shutil.copytree(Path(spills) / "ranks", run / "ranks")
        t0 = time.perf_counter()
        result = merge.collect(run)
        t1 = time.perf_counter()
        write_archive(result.spec, run, writer=path)
        t2 = time.perf_counter()
    print(json.dumps({"collect_s": t1 - t0, "write_s": t2 - t1, "events": result.events,
                      "rss_mb": measure.peak_rss_mb()}))


def bench(events: int, paths: list[str], repeat: int, root: Path) -> list[list[object]]:
    spills = root / f"spills-{events}"
    if not (spills / "done").exists():
        shutil.rmtree(spills, ignore_errors=True)
        write_spills(spills, events)
        (spills / "done").write_text("")
    results: dict[str, list[dict]] = {p: [] for p in paths}
    for i in range(repeat):
        for path in paths if i % 2 == 0 else paths[::-1]:
            out = measure.run(measure.python("-m", "bench.merge", "--child", str(spills), path)).json()
            results[path].append(out)
            print(f"  {out['events']:,} events, {path}: collect {out['collect_s']:.2f} s, "
                  f"write {out['write_s']:.2f} s, peak RSS {out['rss_mb']:.0f} MB", flush=True)
    rows = []
    for path, runs in results.items():
        n = runs[0]["events"]
        total = measure.median([r["collect_s"] + r["write_s"] for r in runs])
        rows.append([f"{n:,}", path, len(runs), measure.median([r["collect_s"] for r in runs]),
                     measure.median([r["write_s"] for r in runs]), total, n / total / 1e6,
                     max(r["rss_mb"] for r in runs)])
    if "native" in results and "python" in results:
        nat, py = rows[paths.index("native")], rows[paths.index("python")]
        rows.append(["", "python/native", "", "", "", py[5] / nat[5], "", ""])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", default="200k", help="sizes, comma-separated (200k,10M)")
    p.add_argument("--paths", default="native,python", help="native, python or both (default)")
    p.add_argument("--repeat", type=int, default=3)
    synth.add_cache_option(p)
    p.add_argument("--child", nargs=2, metavar=("SPILLS", "PATH"), help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.child:
        child(*ns.child)
        return 0
    measure.stop_children_on_sigterm()
    print(measure.machine())
    rows: list[list[object]] = []
    for size in ns.events.split(","):
        rows += bench(synth.parse_count(size), ns.paths.split(","), ns.repeat, ns.cache)
    print(measure.table(["events", "path", "runs", "collect s", "write s", "total s", "Mev/s",
                         "peak RSS MB"], rows))
    print(f"load avg at the end: {measure.load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
