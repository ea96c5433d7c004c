"""The tracer's resident memory stays bounded however many events a run records.

    .venv/bin/python bench/tracer_memory.py [--events 100000000] [--capacity 65536]

Records ``--events`` events (enter/leave pairs of one region, through the same Recorder path
the hooks use) into a real spill file in a temporary directory, sampling the process's
resident set size (VmRSS) every million events. Prints the RSS before recording, the
maximum while recording, the growth, the buffer's fixed size, and events per second.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from instrument.tracer.builtin import DEFAULT_CAPACITY, Tracer  # noqa: E402
from traceio import records  # noqa: E402


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=100_000_000)
    p.add_argument("--capacity", type=int, default=DEFAULT_CAPACITY)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tracer = Tracer(0, 1, Path(d), capacity=args.capacity)
        rid = tracer.region_id(records.FORWARD)
        enter, leave = tracer.enter, tracer.leave
        before = peak = rss_bytes()
        pairs = args.events // 2
        block = 500_000
        t0 = time.perf_counter()
        done = 0
        while done < pairs:
            n = min(block, pairs - done)
            for _ in range(n):
                enter(rid)
                leave(rid)
            done += n
            peak = max(peak, rss_bytes())
        elapsed = time.perf_counter() - t0
        tracer.finalize("ok")
        spill = (Path(d) / "ranks" / "rank-00000.evt").stat().st_size
    buffer_mb = args.capacity * records.EVENT_DTYPE.itemsize / 2**20
    print(f"events recorded: {2 * pairs:,} in {elapsed:.1f} s ({2 * pairs / elapsed / 1e6:.2f} M events/s); "
          f"spill file {spill / 2**30:.2f} GiB")
    print(f"RSS before: {before / 2**20:.1f} MiB; max while recording: {peak / 2**20:.1f} MiB; "
          f"growth: {(peak - before) / 2**20:.1f} MiB; buffer: {buffer_mb:.1f} MiB ({args.capacity:,} records)")


if __name__ == "__main__":
    main()
