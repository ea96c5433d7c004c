"""dltrace's analysis side: traces (OTF2, ours or Score-P's) into DuckDB tables of steps,
collectives and phases, and the analyses built on them.

    import analyze
    db = analyze.open("traces/run42")      # builds traces/run42/trace.duckdb if needed
    db.sql("select rank, sum(duration_ns) from phases where phase = 'idle' group by rank").df()

Rooms, in data-flow order:

- ``readers/``: a trace into column chunks (intervals, collective records, messages), by
  one of interchangeable readers that give identical rows;
- ``tables/``: the chunks into the run's tables (Parquet, with a DuckDB database of views),
  and the tables derived from them (regions classified, steps, matched collectives, the
  phase model), built by stages of independent tasks;
- ``engine/``: where those tasks run (threads of this process, or a Dask cluster);
  ``heap.py``: how the ``analyze`` command's process keeps the memory a build frees;
- ``views.py``, ``background.py``: tables the figures and summaries are drawn from;
- ``experiments/``: across the runs of a sweep (``analyze compare``);
- ``schema.py``: every table declared once; ``errors.py``: the user-facing error;
- ``cli/``: the ``analyze`` command, one thin module per verb.

May import :mod:`traceio` (the native codec); never ``instrument``. Figures live in
``reports`` (which imports this package, not the reverse; only the ``report`` verb of the
CLI reaches into it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["AnalyzeError", "build", "connect", "open"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: ``analyze --help`` must not pay for DuckDB and pandas.
    if name == "AnalyzeError":
        from analyze.errors import AnalyzeError

        return AnalyzeError
    if name in ("build", "connect", "open"):
        from analyze.tables import database

        return database.connect if name == "open" else getattr(database, name)
    raise AttributeError(f"module 'analyze' has no attribute {name!r}")
