"""Which OTF2 reader builds the tables. Both produce identical chunks (analyze/columns.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from analyze import otf2_reader
from analyze.columns import Chunk, Definitions

ReaderError = otf2_reader.ReaderError


def read(anchor: Path, chunk_rows: int = 500_000, prefer: str = "auto") -> tuple[str, Definitions, Iterator[Chunk]]:
    """(reader name, definitions, chunks) for ``anchor``; ``prefer`` is auto, native or python."""
    if prefer not in ("auto", "python", "native"):
        raise ValueError(f"unknown reader {prefer!r}")
    defs, chunks = otf2_reader.read(anchor, chunk_rows)
    return "python", defs, chunks
