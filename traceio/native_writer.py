"""Write an :class:`~traceio.archive.ArchiveSpec` with the native OTF2 codec.

The C part (the codec, :mod:`traceio.codec`, built from traceio/native/ with the reader it
shares its buffers with) writes 15-25 million events per second, against 60-80 thousand for the
``otf2`` package. This module lays out the definitions exactly as
:mod:`traceio.otf2_writer` registers them with the ``otf2`` package (same references for
regions, locations, groups and communicators, same names, roles, paradigms and clock
properties), so both writers' archives read back into identical tables.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from otf2.enums import (
    Base,
    CollectiveOp,
    GroupType,
    LocationGroupType,
    LocationType,
    MappingType,
    MetricMode,
    MetricOccurrence,
    MetricScope,
    MetricType,
    Paradigm,
    RecorderKind,
    Type,
    Undefined,
)

from traceio import codec
from traceio.archive import (
    OTF2_LOCATION_TYPE,
    OTF2_OP,
    OTF2_ROLE,
    TIMER_RESOLUTION,
    ArchiveSpec,
    LocationSpec,
    time_span,
)
from traceio.records import EVENT_DTYPE, Kind, Role

UNDEFINED = 0xFFFFFFFF
UNDEFINED_TIMESTAMP = Undefined.TIMESTAMP.value


class _Strings:
    """String definitions in first-use order; ref 0 is "" as in the otf2 package."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self._refs: dict[str, int] = {}
        self("")

    def __call__(self, s: str | None) -> int:
        if s is None:
            return UNDEFINED
        ref = self._refs.get(s)
        if ref is None:
            ref = self._refs[s] = len(self.items)
            self.items.append(s)
        return ref


def _clock(spec: ArchiveSpec, span: tuple[int, int] | None) -> tuple[int, int, int, int]:
    if span is None:
        return TIMER_RESOLUTION, 0, 0, UNDEFINED_TIMESTAMP
    # The otf2 package stores the realtime as float seconds (the time of writing when the
    # spec has none) and writes int(seconds * 1e9); the same arithmetic gives the same value.
    seconds = spec.start_realtime_ns / 1e9 if spec.start_realtime_ns is not None else time.time()
    return TIMER_RESOLUTION, span[0], span[1] - span[0], int(seconds * 1000000000)


@dataclass
class Written:
    """A location whose events its rank wrote itself (:func:`write_events`) with its own
    definition references: how many events, and the rank's references -> the archive's
    (region ids, communicator indexes, metric channel indexes: ``regions[local]`` is the
    archive's region index ...), written as OTF2 mapping tables into its local definitions."""

    events: int
    regions: np.ndarray
    comms: np.ndarray
    metrics: np.ndarray

    def mappings(self) -> list[tuple[int, np.ndarray]]:
        """(OTF2 MappingType value, local -> global reference) tables; metric channels map
        to their MetricInstance references (2i + 1, see :func:`write`)."""
        tables = [(MappingType.REGION.value, self.regions), (MappingType.COMM.value, self.comms),
                  (MappingType.METRIC.value, 2 * np.asarray(self.metrics, dtype=np.uint64) + 1)]
        return [(t, np.ascontiguousarray(m, dtype=np.uint64)) for t, m in tables if len(m)]


