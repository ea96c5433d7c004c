"""Read an OTF2 archive into definitions and column chunks with the ``otf2`` package.

This is the portable reader (about 60-100 thousand events per second). It applies the rules
in :mod:`analyze.readers.columns`; the native reader produces identical chunks, faster.
Clock offsets are applied by the OTF2 library itself, which interpolates the archive's
ClockOffset records.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _otf2
import otf2
from otf2 import events as ev
from otf2.enums import LocationGroupType, LocationType

from analyze.readers.columns import (
    Chunk,
    CommDef,
    Definitions,
    IntervalBuilder,
    LocationDef,
    MetricDef,
    MetricMemberDef,
    RegionDef,
    ticks_to_ns,
)

UNDEFINED_TIMESTAMP = 0xFFFFFFFFFFFFFFFF


class ReaderError(Exception):
    """The archive is missing, truncated or corrupt; the message names the file."""


def _enum_name(value: Any) -> str:
    """``Paradigm.MPI`` -> ``mpi`` (the package's enums are ctypes types printing that way)."""
    return str(value).rsplit(".", 1)[-1].lower()


def _location_kind(location: Any) -> str:
    try:
        kind = location["dltrace::kind"]
    except (KeyError, TypeError, IndexError):
        kind = None
    if kind is not None:
        # our archives: main/thread are CPU threads; lanes, imported timelines, the tracer's
        # own flush location, device streams (from torch.profiler) and metric locations are
        # not threads of the training
        return {"comm_lane": "comm_lane", "timeline": "timeline", "tracer": "tracer",
                "accelerator_stream": "accelerator_stream", "metric": "metric"}.get(str(kind), "cpu_thread")
    t = location.type
    if t == LocationType.CPU_THREAD:
        return "cpu_thread"
    if t == LocationType.METRIC:
        return "metric"
    if t in (LocationType.GPU, getattr(LocationType, "ACCELERATOR_STREAM", None)):
        return "accelerator_stream"
    return "unknown"


def read_definitions(reader: Any, anchor: Path) -> Definitions:
    """Definitions of an open ``otf2.reader.Reader``, with ranks and main threads assigned."""
    d = reader.definitions
    clock = d.clock_properties
    realtime = clock.realtime_timestamp
    try:
        creator = _otf2.Reader_GetCreator(reader.handle) or ""
    except _otf2.Error:
        creator = ""
    defs = Definitions(
        anchor=anchor, creator=creator, resolution=int(clock.timer_resolution),
        global_offset=int(clock.global_offset), length_ticks=int(clock.trace_length),
        realtime_ns=None if realtime in (None, UNDEFINED_TIMESTAMP) else int(realtime),
    )
    # Ranks: process location groups in definition order; other groups (accelerators)
    # belong to the process that created them, or get ranks after the processes.
    groups = sorted(d.location_groups, key=lambda g: g._ref)
    processes = [g for g in groups if g.location_group_type == LocationGroupType.PROCESS] or groups
    rank_of_group = {g._ref: i for i, g in enumerate(processes)}
    for g in groups:
        if g._ref not in rank_of_group:
            creator_group = getattr(g, "creating_location_group", None)
            rank_of_group[g._ref] = rank_of_group.get(
                getattr(creator_group, "_ref", None), len(rank_of_group))
    by_rank: dict[int, list[Any]] = {}
    for loc in sorted(d.locations, key=lambda x: x._ref):
        by_rank.setdefault(rank_of_group[loc.group._ref], []).append(loc)
    for rank, locs in sorted(by_rank.items()):
        kinds = [_location_kind(loc) for loc in locs]
        main = next((i for i, k in enumerate(kinds) if k == "cpu_thread"), 0)
        for thread, (loc, kind) in enumerate(zip(locs, kinds, strict=True)):
            defs.locations.append(LocationDef(
                location_id=int(loc._ref), rank=rank, thread=thread, name=str(loc.name),
                kind=kind, is_main=thread == main, events=int(loc.number_of_events)))
    for r in sorted(d.regions, key=lambda x: x._ref):
        source = r.source_file
        defs.regions.append(RegionDef(
            region_id=int(r._ref), name=str(r.name), canonical_name=str(r.canonical_name or r.name),
            paradigm=_enum_name(r.paradigm), role=_enum_name(r.region_role),
            source_file=None if source is None else str(getattr(source, "name", source)),
            begin_line=int(r.begin_line_number) or None))
    rank_of_location = {loc.location_id: loc.rank for loc in defs.locations}
    for c in sorted(d.comms, key=lambda x: x._ref):
        members = []
        for m in getattr(c.group, "members", []) or []:
            ref = getattr(m, "_ref", m)
            members.append(rank_of_location.get(int(ref), -1))
        defs.comms.append(CommDef(comm_id=int(c._ref), name=str(c.name), members=members))
    for g in processes:
        node = getattr(g, "system_tree_parent", None)
        if node is not None:
            defs.hosts[rank_of_group[g._ref]] = str(node.name)
    _metric_definitions(d, defs, rank_of_group, rank_of_location)
    return defs


def _node_name(group: Any) -> str | None:
    node = getattr(group, "system_tree_parent", None)
    return None if node is None else str(node.name)


def _metric_definitions(d: Any, defs: Definitions, rank_of_group: dict[int, int],
                        rank_of_location: dict[int, int]) -> None:
    """Metric members, classes and instances (Score-P's plugins scope an instance to a host,
    a process or a location; our power channels to a host or to the rank a GPU is pinned to)."""
    for m in sorted(d.metric_members, key=lambda x: x._ref):
        defs.metric_members.append(MetricMemberDef(
            member_id=int(m._ref), name=str(m.name), description=str(m.description or ""),
            unit=str(m.unit or ""), mode=_enum_name(m.metric_mode), value_type=_enum_name(m.value_type),
            base=_enum_name(m.base), exponent=int(m.exponent), metric_type=_enum_name(m.metric_type)))
    for m in sorted(d.metrics, key=lambda x: x._ref):
        if isinstance(m, otf2.definitions.MetricClass):
            defs.metrics.append(MetricDef(int(m._ref), [int(x._ref) for x in m.members],
                                          _enum_name(m.occurrence), None, None, None, None, None))
            continue
        scope, kind = m.scope, _enum_name(m.metric_scope)
        rank = host = None
        if isinstance(scope, otf2.definitions.Location):
            rank, host = rank_of_location.get(int(scope._ref)), _node_name(scope.group)
        elif isinstance(scope, otf2.definitions.LocationGroup):
            rank, host = rank_of_group.get(int(scope._ref)), _node_name(scope)
        elif isinstance(scope, otf2.definitions.SystemTreeNode):
            host = str(scope.name)
        cls = m.metric_class
        defs.metrics.append(MetricDef(
            int(m._ref), [int(x._ref) for x in cls.members], _enum_name(cls.occurrence),
            int(m.recorder._ref), kind, None if scope is None else str(getattr(scope, "name", "")),
            rank, host, int(cls._ref)))


def read(anchor: Path, chunk_rows: int = 500_000) -> tuple[Definitions, Iterator[Chunk]]:
    """Open ``anchor``; return its definitions and an iterator over column chunks."""
    try:
        reader = otf2.reader.Reader(str(anchor))
    except Exception as e:  # the otf2 package raises several types for bad archives
        raise ReaderError(f"cannot read the OTF2 archive {anchor}: {e}") from None
    try:
        defs = read_definitions(reader, anchor)
    except Exception as e:
        reader.close()
        raise ReaderError(f"cannot read the definitions of {anchor}: {e}") from None
    return defs, _chunks(reader, defs, chunk_rows)


def _chunks(reader: Any, defs: Definitions, chunk_rows: int) -> Iterator[Chunk]:
    rank_of = {loc.location_id: loc.rank for loc in defs.locations}
    # The OTF2 library can decode a damaged event file as an endless run of events (measured:
    # a truncated file made it read on for ever, differently each time); a location's
    # definition says how many events it holds.
    declared = {loc.location_id: loc.events for loc in defs.locations}
    seen = dict.fromkeys(declared, 0)
    b = IntervalBuilder(rank_of)
    off, res = defs.global_offset, defs.resolution
    n = 0
    consumed = 0
    try:
        for location, event in reader.events:
            n += 1
            loc = location._ref
            seen[loc] = count = seen.get(loc, 0) + 1
            if count > declared.get(loc, 0) > 0:
                raise ValueError(f"location {loc} holds more events than the {declared[loc]} "
                                 "its definition declares")
            t = ticks_to_ns(event.time, off, res)
            cls = type(event)
            if cls is ev.Enter:
                b.enter(loc, t, event.region._ref)
            elif cls is ev.Leave:
                b.leave(loc, t, event.region._ref)
            elif cls is ev.MpiCollectiveBegin:
                b.collective_begin(loc, t)
            elif cls is ev.MpiCollectiveEnd:
                b.collective_end(loc, t, event.collective_op.value, event.communicator._ref,
                                 int(event.root), int(event.size_sent), int(event.size_received))
            elif cls is ev.MpiSend or cls is ev.MpiIsend:
                b.message(loc, t, 0, int(event.receiver), event.communicator._ref,
                          int(event.msg_tag), int(event.msg_length))
            elif cls is ev.MpiRecv or cls is ev.MpiIrecv:
                b.message(loc, t, 1, int(event.sender), event.communicator._ref,
                          int(event.msg_tag), int(event.msg_length))
            elif cls is ev.Metric:
                b.metric(loc, t, int(event.metric._ref), [float(v) for v in event.values])
            else:
                b.touch(loc, t)
            if b.pending_rows() >= chunk_rows:
                chunk = b.take(n - consumed)
                if any(len(next(iter(t.values())))
                       for t in (chunk.intervals, chunk.collectives, chunk.messages, chunk.metrics)):
                    yield chunk
                    consumed = n
        short = next(((loc, count) for loc, count in seen.items() if count < declared.get(loc, 0)), None)
        if short is not None:  # a truncated file can also read as fewer events, without an error
            raise ValueError(f"location {short[0]} holds {short[1]} events, fewer than the "
                             f"{declared[short[0]]} its definition declares")
    except (_otf2.Error, otf2.error.TraceReaderError, ValueError) as e:
        raise ReaderError(f"cannot read the events of {defs.anchor}: {e}") from None
    finally:
        reader.close()
    b.finish()
    b.stats.events = n
    yield b.take(n - consumed, last=True)
