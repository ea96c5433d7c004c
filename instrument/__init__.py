"""dltrace's instrumentation side: start the ranks of a training script, trace them, merge
their records into one OTF2 archive per run.

Rooms, in the order a run passes through them:

- ``cli.py``: the ``instrument`` command, thin verbs over the packages below;
- ``launch/``: start the ranks (ourselves or torchrun, horovodrun, mpirun, srun), watch them,
  then merge; the run directory and ``run.json``;
- ``bootstrap.py``: what each rank runs: a tracer from the environment, the hooks, the script;
- ``hooks/``: one module per framework, calling the recorder;
- ``tracer/``: the recorder (regions and steps), the built-in tracer's buffer and spill files,
  clocks, and the merge of all ranks' records into an archive description;
- ``scorep/``: the Score-P backend and the merge of Score-P experiments;
- ``experiments/``: designed experiments (``instrument sweep``).

Writing OTF2 belongs to :mod:`traceio`, shared with the analysis; nothing here imports
``analyze`` or ``reports``.

The public API for training scripts is :func:`region`, a user region marker (a no-op when
the script runs without the tracer).
"""

from __future__ import annotations

from typing import Any

__all__ = ["region"]


def __getattr__(name: str) -> Any:
    # ``instrument --help`` must not pay for numpy: the marker loads on first use.
    if name == "region":
        from instrument.tracer.markers import region

        return region
    raise AttributeError(f"module 'instrument' has no attribute {name!r}")
