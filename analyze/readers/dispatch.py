"""Which OTF2 reader builds the tables. Both produce identical chunks (analyze/readers/columns.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from analyze.readers import otf2_native, otf2_python
from analyze.readers.columns import Chunk, Definitions

ReaderError = otf2_python.ReaderError


def fallback_notice(prefer: str = "auto") -> str | None:
    """The one-line notice to show when ``auto`` falls back to the Python reader, else None."""
    if prefer != "auto" or otf2_native.available():
        return None
    return (f"analyze: the native OTF2 reader is not built ({otf2_native.unavailable_reason()}); "
            "using the Python reader, which is about 100 times slower "
            "(install the OTF2 headers, e.g. `make setup`, and reinstall to build it)")


def definitions(anchor: Path, prefer: str = "auto") -> tuple[str, Definitions]:
    """(reader name, definitions) of ``anchor``, for callers that read the events location by
    location themselves (:func:`otf2_native.read_locations`); ``prefer`` as in :func:`read`."""
    if prefer not in ("auto", "python", "native"):
        raise ValueError(f"unknown reader {prefer!r}")
    if prefer == "native" and not otf2_native.available():
        raise RuntimeError(f"the native OTF2 reader is not built ({otf2_native.unavailable_reason()})")
    used = "native" if prefer == "native" or (prefer == "auto" and otf2_native.available()) else "python"
    return used, otf2_native.definitions(anchor)


def read(anchor: Path, chunk_rows: int = 500_000, prefer: str = "auto") -> tuple[str, Definitions, Iterator[Chunk]]:
    """(reader name, definitions, chunks) for ``anchor``; ``prefer`` is auto, native or python.

    ``auto`` takes the native reader where it is built, else the Python one (callers show
    :func:`fallback_notice`); ``native`` raises RuntimeError where it is not built.
    """
    if prefer not in ("auto", "python", "native"):
        raise ValueError(f"unknown reader {prefer!r}")
    if prefer == "native" or (prefer == "auto" and otf2_native.available()):
        defs, chunks = otf2_native.read(anchor, chunk_rows)
        return "native", defs, chunks
    defs, chunks = otf2_python.read(anchor, chunk_rows)
    return "python", defs, chunks
