"""dltrace's analysis side: OTF2 archives into DuckDB tables of steps, collectives and phases.

    import analyze
    db = analyze.open("traces/run42")      # builds traces/run42/trace.duckdb if needed
    db.sql("select rank, sum(duration_ns) from phases where phase = 'idle' group by rank").df()
"""

from analyze.database import AnalyzeError, build, connect

open = connect  # noqa: A001 -- the documented entry point: analyze.open(run)

__all__ = ["AnalyzeError", "build", "connect", "open"]
