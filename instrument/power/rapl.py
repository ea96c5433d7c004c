"""CPU package and DRAM energy from Linux powercap RAPL (Intel, and AMD under the same names).

Zones are the directories ``intel-rapl:N`` (a package, ``name`` = ``package-N``) and
``intel-rapl:N:M`` (its sub-zones by their ``name``: ``dram``, ``core``, ``uncore``; ``psys``
is the platform) under the powercap root, ``/sys/class/powercap`` (or ``DLTRACE_POWERCAP_ROOT``,
or the ``root`` argument; tests point it at a fake tree). Each zone's ``energy_uj`` is a
counter in microjoules that wraps at ``max_energy_range_uj``; reading it often enough (every
few minutes at most: the range is about 262 kJ, 20 minutes at 200 W) lets :meth:`read` undo
the wraps. On kernels >= 5.10 ``energy_uj`` is readable by root only: such zones are named as
unavailable with that reason.

Files are read through ``reader`` (default: the file's text), so tests can make a zone fail
even when they run as root, where file modes do not.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from instrument.power.sources import Channel, Unavailable, Unusable
from traceio.records import ENERGY, Device

DEFAULT_ROOT = "/sys/class/powercap"
ENV = "DLTRACE_POWERCAP_ROOT"
_ZONE = re.compile(r"^intel-rapl:(\d+)(?::(\d+))?$")
_SUBZONES = {"dram": Device.DRAM, "core": Device.CPU_CORE, "uncore": Device.CPU_UNCORE,
             "psys": Device.PLATFORM}

Reader = Callable[[Path], str]


def _read_text(path: Path) -> str:
    return path.read_text()


def _why(path: Path, error: Exception) -> str:
    if isinstance(error, PermissionError):
        return (f"permission denied reading {path} (energy_uj is readable by root only on "
                "kernels >= 5.10; see docs/energy.md)")
    return f"cannot read {path} ({error})"


class RaplSource:
    """The RAPL zones under ``root`` as energy channels (see the module doc)."""

    name = "RAPL"

    def __init__(self, root: str | Path | None = None, reader: Reader | None = None):
        self.root = Path(root or os.environ.get(ENV) or DEFAULT_ROOT)
        self._read = reader or _read_text
        self.channels: list[Channel] = []
        self.unavailable: list[Unavailable] = []
        self.read_errors: dict[int, str] = {}
        self._paths: list[Path] = []
        self._range: list[int] = []
        self._last: list[int] = []
        self._total: list[int] = []
        zones = sorted(((int(m.group(1)), int(m.group(2) or -1), p) for p in self._list()
                        if (m := _ZONE.match(p.name))), key=lambda z: (z[0], z[1]))
        if not zones:
            raise Unusable(f"no RAPL zones under {self.root} (no RAPL on this CPU, or the "
                           "intel_rapl powercap driver is not loaded)")
        packages: dict[int, int] = {}  # zone N -> package number from its name
        for top, sub, path in zones:
            self._add(top, sub, path, packages)
        if not self.channels:
            raise Unusable("; ".join(u.reason for u in self.unavailable))

    def _list(self) -> list[Path]:
        try:
            return list(self.root.iterdir())
        except OSError:
            return []

    def _add(self, top: int, sub: int, path: Path, packages: dict[int, int]) -> None:
        zone = path.name
        try:
            name = self._read(path / "name").strip()
            wrap = int(self._read(path / "max_energy_range_uj"))
            first = int(self._read(path / "energy_uj"))
        except (OSError, ValueError) as e:
            self.unavailable.append(Unavailable(f"RAPL {zone}", _why(path, e)))
            return
        if sub < 0:
            m = re.fullmatch(r"package-(\d+)", name)
            device, index = (Device.CPU_PACKAGE, int(m.group(1))) if m else (_SUBZONES.get(name, Device.OTHER), top)
            packages[top] = index
        else:
            device, index = _SUBZONES.get(name, Device.OTHER), packages.get(top, top)
        channel = Channel(device, index, ENERGY, f"RAPL {name} ({zone})")
        if any(c.name == channel.name for c in self.channels):
            self.unavailable.append(Unavailable(f"RAPL {zone}", f"a second zone named {name!r}; skipped"))
            return
        self.channels.append(channel)
        self._paths.append(path / "energy_uj")
        self._range.append(wrap)
        self._last.append(first)
        self._total.append(0)

    def read(self) -> list[float | None]:
        """Joules since the source was opened, per zone; None for a zone that failed now."""
        out: list[float | None] = []
        for i, path in enumerate(self._paths):
            try:
                raw = int(self._read(path))
            except (OSError, ValueError) as e:
                self.read_errors.setdefault(i, _why(path, e))
                out.append(None)
                continue
            step = raw - self._last[i]
            if step < 0:  # the counter wrapped at max_energy_range_uj
                step += self._range[i]
            self._last[i] = raw
            self._total[i] += step
            out.append(self._total[i] / 1e6)
        return out

    def close(self) -> None:
        pass
