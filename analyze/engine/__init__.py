"""Engines: where the build's tasks run. Owns running a stage's independent tasks and
showing their progress, not what the tasks do (analyze/tables/stages.py).

- :mod:`.local`: threads in this process (the default; one per core).
- :mod:`.on_dask`: a Dask cluster: a local one on this machine's cores, an existing scheduler
  (``--scheduler tcp://host:8786`` or a scheduler file), a Slurm allocation through
  dask-jobqueue, or the processes of an ``mpirun`` through dask-mpi (:mod:`.clusters`).

Both run the same task functions on the same files, so they give the same tables. The
``dask``, ``distributed``, ``dask_jobqueue`` and ``dask_mpi`` packages load only when a Dask
engine is made.

May import: :mod:`analyze.errors`. Not the tables, readers or CLI (tasks arrive as functions).
"""

from __future__ import annotations

from analyze.engine.base import Engine
from analyze.engine.choose import make

__all__ = ["Engine", "make"]
