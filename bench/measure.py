"""What every benchmark needs: a child process timed with its peak RSS, medians, the machine.

Each measured run is its own process, which reports its own peak RSS (``ru_maxrss``) as the
last line of its output, so the number belongs to that run alone and no run warms a cache for
the next inside one interpreter.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Child:
    wall_s: float
    stdout: str
    stderr: str
    returncode: int

    def json(self) -> dict[str, Any]:
        """The last stdout line, which measured children print as JSON."""
        return json.loads(self.stdout.strip().splitlines()[-1])


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 3600) -> Child:
    """Run ``cmd`` from the repository root; its wall time and peak resident memory."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **(env or {})))
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:  # timeout or Ctrl-C: SIGTERM lets `instrument run` stop its ranks
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return Child(time.perf_counter() - t0, out, err, proc.returncode)


def stop_children_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so that :func:`run` stops the child it waits for."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB (call at the end of a child).

    From VmHWM: Linux carries ``ru_maxrss`` across fork and exec, so a child of a big parent
    would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource  # not Linux

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class TreePeak:
    """The peak of the summed resident memory of this process and all its descendants, sampled
    every ``interval`` seconds while the ``with`` block runs (``.mb`` after it).

    For a tool that works in worker processes (Pipit's pool): adding each process's own peak
    overstates its memory when the peaks do not coincide, and one process's peak understates
    it. A short spike between two samples is missed, so report the larger of this and each
    process's own peak. Pages a forked worker still shares with its parent count in both (RSS,
    0.02 ms a read; the proportional set size needs smaps, whose page walk took 31 ms a read
    in a 2 GB process here, and would slow the tool measured)."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval, self.mb = interval, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> TreePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        import psutil  # (dask's distributed needs it: installed with the cluster extra)

        me = psutil.Process()
        while True:
            total = 0
            for proc in (me, *me.children(recursive=True)):
                with contextlib.suppress(psutil.Error):  # ended between listing and reading
                    total += proc.memory_info().rss
            self.mb = max(self.mb, total / 2**20)
            if self._stop.wait(self.interval):
                return


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f}/{five:.2f}"


def machine() -> str:
    """One line: date, CPU, cores, memory, load, versions."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem = int(Path("/proc/meminfo").read_text().split()[1]) / 1024**2
    except (OSError, ValueError, IndexError):
        mem = float("nan")
    import duckdb
    import numpy

    return (f"{datetime.datetime.now().isoformat(timespec='minutes')}; {cpu}; {os.cpu_count()} cores; "
            f"{mem:.0f} GB RAM; load avg (1/5 min) {load()}; Python {platform.python_version()}, "
            f"numpy {numpy.__version__}, duckdb {duckdb.__version__}")


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain text table, numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[_fmt(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)
