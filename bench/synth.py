"""Synthetic OTF2 archives of a given size, written by our own writer, for the benchmarks.

    python -m bench.synth --events 10M --out /tmp/synth-10M

A trace looks like a DDP run recorded by the built-in tracer: on each rank's main thread
every step has data loading, a forward pass and a backward pass with ``ops`` nested operator
regions each, a wait for the gradient buckets, a blocking allreduce (Enter,
MpiCollectiveBegin, MpiCollectiveEnd, Leave) and the optimizer; the bucket allreduces run on a
communication lane. Ranks after the first start a little late (so collectives have waiting
time) and carry two ClockOffset records each (so readers interpolate). Records live in
memory-mapped temporary files while the archive is written, so 100M events need disk, not
5 GB of RAM.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from traceio.archive import ArchiveSpec, LocationSpec, RankSpec
from traceio.otf2_writer import write_archive
from traceio.records import EVENT_DTYPE, Kind, Op, Role

US = 1_000
T0 = 10**12  # rank clocks look like CLOCK_MONOTONIC on a machine up for a while
STEP_NS = 2_000 * US
BLOCK_STEPS = 50_000  # steps generated per block (bounds the temporary memory)
CACHE = Path.home() / ".cache" / "dltrace" / "bench"  # generated inputs kept between benchmark runs


def parse_count(text: str) -> int:
    """``10M`` -> 10_000_000 (also k and G)."""
    scale = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def regions(ops: int) -> list[tuple[str, str]]:
    return [("dltrace.step", Role.FUNCTION), ("dltrace.dataloader", Role.FUNCTION),
            ("dltrace.forward", Role.FUNCTION), ("dltrace.backward", Role.FUNCTION),
            ("ddp.wait_for_buckets", Role.WAIT), ("torch.distributed.all_reduce", Role.COLL_ALL2ALL),
            ("dltrace.optimizer", Role.FUNCTION)] + [(f"aten::op{i}", Role.FUNCTION) for i in range(ops)]


STEP, DATA, FWD, BWD, WAIT, ALLREDUCE, OPT, OP0 = range(8)


def templates(ops: int, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """One step's records on the main thread and on the lane, times relative to the step."""
    main: list[tuple] = []
    lane: list[tuple] = []

    def rec(out: list[tuple], t: int, kind: int, region: int = 0, **f: int) -> None:
        out.append((t, 0, f.get("sent", 0), f.get("sent", 0), region, f.get("comm", -1), -1, 0,
                    kind, f.get("op", 0)))

    op_ns = 600 * US // max(ops, 1)
    rec(main, 0, Kind.ENTER, STEP)
    rec(main, 10 * US, Kind.ENTER, DATA)
    rec(main, 60 * US, Kind.LEAVE, DATA)
    t = 70 * US
    for phase in (FWD, BWD):
        rec(main, t, Kind.ENTER, phase)
        for i in range(ops):
            rec(main, t + i * op_ns + US, Kind.ENTER, OP0 + i)
            rec(main, t + (i + 1) * op_ns, Kind.LEAVE, OP0 + i)
        t += ops * op_ns + 2 * US
        if phase == BWD:
            for b in range(buckets):  # bucket allreduces overlap the end of backward
                start = t - (buckets - b) * 50 * US
                rec(lane, start, Kind.ENTER, ALLREDUCE)
                rec(lane, start, Kind.COLL_BEGIN)
                rec(lane, start + 45 * US, Kind.COLL_END, comm=0, op=Op.ALLREDUCE, sent=1 << 20)
                rec(lane, start + 45 * US, Kind.LEAVE, ALLREDUCE)
            rec(main, t, Kind.ENTER, WAIT)
            t += 100 * US
            rec(main, t, Kind.LEAVE, WAIT)
        rec(main, t, Kind.LEAVE, phase)
        t += 10 * US
    rec(main, t, Kind.ENTER, ALLREDUCE)
    rec(main, t, Kind.COLL_BEGIN)
    rec(main, t + 30 * US, Kind.COLL_END, comm=0, op=Op.ALLREDUCE, sent=8)
    rec(main, t + 30 * US, Kind.LEAVE, ALLREDUCE)
    rec(main, t + 40 * US, Kind.ENTER, OPT)
    rec(main, t + 140 * US, Kind.LEAVE, OPT)
    rec(main, t + 150 * US, Kind.LEAVE, STEP)
    return np.array(main, dtype=EVENT_DTYPE), np.array(lane, dtype=EVENT_DTYPE)


