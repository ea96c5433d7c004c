"""Score-P-like OTF2 archives with metric-plugin channels, written with the ``otf2`` package,
so tests can state the ground truth of plugins we have no real trace of.

The layout is Score-P's for an asynchronous per-host plugin (docs/research/scorep-metric-plugins.md):
one process (``MPI Rank 0``) with a ``Master thread`` that enters ``main`` for the whole run,
and per channel a METRIC location in that process (Score-P leaves its name empty; the
``otf2`` package would merge identical definitions, so these are numbered) recording a MetricInstance of its
own ASYNCHRONOUS class, scoped to the host's system tree node. Unlike tests/literal.py (which
goes through dltrace's own writer and writes INT64 only), each member gets the unit, mode,
value type (``DOUBLE``, ``UINT64``, ``INT64``) and exponent a plugin declares.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import otf2
from otf2.enums import (
    Base,
    LocationGroupType,
    LocationType,
    MetricMode,
    MetricOccurrence,
    MetricScope,
    MetricType,
    Paradigm,
    RecorderKind,
    RegionRole,
    Type,
)

RESOLUTION = 1_000_000_000  # timer ticks per second: ticks are ns


@dataclass
class Channel:
    name: str
    unit: str  # as the plugin declares it ('#' for none)
    mode: str  # MetricMode name
    value_type: str  # "DOUBLE", "UINT64" or "INT64"
    samples: list[tuple[int, float]]  # (time_ns, value as recorded)
    exponent: int = 0
    scope: str = "host"  # "host": the host's system tree node; "root": the tree's root (the
    # scope Score-P gives plugins with the `once` policy, e.g. the official rocm_smi plugin);
    # "thread": a SYNCHRONOUS_STRICT MetricClass recorded on the Master thread itself (PAPI
    # counters, the *_sync plugins), its samples between the thread's Enter and Leave events


def write(directory: Path, channels: list[Channel], host: str = "node0",
          steps: list[tuple[int, int]] | None = None) -> Path:
    """Write the archive into ``directory``; return the anchor. ``steps``: (start, end) ns of
    ``step`` regions inside ``main`` (analyze with ``step_region="step"``)."""
    times = [t for c in channels for t, _ in c.samples] + [t for s in steps or [] for t in s]
    start, end = min(times) - 1_000_000, max(times) + 1_000_000
    with otf2.writer.open(str(directory), archive_name="traces", timer_resolution=RESOLUTION) as trace:
        defs = trace.definitions
        main = defs.region("main", paradigm=Paradigm.USER, region_role=RegionRole.FUNCTION)
        machine = defs.system_tree_node("machine")
        node = defs.system_tree_node(host, parent=machine)
        group = defs.location_group("MPI Rank 0", system_tree_parent=node,
                                    location_group_type=LocationGroupType.PROCESS)
        thread = defs.location("Master thread", group=group, type=LocationType.CPU_THREAD)
        w = trace.event_writer_from_location(thread)
        step = defs.region("step", paradigm=Paradigm.USER, region_role=RegionRole.FUNCTION)
        # the thread's events in time order: (time, order, what, argument)
        on_thread: list[tuple[int, int, str, object]] = [(start, 0, "enter", main), (end, 2, "leave", main)]
        on_thread += [e for a, b in steps or [] for e in ((a, 1, "enter", step), (b, 1, "leave", step))]
        for i, c in enumerate(channels):
            member = defs.metric_member(c.name, f"{c.name} ({i})", metric_type=MetricType.OTHER,
                                        metric_mode=getattr(MetricMode, c.mode),
                                        value_type=getattr(Type, c.value_type), base=Base.DECIMAL,
                                        exponent=c.exponent, unit=c.unit)
            cast = float if c.value_type == "DOUBLE" else int
            if c.scope == "thread":
                cls = defs.metric_class([member], occurrence=MetricOccurrence.SYNCHRONOUS_STRICT,
                                        recorder_kind=RecorderKind.CPU)
                on_thread += [(t, 1, "metric", (cls, cast(v))) for t, v in c.samples]
                continue
            cls = defs.metric_class([member], occurrence=MetricOccurrence.ASYNCHRONOUS,
                                    recorder_kind=RecorderKind.ABSTRACT)
            location = defs.location(f"metric {i}", group=group, type=LocationType.METRIC)
            instance = defs.metric_instance(cls, location, scope=node if c.scope == "host" else machine)
            assert instance.metric_scope == MetricScope.SYSTEM_TREE_NODE
            ew = trace.event_writer_from_location(location)
            for t, v in c.samples:
                ew.metric(t, instance, cast(v))
        for t, _, what, arg in sorted(on_thread, key=lambda e: (e[0], e[1])):
            if what == "metric":
                w.metric(t, *arg)  # type: ignore[misc]
            else:
                getattr(w, what)(t, arg)
        trace._first_timestamp, trace._last_timestamp = start, end
    return directory / "traces.otf2"
