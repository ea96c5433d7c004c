"""The tracer's event records: one fixed-size binary layout shared by the in-memory buffer,
the per-rank spill files and the merge step.

A record is 48 bytes. Times are integer nanoseconds of the rank's host clock
(CLOCK_MONOTONIC, or a device clock converted to it). What the other fields mean depends on
the record kind:

- ``ENTER`` / ``LEAVE``: ``region`` entered or left on thread-location ``loc``.
- ``COLL_END``: the collective that the innermost open region on ``loc`` performs; written just
  before that region's ``LEAVE`` (``comm``, ``op``, ``root``, ``bytes_sent``, ``bytes_recv``).
  The merge writes it as an OTF2 MpiCollectiveBegin at the region's enter time and an
  MpiCollectiveEnd at this record's time.
- ``ASYNC_COLL``: a whole asynchronous collective (issued at ``time``, completed at ``aux``),
  recorded when it completes, possibly from another thread. The merge places these on
  per-rank communication lanes (extra OTF2 locations), because several can be in flight.
- ``STEP_DISCARD``: the step region whose index is ``aux`` ended without an optimizer step
  (evaluation or shutdown after the last step); the merge writes it as a ``dltrace.tail``
  region instead of a step.
- ``METRIC``: one sample of metric member ``region`` (an index into the rank's metric
  definitions, as regions index region definitions) on metric location ``loc``, taken at
  ``time``; the value is the integer ``aux`` in the member's unit and exponent (the power
  sampler: cumulative energy in microjoules, or power in milliwatts). An integer rather than a
  float reinterpreted in the field: the readings are integers at the source (RAPL's
  ``energy_uj``, NVML's mJ and mW), so nothing is rounded, and ``otf2-print`` shows them as
  they were read. The merge writes it as an OTF2 Metric event of type INT64.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

import numpy as np

EVENT_DTYPE = np.dtype(
    [
        ("time", "<i8"),
        ("aux", "<i8"),
        ("bytes_sent", "<u8"),
        ("bytes_recv", "<u8"),
        ("region", "<u4"),
        ("comm", "<i4"),
        ("root", "<i4"),
        ("loc", "<u2"),
        ("kind", "u1"),
        ("op", "u1"),
    ]
)
assert EVENT_DTYPE.itemsize == 48

# ``loc`` of ASYNC_COLL records: they are not on a thread; the merge assigns lanes.
NO_LOC = 0xFFFF

# Record fields in the order the tracer passes them to the buffer.
FIELDS = EVENT_DTYPE.names


class Kind(IntEnum):
    ENTER = 1
    LEAVE = 2
    COLL_END = 3
    ASYNC_COLL = 4
    STEP_DISCARD = 5
    # Only in the merge's normalized per-location streams handed to the OTF2 writer: the
    # begin of the collective that the enclosing region performs, at the region's enter time,
    COLL_BEGIN = 6
    # and point-to-point messages: ``root`` is the peer's rank in communicator ``comm``,
    # ``aux`` the tag, ``bytes_sent`` the message length.
    SEND = 7
    RECV = 8
    METRIC = 9


class Op(IntEnum):
    """Collective operations; the numbers are our own, names match OTF2's CollectiveOp."""

    NONE = 0
    BARRIER = 1
    BCAST = 2
    GATHER = 3
    SCATTER = 4
    ALLGATHER = 5
    ALLTOALL = 6
    REDUCE = 7
    ALLREDUCE = 8
    REDUCE_SCATTER = 9
    SEND = 10
    RECV = 11
    # NCCL kernels whose operation their trace does not say (SendRecv: all_to_all or grouped
    # send/recv); OTF2 has no "unknown" operation, this is its nearest
    ALLTOALLV = 12


class Role(StrEnum):
    """What a region is, as the tracer knows it. Written to OTF2 as a region role."""

    FUNCTION = "function"  # user regions and markers
    COLL_ALL2ALL = "coll_all2all"
    COLL_ONE2ALL = "coll_one2all"
    COLL_ALL2ONE = "coll_all2one"
    BARRIER = "barrier"
    POINT2POINT = "point2point"
    WAIT = "wait"  # the main thread blocks on asynchronous communication
    ARTIFICIAL = "artificial"  # tracer overhead (spill writes, clock sync)
    KERNEL = "kernel"  # an accelerator kernel (imported from torch.profiler)
    DATA_TRANSFER = "data_transfer"  # an accelerator memory copy or set
    COLL_OTHER = "coll_other"  # a collective kernel whose operation is not known


ROLE_OF_OP = {
    Op.BARRIER: Role.BARRIER,
    Op.BCAST: Role.COLL_ONE2ALL,
    Op.SCATTER: Role.COLL_ONE2ALL,
    Op.GATHER: Role.COLL_ALL2ONE,
    Op.REDUCE: Role.COLL_ALL2ONE,
    Op.ALLGATHER: Role.COLL_ALL2ALL,
    Op.ALLTOALL: Role.COLL_ALL2ALL,
    Op.ALLREDUCE: Role.COLL_ALL2ALL,
    Op.REDUCE_SCATTER: Role.COLL_ALL2ALL,
    Op.ALLTOALLV: Role.COLL_ALL2ALL,
    Op.SEND: Role.POINT2POINT,
    Op.RECV: Role.POINT2POINT,
}

NO_ROOT = -1
NO_COMM = -1

# Names of the regions the built-in markers write. The analyzer recognises them (also with
# Score-P's "user:" prefix, which the Score-P backend's user regions carry).
STEP = "dltrace.step"
TAIL = "dltrace.tail"
FORWARD = "dltrace.forward"
BACKWARD = "dltrace.backward"
OPTIMIZER = "dltrace.optimizer"
DATALOADER = "dltrace.dataloader"
TRACER_FLUSH = "dltrace.flush"
CLOCK_SYNC = "dltrace.clock_sync"


def empty(n: int) -> np.ndarray:
    """A zeroed record array of length ``n``."""
    return np.zeros(n, dtype=EVENT_DTYPE)


# --- power channels ----------------------------------------------------------------------
# What the power sampler (instrument/power) records and the analysis (analyze/energy)
# recognises: member names "<device> <index> energy" (running total, J with an exponent) or
# "<device> <index> power" (a reading, W with an exponent).


class Device(StrEnum):
    """The kind of device a power or energy channel measures."""

    CPU_PACKAGE = "cpu_package"  # a CPU socket (RAPL package-N)
    DRAM = "dram"  # the memory of a package (RAPL dram sub-zone)
    CPU_CORE = "cpu_core"  # the cores of a package: part of the package's energy
    CPU_UNCORE = "cpu_uncore"  # a package's uncore (graphics): part of the package's energy
    PLATFORM = "platform"  # RAPL psys: the whole platform, packages included
    GPU = "gpu"
    NODE = "node"  # a whole node or blade (Score-P's x86_energy BLADE, Cray PM)
    SENSOR = "sensor"  # a sensor of a device measured otherwise too (hwmon, Cray PM's accelerators)
    OTHER = "other"


ENERGY = "energy"
POWER = "power"


def channel_name(device: Device, index: int, quantity: str) -> str:
    """The metric member name of one of our power channels: ``gpu 1 energy``."""
    return f"{device} {index} {quantity}"
