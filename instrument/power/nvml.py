"""NVIDIA GPU energy through NVML (the ``nvidia-ml-py`` package, module ``pynvml``).

Per GPU, the total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since
the driver loaded; Volta and newer) where the GPU has one: an energy channel. Otherwise its
power reading (``nvmlDeviceGetPowerUsage``, milliwatts): a power channel, which the analysis
integrates. On Ampere (except GA100) and newer that reading is an average over the last second,
so it says nothing about phases shorter than that; the channel's description says so, and the
analysis flags energy integrated from it.

Without a driver the import works and ``nvmlInit`` raises ``NVMLError_LibraryNotFound``: the
source is then unusable with NVML's own message. The module is injected in tests (a fake with
the same names; a test checks every name used here exists in the real ``pynvml``).
"""

from __future__ import annotations

import contextlib
import importlib
from types import ModuleType
from typing import Any

from instrument.power.sources import Channel, Unavailable, Unusable
from traceio.records import ENERGY, POWER, Device


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error(e: Exception) -> str:
    return f"{e} ({type(e).__name__})"


class NvmlSource:
    """Every GPU NVML sees, as an energy channel or, without a counter, a power channel."""

    name = "NVML"

    def __init__(self, module: ModuleType | Any | None = None):
        if module is None:
            try:
                module = importlib.import_module("pynvml")
            except ImportError:
                raise Unusable("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None
        self.nvml = nvml = module
        self.channels: list[Channel] = []
        self.unavailable: list[Unavailable] = []
        self.read_errors: dict[int, str] = {}
        self._handles: list[Any] = []
        self._start: list[int] = []
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise Unusable(f"NVML cannot start: {_error(e)}; no NVIDIA driver on this host?") from None
        try:
            count = nvml.nvmlDeviceGetCount()
            for i in range(count):
                self._add(i)
        except nvml.NVMLError as e:
            self.close()
            raise Unusable(f"NVML cannot list the GPUs: {_error(e)}") from None
        if not self.channels:
            self.close()
            raise Unusable("NVML sees no GPU" if not self.unavailable else
                           "; ".join(u.reason for u in self.unavailable))

    def _add(self, index: int) -> None:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        label = f"{_text(nvml.nvmlDeviceGetName(handle))} (NVML device {index})"
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        try:
            start = int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
            channel = Channel(Device.GPU, index, ENERGY, f"NVML total energy of {label}", uuid)
        except nvml.NVMLError:
            try:
                nvml.nvmlDeviceGetPowerUsage(handle)
            except nvml.NVMLError as e:
                self.unavailable.append(Unavailable(f"NVML device {index}", f"{label}: no energy counter "
                                                    f"and no power reading ({_error(e)})"))
                return
            start = 0
            channel = Channel(Device.GPU, index, POWER, f"NVML power usage of {label} (an average "
                              "over the last second on Ampere and newer: not for short phases)", uuid)
        self.channels.append(channel)
        self._handles.append(handle)
        self._start.append(start)

    def read(self) -> list[float | None]:
        """Joules since opening (energy channels) or watts (power channels), per GPU."""
        nvml = self.nvml
        out: list[float | None] = []
        for i, (channel, handle) in enumerate(zip(self.channels, self._handles, strict=True)):
            try:
                if channel.quantity == ENERGY:
                    out.append((int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)) - self._start[i]) / 1e3)
                else:
                    out.append(int(nvml.nvmlDeviceGetPowerUsage(handle)) / 1e3)
            except nvml.NVMLError as e:
                self.read_errors.setdefault(i, f"{channel.description}: {_error(e)}")
                out.append(None)
        return out

    def close(self) -> None:
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()
