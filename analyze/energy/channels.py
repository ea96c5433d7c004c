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
  ``accelN_energy``, ``accelN_power``, ``cpu_energy``, ``memory_power``...) in joules and watts, as ``/sys/cray/pm_counters``
  gives them (seen in adam-mcdaniel/hpc-energy-trace-analysis' Frontier traces);
- PAPI's nvml component (``nvml:::<GPU>:device_N:power`` and ``gpu_inst_power`` in milliwatts,
  ``total_energy_consumption`` in millijoules: icl-utk-edu/papi
  ``src/components/nvml/linux-nvml.c``), its amd_smi component (``energy_consumed``,
  ``energy_socket=S`` in microjoules, ``power_average`` / ``power_current`` /
  ``power_sensor_*_watts`` in watts, ``..._microwatts`` in microwatts: ``amd_smi/amds.c``)
  and its rapl component (``PACKAGE_ENERGY:PACKAGEn`` and the like in nanojoules,
  ``rapl/linux-rapl.c``), as Score-P's apapi plugins record them (``A`` + the event name).

Settings are not readings: power caps and limits, ranges, profiles, counter resolutions and
timestamps (``power_cap:device=0``, ``POWER_LIMIT_A_UW``, ``power_management_limit``,
``energy_resolution``...) are OTHER whatever their unit, so that a device's energy is never
integrated from its power limit.

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
_SYMBOL = re.compile(r"^(k|m|u|µ|μ|n)?(J|W|Wh)$")
_WORD = re.compile(r"^(kilo|milli|micro|nano)?(joule|watt)s?$", re.IGNORECASE)

# (pattern on the member name, quantity, to_si) for members without a usable unit
_BY_NAME: list[tuple[re.Pattern[str], Quantity, float]] = [
    (re.compile(r"rocm_smi:::.*energy", re.IGNORECASE), Quantity.ENERGY, 1e-6),
    (re.compile(r"rocm_smi:::.*power", re.IGNORECASE), Quantity.POWER, 1e-6),
    (re.compile(r"amd_smi:::(energy_consumed|energy_socket=)"), Quantity.ENERGY, 1e-6),
    (re.compile(r"amd_smi:::power_sensor_\w*microwatts"), Quantity.POWER, 1e-6),
    (re.compile(r"amd_smi:::(power_average|power_current|power_sensor_\w*watts)[:=]"), Quantity.POWER, 1.0),
    (re.compile(r"amd_smi:::power_socket="), Quantity.POWER, 1e-3),  # amdsmi_get_cpu_socket_power: mW
    (re.compile(r"nvml:::.*:total_energy_consumption$"), Quantity.ENERGY, 1e-3),
    (re.compile(r"nvml:::.*:(power|gpu_inst_power|gpu_memory_avg_power)$"), Quantity.POWER, 1e-3),
    (re.compile(r"rapl:::(PACKAGE|DRAM|PP0|PP1|PSYS)_ENERGY:PACKAGE\d+$"), Quantity.ENERGY, 1e-9),
    (re.compile(r"hwmon\d+:energy\d*_input$"), Quantity.ENERGY, 1e-6),
    (re.compile(r"hwmon\d+:power\d*_(input|average)$"), Quantity.POWER, 1e-6),
    (re.compile(r"powercap:::ENERGY_UJ", re.IGNORECASE), Quantity.ENERGY, 1e-6),
    (re.compile(r"craypm:(accel\d+_|cpu_|memory_)?energy$"), Quantity.ENERGY, 1.0),
    (re.compile(r"craypm:(accel\d+_|cpu_|memory_)?power$"), Quantity.POWER, 1.0),
]
# a setting or a property of a counter, not a reading of power or energy (see the module doc)
_SETTING = re.compile(r"(?<![a-z])(cap|caps|limit|limits|constraint|range|profiles?|presets?|max|min|crit|"
                      r"tdp|enabled|interval|resolution|timestamp|time_window)(?![a-z])", re.IGNORECASE)
