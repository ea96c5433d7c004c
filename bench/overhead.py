"""Tracer overhead on a 2-rank DDP run: step time with our tracer, without, with torch.profiler.

    python -m bench.overhead --repeat 5 --steps 30

Each run is ``instrument run -np 2 runs/ddp_resnet.py`` with ``--tracer builtin`` (power
sampling off), with ``--tracer builtin`` sampling power (``builtin+power``: the power sampler
reads a powercap tree of two packages and their DRAM, written for the benchmark, every
``--power-interval`` seconds, 0.1 by default: the cost of reading the files and recording, as
on a machine with RAPL), with ``--tracer none`` (the baseline) or with ``--tracer none`` under
torch.profiler (bench/torch_profiled.py); the modes take turns, the order rotating each round so that no mode
always runs first or last. A run's step time is the median of rank 0's step times after the first
(from the per-step times the script writes to ``DLTRACE_EXAMPLE_RESULT``); reported are, per
mode, the median and the minimum over runs and the ratio of the medians to the baseline's.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench import measure

MODES = {
    "none": ["--tracer", "none", "runs/ddp_resnet.py"],
    "builtin": ["--tracer", "builtin", "--power", "off", "runs/ddp_resnet.py"],
    "builtin+power": ["--tracer", "builtin", "runs/ddp_resnet.py"],
    "torch.profiler": ["--tracer", "none", "bench/torch_profiled.py", "runs/ddp_resnet.py"],
}
DEFAULT_MODES = ("none", "builtin", "builtin+power", "torch.profiler")


def powercap_tree(root: Path) -> Path:
    """Two packages with a DRAM zone each, as /sys/class/powercap lays them out."""
    for zone, name in (("intel-rapl:0", "package-0"), ("intel-rapl:0:0", "dram"),
                       ("intel-rapl:1", "package-1"), ("intel-rapl:1:0", "dram")):
        (root / zone).mkdir(parents=True, exist_ok=True)
        (root / zone / "name").write_text(name + "\n")
        (root / zone / "max_energy_range_uj").write_text("262143328850\n")
        (root / zone / "energy_uj").write_text("123456789\n")
    return root


def one(mode: str, out: Path, i: int, script_args: list[str], env: dict[str, str]) -> float:
    """Rank 0's median step time (s) of one run, steps after the first (the median, unlike
    the mean the script prints, ignores the few steps another process on the machine slows)."""
    result = out / f"{mode}-{i}.json"
    mode_env = {"DLTRACE_POWERCAP_ROOT": str(powercap_tree(out / "powercap"))} if mode == "builtin+power" else {}
    measure.run(measure.python("-m", "instrument.cli", "run", "-np", "2", "--out", str(out),
                               "--name", f"{mode.replace('.', '-').replace('+', '-')}-{i}", *MODES[mode],
                               *script_args),
                env={"DLTRACE_EXAMPLE_RESULT": str(result), **env, **mode_env})
    times = json.loads(result.read_text())["step_times_s"]
    return measure.median(times[1:] or times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5, help="rounds (each runs every mode once)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"some of {', '.join(MODES)}")
    p.add_argument("--power-interval", type=float, default=0.1, help="builtin+power's sampling interval (s)")
    p.add_argument("--threads", type=int, help="intra-op threads per rank (OMP_NUM_THREADS); "
                   "default: torch's own choice (all cores per rank)")
    ns = p.parse_args(argv)
    env = {} if ns.threads is None else {"OMP_NUM_THREADS": str(ns.threads), "MKL_NUM_THREADS": str(ns.threads)}
    env["DLTRACE_POWER_INTERVAL_S"] = repr(ns.power_interval)
    modes = ns.modes.split(",")
    script_args = ["--steps", str(ns.steps), "--batch-size", str(ns.batch_size)]
    measure.stop_children_on_sigterm()
    print(measure.machine())
    print(f"runs/ddp_resnet.py {' '.join(script_args)}, 2 ranks, intra-op threads per rank: "
          f"{ns.threads or 'torch default'}")
    times: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        for i in range(ns.repeat):
            order = modes[i % len(modes):] + modes[:i % len(modes)]
            for mode in order:
                times[mode].append(one(mode, Path(tmp), i, script_args, env))
            print(f"  round {i + 1}: " + ", ".join(f"{m} {1000 * times[m][-1]:.1f} ms" for m in modes), flush=True)
    base = measure.median(times["none"]) if "none" in times else float("nan")
    low = min(times["none"]) if "none" in times else float("nan")
    rows = [[m, len(t), 1000 * measure.median(t), 1000 * min(t), 1000 * max(t), measure.median(t) / base,
             min(t) / low] for m, t in times.items()]
    print(measure.table(["mode", "runs", "median step ms", "min", "max", "ratio to none",
                         "ratio of mins"], rows))
    print(f"load avg at the end: {measure.load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
