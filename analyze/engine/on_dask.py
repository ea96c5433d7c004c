"""The Dask engine: a stage's tasks as Dask futures on a cluster's workers.

Where the cluster comes from (``--scheduler``):

- nothing: a ``LocalCluster`` of one single-threaded worker process per core (or
  ``--workers N``) on this machine;
- ``tcp://host:port`` or a scheduler file (JSON, as ``dask scheduler --scheduler-file``
  and dask-mpi write): an existing scheduler and its workers;
- ``slurm``: workers submitted as Slurm jobs by dask-jobqueue, configured as in
  docs/scale.md (:func:`analyze.engine.clusters.slurm`);
- ``mpi``: inside ``mpirun``, rank 0 becomes the scheduler, rank 1 runs this command and
  the other ranks are workers (dask-mpi; :func:`analyze.engine.clusters.mpi`).

Every worker must see the run directory at the same path (a shared file system on a cluster)
and import the same ``analyze``: tasks read the archive and exchange Parquet files there.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from analyze.engine.base import StageTime, cores, cores_per_task, timed_call
from analyze.engine.progress import Progress
from analyze.errors import AnalyzeError


class DaskEngine:
    name = "dask"

    def __init__(self, client: Any, cluster: Any = None):
        self.client = client
        self.stages: list[StageTime] = []
        self._cluster = cluster  # closed with the engine when we started it
        self._stderr = Progress.stderr()
        from distributed import LocalCluster  # installed: the client is its

        # every worker runs on this machine: the cluster started with the engine is a local one
        self._shares_cores = isinstance(cluster, LocalCluster)
        info = client.scheduler_info(n_workers=-1)
        self.workers = max(1, sum(w.get("nthreads", 1) for w in info.get("workers", {}).values()))

    @classmethod
    def connect(cls, scheduler: str | None = None, workers: int | None = None) -> DaskEngine:
        """An engine on the cluster ``scheduler`` names (see the module docstring)."""
        try:
            import distributed
        except ImportError:
            raise AnalyzeError("--engine dask needs the dask[distributed] package "
                               "(pip install 'dltrace[cluster]')") from None
        if scheduler is None:
            cluster = distributed.LocalCluster(
                n_workers=workers or cores(), threads_per_worker=1, processes=True,
                # any free port: None still serves the scheduler's HTTP pages on 8787 and warns
                # when another cluster (a second analysis, a notebook) holds it
                dashboard_address=":0", silence_logs=logging.ERROR)
            return cls(distributed.Client(cluster), cluster)
        if scheduler == "slurm":
            from analyze.engine import clusters

            cluster = clusters.slurm()
            cluster.scale(n=workers or 1)
            client = distributed.Client(cluster)
            client.wait_for_workers(1)
            return cls(client, cluster)
        if scheduler == "mpi":
            from analyze.engine import clusters

            clusters.mpi()  # returns on the client rank only
            return cls(_client(distributed, None))
        return cls(_client(distributed, scheduler))

    def run(self, label: str, fn: Callable[..., Any], items: Sequence[Any], *args: Any,
            sizes: Sequence[int] | None = None, unit: str = "tasks",
            partial_progress: bool = False) -> list[Any]:
        from distributed import as_completed

        sizes = list(sizes) if sizes is not None else [1] * len(items)
        progress = Progress(label, sum(sizes), unit, self._stderr)
        t0 = time.perf_counter()
        futures = [self.client.submit(timed_call, fn, item, *args, pure=False) for item in items]
        size_of = {f.key: n for f, n in zip(futures, sizes, strict=True)}
        try:
            for fut in as_completed(futures):
                if fut.status == "error":
                    self.client.cancel(futures)
                    fut.result()  # raises the task's exception, with its traceback
                progress.add(size_of[fut.key])
            results = self.client.gather(futures)
        finally:
            progress.close()
        times = [t for _, t in results]
        self.stages.append(StageTime(label, len(items), time.perf_counter() - t0, sum(times),
                                     max(times, default=0.0)))
        return [r for r, _ in results]

    def everywhere(self, fn: Callable[..., Any], *args: Any) -> None:
        self.client.run(fn, *args)

    def threads_per_task(self, tasks: int) -> int | None:
        """A local cluster's workers share this machine's cores (one task each at a time);
        elsewhere the layout of workers on nodes is not known: DuckDB's default."""
        return cores_per_task(tasks, self.workers) if self._shares_cores else None

    def peak_rss_mb(self) -> dict[str, float]:
        """Each worker process's peak resident memory so far, in MB."""
        return self.client.run(_peak_rss_mb)

    def close(self) -> None:
        if self._stderr is not None:
            os.close(self._stderr)
            self._stderr = None
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()


def _client(distributed: Any, scheduler: str | None) -> Any:
    """A client of ``scheduler`` (address or scheduler file; None: dask's configured one)."""
    import dask

    timeout = dask.config.get("distributed.comm.timeouts.connect")  # 30s unless configured
    try:
        if scheduler is not None and Path(scheduler).is_file():
            _check_scheduler_file(Path(scheduler))
            return distributed.Client(scheduler_file=scheduler, timeout=timeout)
        return distributed.Client(scheduler, timeout=timeout)
    except (OSError, TimeoutError) as e:
        raise AnalyzeError(f"cannot reach the Dask scheduler {scheduler or '(configured)'} ({e}); "
                           "start it first, or leave out --scheduler for a cluster on this machine") from None
    except (ValueError, KeyError, TypeError) as e:  # not an address, or a file that is not one
        what = "no file and no address" if not Path(str(scheduler)).exists() else "not a scheduler file"
        raise AnalyzeError(f"--scheduler {scheduler}: {what} ({type(e).__name__}: {e}); give the "
                           "scheduler's address (tcp://host:8786) or the JSON file that "
                           "'dask scheduler --scheduler-file' wrote") from None


def _check_scheduler_file(path: Path) -> None:
    """Fail clearly on a file that is not a scheduler file (Dask reads it with an assert)."""
    try:
        address = json.loads(path.read_text()).get("address")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        address = None
    if not isinstance(address, str) or not address:
        raise AnalyzeError(f"--scheduler {path}: not a Dask scheduler file (JSON with the "
                           "scheduler's \"address\"); give the file that 'dask scheduler "
                           "--scheduler-file' wrote, or the address tcp://host:8786")


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
