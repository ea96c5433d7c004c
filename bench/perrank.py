"""Per-rank writing against the merge: the end step's time, each rank's own cost, a flush.

    python -m bench.perrank --events 1M,10M --ranks 8 --repeat 3

For each size, the same spill files (bench.merge's synthetic steps, ``--ranks`` ranks) are
turned into ``traces.otf2`` both ways, each in a fresh copy and in its own process:

- ``merged``: the end step reads every rank's records, replays them and writes the archive
  (instrument/tracer/merge.py + the native writer): what ``DLTRACE_TRACE_WRITING=merged`` does;
- ``per-rank``: each rank converts its own records into its event files at finalize
  (instrument/tracer/perrank.write_rank; ranks do this in parallel, so the table shows the
  slowest rank), then the end step writes only the definitions and links the files
  (perrank.assemble).

The ratio is the end step's time merged / per-rank. Then the cost of one flush of the tracer
(the metadata rewrite and the append of the buffered records to the spill file), by the number
of records flushed, and what the default interval (0.5 s, two flushes a second) costs a rank.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from bench import measure, synth
from bench.merge import write_spills


def child(spills: str, path: str) -> None:
    """One measured end step (and, per rank, the ranks' own conversion) on a copy; prints JSON."""
    from instrument.tracer import merge, perrank
    from instrument.tracer.spill import ranks_present
    from traceio.otf2_writer import write_archive

    with tempfile.TemporaryDirectory(prefix="bench-perrank-", dir=Path(spills).parent) as tmp:
        run = Path(tmp)
        shutil.copytree(Path(spills) / "ranks", run / "ranks")
        rank_s: list[float] = []
        if path == "per-rank":
            for rank in ranks_present(run / "ranks"):
                t0 = time.perf_counter()
                perrank.write_rank(run / "ranks", rank)
                rank_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            result, _ = perrank.assemble(run)
        else:
            t0 = time.perf_counter()
            result = merge.collect(run)
            write_archive(result.spec, run, writer="native")
        end_s = time.perf_counter() - t0
    print(json.dumps({"end_s": end_s, "rank_max_s": max(rank_s, default=0.0), "rank_sum_s": sum(rank_s),
                      "events": result.events, "rss_mb": measure.peak_rss_mb()}))


def end_step(events: int, ranks: int, repeat: int, root: Path) -> list[list[object]]:
    spills = root / f"spills-{events}-{ranks}"
    if not (spills / "done").exists():
        shutil.rmtree(spills, ignore_errors=True)
        write_spills(spills, events, ranks)
        (spills / "done").write_text("")
    paths = ["merged", "per-rank"]
    results: dict[str, list[dict]] = {p: [] for p in paths}
    for i in range(repeat):
        for path in paths if i % 2 == 0 else paths[::-1]:
            out = measure.run(measure.python("-m", "bench.perrank", "--child", str(spills), path)).json()
            results[path].append(out)
            print(f"  {out['events']:,} events, {path}: end step {out['end_s']:.3f} s"
                  + (f", slowest rank {out['rank_max_s']:.3f} s" if path == "per-rank" else ""), flush=True)
    m, p = (measure.median([r["end_s"] for r in results[k]]) for k in paths)
    n = results["merged"][0]["events"]
    return [[f"{n:,}", ranks, "merged", m, "", max(r["rss_mb"] for r in results["merged"]), ""],
            [f"{n:,}", ranks, "per-rank", p, measure.median([r["rank_max_s"] for r in results["per-rank"]]),
             max(r["rss_mb"] for r in results["per-rank"]), m / p]]


def flush_cost(repeat: int = 200) -> list[list[object]]:
    """Median wall time of one flush of the tracer's buffer, by records flushed."""
    from instrument.tracer.builtin import Tracer
    from traceio.records import Kind

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-flush-") as tmp:
        tracer = Tracer(0, 1, Path(tmp), capacity=1 << 17, flush_interval_s=None)
        for i in range(200):  # a realistic definition table for the metadata rewrite
            tracer.region_id(f"torch.nn.modules.layer{i}.forward")
        for n in (1, 1_000, 10_000, 100_000):
            times = []
            for _ in range(max(5, repeat // max(1, n // 1000))):
                for k in range(n):
                    tracer.buffer.append(k, Kind.ENTER, region=1)
                t0 = time.perf_counter()
                tracer.buffer.flush()
                times.append(time.perf_counter() - t0)
            per = measure.median(times)
            rows.append([f"{n:,}", per * 1e6, per * 1e9 / n, 2 * per * 100])
        tracer.finalize("ok")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", default="1M", help="sizes, comma-separated (1M,10M)")
    p.add_argument("--ranks", type=int, default=8)
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
        rows += end_step(synth.parse_count(size), ns.ranks, ns.repeat, ns.cache)
    print(measure.table(["events", "ranks", "writing", "end step s", "slowest rank s", "peak RSS MB",
                         "end step merged/per-rank"], rows))
    print(measure.table(["records flushed", "flush us", "ns/record", "% of a core at 0.5 s"], flush_cost()))
    print(f"load avg at the end: {measure.load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
