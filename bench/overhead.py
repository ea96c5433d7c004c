"""Tracer overhead on 2-rank DDP runs: step time with our tracer, without, with torch.profiler.

    python -m bench.overhead --repeat 5 --steps 30                       # the ResNet step
    python -m bench.overhead --workload small-ops --repeat 5 --threads 1  # thousands of tiny ops

Each run is ``instrument run -np 2 SCRIPT`` with ``--tracer none`` (the baseline), ``--tracer
builtin`` (power sampling off), ``builtin+power`` (``--tracer builtin`` sampling power: the
sampler reads a powercap tree of two packages and their DRAM, written for the benchmark, every
``--power-interval`` seconds, 0.1 by default: the cost of reading the files and recording, as
on a machine with RAPL), ``--tracer builtin --device-activity`` (our tracer plus
torch.profiler's activity import, docs/gpu.md) or ``--tracer none`` under torch.profiler with
its default settings (bench/torch_profiled.py); ``builtin-flush10s`` is ``builtin`` flushing
every 10 s, as before per-rank writing (the default is 0.5 s: the cost of flushing). SCRIPT is runs/ddp_resnet.py (``--workload
resnet``: a few dozen large operators per step, where every mode hides in the noise) or
runs/ddp_small_ops.py (``--workload small-ops``: a few thousand operators of microseconds each,
where a profiler's per-operator cost shows). The modes take turns, the order rotating each
round so that no mode always runs first or last. A run's step time is the median of rank 0's
step times after the first (from the per-step times the script writes to
``DLTRACE_EXAMPLE_RESULT``); reported are, per mode, the median and the minimum over runs, the
ratio of the medians to the baseline's, and each mode's overhead (ratio - 1) as a share of
torch.profiler's; the same for the CPU time rank 0's process used per step (all its threads),
which other jobs on the machine disturb far less than wall time.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench import measure, power_sampler

MODES = {
    "none": ["--tracer", "none"],
    "builtin": ["--tracer", "builtin", "--power", "off"],
    # as builtin, with the flush interval before per-rank writing (10 s; the default is 0.5 s)
    "builtin-flush10s": ["--tracer", "builtin", "--power", "off"],
    "builtin+power": ["--tracer", "builtin"],
    "builtin+device": ["--tracer", "builtin", "--power", "off", "--device-activity"],
    "torch.profiler": ["--tracer", "none", "bench/torch_profiled.py"],
}
WORKLOADS = {"resnet": "runs/ddp_resnet.py", "small-ops": "runs/ddp_small_ops.py"}


def one(mode: str, out: Path, i: int, script: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Rank 0's median step time and median CPU time per step (s) of one run, steps after
    the first (the median, unlike the mean the script prints, ignores the few steps another
    process on the machine slows; CPU time, of the whole rank process, does not count the
    time other processes hold the cores)."""
    result = out / f"{mode}-{i}.json"
    mode_env = {"DLTRACE_POWERCAP_ROOT": str(power_sampler.tree(out / "powercap", zones=4))} if mode == "builtin+power" else {}
    if mode == "builtin-flush10s":
        mode_env["DLTRACE_FLUSH_INTERVAL_S"] = "10"
    measure.run(measure.python("-m", "instrument.cli", "run", "-np", "2", "--out", str(out),
                               "--name", f"{mode.replace('.', '-').replace('+', '-')}-{i}", *MODES[mode], *script),
                env={"DLTRACE_EXAMPLE_RESULT": str(result), **env, **mode_env})
    data = json.loads(result.read_text())
    times, cpu = data["step_times_s"], data["step_cpu_s"]
    return measure.median(times[1:] or times), measure.median(cpu[1:] or cpu)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=5, help="rounds (each runs every mode once)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=None, help="default: the script's own (resnet 32, small-ops 8)")
    p.add_argument("--workload", choices=WORKLOADS, default="resnet")
    p.add_argument("--modes", default=",".join(MODES), help=f"some of {', '.join(MODES)}")
    p.add_argument("--power-interval", type=float, default=0.1, help="builtin+power's sampling interval (s)")
    p.add_argument("--threads", type=int, help="intra-op threads per rank (OMP_NUM_THREADS); "
                   "default: torch's own choice (all cores per rank)")
    ns = p.parse_args(argv)
    env = {} if ns.threads is None else {"OMP_NUM_THREADS": str(ns.threads), "MKL_NUM_THREADS": str(ns.threads)}
    env["DLTRACE_POWER_INTERVAL_S"] = repr(ns.power_interval)
    modes = ns.modes.split(",")
    script_args = ["--steps", str(ns.steps)] + ([] if ns.batch_size is None else ["--batch-size", str(ns.batch_size)])
    script = [WORKLOADS[ns.workload], *script_args]
    measure.stop_children_on_sigterm()
    print(measure.machine())
    print(f"{' '.join(script)}, 2 ranks, intra-op threads per rank: {ns.threads or 'torch default'}")
    times: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        for i in range(ns.repeat):
            order = modes[i % len(modes):] + modes[:i % len(modes)]
            for mode in order:
                wall, used = one(mode, Path(tmp), i, script, env)
                times[mode].append(wall)
                cpu[mode].append(used)
            print(f"  round {i + 1}: " + ", ".join(f"{m} {1000 * times[m][-1]:.1f} ms ({1000 * cpu[m][-1]:.1f} CPU)"
                                                  for m in modes), flush=True)
    for label, values in (("step time (wall)", times), ("CPU time per step (rank 0's process)", cpu)):
        print(f"\n{label}:")
        print(_table(values))
    print(f"load avg at the end: {measure.load()}")
    return 0


def _table(times: dict[str, list[float]]) -> str:
    base = measure.median(times["none"]) if "none" in times else float("nan")
    low = min(times["none"]) if "none" in times else float("nan")
    prof = measure.median(times["torch.profiler"]) / base - 1 if "torch.profiler" in times else float("nan")
    rows = [[m, len(t), 1000 * measure.median(t), 1000 * min(t), 1000 * max(t), measure.median(t) / base,
             min(t) / low, (measure.median(t) / base - 1) / prof] for m, t in times.items()]
    return measure.table(["mode", "runs", "median ms", "min", "max", "ratio to none", "ratio of mins",
                          "overhead / torch.profiler's"], rows)


if __name__ == "__main__":
    raise SystemExit(main())