def write(spec: ArchiveSpec, directory: Path, archive_name: str,
          written: dict[tuple[int, int], Written] | None = None,
          span: tuple[int, int] | None = None) -> int:
    """Write ``spec`` as ``directory/archive_name.otf2`` (+ .def, dir); return events written.

    With ``written`` (per (rank, location index)), only the definitions are written: the
    global ones, and each location's local ones (clock offsets, mapping tables); the event
    files come from the ranks and the locations' records are ignored. ``span`` (first, last
    reference time) then replaces the one computed from the records.

    Raises RuntimeError where the extension is not built, and the extension's ``Error`` when
    OTF2 fails (disk full, directory exists).
    """
    native = codec.native()
    if native is None:
        raise RuntimeError("the native OTF2 writer is not built")

    # Strings are numbered in the order the otf2 package writes them (nodes, location groups,
    # locations, location properties, regions, groups, metric members, communicators), so that
    # the definition files come out byte for byte like its.
    s = _Strings()
    nodes = [(s("machine"), s(""), UNDEFINED)]
    node_of: dict[str, int] = {}
    groups = []
    for rank in spec.ranks:
        if rank.host not in node_of:
            node_of[rank.host] = len(nodes)
            nodes.append((s(rank.host), s(""), 0))
    for rank in spec.ranks:
        groups.append((s(f"rank {rank.rank}"), LocationGroupType.PROCESS.value, node_of[rank.host],
                       UNDEFINED))
    locations: list[tuple[Any, ...]] = []
    kinds: list[str] = []
    main_of: dict[int, int] = {}
    group_of: dict[int, int] = {}
    placed: dict[tuple[int, int], int] = {}
    for group, rank in enumerate(spec.ranks):
        group_of[rank.rank] = group
        offsets = [(int(t), int(o), float(sd)) for t, o, sd in rank.clock_offsets]
        for loc in rank.locations:
            records = np.ascontiguousarray(loc.records)
            if records.dtype != EVENT_DTYPE:
                raise ValueError(f"location {loc.name!r} of rank {rank.rank}: records are not EVENT_DTYPE")
            if loc.kind == "main":
                main_of[rank.rank] = len(locations)
            placed[(rank.rank, loc.index)] = len(locations)
            otf2_type = OTF2_LOCATION_TYPE.get(loc.kind, LocationType.CPU_THREAD)
            done = None if written is None else written[(rank.rank, loc.index)]
            if done is None:
                locations.append((s(loc.name), otf2_type.value, group, records, offsets))
            else:
                locations.append((s(loc.name), otf2_type.value, group, records[:0], offsets, done.events,
                                  done.mappings()))
            kinds.append(loc.kind)
    properties = [(ref, s("dltrace::kind"), s(kind)) for ref, kind in enumerate(kinds)]
    regions = [
        (s(name), s(name), s(""), OTF2_ROLE[Role(role)].value,
         (Paradigm.MEASUREMENT_SYSTEM if role == Role.ARTIFICIAL else Paradigm.USER).value,
         0, UNDEFINED, 0, 0)
        for name, role in spec.regions
    ]
    comm_groups, comms = [], []
    if spec.comms:
        ordered = sorted(main_of)
        index = {r: i for i, r in enumerate(ordered)}
        comm_groups.append((s(""), GroupType.COMM_LOCATIONS.value, Paradigm.MPI.value, 0,
                            [main_of[r] for r in ordered]))
        for name, members in spec.comms:
            comm_groups.append((s(name), GroupType.COMM_GROUP.value, Paradigm.MPI.value, 0,
                                [index[m] for m in members if m in index]))
    # One member, class and instance per channel, as the otf2 writer registers them: members
    # 0, 1, ...; classes and instances share the metric references: class 2i, instance 2i+1.
    metric_members: list[tuple[Any, ...]] = []
    metrics: list[tuple[Any, ...]] = []
    for i, m in enumerate(spec.metrics):
        metric_members.append((s(m.name), s(m.description), MetricType.OTHER.value, getattr(MetricMode, m.mode).value,
                        Type.INT64.value, Base.DECIMAL.value, m.exponent, s(m.unit)))
        metrics.append((0, [i], MetricOccurrence.ASYNCHRONOUS.value, RecorderKind.ABSTRACT.value))
        scope = (MetricScope.SYSTEM_TREE_NODE.value, node_of[m.host]) if m.rank is None else \
            (MetricScope.LOCATION_GROUP.value, group_of[m.rank])
        metrics.append((1, 2 * i, placed[m.recorder], *scope))
    if spec.comms:
        comms = [(s(name), i + 1, UNDEFINED, 0) for i, (name, _) in enumerate(spec.comms)]

    clock = _clock(spec, time_span(spec) if written is None else span)
    n = int(native.write_archive(
        str(directory), archive_name, spec.creator, clock, s.items, nodes, groups, locations,
        properties, regions, comm_groups, comms, list(range(len(comms))), _op_map(),
        metric_members, metrics, [2 * i + 1 for i in range(len(metric_members))], written is not None))
    return n if written is None else sum(w.events for w in written.values())


def _op_map() -> bytes:
    op_map = bytearray([CollectiveOp.ALLREDUCE.value] * 256)
    for op, otf2_op in OTF2_OP.items():
        op_map[int(op)] = otf2_op.value
    return bytes(op_map)


def write_events(locations: list[LocationSpec], directory: Path, archive_name: str,
                 n_comms: int, n_metrics: int) -> list[int]:
    """One rank's event files: ``directory/archive_name/<i>.evt`` for ``locations[i]``, with the
    records' own references (regions, communicators and metric channels numbered as the rank
    defined them); the archive assembled later maps them through :class:`Written` tables.
    Event files do not depend on the location reference, so they can be renamed into place.
    ``n_comms`` and ``n_metrics``: how many communicators and metric channels the rank defined.
    Returns the events written per location. (The archive's anchor and definitions written
    here are placeholders.)"""
    native = codec.native()
    if native is None:
        raise RuntimeError("the native OTF2 writer is not built")
    arrays = [np.ascontiguousarray(loc.records) for loc in locations]
    native.write_archive(
        str(directory), archive_name, "dltrace (one rank's events)", (TIMER_RESOLUTION, 0, 0, 0), [""],
        [], [], [(0, LocationType.CPU_THREAD.value, 0, a, []) for a in arrays], [], [], [], [],
        list(range(n_comms)), _op_map(), [], [], list(range(n_metrics)))
    return [int(np.isin(a["kind"], EVENT_KINDS).sum()) for a in arrays]


# Record kinds the writers turn into OTF2 events (the others are the tracer's own).
EVENT_KINDS = (Kind.ENTER, Kind.LEAVE, Kind.COLL_BEGIN, Kind.COLL_END, Kind.SEND, Kind.RECV, Kind.METRIC)