_ENERGY_NAME = re.compile(r"energy|/E$", re.IGNORECASE)
_POWER_NAME = re.compile(r"power|/P$", re.IGNORECASE)

# (pattern, device): group 1 of the pattern is the device number, when it has one
_DEVICES: list[tuple[re.Pattern[str], Device]] = [
    # Cray PM: a blade's accelerator modules (an MI250X module holds two GCDs, which ROCm SMI
    # lists as two devices, so they are not matched to those) and the whole node
    (re.compile(r"craypm:accel(\d+)_"), Device.SENSOR),
    (re.compile(r"craypm:(?:energy|power)$"), Device.NODE),
    (re.compile(r"craypm:cpu_(?:energy|power)$"), Device.CPU_PACKAGE),  # all of the node's CPUs
    (re.compile(r"craypm:memory_(?:energy|power)$"), Device.DRAM),  # all of its memory
    (re.compile(r"rocm_smi:::.*:device=(\d+)"), Device.GPU),
    (re.compile(r"amd_smi:::energy_socket=(\d+)_core="), Device.CPU_CORE),
    (re.compile(r"amd_smi:::(?:energy|power)_socket=(\d+)"), Device.CPU_PACKAGE),
    (re.compile(r"amd_smi:::.*device=(\d+)"), Device.GPU),
    (re.compile(r"nvml:::.*device_(\d+):gpu_memory"), Device.SENSOR),  # part of the board's power
    (re.compile(r"rapl:::DRAM_ENERGY:PACKAGE(\d+)"), Device.DRAM),
    (re.compile(r"rapl:::PP0_ENERGY:PACKAGE(\d+)"), Device.CPU_CORE),
    (re.compile(r"rapl:::PP1_ENERGY:PACKAGE(\d+)"), Device.CPU_UNCORE),
    (re.compile(r"rapl:::PSYS_ENERGY:PACKAGE(\d+)"), Device.PLATFORM),
    (re.compile(r"^ID(\d+)::"), Device.GPU),  # Score-P's rocm_smi plugin
    (re.compile(r" on CUDA: (\d+)$"), Device.GPU),  # Score-P's nvml plugins
    (re.compile(r"nvml:::.*device_(\d+)"), Device.GPU),  # PAPI's nvml component
    (re.compile(r"\bPCKG\[(\d+)\]|\bPACKAGE(\d+)\b|\bs(\d+)\.package\b"), Device.CPU_PACKAGE),
    (re.compile(r"\bDRAM\[?(\d+)|\bs(\d+)\.dram\b"), Device.DRAM),
    (re.compile(r"\b(?:SINGLE_)?CORES?\[(\d+)\]"), Device.CPU_CORE),
    (re.compile(r"BLADE"), Device.NODE),
    (re.compile(r"hwmon(\d+)"), Device.SENSOR),
    # other plugins' GPUs: "gpu0", "GPU 1", "gpu_2", "cuda:0", "device=3" (last: the weakest)
    (re.compile(r"(?<![a-z])gpu[ _.:#-]?(\d+)", re.IGNORECASE), Device.GPU),
    (re.compile(r"(?<![a-z])(?:cuda|device)[ _.:#=-]{0,2}(\d+)", re.IGNORECASE), Device.GPU),
]
_OURS = re.compile(r"^(" + "|".join(d.value for d in Device) + r") (\d+) (energy|power)$")


def unit_scale(unit: str) -> tuple[Quantity, float] | None:
    """``mJ`` -> (energy, 1e-3), ``Watt`` -> (power, 1), ``kWh`` -> (energy, 3.6e6), ``#`` -> None."""
    u = unit.strip()
    m = _SYMBOL.match(u)
    if m:
        quantity = Quantity.POWER if m.group(2) == "W" else Quantity.ENERGY
        return quantity, _PREFIX[m.group(1) or ""] * (3600.0 if m.group(2) == "Wh" else 1.0)
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
    if _SETTING.search(name):
        return Channel(Quantity.OTHER, None, None, None, None)
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
