"""How fast the commands answer before any work: ``--help`` and an argument error, side by side
with a bare Python start (the floor) and with importing the whole analysis (what every verb
cost before the verbs loaded their libraries lazily).

    python -m bench.cli_start --repeat 10

Each command runs as its own process, in turns; reported are the median wall times and their
ratio to the bare interpreter.
"""

from __future__ import annotations

import argparse
import subprocess
import time

from bench import measure

COMMANDS = {
    "python -c pass": measure.python("-c", "pass"),
    "analyze --help": measure.python("-m", "analyze.cli", "--help"),
    "analyze phases (missing RUN)": measure.python("-m", "analyze.cli", "phases"),
    "instrument --help": measure.python("-m", "instrument.cli", "--help"),
    "instrument run --help": measure.python("-m", "instrument.cli", "run", "--help"),
    "import every analysis module": measure.python(
        "-c", "import analyze.tables.database, analyze.experiments.compare, analyze.views, reports.report"),
}


def wall(cmd: list[str]) -> float:
    """Seconds from start to exit; an argument error (exit status 2) is timed like success."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=measure.ROOT, capture_output=True, text=True, timeout=120)
    if proc.returncode not in (0, 2):
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=10)
    ns = p.parse_args(argv)
    print(measure.machine())
    times: dict[str, list[float]] = {k: [] for k in COMMANDS}
    names = list(COMMANDS)
    for i in range(ns.repeat):
        for name in names[i % len(names):] + names[:i % len(names)]:
            times[name].append(wall(COMMANDS[name]))
    base = measure.median(times["python -c pass"])
    rows = [[name, 1000 * measure.median(t), 1000 * min(t), measure.median(t) / base]
            for name, t in times.items()]
    print(measure.table(["command", "median ms", "min ms", "ratio to python -c pass"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
