"""Metric channels (the power sampler's) through both OTF2 writers: the same bytes, and
``otf2-print`` reads the METRIC location, its members, units, scopes and every sample."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.traceio.test_native_writer import files
from traceio import codec
from traceio.archive import ArchiveSpec, LocationSpec, MetricSpec, RankSpec
from traceio.otf2_writer import write_archive
from traceio.records import EVENT_DTYPE, Kind

MS = 1_000_000


def metric_spec(samples: int = 5) -> ArchiveSpec:
    """Two ranks on host h0, rank 0 records three channels every 100 ms on its METRIC location:
    the host's package energy (uJ), rank 1's GPU energy (mJ) and a power reading (mW)."""
    ranks = []
    for r in range(2):
        main = np.zeros(2, dtype=EVENT_DTYPE)
        main["time"] = [0, (samples - 1) * 100 * MS]
        main["kind"] = [Kind.ENTER, Kind.LEAVE]
        locations = [LocationSpec(r, 0, "main thread", "main", main)]
        if r == 0:
            n = 3 * samples
            rec = np.zeros(n, dtype=EVENT_DTYPE)
            rec["time"] = np.repeat(np.arange(samples) * 100 * MS, 3)
            rec["kind"] = Kind.METRIC
            rec["region"] = np.tile([0, 1, 2], samples)
            step = np.arange(samples)
            rec["aux"] = np.column_stack([step * 20_000_000, step * 15_000, 150_000 + 0 * step]).reshape(-1)
            rec["loc"] = 1
            locations.append(LocationSpec(r, 1, "power h0", "metric", rec))
        ranks.append(RankSpec(r, "h0", [(0, 1000 * (r + 1), 2.0)], locations))
    metrics = [
        MetricSpec("cpu_package 0 energy", "RAPL package-0 (intel-rapl:0) on h0", "J", -6,
                   "ACCUMULATED_START", "h0", None, (0, 1)),
        MetricSpec("gpu 0 energy", "NVML total energy on h0", "J", -3, "ACCUMULATED_START", "h0", 1, (0, 1)),
        MetricSpec("gpu 1 power", "NVML power usage on h0", "W", -3, "ABSOLUTE_POINT", "h0", None, (0, 1)),
    ]
    return ArchiveSpec([("dltrace.step", "function")], [("WORLD", [0, 1])], ranks,
                       start_realtime_ns=1_700_000_000_000_000_000, creator="dltrace test",
                       metrics=metrics)


@pytest.mark.skipif(not codec.available(), reason="native writer not built")
def test_both_writers_write_the_same_bytes(tmp_path: Path) -> None:
    spec = metric_spec()
    write_archive(spec, tmp_path / "python", writer="python")
    write_archive(spec, tmp_path / "native", writer="native")
    python, native = files(tmp_path / "python"), files(tmp_path / "native")
    assert sorted(native) == sorted(python)
    for name in python:
        assert native[name] == python[name], name


@pytest.mark.parametrize("writer", ["python", "native"])
def test_otf2_print_reads_the_metric_location(writer: str, tmp_path: Path) -> None:
    if writer == "native" and not codec.available():
        pytest.skip("native writer not built")
    anchor = write_archive(metric_spec(), tmp_path, writer=writer)
    tool = shutil.which("otf2-print")
    assert tool, "otf2-print not found: the setup installs Debian's otf2-tools (make setup)"
    events = subprocess.run([tool, str(anchor)], capture_output=True, text=True, timeout=60,
                            check=True).stdout
    defs = subprocess.run([tool, "-G", str(anchor)], capture_output=True, text=True, timeout=60,
                          check=True).stdout
    metric = [line for line in events.splitlines() if line.startswith("METRIC ")]
    assert len(metric) == 15  # 5 samples x 3 channels
    # the last package sample: 4 x 20,000,000 uJ at 400 ms (otf2-print shows the rank's clock)
    last = [line for line in metric if '"cpu_package 0 energy"' in line][-1]
    assert re.search(r"\s400000000\s", last) and "INT64; 80000000)" in last
    assert re.search(r'LOCATION\s+\d+\s+Name: "power h0" <\d+>, Type: METRIC, # Events: 15', defs)
    assert 'Mode: ACCUMULATED_START, Value Type: INT64, Base: DECIMAL, Exponent: -6, Unit: "J"' in defs
    assert 'Mode: ABSOLUTE_POINT, Value Type: INT64, Base: DECIMAL, Exponent: -3, Unit: "W"' in defs
    assert re.search(r'METRIC_INSTANCE\s+1\s+Class: 0, Recorder: "power h0" <1>, Scope: SYSTEM_TREE_NODE', defs)
    assert re.search(r'METRIC_INSTANCE\s+3\s+Class: 2, Recorder: "power h0" <1>, Scope: LOCATION_GROUP "rank 1"', defs)
    assert defs.count("Occurrence: ASYNCHRONOUS") == 3
