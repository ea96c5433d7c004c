"""What every engine offers: run a stage's tasks, report progress, close."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol


class Engine(Protocol):
    name: str
    workers: int  # tasks that can run at once: the planner splits the work by it

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

    def close(self) -> None: ...


def cores() -> int:
    """CPU cores this process may use."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
