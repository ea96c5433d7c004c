"""Where a run's OTF2 archive and its database are, without the build's libraries: the
``analyze`` command asks before it imports them (:func:`analyze.cli.heap_to_warm`), and
:func:`analyze.tables.database.resolve` decides from the same rules."""

from __future__ import annotations

from pathlib import Path

DB_NAME = "trace.duckdb"  # a run's database, beside its archive


def otf2_anchors(directory: Path) -> list[Path]:
    """The OTF2 anchor files of a run directory: its ``traces.otf2`` (ours, Score-P's), else
    every ``*.otf2`` in it, sorted (more than one: the user names one)."""
    anchor = directory / "traces.otf2"
    return [anchor] if anchor.is_file() else sorted(directory.glob("*.otf2"))
