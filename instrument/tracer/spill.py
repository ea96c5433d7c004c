"""Per-rank spill files: what each rank's tracer leaves on disk for the merge step.

Each rank writes two files into ``<run>/ranks/``:

- ``rank-<r>.evt``: a 16-byte header (magic, format version, record size) followed by event
  records (:data:`traceio.records.EVENT_DTYPE`), appended in the order the tracer recorded
  them. A rank killed during a write leaves a partial last record; readers drop it.
- ``rank-<r>.json``: the rank's definitions (regions, communicators, thread names) and
  metadata (host, versions, clock samples, status). Rewritten atomically before every append
  of events, so every record on disk refers only to definitions already on disk.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from traceio.records import EVENT_DTYPE

MAGIC = b"DLTRACE\x00"
VERSION = 1
HEADER = MAGIC + VERSION.to_bytes(4, "little") + EVENT_DTYPE.itemsize.to_bytes(4, "little")
RANK_FILE = re.compile(r"rank-(\d+)\.evt$")


class SpillError(Exception):
    """A spill file is missing, unreadable or not ours."""


def rank_paths(ranks_dir: Path, rank: int) -> tuple[Path, Path]:
    """The (events, metadata) paths of ``rank`` inside ``ranks_dir``."""
    stem = ranks_dir / f"rank-{rank:05d}"
    return stem.with_suffix(".evt"), stem.with_suffix(".json")


class SpillWriter:
    """Appends record batches and rewrites the metadata file of one rank."""

    def __init__(self, ranks_dir: Path, rank: int):
        ranks_dir.mkdir(parents=True, exist_ok=True)
        self.events_path, self.meta_path = rank_paths(ranks_dir, rank)
        self._fd = os.open(self.events_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._write_all(HEADER)
        self.records_written = 0

    def _write_all(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def append(self, raw: bytes | memoryview) -> None:
        """Append whole records given as raw bytes (a multiple of the record size)."""
        self._write_all(raw)
        self.records_written += len(raw) // EVENT_DTYPE.itemsize

    def write_meta(self, meta: dict[str, Any]) -> None:
        tmp = self.meta_path.with_name(self.meta_path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(meta, f, ensure_ascii=False)
        os.replace(tmp, self.meta_path)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass
class RankSpill:
    rank: int
    records: np.ndarray
    meta: dict[str, Any]
    dropped_bytes: int  # a partial record at the end (rank killed during a write)


def read_rank(ranks_dir: Path, rank: int) -> RankSpill:
    """Read one rank's spill files; tolerate a partial last record."""
    evt, meta_path = rank_paths(ranks_dir, rank)
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpillError(f"{meta_path}: missing; the rank did not get far enough to record anything") from None
    except (OSError, ValueError) as e:
        raise SpillError(f"{meta_path}: unreadable ({e})") from None
    try:
        data = evt.read_bytes()
    except FileNotFoundError:
        data = HEADER
    if not data.startswith(MAGIC):
        raise SpillError(f"{evt}: not a dltrace spill file")
    if data[: len(HEADER)] != HEADER:
        raise SpillError(f"{evt}: written by another dltrace version (header {data[:16]!r})")
    body = len(data) - len(HEADER)
    whole = body - body % EVENT_DTYPE.itemsize
    records = np.frombuffer(data, dtype=EVENT_DTYPE, count=whole // EVENT_DTYPE.itemsize, offset=len(HEADER))
    return RankSpill(rank, records, meta, body - whole)


def ranks_present(ranks_dir: Path) -> list[int]:
    """Ranks that left an events file in ``ranks_dir``, sorted."""
    if not ranks_dir.is_dir():
        return []
    found = (RANK_FILE.match(p.name) for p in ranks_dir.iterdir())
    return sorted(int(m.group(1)) for m in found if m)
