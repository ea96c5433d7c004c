"""The local engine: a stage's tasks on threads of this process.

The work inside a task runs without the GIL (the native OTF2 reader, DuckDB, numpy's large
operations), so threads use every core without copying data between processes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

from analyze.engine.base import StageTime, cores, cores_per_task, timed_call
from analyze.engine.progress import Progress


class LocalEngine:
    name = "local"

    def __init__(self, workers: int | None = None):
        self.workers = max(1, workers or cores())
        self.stages: list[StageTime] = []
        self._stderr = Progress.stderr()

    def run(self, label: str, fn: Callable[..., Any], items: Sequence[Any], *args: Any,
            sizes: Sequence[int] | None = None, unit: str = "tasks",
            partial_progress: bool = False) -> list[Any]:
        sizes = list(sizes) if sizes is not None else [1] * len(items)
        progress = Progress(label, sum(sizes), unit, self._stderr)
        kwargs = {"progress": progress.add} if partial_progress else {}
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=f"analyze-{label}") as pool:
            futures: list[Future[Any]] = [pool.submit(timed_call, fn, item, *args, **kwargs) for item in items]
            if not partial_progress:
                for fut, size in zip(futures, sizes, strict=True):
                    fut.add_done_callback(_adder(progress, size))
            try:
                done, pending = wait(futures, return_when=FIRST_EXCEPTION)
                failed = next((f for f in futures if f in done and f.exception() is not None), None)
                if failed is not None:
                    for fut in pending:
                        fut.cancel()
                    wait(futures)
                    raise failed.exception()  # type: ignore[misc]
                results = [f.result() for f in futures]
                times = [t for _, t in results]
                self.stages.append(StageTime(label, len(items), time.perf_counter() - t0, sum(times),
                                             max(times, default=0.0)))
                return [r for r, _ in results]
            finally:
                wait(futures)
                progress.close()

    def everywhere(self, fn: Callable[..., Any], *args: Any) -> None:
        fn(*args)

    def threads_per_task(self, tasks: int) -> int | None:
        """This process's cores over the tasks that run at once: one each when a stage has a
        task per worker (2 ranks on 2 cores: 5% faster than DuckDB's two threads per task),
        more when it has fewer (one rank: its queries keep every core)."""
        return cores_per_task(tasks, self.workers)

    def close(self) -> None:
        if self._stderr is not None:
            os.close(self._stderr)
            self._stderr = None


def _adder(progress: Progress, n: int) -> Callable[[Future[Any]], None]:
    return lambda _future: progress.add(n)
