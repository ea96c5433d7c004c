"""Which OTF2 reader builds the tables. Both produce identical chunks (analyze/columns.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from analyze import native_reader, otf2_reader
from analyze.columns import Chunk, Definitions

ReaderError = otf2_reader.ReaderError


def fallback_notice(prefer: str = "auto") -> str | None:
    """The one-line notice to show when ``auto`` falls back to the Python reader, else None."""
    if prefer != "auto" or native_reader.available():
        return None
    return (f"analyze: the native OTF2 reader is not built ({native_reader.unavailable_reason()}); "
            "using the Python reader, which is about 100 times slower "
            "(install the OTF2 headers, e.g. `make setup`, and reinstall to build it)")


def read(anchor: Path, chunk_rows: int = 500_000, prefer: str = "auto") -> tuple[str, Definitions, Iterator[Chunk]]:
    """(reader name, definitions, chunks) for ``anchor``; ``prefer`` is auto, native or python.

    ``auto`` takes the native reader where it is built, else the Python one (callers show
    :func:`fallback_notice`); ``native`` raises RuntimeError where it is not built.
    """
    if prefer not in ("auto", "python", "native"):
        raise ValueError(f"unknown reader {prefer!r}")
    if prefer == "native" or (prefer == "auto" and native_reader.available()):
        defs, chunks = native_reader.read(anchor, chunk_rows)
        return "native", defs, chunks
    defs, chunks = otf2_reader.read(anchor, chunk_rows)
    return "python", defs, chunks
