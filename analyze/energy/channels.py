"""What a metric channel measures: energy or power, the factor to joules or watts, the device.

The OTF2 unit is used where it says something (``J``, ``mJ``, ``uW``, ``Watt``...; with the
member's exponent already applied to the values). Where it says nothing (``#``: Score-P's
PAPI-based plugins hard-code it, and declare every member ACCUMULATED_START, power readings
included), the member name decides, and the scale comes from the PAPI component that is known
to report it (docs/research/scorep-metric-plugins.md has the sources):

- ``rocm_smi:::...energy_count...`` in microjoules, ``rocm_smi:::...power...`` in microwatts
  (adam-mcdaniel/scorep-amd ``patches/rocm_smi/rocs.c`` l. 2591, 2595);
- hwmon ``powerN_input`` / ``powerN_average`` in microwatts and ``energyN_input`` in
  microjoules (the Linux hwmon sysfs interface; ``patches/coretemp/linux-coretemp.c`` l. 251);
- PAPI powercap's ``ENERGY_UJ`` in microjoules (its name says so);
- Cray PM counters read through the coretemp plugin (``...craypm:energy``, ``power``,
  ``accelN_energy``, ``accelN_power``) in joules and watts, as ``/sys/cray/pm_counters``
  gives them (seen in adam-mcdaniel/hpc-energy-trace-analysis' Frontier traces).

Other unitless energy or power members keep their quantity but no scale (``to_si`` None): the
analysis lists them and says it cannot convert them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from analyze.schema import Quantity
from traceio.records import Device


@dataclass(frozen=True)
class Channel:
    quantity: Quantity
    device: Device | None  # None for quantity OTHER
    index: int | None
    to_si: float | None  # value (exponent applied) x to_si = J or W; None: unknown
    unit_from: str | None  # "unit", "name" or None


_PREFIX = {"": 1.0, "k": 1e3, "m": 1e-3, "u": 1e-6, "µ": 1e-6, "μ": 1e-6, "n": 1e-9}
_WORD_PREFIX = {"": 1.0, "kilo": 1e3, "milli": 1e-3, "micro": 1e-6, "nano": 1e-9}
_SYMBOL = re.compile(r"^(k|m|u|µ|μ|n)?(J|W)$")
_WORD = re.compile(r"^(kilo|milli|micro|nano)?(joule|watt)s?$", re.IGNORECASE)

# (pattern on the member name, quantity, to_si) for members without a usable unit
_BY_NAME: list[tuple[re.Pattern[str], Quantity, float]] = [
    (re.compile(r"rocm_smi:::.*energy", re.IGNORECASE), Quantity.ENERGY, 1e-6),
    (re.compile(r"rocm_smi:::.*power", re.IGNORECASE), Quantity.POWER, 1e-6),
    (re.compile(r"hwmon\d+:energy\d*_input"), Quantity.ENERGY, 1e-6),
    (re.compile(r"hwmon\d+:power\d*_(input|average)"), Quantity.POWER, 1e-6),
    (re.compile(r"powercap:::ENERGY_UJ", re.IGNORECASE), Quantity.ENERGY, 1e-6),
    (re.compile(r"craypm:(accel\d+_)?energy$"), Quantity.ENERGY, 1.0),
    (re.compile(r"craypm:(accel\d+_)?power$"), Quantity.POWER, 1.0),
]
_ENERGY_NAME = re.compile(r"energy|/E$", re.IGNORECASE)
_POWER_NAME = re.compile(r"power|/P$", re.IGNORECASE)

# (pattern, device): group 1 of the pattern is the device number, when it has one
_DEVICES: list[tuple[re.Pattern[str], Device]] = [
    # Cray PM: a blade's accelerator modules (an MI250X module holds two GCDs, which ROCm SMI
    # lists as two devices, so they are not matched to those) and the whole node
    (re.compile(r"craypm:accel(\d+)_"), Device.SENSOR),
    (re.compile(r"craypm:(?:energy|power)$"), Device.NODE),
    (re.compile(r"rocm_smi:::.*:device=(\d+)"), Device.GPU),
    (re.compile(r"^ID(\d+)::"), Device.GPU),  # Score-P's rocm_smi plugin
    (re.compile(r" on CUDA: (\d+)$"), Device.GPU),  # Score-P's nvml plugins
    (re.compile(r"nvml:::.*device_(\d+)"), Device.GPU),  # PAPI's nvml component
    (re.compile(r"\bPCKG\[(\d+)\]|\bPACKAGE(\d+)\b|\bs(\d+)\.package\b"), Device.CPU_PACKAGE),
    (re.compile(r"\bDRAM\[?(\d+)|\bs(\d+)\.dram\b"), Device.DRAM),
    (re.compile(r"\b(?:SINGLE_)?CORES?\[(\d+)\]"), Device.CPU_CORE),
    (re.compile(r"BLADE"), Device.NODE),
    (re.compile(r"hwmon(\d+)"), Device.SENSOR),
]
_OURS = re.compile(r"^(" + "|".join(d.value for d in Device) + r") (\d+) (energy|power)$")


def unit_scale(unit: str) -> tuple[Quantity, float] | None:
    """``mJ`` -> (energy, 1e-3), ``Watt`` -> (power, 1), ``#`` -> None."""
    u = unit.strip()
    m = _SYMBOL.match(u)
    if m:
        return (Quantity.ENERGY if m.group(2) == "J" else Quantity.POWER), _PREFIX[m.group(1) or ""]
    m = _WORD.match(u)
    if m:
        quantity = Quantity.ENERGY if m.group(2).lower() == "joule" else Quantity.POWER
        return quantity, _WORD_PREFIX[(m.group(1) or "").lower()]
    return None


def device_of(name: str) -> tuple[Device, int | None]:
    """The device a member name names (ours: ``gpu 1 energy``; Score-P's plugins' forms)."""
    m = _OURS.match(name)
    if m:
        return Device(m.group(1)), int(m.group(2))
    for pattern, device in _DEVICES:
        m = pattern.search(name)
        if m:
            number = next((g for g in m.groups() if g is not None), None)
            return device, None if number is None else int(number)
    return Device.OTHER, None


def classify(name: str, unit: str) -> Channel:
    """What member ``name`` with ``unit`` (as written) measures; see the module doc."""
    scaled = unit_scale(unit)
    if scaled is not None:
        quantity, to_si = scaled
        return Channel(quantity, *device_of(name), to_si, "unit")
    for pattern, quantity, to_si in _BY_NAME:
        if pattern.search(name):
            return Channel(quantity, *device_of(name), to_si, "name")
    if unit.strip() in ("", "#"):
        for pattern, quantity in ((_ENERGY_NAME, Quantity.ENERGY), (_POWER_NAME, Quantity.POWER)):
            if pattern.search(name):
                return Channel(quantity, *device_of(name), None, None)
    return Channel(Quantity.OTHER, None, None, None, None)
