"""Region names of Horovod collectives, shared by the PyTorch and TensorFlow Horovod hooks.

A collective's region is ``horovod.<op>:<tensor name>`` (``horovod.allreduce:layer1.weight``),
so a trace shows which tensor each collective moved; unnamed operations, and every name past
:data:`MAX_NAMED_REGIONS` (a script that names each step's tensors anew), use the plain
``horovod.<op>``, keeping the region table bounded.
"""

from __future__ import annotations

from instrument.tracer.recorder import Recorder
from traceio import records
from traceio.records import Op

MAX_NAMED_REGIONS = 4096


class TensorRegions:
    """Region ids by (operation, tensor name), defined on first use."""

    def __init__(self, rec: Recorder):
        self.rec = rec
        self._rids: dict[tuple[str, str | None], int] = {}
        self._named = 0

    def __call__(self, base: str, op: Op, name: str | None) -> int:
        key = (base, name)
        rid = self._rids.get(key)
        if rid is None:
            if name is not None and self._named >= MAX_NAMED_REGIONS:
                return self(base, op, None)
            self._named += name is not None
            label = f"horovod.{base}" if name is None else f"horovod.{base}:{name}"
            rid = self._rids[key] = self.rec.region_id(label, records.ROLE_OF_OP[op])
        return rid
