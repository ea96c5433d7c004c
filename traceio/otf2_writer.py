"""Write an :class:`~traceio.archive.ArchiveSpec` as an OTF2 archive with the ``otf2`` package.

Layout follows Score-P's so that Vampir, ``otf2-print`` and other readers treat it alike: one
PROCESS location group per rank, CPU_THREAD locations (ACCELERATOR_STREAM for device streams
imported from torch.profiler), communicators as a COMM_LOCATIONS
group of the ranks' main threads plus one COMM_GROUP and COMM per communicator, collectives
as Enter, MpiCollectiveBegin, MpiCollectiveEnd, Leave; metric channels (the power sampler's)
as Score-P writes asynchronous per-host plugin metrics: a METRIC location with one
MetricMember, MetricClass and MetricInstance per channel (:class:`~traceio.archive.MetricSpec`)
and Metric events. Timestamps are each rank's own clock
in nanoseconds; each location carries its rank's ClockOffset records, which readers
interpolate to the reference clock.

The ``otf2`` package's Python writer manages roughly 60-80 thousand events per second; the
native writer (:mod:`traceio.native_writer`, used where it is built) takes the same
``ArchiveSpec`` and writes the same archive at millions of events per second.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import _otf2
import numpy as np
import otf2
from otf2.enums import (
    Base,
    CollectiveOp,
    GroupType,
    LocationGroupType,
    LocationType,
    MetricMode,
    MetricOccurrence,
    MetricType,
    Paradigm,
    RecorderKind,
    Type,
)

from traceio import codec, native_writer
from traceio.archive import (
    ARCHIVE_NAME,
    OTF2_LOCATION_TYPE,
    OTF2_OP,
    OTF2_ROLE,
    TIMER_RESOLUTION,
    UNDEFINED_ROOT,
    ArchiveSpec,
    LocationSpec,
    time_span,
)
from traceio.records import Kind, Op, Role


def write_archive(spec: ArchiveSpec, run_dir: Path, writer: str = "auto") -> Path:
    """Write ``run_dir/traces.otf2`` (+ ``traces.def``, ``traces/``); return the anchor path.

    ``writer`` is auto (the native writer where it is built, else the ``otf2`` package),
    native or python; both write archives that read back identically.
    The archive is written into a temporary directory first and moved into place, so a
    failure never leaves a half-written archive where a complete one is expected.
    """
    if writer not in ("auto", "native", "python"):
        raise ValueError(f"unknown OTF2 writer {writer!r}")
    run_dir = Path(run_dir)
    tmp = run_dir / ".archive.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    if writer == "native" or (writer == "auto" and codec.available()):
        native_writer.write(spec, tmp, ARCHIVE_NAME)
    else:
        _write(spec, tmp)
    for entry in (f"{ARCHIVE_NAME}.otf2", f"{ARCHIVE_NAME}.def", ARCHIVE_NAME):
        target = run_dir / entry
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    # The anchor file moves last: its presence marks a complete archive.
    os.replace(tmp / ARCHIVE_NAME, run_dir / ARCHIVE_NAME)
    os.replace(tmp / f"{ARCHIVE_NAME}.def", run_dir / f"{ARCHIVE_NAME}.def")
    os.replace(tmp / f"{ARCHIVE_NAME}.otf2", run_dir / f"{ARCHIVE_NAME}.otf2")
    shutil.rmtree(tmp, ignore_errors=True)
    return run_dir / f"{ARCHIVE_NAME}.otf2"


def _write(spec: ArchiveSpec, directory: Path) -> None:
    with otf2.writer.open(str(directory), archive_name=ARCHIVE_NAME,
                          timer_resolution=TIMER_RESOLUTION) as trace:
        defs = trace.definitions
        regions = [
            defs.region(name, paradigm=Paradigm.MEASUREMENT_SYSTEM if role == Role.ARTIFICIAL
                        else Paradigm.USER, region_role=OTF2_ROLE[Role(role)])
            for name, role in spec.regions
        ]
        machine = defs.system_tree_node("machine")
        nodes: dict[str, object] = {}
        main_locations = {}
        groups: dict[int, object] = {}
        placed: dict[tuple[int, int], object] = {}
        written: list[tuple[object, LocationSpec, list[tuple[int, int, float]]]] = []
        for rank in spec.ranks:
            node = nodes.get(rank.host)
            if node is None:
                node = nodes[rank.host] = defs.system_tree_node(rank.host, parent=machine)
            group = groups[rank.rank] = defs.location_group(
                f"rank {rank.rank}", system_tree_parent=node, location_group_type=LocationGroupType.PROCESS)
            for loc in rank.locations:
                location = defs.location(loc.name, group=group,
                                         type=OTF2_LOCATION_TYPE.get(loc.kind, LocationType.CPU_THREAD))
                defs.location_property(location, "dltrace::kind", value=loc.kind)
                if loc.kind == "main":
                    main_locations[rank.rank] = location
                placed[(rank.rank, loc.index)] = location
                written.append((location, loc, rank.clock_offsets))

        comm_refs = []
        if spec.comms:
            ordered = sorted(main_locations)
            index = {r: i for i, r in enumerate(ordered)}
            defs.group("", group_type=GroupType.COMM_LOCATIONS, paradigm=Paradigm.MPI,
                       members=[main_locations[r] for r in ordered])
            for name, members in spec.comms:
                group = defs.group(name, group_type=GroupType.COMM_GROUP, paradigm=Paradigm.MPI,
                                   members=[index[m] for m in members if m in index])
                comm_refs.append(defs.comm(name, group))

        instances = []
        for m in spec.metrics:
            member = defs.metric_member(m.name, m.description, metric_type=MetricType.OTHER,
                                        metric_mode=getattr(MetricMode, m.mode), value_type=Type.INT64,
                                        base=Base.DECIMAL, exponent=m.exponent, unit=m.unit)
            cls = defs.metric_class([member], occurrence=MetricOccurrence.ASYNCHRONOUS,
                                    recorder_kind=RecorderKind.ABSTRACT)
            scope = nodes[m.host] if m.rank is None else groups[m.rank]
            instances.append(defs.metric_instance(cls, placed[m.recorder], scope=scope))

        for location, loc, offsets in written:
            writer = trace.event_writer_from_location(location)
            _write_events(writer, loc.records, regions, comm_refs, instances)
            def_writer = _otf2.Archive_GetDefWriter(trace._handle, location._ref)  # type: ignore[attr-defined]
            for local_ns, offset_ns, stddev in offsets:
                _otf2.DefWriter_WriteClockOffset(def_writer, int(local_ns), int(offset_ns), float(stddev))

        _otf2.Archive_SetCreator(trace._handle, spec.creator)
        span = time_span(spec)
        if span is not None:
            # Clock properties describe reference (corrected) time, not the raw stamps.
            trace._first_timestamp, trace._last_timestamp = span
            if spec.start_realtime_ns is not None:
                trace._realtime_timestamp = spec.start_realtime_ns / 1e9


def _write_events(writer, records: np.ndarray, regions: list, comms: list, metrics: list) -> None:  # type: ignore[no-untyped-def]
    for rec in records.tolist():
        time, _aux, sent, recv, region, comm, root, _loc, kind, op = rec
        if kind == Kind.ENTER:
            writer.enter(time, regions[region])
        elif kind == Kind.LEAVE:
            writer.leave(time, regions[region])
        elif kind == Kind.COLL_BEGIN:
            writer.mpi_collective_begin(time)
        elif kind == Kind.COLL_END:
            writer.mpi_collective_end(time, OTF2_OP.get(Op(op), CollectiveOp.ALLREDUCE),
                                      comms[comm], UNDEFINED_ROOT if root < 0 else root,
                                      sent, recv)
        elif kind == Kind.SEND:
            writer.mpi_send(time, root, comms[comm], _aux, sent)
        elif kind == Kind.RECV:
            writer.mpi_recv(time, root, comms[comm], _aux, sent)
        elif kind == Kind.METRIC:
            writer.metric(time, metrics[region], _aux)
