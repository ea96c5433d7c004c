"""What one power sample costs the sampling rank: CPU time per sample against the interval.

    python -m bench.power_sampler --samples 2000 --zones 4

The sampler of ``instrument run`` reads every source and appends one record per channel through
the rank's tracer. Here it reads a powercap tree of ``--zones`` zones (packages and DRAM, files
on disk read through the real code path) into a real tracer, ``--samples`` times in a row; the
CPU time per sample (``time.thread_time``, so other processes on a loaded machine do not count)
over the sampling interval is the share of one core it takes. While a sample runs the sampler
holds the GIL, so that share also bounds how much it can delay the training thread of the same
rank. End to end step times are measured by bench/overhead.py (mode builtin+power); on a
loaded machine their run-to-run spread hides differences below a few percent, which this
measurement does not suffer from.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench import measure
from instrument.power.rapl import RaplSource
from instrument.power.sampler import Sampler
from instrument.tracer.builtin import Tracer


def tree(root: Path, zones: int) -> Path:
    """A powercap tree as /sys/class/powercap lays it out: packages with a DRAM zone each
    (``zones`` zones in all)."""
    for i in range(zones):
        zone, name = (f"intel-rapl:{i // 2}", f"package-{i // 2}") if i % 2 == 0 else (f"intel-rapl:{i // 2}:0", "dram")
        (root / zone).mkdir(parents=True, exist_ok=True)
        (root / zone / "name").write_text(name + "\n")
        (root / zone / "max_energy_range_uj").write_text("262143328850\n")
        (root / zone / "energy_uj").write_text(f"{123456789 + i}\n")
    return root


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--zones", type=int, default=4, help="powercap zones (2 packages with DRAM: 4)")
    p.add_argument("--intervals", default="0.1,0.5,0.01", help="sampling intervals to compare against (s)")
    ns = p.parse_args(argv)
    print(measure.machine())
    with tempfile.TemporaryDirectory(prefix="bench-power-") as tmp:
        source = RaplSource(tree(Path(tmp) / "powercap", ns.zones))
        tracer = Tracer(0, 1, Path(tmp) / "run", flush_interval_s=None)
        sampler = Sampler(tracer, [source], 3600, "bench")  # the thread is not started
        for _ in range(50):  # warm up
            sampler.sample()
        c0, w0 = time.thread_time(), time.perf_counter()
        for _ in range(ns.samples):
            sampler.sample()
        cpu = (time.thread_time() - c0) / ns.samples
        wall = (time.perf_counter() - w0) / ns.samples
        tracer.finalize("ok")
    rows = [[f"{float(i):g}", f"{1e6 * cpu:.1f}", f"{1e6 * wall:.1f}", f"{100 * cpu / float(i):.3f}"]
            for i in ns.intervals.split(",")]
    print(f"{ns.zones} zones, {ns.samples} samples; one record per zone and sample")
    print(measure.table(["interval s", "CPU us/sample", "wall us/sample", "% of a core"], rows))
    print(f"load avg at the end: {measure.load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
