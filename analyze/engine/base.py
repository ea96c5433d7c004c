"""What every engine offers: run a stage's tasks, report progress, close."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class StageTime:
    """How one stage ran: its tasks, its wall time, the tasks' summed and longest times (s).
    With W workers a stage takes at least max(busy / W, longest): what bench/ predicts from."""

    label: str
    tasks: int
    wall: float
    busy: float
    longest: float


def timed_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``(fn(*args, **kwargs), seconds it took)``, measured where the task runs."""
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - t0


class Engine(Protocol):
    name: str
    workers: int  # tasks that can run at once: the planner splits the work by it
    stages: list[StageTime]  # one per run(), in order

    def run(self, label: str, fn: Callable[..., Any], items: Sequence[Any], *args: Any,
            sizes: Sequence[int] | None = None, unit: str = "tasks",
            partial_progress: bool = False) -> list[Any]:
        """``[fn(item, *args) for item in items]``, run side by side, in order; the first
        failure is raised once the tasks still running end. Progress counts ``sizes`` (one
        per item, in ``unit``) or tasks; with ``partial_progress`` an in-process engine also
        passes ``progress=callable`` to ``fn`` for counts within a task."""
        ...

    def everywhere(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` once in every process that runs tasks (to free per-process state)."""
        ...

    def threads_per_task(self, tasks: int) -> int | None:
        """Threads a task's own parallel work (DuckDB's) may use when a stage has ``tasks``
        tasks, so that tasks side by side do not oversubscribe the cores (None: not known)."""
        ...

    def close(self) -> None: ...


def cores_per_task(tasks: int, workers: int) -> int:
    """This machine's cores over the tasks that run on it at once (at most ``workers``): the
    threads each may use without the tasks side by side oversubscribing the cores."""
    return max(1, cores() // max(1, min(tasks, workers)))


def cores() -> int:
    """CPU cores this process may use."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
