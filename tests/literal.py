"""Build small OTF2 archives from literal interval lists, so tests state their ground truth.

    write_literal(tmp_path, [
        (0, "dltrace.step", 0, 200_000_000),
        (0, "MPI_Allreduce", 100_000_000, 150_000_000, {"op": "allreduce", "bytes": 4096}),
        (1, "dltrace.step", 0, 200_000_000),
        (1, "MPI_Allreduce", 50_000_000, 150_000_000, {"op": "allreduce", "bytes": 4096}),
    ])

Each item is ``(rank, region, start_ns, end_ns[, extra])``; intervals of a rank must nest.
``extra`` describes what the region does: a collective (``op``, ``bytes`` or
``sent``/``recv``, ``root``, ``comm``), a message (``send``/``recv``: peer rank, ``tag``,
``bytes``, ``at``: time, default the region's start for sends and end for receives), or a
region role (``role``) for regions whose name says nothing. ``lane=True`` puts the item on
the rank's communication lane (an asynchronous collective), ``lane=K`` on its lane K (for
operations in flight at once); ``timeline="NAME"`` on a location
of that name and kind ``timeline`` (an imported timeline, such as Horovod's). The archive goes through the
same writer as real runs.

``metrics`` adds metric channels as the power sampler records them: dicts with ``name`` (e.g.
``gpu 0 energy``), ``unit``, ``exponent``, ``mode`` (default J, -6, ACCUMULATED_START),
``rank`` (the rank it is charged to; None: the host), ``recorder`` (the rank whose METRIC
location records it, default 0) and ``samples``: [(time_ns, integer value), ...].
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from traceio.archive import ArchiveSpec, LocationSpec, MetricSpec, RankSpec
from traceio.otf2_writer import write_archive
from traceio.records import EVENT_DTYPE, Kind, Op, Role

NAME_ROLES = {
    "MPI_Allreduce": Role.COLL_ALL2ALL, "MPI_Bcast": Role.COLL_ONE2ALL, "MPI_Reduce": Role.COLL_ALL2ONE,
    "MPI_Barrier": Role.BARRIER, "MPI_Send": Role.POINT2POINT, "MPI_Recv": Role.POINT2POINT,
    "MPI_Allgather": Role.COLL_ALL2ALL,
}
OPS = {"allreduce": Op.ALLREDUCE, "bcast": Op.BCAST, "reduce": Op.REDUCE, "barrier": Op.BARRIER,
       "allgather": Op.ALLGATHER, "gather": Op.GATHER, "scatter": Op.SCATTER}

Item = tuple[Any, ...]


def _row(t: int, kind: int, **f: int) -> tuple:
    return (t, f.get("aux", 0), f.get("sent", 0), f.get("recv", 0), f.get("region", 0),
            f.get("comm", -1), f.get("root", -1), f.get("loc", 0), kind, f.get("op", 0))


def _stream(items: list[Item], regions: dict[tuple[str, str], int], comms: dict[str, int],
            loc: int) -> np.ndarray:
    rows: list[tuple] = []
    stack: list[Item] = []

    def close(item: Item) -> None:
        _, name, _, end, extra = item
        rid = regions[(name, _role(name, extra))]
        if "op" in extra:
            sent = extra.get("sent", extra.get("bytes", 0))
            recv = extra.get("recv", extra.get("bytes", 0))
            rows.append(_row(end, Kind.COLL_END, sent=sent, recv=recv, comm=comms[extra.get("comm", "WORLD")],
                             root=extra.get("root", -1), op=OPS[extra["op"]], loc=loc))
        if "recv" in extra and "op" not in extra:
            rows.append(_row(extra.get("at", end), Kind.RECV, root=extra["recv"], aux=extra.get("tag", 0),
                             sent=extra.get("bytes", 0), comm=comms[extra.get("comm", "WORLD")], loc=loc))
        rows.append(_row(end, Kind.LEAVE, region=rid, loc=loc))

    for item in sorted(items, key=lambda i: (i[2], -i[3])):
        _, name, start, end, extra = item
        while stack and stack[-1][3] <= start:
            close(stack.pop())
        rid = regions[(name, _role(name, extra))]
        rows.append(_row(start, Kind.ENTER, region=rid, loc=loc))
        if "op" in extra:
            rows.append(_row(start, Kind.COLL_BEGIN, loc=loc))
        if "send" in extra:
            rows.append(_row(extra.get("at", start), Kind.SEND, root=extra["send"], aux=extra.get("tag", 0),
                             sent=extra.get("bytes", 0), comm=comms[extra.get("comm", "WORLD")], loc=loc))
        stack.append(item)
    while stack:
        close(stack.pop())
    return np.array(rows, dtype=EVENT_DTYPE)


def _lane(value: bool | int) -> int:
    """``lane=True`` is lane 0; ``lane=k`` lane k (concurrent operations need lanes of their own)."""
    return 0 if value is True else int(value)


def _role(name: str, extra: dict[str, Any]) -> str:
    if "role" in extra:
        return str(extra["role"])
    if name in NAME_ROLES:
        return str(NAME_ROLES[name])
    if "op" in extra:
        return str(Role.COLL_ALL2ALL)
    return str(Role.FUNCTION)


def write_literal(directory: Path, items: list[Item], clock_offsets: dict[int, list] | None = None,
                  hosts: dict[int, str] | None = None, metrics: list[dict[str, Any]] | None = None) -> Path:
    """Write the archive into ``directory``; return the anchor path."""
    full = [tuple(i) if len(i) == 5 else (*i, {}) for i in items]
    ranks = sorted({i[0] for i in full})
    regions: dict[tuple[str, str], int] = {}
    for _, name, _, _, extra in full:
        regions.setdefault((name, _role(name, extra)), len(regions))
    comm_names = sorted({i[4].get("comm", "WORLD") for i in full} | {"WORLD"})
    comms = {name: i for i, name in enumerate(comm_names)}
    specs = []
    for rank in ranks:
        mine = [i for i in full if i[0] == rank]
        main = [i for i in mine if "lane" not in i[4] and "timeline" not in i[4]]
        locations = [LocationSpec(rank, 0, "main thread", "main", _stream(main, regions, comms, 0))]
        for lane in sorted({_lane(i[4]["lane"]) for i in mine if "lane" in i[4]}):
            on = [i for i in mine if "lane" in i[4] and _lane(i[4]["lane"]) == lane]
            index = len(locations)
            locations.append(LocationSpec(rank, index, f"comm lane {lane}", "comm_lane",
                                          _stream(on, regions, comms, index)))
        for name in sorted({i[4]["timeline"] for i in mine if "timeline" in i[4]}):
            index = len(locations)
            locations.append(LocationSpec(rank, index, name, "timeline", _stream(
                [i for i in mine if i[4].get("timeline") == name], regions, comms, index)))
        specs.append(RankSpec(rank, (hosts or {}).get(rank, "host"), (clock_offsets or {}).get(rank, []),
                              locations))
    channels = []
    for spec in specs:
        mine = [(i, m) for i, m in enumerate(metrics or []) if m.get("recorder", 0) == spec.rank]
        if not mine:
            continue
        index = len(spec.locations)
        rows = sorted((t, i, v) for i, m in mine for t, v in m["samples"])
        recs = np.array([_row(t, Kind.METRIC, region=i, aux=v, loc=index) for t, i, v in rows], dtype=EVENT_DTYPE)
        spec.locations.append(LocationSpec(spec.rank, index, f"power {spec.host}", "metric", recs))
    for m in metrics or []:
        recorder = next(s for s in specs if s.rank == m.get("recorder", 0))
        channels.append(MetricSpec(m["name"], f"literal on {recorder.host}", m.get("unit", "J"),
                                   m.get("exponent", -6), m.get("mode", "ACCUMULATED_START"), recorder.host,
                                   m.get("rank"), (recorder.rank, len(recorder.locations) - 1)))
    spec = ArchiveSpec([k for k, _ in sorted(regions.items(), key=lambda kv: kv[1])],
                       [(name, ranks) for name in comm_names], specs, metrics=channels)
    directory.mkdir(parents=True, exist_ok=True)
    return write_archive(spec, directory)