def events_per_step(ops: int = 20, buckets: int = 4) -> int:
    """Events one rank records per step (main thread and lane)."""
    main, lane = templates(ops, buckets)
    return len(main) + len(lane)


def _fill(out: np.ndarray, template: np.ndarray, steps: int, start: int, loc: int) -> None:
    """out[k*E:(k+1)*E] = the template shifted to step k, block by block."""
    e = len(template)
    for s0 in range(0, steps, BLOCK_STEPS):
        s1 = min(steps, s0 + BLOCK_STEPS)
        block = np.repeat(template[None, :], s1 - s0, axis=0)
        block["time"] += start + np.arange(s0, s1, dtype=np.int64)[:, None] * STEP_NS
        block["loc"] = loc
        out[s0 * e:s1 * e] = block.reshape(-1)


def make_spec(events: int, scratch: Path, ranks: int = 2, ops: int = 20, buckets: int = 4,
              shared: bool = False) -> ArchiveSpec:
    """An ArchiveSpec of about ``events`` events; its record arrays are memory-mapped files
    in ``scratch`` (delete the directory after writing). ``shared``: every rank records the
    same streams from the same start (their clock offsets still differ), so the scratch
    space is one rank's: 10^9 events in 16 ranks need 3 GB of it instead of 48 GB."""
    main_t, lane_t = templates(ops, buckets)
    steps = max(1, -(-events // (ranks * (len(main_t) + len(lane_t)))))
    specs = []
    streams: dict[tuple[int, int], np.ndarray] = {}
    for r in range(ranks):
        start = T0 + (0 if shared else r * 7 * US)
        locs = []
        for index, (name, kind, template) in enumerate((("main thread", "main", main_t),
                                                        ("comm lane 0", "comm_lane", lane_t))):
            key = (0 if shared else r, index)
            records = streams.get(key)
            if records is None:
                records = streams[key] = np.memmap(scratch / f"rank{key[0]}-{index}.rec", dtype=EVENT_DTYPE,
                                                   mode="w+", shape=(steps * len(template),))
                _fill(records, template, steps, start, index)
            locs.append(LocationSpec(r, index, name, kind, records))
        end = start + steps * STEP_NS
        offsets = [(start, -5 * US * r, 50.0), (end, 3 * US * r, 50.0)] if r else []
        specs.append(RankSpec(r, "synth-host", offsets, locs))
    return ArchiveSpec(regions(ops), [("WORLD", list(range(ranks)))], specs,
                       start_realtime_ns=1_700_000_000 * 10**9, creator="dltrace bench.synth")


def write(events: int, run_dir: Path, ranks: int = 2, writer: str = "auto",
          shared: bool = False) -> tuple[Path, int]:
    """Write a synthetic archive into ``run_dir``; return (anchor, events written)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="synth-", dir=run_dir))
    try:
        spec = make_spec(events, scratch, ranks, shared=shared)
        anchor = write_archive(spec, run_dir, writer=writer)
        return anchor, spec.event_count()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def add_cache_option(p: argparse.ArgumentParser) -> None:
    """``--cache``, where a benchmark keeps what it generates (archives, spill files)."""
    p.add_argument("--cache", type=Path, default=CACHE, help="where the generated inputs are kept between runs")


def cached(events: int, ranks: int = 2, root: Path | None = None, shared: bool = False) -> tuple[Path, int]:
    """A synthetic archive of ``events`` events, generated once under ``root``
    (default :data:`CACHE`); returns (run directory, events)."""
    root = root or CACHE
    run_dir = root / f"synth-{events}-r{ranks}{'-shared' if shared else ''}"
    done = run_dir / "events.txt"
    if not done.exists():
        shutil.rmtree(run_dir, ignore_errors=True)
        _, n = write(events, run_dir, ranks, shared=shared)
        done.write_text(str(n))
    return run_dir, int(done.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=parse_count, default=parse_count("1M"), help="about how many (1M, 10M, ...)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--writer", choices=("auto", "native", "python"), default="auto")
    p.add_argument("--shared", action="store_true",
                   help="every rank records the same streams (scratch disk for one rank only)")
    p.add_argument("--out", type=Path, required=True, help="run directory to write")
    ns = p.parse_args(argv)
    t0 = time.perf_counter()
    anchor, n = write(ns.events, ns.out, ns.ranks, ns.writer, ns.shared)
    dt = time.perf_counter() - t0
    print(f"{anchor}: {n:,} events in {dt:.2f} s ({n / dt / 1e6:.2f} M events/s, writer {ns.writer})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
