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
from pathlib import Path
from typing import Any

import numpy as np
from otf2.enums import (
    Base,
    CollectiveOp,
    GroupType,
    LocationGroupType,
    LocationType,
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
    time_span,
)
from traceio.records import EVENT_DTYPE, Role

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


def _clock(spec: ArchiveSpec) -> tuple[int, int, int, int]:
    span = time_span(spec)
    if span is None:
        return TIMER_RESOLUTION, 0, 0, UNDEFINED_TIMESTAMP
    # The otf2 package stores the realtime as float seconds (the time of writing when the
    # spec has none) and writes int(seconds * 1e9); the same arithmetic gives the same value.
    seconds = spec.start_realtime_ns / 1e9 if spec.start_realtime_ns is not None else time.time()
    return TIMER_RESOLUTION, span[0], span[1] - span[0], int(seconds * 1000000000)


def write(spec: ArchiveSpec, directory: Path, archive_name: str) -> int:
    """Write ``spec`` as ``directory/archive_name.otf2`` (+ .def, dir); return events written.

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
            locations.append((s(loc.name), otf2_type.value, group, records, offsets))
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

    op_map = bytearray([CollectiveOp.ALLREDUCE.value] * 256)
    for op, otf2_op in OTF2_OP.items():
        op_map[int(op)] = otf2_op.value
    return int(native.write_archive(
        str(directory), archive_name, spec.creator, _clock(spec), s.items, nodes, groups, locations,
        properties, regions, comm_groups, comms, list(range(len(comms))), bytes(op_map),
        metric_members, metrics, [2 * i + 1 for i in range(len(metric_members))]))
