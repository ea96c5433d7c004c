"""Which reader builds the tables: one of the two OTF2 readers (identical chunks, see
analyze/readers/columns.py), or the Kineto / Chrome trace JSON reader for a directory of
per-rank JSON files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from analyze.readers import kineto, otf2_native, otf2_python
from analyze.readers.columns import Chunk, Definitions
from traceio import chrome

ReaderError = otf2_python.ReaderError


def is_chrome(path: Path) -> bool:
    """Whether ``path`` is Chrome trace JSON (a directory of per-rank files, or one file)
    rather than an OTF2 anchor."""
    return Path(path).is_dir() or chrome.is_trace_file(Path(path))


def fallback_notice(prefer: str = "auto") -> str | None:
    """The one-line notice to show when ``auto`` falls back to the Python reader, else None."""
    if prefer != "auto" or otf2_native.available():
        return None
    return (f"analyze: the native OTF2 reader is not built ({otf2_native.unavailable_reason()}); "
            "using the Python reader, which is about 100 times slower "
            "(install the OTF2 headers, e.g. `make setup`, and reinstall to build it)")


def definitions(anchor: Path, prefer: str = "auto") -> tuple[str, Definitions]:
    """(reader name, definitions) of ``anchor``, for callers that read the events location by
    location themselves (:func:`otf2_native.read_locations`); ``prefer`` as in :func:`read`.

    Chrome trace JSON defines its locations, regions and communicators as it goes: its
    definitions take reading every file (the events are read again by whoever reads them).
    """
    if prefer not in ("auto", "python", "native"):
        raise ValueError(f"unknown reader {prefer!r}")
    if is_chrome(anchor):
        _, defs, chunks = read(anchor)
        for _ in chunks:
            pass
        return "kineto", defs
    if prefer == "native" and not otf2_native.available():
        raise RuntimeError(f"the native OTF2 reader is not built ({otf2_native.unavailable_reason()})")
    used = "native" if prefer == "native" or (prefer == "auto" and otf2_native.available()) else "python"
    return used, otf2_native.definitions(anchor)


def read(anchor: Path, chunk_rows: int = 500_000, prefer: str = "auto") -> tuple[str, Definitions, Iterator[Chunk]]:
    """(reader name, definitions, chunks) for ``anchor``; ``prefer`` is auto, native or python.

    ``anchor`` may also be a directory of Chrome trace JSON files or one such file (the
    ``kineto`` reader, whatever ``prefer`` says).

    ``auto`` takes the native reader where it is built, else the Python one (callers show
    :func:`fallback_notice`); ``native`` raises RuntimeError where it is not built.
    """
    if prefer not in ("auto", "python", "native"):
        raise ValueError(f"unknown reader {prefer!r}")
    if is_chrome(anchor):
        try:
            defs, chunks = kineto.read(anchor, chunk_rows)
        except (kineto.KinetoError, chrome.ChromeTraceError) as e:
            raise ReaderError(str(e)) from None
        return "kineto", defs, _kineto_errors(chunks)
    if prefer == "native" or (prefer == "auto" and otf2_native.available()):
        defs, chunks = otf2_native.read(anchor, chunk_rows)
        return "native", defs, chunks
    defs, chunks = otf2_python.read(anchor, chunk_rows)
    return "python", defs, chunks


def _kineto_errors(chunks: Iterator[Chunk]) -> Iterator[Chunk]:
    """The Kineto reader's chunks, its errors while reading them as :class:`ReaderError`."""
    try:
        yield from chunks
    except (kineto.KinetoError, chrome.ChromeTraceError) as e:
        raise ReaderError(str(e)) from None
