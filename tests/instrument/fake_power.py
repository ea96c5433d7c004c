"""Fake power hardware for tests: a powercap tree driven by a clock, and an NVML module.

``FakePowercap`` writes the directory layout of ``/sys/class/powercap`` (zones with ``name``
and ``max_energy_range_uj``); the zones' ``energy_uj`` comes from the power each zone draws
times the clock's time, modulo the range, through :meth:`FakePowercap.reader` (what
``RaplSource`` is given) or, for runs in other processes, written into the files by
:meth:`FakePowercap.write_energies` (atomically, as sysfs reads never see half a number).

``fake_nvml(...)`` returns a module object with the names ``instrument/power/nvml.py`` uses
(tests/instrument/test_power.py checks that each exists in the real ``pynvml``).
"""

from __future__ import annotations

import os
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path

RANGE_UJ = 262_143_328_850  # a real package zone's max_energy_range_uj


class FakeClock:
    """Nanoseconds the test sets."""

    def __init__(self, t: int = 1_000_000_000) -> None:
        self.t = t

    def now(self) -> int:
        return self.t


class FakePowercap:
    """Zones ``{"intel-rapl:0": ("package-0", watts), ...}`` under ``root``; energy since t=0."""

    def __init__(self, root: Path, zones: dict[str, tuple[str, float]], clock: Callable[[], float],
                 range_uj: int = RANGE_UJ, offset_uj: int = 5_000_000):
        self.root, self.zones, self.clock = root, dict(zones), clock
        self.range_uj, self.offset_uj = range_uj, offset_uj
        self.failing: dict[str, OSError] = {}  # zone -> the error reading its energy_uj raises
        for zone, (name, _) in zones.items():
            d = root / zone
            d.mkdir(parents=True, exist_ok=True)
            (d / "name").write_text(name + "\n")
            (d / "max_energy_range_uj").write_text(f"{range_uj}\n")
            (d / "energy_uj").write_text(f"{self.energy_uj(zone)}\n")

    def energy_uj(self, zone: str) -> int:
        seconds = self.clock()
        return int(self.offset_uj + round(self.zones[zone][1] * seconds * 1e6)) % self.range_uj

    def reader(self, path: Path) -> str:
        """What RaplSource reads: files as they are, energy_uj from the clock."""
        zone = path.parent.name
        if path.name == "energy_uj":
            if zone in self.failing:
                raise self.failing[zone]
            return f"{self.energy_uj(zone)}\n"
        return path.read_text()

    def write_energies(self) -> None:
        for zone in self.zones:
            target = self.root / zone / "energy_uj"
            tmp = target.with_name("energy_uj.tmp")
            tmp.write_text(f"{self.energy_uj(zone)}\n")
            os.replace(tmp, target)

    def run(self, period_s: float = 0.005) -> Callable[[], None]:
        """Keep writing the energies from a thread; returns the function that stops it."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                self.write_energies()
                time.sleep(period_s)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()

        def halt() -> None:
            stop.set()
            thread.join(timeout=5)

        return halt


class NVMLError(Exception):
    def __str__(self) -> str:
        return {"NVMLError_LibraryNotFound": "NVML Shared Library Not Found",
                "NVMLError_NotSupported": "Not Supported"}.get(type(self).__name__, "Unknown Error")


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - pynvml's name
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's name
    pass


def fake_nvml(gpus: list[dict], clock: Callable[[], float] | None = None,
              driver: bool = True) -> types.SimpleNamespace:
    """A pynvml stand-in. ``gpus``: dicts with ``name``, ``uuid``, ``watts`` and ``counter``
    (whether it has the total-energy counter, in mJ since ``clock`` 0)."""
    clock = clock or (lambda: 0.0)
    state = {"init": 0}

    def init() -> None:
        if not driver:
            raise NVMLError_LibraryNotFound()
        state["init"] += 1

    def shutdown() -> None:
        state["init"] -= 1

    def energy(h: int) -> int:
        if not gpus[h]["counter"]:
            raise NVMLError_NotSupported()
        return int(gpus[h]["watts"] * clock() * 1000) + 7_000

    return types.SimpleNamespace(
        NVMLError=NVMLError, NVMLError_LibraryNotFound=NVMLError_LibraryNotFound,
        NVMLError_NotSupported=NVMLError_NotSupported, state=state,
        nvmlInit=init, nvmlShutdown=shutdown, nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: gpus[h]["name"].encode(),
        nvmlDeviceGetUUID=lambda h: gpus[h]["uuid"],
        nvmlDeviceGetTotalEnergyConsumption=energy,
        nvmlDeviceGetPowerUsage=lambda h: int(gpus[h]["watts"] * 1000),
    )
