"""Making an engine from its name (what the CLI and ``analyze.build(engine="dask")`` give)."""

from __future__ import annotations

from analyze.engine.base import Engine
from analyze.errors import AnalyzeError

ENGINES = ("local", "dask")


def make(name: str = "local", *, workers: int | None = None, scheduler: str | None = None) -> Engine:
    """An engine by name: ``local`` (``workers`` threads, default one per core) or ``dask``
    (``scheduler``: None for a local cluster of ``workers`` processes, an address, a
    scheduler file, ``slurm`` or ``mpi``; see :mod:`analyze.engine.on_dask`)."""
    if name == "local":
        if scheduler is not None:
            raise AnalyzeError("--scheduler needs --engine dask")
        from analyze.engine.local import LocalEngine

        return LocalEngine(workers)
    if name == "dask":
        from analyze.engine.on_dask import DaskEngine

        return DaskEngine.connect(scheduler, workers)
    raise AnalyzeError(f"unknown engine {name!r}; use one of: {', '.join(ENGINES)}")
