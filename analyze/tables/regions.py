"""Classify regions for the phase model, from their names, paradigms and roles.

Our own markers are recognised by name (``dltrace.step`` ...), also with the ``user:`` prefix
Score-P gives user regions, so traces from both backends classify alike; so are the names
PyTorch's profiler gives steps, data loading, optimizer steps and device synchronization.
Everything else goes by OTF2 paradigm and role, as Score-P writes them (see
docs/phase-model.md); accelerator kernels and copies by their roles (docs/gpu.md).
"""

from __future__ import annotations

import re

from analyze.schema import Category

MARKERS = {
    "dltrace.step": Category.STEP,
    "dltrace.tail": Category.TAIL,
    "dltrace.forward": Category.FORWARD,
    "dltrace.backward": Category.BACKWARD,
    "dltrace.optimizer": Category.OPTIMIZER,
    "dltrace.dataloader": Category.DATALOADER,
    "dltrace.flush": Category.OVERHEAD,
    "dltrace.clock_sync": Category.OVERHEAD,
}
# Score-P's own work: buffer flushes and switched-off recording.
OVERHEAD_NAMES = {"TRACE BUFFER FLUSH", "MEASUREMENT OFF"}
COLLECTIVE_ROLES = {"coll_all2all", "coll_one2all", "coll_all2one", "coll_other", "barrier"}
# Thread-level synchronization (OpenMP, pthreads) is not communication between ranks.
THREAD_PARADIGMS = {"openmp", "pthread", "winthread", "qtthread", "acethread", "tbbthread"}
# What PyTorch's profiler (Kineto) names steps, data loading, optimizer steps and the runtime
# calls that block the host until the device is done.
KINETO_NAMES = (
    (re.compile(r"ProfilerStep#\d+"), Category.STEP),
    (re.compile(r"enumerate\(DataLoader\)#.*"), Category.DATALOADER),
    (re.compile(r"Optimizer\.step#.*"), Category.OPTIMIZER),
    (re.compile(r"(cuda|hip)(Device|Stream|Event)Synchronize"), Category.WAIT),
)


def classify(name: str, paradigm: str, role: str) -> Category:
    """The :class:`Category` of a region (paradigm and role as lowercase OTF2 enum names)."""
    base = name[5:] if name.startswith("user:") else name
    if base in MARKERS:
        return MARKERS[base]
    if name in OVERHEAD_NAMES:
        return Category.OVERHEAD
    if role == "kernel":
        return Category.KERNEL
    if role == "data_transfer":
        return Category.MEMORY
    for pattern, category in KINETO_NAMES:
        if pattern.fullmatch(name):
            return category
    if paradigm in THREAD_PARADIGMS:
        return Category.FUNCTION
    if role in COLLECTIVE_ROLES:
        return Category.COLLECTIVE
    if role in ("point2point", "rma"):
        return Category.P2P
    if role == "task_wait" and paradigm == "user":
        return Category.WAIT
    if paradigm == "mpi":
        # Completion of non-blocking operations is communication time.
        if base.startswith(("MPI_Wait", "MPI_Test")):
            return Category.P2P
        if role in ("function", "unknown"):
            return Category.RUNTIME
        return Category.FUNCTION
    if name.startswith("user:"):
        return Category.USER
    return Category.FUNCTION
