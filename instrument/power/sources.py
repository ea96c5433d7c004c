"""The interface of a power source: channels, read on demand.

A source owns some channels (a CPU package, its DRAM, a GPU...). :meth:`PowerSource.read`
returns one value per channel, in channel order: for an ``energy`` channel the energy in
joules since the source was opened (a running total, wrap-arounds of the hardware counter
already undone), for a ``power`` channel the device's power reading in watts. A value that
could not be read this time is None (and the reason is kept in ``read_errors``): the sampler
records no sample then, never a zero.

A source that cannot be used at all raises :class:`Unusable` when opened, with one sentence
saying why (no RAPL zones, no permission, no NVIDIA driver); the sampler records it as an
:class:`Unavailable` entry in the rank's metadata and ``run.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from traceio.records import Device, channel_name


class Unusable(Exception):
    """The source cannot be used on this host; the message says why."""


@dataclass(frozen=True)
class Unavailable:
    source: str  # "RAPL", "NVML", or a zone or device of one
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"source": self.source, "reason": self.reason}


@dataclass(frozen=True)
class Channel:
    device: Device
    index: int  # package, GPU or zone number on the host
    quantity: str  # traceio.records.ENERGY or POWER
    description: str  # where the numbers come from, e.g. "RAPL package-0 (intel-rapl:0)"
    uuid: str | None = None  # GPUs: matched against CUDA_VISIBLE_DEVICES entries

    @property
    def name(self) -> str:
        return channel_name(self.device, self.index, self.quantity)


class PowerSource(Protocol):
    name: str
    channels: list[Channel]
    unavailable: list[Unavailable]  # zones or devices of this source that could not be used
    read_errors: dict[int, str]  # channel index -> the first read error, if any

    def read(self) -> list[float | None]:
        """One value per channel (see the module doc)."""
        ...

    def close(self) -> None:
        """Release the source (NVML's shutdown)."""
        ...
