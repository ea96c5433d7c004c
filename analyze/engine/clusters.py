"""Dask clusters on HPC systems: Slurm jobs through dask-jobqueue, ``mpirun`` through dask-mpi.

Both read their settings from Dask's configuration (``~/.config/dask/jobqueue.yaml`` or
``DASK_JOBQUEUE__SLURM__...`` variables), so a site sets its partition, account and the
environment activation once; docs/scale.md has the configuration we test against
(tests/analyze/test_clusters.py builds the job script from it without submitting it).
"""

from __future__ import annotations

from typing import Any

from analyze.errors import AnalyzeError


def slurm(**overrides: Any) -> Any:
    """A ``dask_jobqueue.SLURMCluster`` from Dask's ``jobqueue.slurm`` configuration
    (``overrides`` win). It submits nothing until scaled (``cluster.scale(n=workers)``)."""
    try:
        from dask_jobqueue import SLURMCluster
    except ImportError:
        raise AnalyzeError("--scheduler slurm needs the dask-jobqueue package "
                           "(pip install 'dltrace[cluster]')") from None
    import dask

    if dask.config.get("jobqueue.slurm.cores", None) is None and "cores" not in overrides:
        raise AnalyzeError("--scheduler slurm needs Dask's jobqueue.slurm configuration "
                           "(cores, memory, queue...); see docs/scale.md")
    return SLURMCluster(**overrides)


def mpi(**options: Any) -> None:
    """Make this ``mpirun`` a Dask cluster: rank 0 runs the scheduler, ranks 2 and up run a
    single-threaded worker each until the client ends, and rank 1 returns to run the
    client (this command). Needs at least 3 ranks."""
    try:
        import dask_mpi
    except ImportError:
        raise AnalyzeError("--scheduler mpi needs the dask-mpi and mpi4py packages "
                           "(pip install 'dltrace[cluster,mpi]')") from None
    try:
        dask_mpi.initialize(**{"nthreads": 1, "dashboard": False, **options})
    except dask_mpi.WorldTooSmallException:
        raise AnalyzeError("--scheduler mpi needs at least 3 MPI ranks (scheduler, client, "
                           "workers): mpirun -np N with N >= 3") from None
