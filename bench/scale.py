"""`analyze phases` at scale, side by side: against the `otf2` Python API and Pipit, at 10^8
events, and on the Dask engine with 1 and 2 workers (and what that predicts for 64).

    python -m bench.scale ratios --events 10M --pipit /tmp/pipit
    python -m bench.scale ratios --events 10M --python-events 1M --pipit /tmp/pipit --pipit-events 200k  # quicker
    python -m bench.scale big --events 100M
    python -m bench.scale dask --events 1G --ranks 16 --workers 1,2
    python -m bench.scale verbs --events 100M

``ratios``: OTF2 -> queryable tables, end to end (the build with the local engine and the
summary ``analyze phases`` prints, as it runs them: ``database.built``), against the ``otf2``
package's Python API (our pipeline with the Python reader) and Pipit (``pipit.Trace.from_otf2``,
then its exclusive-time metric, which pairs Enter and Leave as our intervals do; its source
fetched from github.com/hpcgroup/pipit, not vendored), by default all three on the same
synthetic archive. They read about 0.1 M events/s, so ``--python-events`` and ``--pipit-events``
can give them a smaller archive of the same kind for a quicker run; their times are then
extrapolated per event (the table says which numbers are). That flatters us a little: Pipit took
11.7 us per event at 200k events and 11.2 at 10M (112 s; its fixed costs spread over more
events). Pipit reads in a pool of worker processes: its peak RSS is that of its processes
together, sampled every 50 ms (:class:`bench.measure.TreePeak`). A fourth row times the OTF2
library decoding the big archive by itself (our reader's threads with callbacks that only
count): no reader built on the library can be faster, and the ratios it would give if everything
after it were free are printed below the table. The runs go in rounds (``--rounds``), one run
each of the Python API and Pipit per round, and each ratio is taken within a round: the
machine's speed drifts by 10-20% over minutes, more than the runs of one tool differ from each
other back to back. Ours and the decoding take under a second, so one run of them is at the
mercy of a moment's jitter on a shared VM (ours: 0.49-0.75 s back to back on 2026-12-08), which
a minute-long run averages away by itself: per round they run ``--ours-runs`` times (5) back to
back and the round's median run counts; the ratios with the round's first run alone (how
``--ours-runs 1`` and every run before 2026-12-08 measured them) are printed too.
``big``: time and peak memory of one large build. ``dask``: the Dask engine on a local
cluster of 1 and 2 worker processes. For W workers, each stage's work measured with the first
worker count (its tasks' summed seconds) is split into the tasks the build's plan makes for W
workers, in proportion to their events, and scheduled longest first: the prediction is checked
against the other measured worker counts, then computed for 16 and 64 (where the archive's
locations and ranks bound the number of tasks, the longest task bounds the stage). ``verbs``:
time and peak memory of each ``analyze`` verb on the archive, each in its own process. Every
measured run is its own process; the load average is printed with each result (the machine
is shared: repeat runs made under load).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import measure


def child(kind: str, run: str, db: str, extra: str) -> None:
    """One measured run; prints JSON: seconds, events, peak RSS, and what else it knows.
    Our pipeline runs in a process set up as the ``analyze`` command sets up its own
    (:mod:`analyze.heap`); Pipit in a process as Python starts it."""
    out: dict[str, object] = {}
    if kind == "decode":
        out = _decode_only(Path(run) / "traces.otf2")
    elif kind == "pipit":
        import resource

        sys.path.insert(0, extra)
        import pipit

        with measure.TreePeak() as tree:
            t0 = time.perf_counter()
            trace = pipit.Trace.from_otf2(run)
            read = time.perf_counter() - t0
            trace.calc_exc_metrics(["Timestamp (ns)"])
            seconds = time.perf_counter() - t0
        out = {"seconds": seconds, "read_seconds": read, "events": len(trace.events),
               "worker_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
               "tree_rss_mb": tree.mb}
    else:
        from analyze import heap
        from analyze.cli import heap_to_warm

        out["heap_tuned"] = heap.keep_freed_memory()  # first, as the command does it
        # then, as `analyze phases --force RUN` does, the heap faulted in while the imports run
        command = argparse.Namespace(run=Path(run), db=Path(db), force=True,
                                     engine="dask" if kind.startswith("dask") else "local")
        warmed = heap_to_warm(command)
        out["heap_warmed_mb"] = warmed / 2**20
        heap.warm(warmed)
        import duckdb

        from analyze import background, power
        from analyze.cli import phases as phases_cli
        from analyze.tables import database, device_phases, phases

        # imported before the clock starts, phases_cli.read's own imports too
        assert background and power and device_phases and phases

        engine: object = "local"
        if kind.startswith("dask"):
            from analyze.engine.on_dask import DaskEngine

            t0 = time.perf_counter()
            engine = DaskEngine.connect(None, workers=int(kind[4:]))
            out["cluster_start_seconds"] = time.perf_counter() - t0
        reader = "python" if kind == "python" else "native"
        cpu0 = time.process_time()  # every thread of this process
        t0 = time.perf_counter()
        # the build and what `analyze phases` prints, as it runs them
        paths, _ = database.built(run, phases_cli.read, db=db, force=True, reader=reader,
                                  engine=engine)  # type: ignore[arg-type]
        out["seconds"] = time.perf_counter() - t0
        out["cpu_seconds"] = time.process_time() - cpu0
        with duckdb.connect(str(paths.db), read_only=True) as con:
            out["events"] = con.execute("select events from runs").fetchone()[0]  # type: ignore[index]
            info = dict(con.execute("select key, value from build_info").fetchall())
        out["cores"] = len(os.sched_getaffinity(0))
        out["stages"] = json.loads(info["stages"])
        if kind.startswith("dask"):
            out["worker_rss_mb"] = max(engine.peak_rss_mb().values())  # type: ignore[attr-defined]
            engine.close()  # type: ignore[attr-defined]
    out["rss_mb"] = measure.peak_rss_mb()
    out["load"] = measure.load()
    print(json.dumps(out))


def _decode_only(anchor: Path) -> dict[str, object]:
    """The OTF2 library decoding the archive's events by itself, as our reader's threads
    read them (``otf2_native.read``: one per core, the locations in the read stage's buckets),
    with callbacks that only count: what any reader built on the library pays before it makes
    a single row. The definitions are read before the clock starts."""
    from analyze.readers import otf2_native

    defs = otf2_native.definitions(anchor)
    t0 = time.perf_counter()
    _, chunks = otf2_native.read(anchor, defs=defs, decode_only=True)
    events = sum(chunk.events for chunk in chunks)
    return {"seconds": time.perf_counter() - t0, "events": events}


def run_child(kind: str, run_dir: Path, tmp: Path, extra: str = "") -> dict:
    out = measure.run(measure.python("-m", "bench.scale", "--child", kind, str(run_dir),
                                     str(tmp / f"{kind}.duckdb"), extra), timeout=6 * 3600).json()
    print(f"  {kind}: {out['events']:,} events, {out['seconds']:.2f} s, peak RSS {out['rss_mb']:.0f} MB"
          f"{', worker ' + format(out['worker_rss_mb'], '.0f') + ' MB' if 'worker_rss_mb' in out else ''}"
          f"{', all at once ' + format(out['tree_rss_mb'], '.0f') + ' MB' if 'tree_rss_mb' in out else ''}"
          f", load {out['load']}", flush=True)
    return out


def repeated(kind: str, run_dir: Path, repeat: int, tmp: Path, extra: str = "") -> dict:
    """The run with the median time of ``repeat`` runs, with every run's load."""
    return _median_run([run_child(kind, run_dir, tmp, extra) for _ in range(repeat)])


def ratios(ns: argparse.Namespace, tmp: Path) -> None:
    """Ours, the Python API and Pipit in rounds, one run of each per round: this machine's speed
    drifts by 10-20% over minutes, so each ratio is taken between runs of the same round and the
    table shows their median (and range) over the rounds."""
    from bench import synth

    big, n = synth.cached(ns.events, ns.ranks, ns.cache)
    others = [("otf2 Python API", "python", ns.python_events or ns.events, "")]
    if ns.pipit:
        others.append(("Pipit", "pipit", ns.pipit_events or ns.events, ns.pipit))
    inputs = {kind: synth.cached(events, ns.ranks, ns.cache) for _, kind, events, _ in others}
    runs: dict[str, list[dict]] = {"ours": [], "first": [], "decode": [], **{kind: [] for _, kind, _, _ in others}}
    for _ in range(ns.rounds):
        # ours and the decoding, sub-second, back to back: the round's median run stands for them
        mine = [run_child("ours", big, tmp) for _ in range(ns.ours_runs)]
        runs["ours"].append(_median_run(mine))
        runs["first"].append(mine[0])
        runs["decode"].append(_median_run([run_child("decode", big, tmp) for _ in range(ns.ours_runs)]))
        for _, kind, _, extra in others:
            runs[kind].append(run_child(kind, inputs[kind][0], tmp, extra))
    ours = _median_run(runs["ours"], ns.ours_runs)
    rows: list[list[object]] = [["analyze phases (native, local)", f"{n:,}", ours["runs"], ours["seconds"],
                                 n / ours["seconds"] / 1e6, ours["rss_mb"], "", "", "measured", ours["loads"]]]
    floor = _median_run(runs["decode"], ns.ours_runs)
    rows.append(["OTF2 library decoding alone (no rows)", f"{n:,}", floor["runs"], floor["seconds"],
                 n / floor["seconds"] / 1e6, floor["rss_mb"], "", "", "measured", floor["loads"]])
    firsts = []
    ceilings = []
    for label, kind, _, _ in others:
        m = inputs[kind][1]
        out = _median_run(runs[kind])
        # per round: their time per event over ours
        slower = sorted((r["seconds"] / m) / (o["seconds"] / n) for r, o in zip(runs[kind], runs["ours"], strict=True))
        ratio, spread = statistics.median(slower), f"{slower[0]:.1f}-{slower[-1]:.1f}"
        seconds = out["seconds"] / m * n
        rss = _peak_of_all(out)
        rows.append([label, f"{m:,}", out["runs"], out["seconds"], m / out["seconds"] / 1e6, rss, ratio, spread,
                     "measured", out["loads"]])
        ceilings.append((label, statistics.median((r["seconds"] / m) / (d["seconds"] / n)
                                                  for r, d in zip(runs[kind], runs["decode"], strict=True))))
        firsts.append((label, statistics.median((r["seconds"] / m) / (o["seconds"] / n)
                                                for r, o in zip(runs[kind], runs["first"], strict=True))))
        if m != n:
            rows.append([f"{label}, extrapolated", f"{n:,}", "", seconds, n / seconds / 1e6,
                         rss / m * n, ratio, spread, "per event from the line above", ""])
    print(measure.table(["tool", "events", "runs", "s (median)", "M ev/s", "peak RSS MB", "x ours (per event)",
                         "x ours per round", "how", "load (1/5 min) per run"], rows))
    print("The most any reader on the OTF2 library could reach here, if everything after its decoding "
          "were free (their time over the decoding's, per round, median): "
          + ", ".join(f"{x:.0f}x {label}" for label, x in ceilings))
    if ns.ours_runs > 1:
        print(f"Ours with one run per round (the round's first of {ns.ours_runs}), as --ours-runs 1 measures it: "
              + ", ".join(f"{x:.1f}x {label}" for label, x in firsts))
    stages(ours["stages"], ours)


def _peak_of_all(out: dict) -> float:
    """A run's peak memory with its worker processes: the sampled peak of their sum, or any one
    process's own peak where that is larger (a spike between samples)."""
    return max(out["rss_mb"], out.get("worker_rss_mb", 0), out.get("tree_rss_mb", 0))


def _median_run(runs: list[dict], each: int = 1) -> dict:
    """The run with the median time, with every run's load (``each``: runs that each of
    ``runs`` stands for, itself a median)."""
    ordered = sorted(runs, key=lambda r: r["seconds"])
    out = dict(ordered[len(ordered) // 2])
    out["loads"] = " ".join(r["load"] for r in runs)
    out["runs"] = len(runs) if each == 1 else f"{len(runs)}x{each}"
    return out


def stages(times: list[dict], run: dict | None = None) -> None:
    """The stages' times; given the whole run, also the time outside them (the driver: the
    definitions, the database, the views, reopening it for the summary) and the CPU time of
    every thread, which bounds the wall time from below on this machine's cores."""
    rows = [[t["label"], t["tasks"], t["wall"], t["busy"], t["longest"]] for t in times]
    if run is not None:
        rows.append(["outside the stages (driver)", "", run["seconds"] - sum(t["wall"] for t in times), "", ""])
    print(measure.table(["stage", "tasks", "wall s", "tasks' summed s", "longest task s"], rows))
    if run is not None and "cpu_seconds" in run:
        cpu, cores = run["cpu_seconds"], run["cores"]
        print(f"CPU time of the run (every thread): {cpu:.2f} s; on {cores} cores no schedule of it takes "
              f"less than {cpu / cores:.2f} s (wall {run['seconds']:.2f} s)")


def big(ns: argparse.Namespace, tmp: Path) -> None:
    from bench import synth

    run_dir, n = synth.cached(ns.events, ns.ranks, ns.cache)
    out = repeated("ours", run_dir, ns.repeat, tmp)
    print(measure.table(["events", "runs", "s", "M ev/s", "peak RSS MB", "load (1/5 min) per run"],
                        [[f"{n:,}", out["runs"], out["seconds"], n / out["seconds"] / 1e6, out["rss_mb"],
                          out["loads"]]]))
    stages(out["stages"], out)


VERBS = ["phases", "causes", "critical-path", "overlap", "balance", "patterns", "diff", "report", "export"]


def verbs(ns: argparse.Namespace, tmp: Path) -> None:
    """Each verb on a copy of the archive, in a process as a user runs it: `analyze phases`
    builds the tables, `analyze causes` fills the cause tables, the others read them."""
    import shutil

    from bench import synth

    run_dir, n = synth.cached(ns.events, ns.ranks, ns.cache)
    run = tmp / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("trace.duckdb*", "tables", ".builds"))
    extra = {"diff": [str(run)], "report": ["-o", str(tmp / "report.pdf")],
             "export": ["-o", str(tmp / "export.json.gz")]}
    rows = []
    for verb in ns.verbs.split(","):
        if verb not in VERBS:
            raise SystemExit(f"--verbs: no verb {verb!r}; choose from {', '.join(VERBS)}")
        with measure.TreePeak() as peak:
            got = measure.run(measure.python("-m", "analyze.cli", verb, str(run), *extra.get(verb, [])))
        rows.append([verb, got.wall_s, peak.mb, measure.load()])
        print(f"  {verb}: {got.wall_s:.1f} s, {peak.mb:,.0f} MB", flush=True)
    print(f"{n:,} events, {ns.ranks} ranks (diff compares the run with itself; export writes one merged .json.gz)")
    print(measure.table(["verb", "s", "peak RSS MB", "load (1/5 min)"], rows))


def task_shares(defs, workers: int) -> list[list[float]]:  # type: ignore[no-untyped-def]
    """Each stage's tasks for ``workers`` workers, as shares of the stage's work, in the order
    the build runs the stages (read, prepare, match, finish): the plan the build would make
    (analyze/tables/stages.plan), each task's share in events (the read buckets' own, a
    group's its ranks' locations'; the shuffle's buckets equal)."""
    from analyze.tables import stages as build_stages

    plan = build_stages.plan(defs, "native", workers)
    total = max(1, sum(plan.read_events))
    by_rank: dict[int, int] = {}
    for loc in defs.locations:
        by_rank[loc.rank] = by_rank.get(loc.rank, 0) + loc.events
    groups = [sum(by_rank.get(r, 0) for r in ranks) / total for _, ranks in plan.groups]
    return [[e / total for e in plan.read_events], groups, [1 / plan.buckets] * plan.buckets, groups]


def makespan(tasks: list[float], workers: int) -> float:
    """Longest-first onto the least loaded worker (what a scheduler with free workers does)."""
    load = [0.0] * max(1, workers)
    for t in sorted(tasks, reverse=True):
        load[load.index(min(load))] += t
    return max(load)


def predicted(times: list[dict], measured: int, workers: int, defs) -> float:  # type: ignore[no-untyped-def]
    """Stage times for ``workers`` workers from those measured with ``measured``: each stage's
    work (the tasks' summed seconds) split as the plan for that many workers splits it and
    scheduled on them, plus the stage's fixed cost (its measured wall time beyond its
    scheduled tasks: handing tasks out, starting them)."""
    total = 0.0
    for t, then, now in zip(times, task_shares(defs, measured), task_shares(defs, workers), strict=True):
        fixed = max(0.0, t["wall"] - makespan([t["busy"] * share for share in then], measured))
        total += fixed + makespan([t["busy"] * share for share in now], workers)
    return total


def dask(ns: argparse.Namespace, tmp: Path) -> None:
    from analyze.readers import dispatch
    from bench import synth

    run_dir, n = synth.cached(ns.events, ns.ranks, ns.cache, shared=ns.shared)
    _, defs = dispatch.definitions(run_dir / "traces.otf2", "native")
    counts = [int(w) for w in ns.workers.split(",")]
    results = {w: repeated(f"dask{w}", run_dir, ns.repeat, tmp) for w in counts}
    one = results[counts[0]]  # the costs every prediction starts from
    rows: list[list[object]] = []
    for w in counts:
        r = results[w]
        staged = sum(t["wall"] for t in r["stages"])
        rows.append([w, f"{n:,}", r["runs"], r["seconds"], n / r["seconds"] / 1e6, one["seconds"] / r["seconds"],
                     staged, predicted(one["stages"], counts[0], w, defs) + (r["seconds"] - staged),
                     r["worker_rss_mb"], r["rss_mb"], r["cluster_start_seconds"], r["loads"]])
    print(measure.table(["workers", "events", "runs", "s", "M ev/s", "speedup", "stages s",
                         "predicted s", "worker peak RSS MB", "driver peak RSS MB", "cluster start s",
                         "load (1/5 min) per run"], rows))
    driver = one["seconds"] - sum(t["wall"] for t in one["stages"])
    print(f"per-stage costs measured with {counts[0]} worker(s):")
    stages(one["stages"])
    for w in (16, 64):
        p = predicted(one["stages"], counts[0], w, defs) + driver
        tasks = [len(shares) for shares in task_shares(defs, w)]
        print(f"predicted with {w} workers: {p:.1f} s ({n / p / 1e6:.1f} M events/s): each stage's summed "
              f"task seconds split into the {'/'.join(map(str, tasks))} tasks the plan makes for {w} workers "
              f"(in proportion to their events) and scheduled longest first, plus each stage's fixed cost, "
              f"+ {driver:.1f} s outside the stages (driver, definitions, views); {len(defs.locations)} "
              f"locations and {len({loc.rank for loc in defs.locations})} ranks bound the tasks")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--child"]:  # a measured run: it sets its process up before any import
        child(*args[1:5])
        return 0
    from bench import synth  # numpy

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", nargs="?", choices=("ratios", "big", "dask", "verbs"))
    p.add_argument("--events", type=synth.parse_count, default=synth.parse_count("10M"))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--shared", action="store_true", help="dask: ranks share one record stream (bench.synth)")
    p.add_argument("--repeat", type=int, default=2, help="big, dask: runs of ours (median shown)")
    p.add_argument("--rounds", type=int, default=3,
                   help="ratios: rounds of one run each of ours, the Python API and Pipit (medians shown)")
    p.add_argument("--ours-runs", type=int, default=5,
                   help="ratios: runs of ours and of the decoding per round, back to back (the round's median "
                        "counts: one sub-second run varies by 20-40%% on a shared VM, a minute-long one less)")
    p.add_argument("--python-events", type=synth.parse_count,
                   help="ratios: the Python API's archive (default: --events), extrapolated per event")
    p.add_argument("--pipit", help="directory holding Pipit's source (the pipit package)")
    p.add_argument("--pipit-events", type=synth.parse_count,
                   help="ratios: Pipit's archive (default: --events), extrapolated per event")
    p.add_argument("--workers", default="1,2", help="dask: worker counts")
    p.add_argument("--verbs", default=",".join(VERBS), help="verbs: which, in order (phases first builds)")
    synth.add_cache_option(p)
    ns = p.parse_args(args)
    if ns.what is None:
        p.error("say what to measure: ratios, big, dask or verbs")
    if ns.pipit and not (Path(ns.pipit) / "pipit" / "__init__.py").is_file():
        p.error(f"--pipit {ns.pipit}: no pipit package there; give the directory of a clone of "
                "github.com/hpcgroup/pipit (the one holding its pipit/ folder)")
    measure.stop_children_on_sigterm()
    print(measure.machine())
    with tempfile.TemporaryDirectory(prefix="bench-scale-", dir=os.environ.get("DLTRACE_BENCH_TMP")) as tmp:
        {"ratios": ratios, "big": big, "dask": dask, "verbs": verbs}[ns.what](ns, Path(tmp))
    print(f"load avg at the end: {measure.load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
