"""The native OTF2 codec (``traceio._otf2native``, built from ``traceio/native/`` by setup.py).

One C extension reads OTF2 into column arrays (the analysis side's fast reader), writes
archives, and replays the tracer's records (the merge's inner loops). Where it is not built
(no OTF2 headers at install time), every caller has a Python path; this module says which.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

try:
    _native: Any = importlib.import_module("traceio._otf2native")
except ImportError as e:  # not built: no OTF2 headers at install time, or removed
    _native = None
    _IMPORT_ERROR = str(e)
else:
    _IMPORT_ERROR = ""


def native() -> ModuleType | None:
    """The extension module, or None where it is not built."""
    return _native


def available() -> bool:
    """Whether the extension is built and importable."""
    return _native is not None


def unavailable_reason() -> str:
    """Why the extension cannot be used ("" when it can)."""
    return _IMPORT_ERROR if _native is None else ""
