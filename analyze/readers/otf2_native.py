"""Read an OTF2 archive with the native codec (:mod:`traceio.codec`), the fast path.

Definitions come from the ``otf2`` package exactly as in :mod:`analyze.readers.otf2_python` (they are
small). Events are decoded in C: the archive's locations are split into one bucket per CPU,
balanced by event count, and each bucket's ``Reader`` runs in its own thread with the GIL
released, applying the rules of :mod:`analyze.readers.columns` location by location. Rows come back
as numpy arrays over C memory, without per-event Python work; the rows are the portable
reader's, in another order (per location rather than by time across locations).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np
import otf2

from analyze.readers.columns import (
    COLLECTIVE_COLUMNS,
    INTERVAL_COLUMNS,
    MESSAGE_COLUMNS,
    METRIC_COLUMNS,
    Chunk,
    Definitions,
    ReadStats,
)
from analyze.readers.otf2_python import ReaderError, read_definitions
from traceio import codec

available = codec.available
unavailable_reason = codec.unavailable_reason


def definitions(anchor: Path) -> Definitions:
    """The archive's definitions (read with the ``otf2`` package; they are small)."""
    try:
        reader = otf2.reader.Reader(str(anchor))
    except Exception as e:  # the otf2 package raises several types for bad archives
        raise ReaderError(f"cannot read the OTF2 archive {anchor}: {e}") from None
    try:
        return read_definitions(reader, anchor)
    except Exception as e:
        raise ReaderError(f"cannot read the definitions of {anchor}: {e}") from None
    finally:
        reader.close()


def buckets(defs: Definitions, n: int) -> list[list[tuple[int, int]]]:
    """The locations as (location_id, rank) split into at most ``n`` buckets of similar event
    counts (largest location first into the lightest bucket), each in location order."""
    out: list[list[tuple[int, int]]] = [[] for _ in range(max(1, min(n, len(defs.locations))))]
    load = [0] * len(out)
    for loc in sorted(defs.locations, key=lambda x: (-x.events, x.location_id)):
        i = load.index(min(load))
        out[i].append((loc.location_id, loc.rank))
        load[i] += max(loc.events, 1)
    return [sorted(b) for b in out if b]


def _threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def read(anchor: Path, chunk_rows: int = 500_000, threads: int | None = None, *,
         defs: Definitions | None = None, decode_only: bool = False) -> tuple[Definitions, Iterator[Chunk]]:
    """Open ``anchor``; return its definitions (``defs``, when read already) and an iterator
    over column chunks. ``decode_only``: the events are decoded and counted, and the chunks
    hold no rows (what the OTF2 library costs by itself: bench/scale.py).

    Raises :class:`ReaderError` for a missing or corrupt archive, also while iterating.
    """
    native = codec.native()
    if native is None:
        raise RuntimeError(f"the native OTF2 reader is not built ({codec.unavailable_reason()})")
    if defs is None:
        defs = definitions(anchor)
    declared = {loc.location_id: loc.events for loc in defs.locations}
    readers = []
    try:
        for bucket in buckets(defs, threads or _threads()):
            readers.append(native.Reader(str(anchor), [b[0] for b in bucket], [b[1] for b in bucket],
                                          defs.global_offset, defs.resolution,
                                          [declared[b[0]] for b in bucket], decode_only=decode_only))
    except native.Error as e:
        for r in readers:
            r.close()
        raise ReaderError(f"cannot read the events of {anchor}: {e}") from None
    return defs, _chunks(anchor, readers, chunk_rows)


def read_locations(anchor: Path, locations: list[tuple[int, int, int]], global_offset: int,
                   resolution: int, chunk_rows: int = 500_000) -> Iterator[Chunk]:
    """Chunks of the events of ``locations`` ((location_id, rank, declared events), from the
    definitions), read one location after the other in the calling thread (the GIL is
    released while C reads); the last chunk carries the stats. For callers that spread
    locations over tasks themselves (analyze/tables/stages.py)."""
    native = codec.native()
    if native is None:
        raise RuntimeError(f"the native OTF2 reader is not built ({codec.unavailable_reason()})")
    try:
        reader = native.Reader(str(anchor), [x[0] for x in locations], [x[1] for x in locations],
                               global_offset, resolution, [x[2] for x in locations])
    except native.Error as e:
        raise ReaderError(f"cannot read the events of {anchor}: {e}") from None
    try:
        finished = not locations
        while not finished:
            try:
                intervals, collectives, messages, metrics, events, finished = reader.read(chunk_rows)
            except native.Error as e:
                raise ReaderError(f"cannot read the events of {anchor}: {e}") from None
            yield Chunk(_table(intervals, INTERVAL_COLUMNS), _table(collectives, COLLECTIVE_COLUMNS),
                        _table(messages, MESSAGE_COLUMNS), int(events), metrics=_table(metrics, METRIC_COLUMNS))
        stats = ReadStats(*reader.stats())
        yield Chunk(_empty(INTERVAL_COLUMNS), _empty(COLLECTIVE_COLUMNS), _empty(MESSAGE_COLUMNS), 0, stats)
    finally:
        reader.close()


def _empty(spec: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {name: np.zeros(0, dtype=dt) for name, dt in spec.items()}


def _table(columns: tuple[Any, ...], spec: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {name: np.frombuffer(col, dtype=dt) for col, (name, dt) in zip(columns, spec.items(), strict=True)}


def _chunks(anchor: Path, readers: list[Any], chunk_rows: int) -> Iterator[Chunk]:
    # One read in flight per reader: while the caller loads a chunk, the readers go on.
    pool = ThreadPoolExecutor(max_workers=max(1, len(readers)), thread_name_prefix="otf2-read")
    pending: dict[Future, Any] = {pool.submit(r.read, chunk_rows): r for r in readers}
    try:
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                reader = pending.pop(fut)
                try:
                    intervals, collectives, messages, metrics, events, finished = fut.result()
                except codec.native().Error as e:  # type: ignore[union-attr]
                    raise ReaderError(f"cannot read the events of {anchor}: {e}") from None
                if not finished:
                    pending[pool.submit(reader.read, chunk_rows)] = reader
                yield Chunk(_table(intervals, INTERVAL_COLUMNS), _table(collectives, COLLECTIVE_COLUMNS),
                            _table(messages, MESSAGE_COLUMNS), int(events),
                            metrics=_table(metrics, METRIC_COLUMNS))
        stats = ReadStats()
        for r in readers:
            events, leaves, truncated, ends = r.stats()
            stats.events += events
            stats.unmatched_leaves += leaves
            stats.truncated += truncated
            stats.unmatched_collective_ends += ends
        empty = Chunk(_table(((b"",) * len(INTERVAL_COLUMNS)), INTERVAL_COLUMNS),
                      _table(((b"",) * len(COLLECTIVE_COLUMNS)), COLLECTIVE_COLUMNS),
                      _table(((b"",) * len(MESSAGE_COLUMNS)), MESSAGE_COLUMNS), 0, stats)
        yield empty
    finally:
        # a read in flight cannot be interrupted: let it finish before closing its archive
        wait(pending)
        pool.shutdown(wait=True)
        for r in readers:
            r.close()
