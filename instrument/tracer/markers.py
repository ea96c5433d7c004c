"""User regions: ``from instrument import region`` then ``with region("data_aug"): ...``.

Works under every backend (built-in tracer, Score-P) and costs one attribute lookup when
tracing is off, so scripts can keep their markers in production.
"""

from __future__ import annotations

from contextlib import ContextDecorator
from typing import Any

from instrument.tracer import recorder
from traceio.records import Role


class region(ContextDecorator):  # noqa: N801 -- used like a function, as contextlib's helpers
    """A named user region, as a context manager or a decorator."""

    def __init__(self, name: str):
        self.name = str(name)
        self._rid: int | None = None

    def __enter__(self) -> region:
        rec = recorder.current()
        if rec is not None:
            if self._rid is None:
                self._rid = rec.region_id(self.name, Role.FUNCTION)
            rec.enter(self._rid)
        return self

    def __exit__(self, *exc: Any) -> None:
        rec = recorder.current()
        if rec is not None and self._rid is not None:
            rec.leave(self._rid)


def end_step() -> None:
    """End the current training step here, for loops without an optimizer step the hooks see
    (mpi4py programs, hand-written updates); the framework hooks end steps by themselves."""
    rec = recorder.current()
    if rec is not None:
        rec.optimizer_done()
