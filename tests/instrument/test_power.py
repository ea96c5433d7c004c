"""Power sources and the sampler, on a fake powercap tree and a fake NVML driven by a clock
(this machine has neither RAPL nor a GPU)."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import numpy as np
import otf2
import pynvml
import pytest

from instrument.power import sampler as power
from instrument.power.nvml import NvmlSource
from instrument.power.rapl import RaplSource
from instrument.power.sources import Unusable
from instrument.tracer import merge
from instrument.tracer.builtin import Tracer
from tests.conftest import ROOT
from tests.instrument.fake_power import FakeClock, FakePowercap, fake_nvml
from traceio.otf2_writer import write_archive
from traceio.records import Device

ZONES = {"intel-rapl:0": ("package-0", 60.0), "intel-rapl:0:0": ("dram", 10.0),
         "intel-rapl:1": ("package-1", 40.0), "intel-rapl:1:0": ("dram", 5.0),
         "intel-rapl:2": ("psys", 120.0)}


def seconds(clock: FakeClock) -> float:
    return clock.t / 1e9


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(0)


def test_rapl_zones_become_package_and_dram_channels(tmp_path: Path, clock: FakeClock) -> None:
    tree = FakePowercap(tmp_path, ZONES, lambda: seconds(clock))
    src = RaplSource(tmp_path, reader=tree.reader)
    assert [c.name for c in src.channels] == ["cpu_package 0 energy", "dram 0 energy", "cpu_package 1 energy",
                                              "dram 1 energy", "platform 2 energy"]
    assert src.channels[1].description == "RAPL dram (intel-rapl:0:0)"
    clock.t = 2_500_000_000
    assert src.read() == pytest.approx([150.0, 25.0, 100.0, 12.5, 300.0])


def test_rapl_undoes_the_wraparound(tmp_path: Path, clock: FakeClock) -> None:
    # a 1 J range at 50 W wraps 50 times a second; reading every 10 ms (0.5 J) undoes each wrap
    tree = FakePowercap(tmp_path, {"intel-rapl:0": ("package-0", 50.0)}, lambda: seconds(clock),
                        range_uj=1_000_000, offset_uj=900_000)
    src = RaplSource(tmp_path, reader=tree.reader)
    raw = []
    for _ in range(100):
        clock.t += 10_000_000
        raw.append(tree.energy_uj("intel-rapl:0"))
        total = src.read()[0]
    assert min(np.diff(raw)) < 0  # the counter did wrap
    assert total == pytest.approx(50.0, abs=1e-6)


def test_rapl_without_a_dram_zone(tmp_path: Path, clock: FakeClock) -> None:
    tree = FakePowercap(tmp_path, {"intel-rapl:0": ("package-0", 60.0)}, lambda: seconds(clock))
    src = RaplSource(tmp_path, reader=tree.reader)
    assert [c.device for c in src.channels] == [Device.CPU_PACKAGE] and src.unavailable == []


def test_an_unreadable_zone_is_named_with_the_reason(tmp_path: Path, clock: FakeClock) -> None:
    tree = FakePowercap(tmp_path, ZONES, lambda: seconds(clock))
    tree.failing["intel-rapl:1"] = PermissionError(13, "Permission denied")
    src = RaplSource(tmp_path, reader=tree.reader)
    assert "cpu_package 1 energy" not in [c.name for c in src.channels]
    assert "dram 1 energy" in [c.name for c in src.channels]  # its sub-zone still reads
    (bad,) = src.unavailable
    assert bad.source == "RAPL intel-rapl:1"
    assert "permission denied" in bad.reason and "root only on kernels >= 5.10" in bad.reason


def test_a_zone_failing_later_gives_no_value_not_zero(tmp_path: Path, clock: FakeClock) -> None:
    tree = FakePowercap(tmp_path, ZONES, lambda: seconds(clock))
    src = RaplSource(tmp_path, reader=tree.reader)
    clock.t = 1_000_000_000
    tree.failing["intel-rapl:0:0"] = OSError(5, "Input/output error")
    values = src.read()
    assert values[1] is None and values[0] == pytest.approx(60.0)
    assert "Input/output error" in src.read_errors[1]
    del tree.failing["intel-rapl:0:0"]
    clock.t = 2_000_000_000
    assert src.read()[1] == pytest.approx(20.0)  # nothing lost in between: it is a counter


def test_no_rapl_zones_is_unusable_with_a_reason(tmp_path: Path) -> None:
    with pytest.raises(Unusable, match=r"no RAPL zones under .* intel_rapl powercap driver"):
        RaplSource(tmp_path)
    with pytest.raises(Unusable, match="no RAPL zones"):
        RaplSource(tmp_path / "missing")


GPUS = [{"name": "A100-SXM4-40GB", "uuid": "GPU-aaaa-1111", "watts": 250.0, "counter": True},
        {"name": "Tesla P100", "uuid": "GPU-bbbb-2222", "watts": 100.0, "counter": False}]


def test_nvml_counter_where_supported_else_power_readings(clock: FakeClock) -> None:
    nvml = fake_nvml(GPUS, lambda: seconds(clock))
    src = NvmlSource(nvml)
    assert [c.name for c in src.channels] == ["gpu 0 energy", "gpu 1 power"]
    assert "A100-SXM4-40GB (NVML device 0)" in src.channels[0].description
    assert "average over the last second" in src.channels[1].description
    assert src.channels[1].uuid == "GPU-bbbb-2222"
    clock.t = 4_000_000_000
    assert src.read() == pytest.approx([1000.0, 100.0])  # J since opening; W
    src.close()
    assert nvml.state["init"] == 0


def test_nvml_without_a_driver_is_unusable_with_nvmls_reason() -> None:
    with pytest.raises(Unusable, match=r"NVML Shared Library Not Found \(NVMLError_LibraryNotFound\)"):
        NvmlSource(fake_nvml(GPUS, driver=False))


def nvml_names_used() -> set[str]:
    """Every attribute of the NVML module that instrument/power/nvml.py touches."""
    tree = ast.parse((ROOT / "instrument" / "power" / "nvml.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (
                isinstance(node.value, ast.Name) and node.value.id == "nvml"
                or isinstance(node.value, ast.Attribute) and node.value.attr == "nvml"):
            names.add(node.attr)
    return names


def test_every_nvml_name_the_code_uses_exists_in_pynvml() -> None:
    used = nvml_names_used()
    assert {"nvmlInit", "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerUsage", "NVMLError"} <= used
    assert sorted(n for n in used if not hasattr(pynvml, n)) == []
    fake = fake_nvml(GPUS)
    assert sorted(n for n in used if not hasattr(fake, n)) == []  # the fake stands in for all of them
    assert issubclass(pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError)


def test_real_pynvml_here_says_why_it_cannot_be_used() -> None:
    """This machine has no NVIDIA driver: the real module fails as the fake does."""
    with pytest.raises(Unusable, match="NVMLError_LibraryNotFound"):
        NvmlSource()


@pytest.mark.parametrize(("env", "local_rank", "torch", "expected"), [
    ({}, 1, None, "1"),  # no torch, no CUDA_VISIBLE_DEVICES: local rank k uses device k
    ({"CUDA_VISIBLE_DEVICES": "2,3"}, 1, None, "3"),
    ({"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}, 0, None, "GPU-bbbb"),
    ({"CUDA_VISIBLE_DEVICES": ""}, 0, None, None),  # no GPU visible
    ({}, None, None, None),
    ({"CUDA_VISIBLE_DEVICES": "4,5"}, 0, (True, 1), "5"),  # torch's current device wins
    ({}, 0, (False, 0), None),  # torch imported, CUDA never initialized: a CPU run
])
def test_the_gpu_a_rank_is_pinned_to(env: dict, local_rank: int | None, torch: tuple | None,
                                     expected: str | None) -> None:
    modules = {}
    if torch is not None:
        cuda = types.SimpleNamespace(is_initialized=lambda: torch[0], current_device=lambda: torch[1])
        modules["torch"] = types.SimpleNamespace(cuda=cuda)
    assert power.pinned_gpu(env, local_rank, modules) == expected


def openers(tree: FakePowercap, nvml: types.SimpleNamespace) -> list:
    return [("RAPL", lambda: RaplSource(tree.root, reader=tree.reader)), ("NVML", lambda: NvmlSource(nvml))]


def test_sampler_records_through_the_tracer_and_the_merge_charges_gpus(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000_000)
    tree = FakePowercap(tmp_path / "powercap", {"intel-rapl:0": ("package-0", 60.0),
                                                "intel-rapl:0:0": ("dram", 10.0)}, lambda: seconds(clock))
    nvml = fake_nvml(GPUS, lambda: seconds(clock))
    run = tmp_path / "run"
    tracers = []
    for rank, visible in ((0, "1"), (1, "")):  # rank 0 uses GPU 1; rank 1 none: GPU 0 is idle
        tr = Tracer(rank, 2, run, clock=clock, capacity=64, flush_interval_s=None, local_rank=rank)
        # an hour's interval: the sampler's own thread takes no sample while the test samples
        env = {"CUDA_VISIBLE_DEVICES": visible, "DLTRACE_POWER_INTERVAL_S": "3600"}
        sampler = power.attach(tr, env, openers(tree, nvml), modules={})
        assert (sampler is not None) == (rank == 0)
        tracers.append((tr, sampler))
    tr0, sampler = tracers[0]
    assert sampler is not None
    for _ in range(5):
        clock.t += 100_000_000
        sampler.sample()
    for tr, _ in tracers:
        clock.t += 50_000_000
        tr.finalize("ok")  # rank 0's finalize takes the last sample
    assert sampler.samples == 7
    info = tr0.meta["extra"]["power"]
    assert [c["name"] for c in info["channels"]] == ["cpu_package 0 energy", "dram 0 energy", "gpu 0 energy",
                                                     "gpu 1 power"]
    assert info["unavailable"] == [] and info["read_errors"] == []

    result = merge.collect(run)
    spec = result.spec
    assert [(m.name, m.rank, m.unit, m.exponent, m.mode) for m in spec.metrics] == [
        ("cpu_package 0 energy", None, "J", -6, "ACCUMULATED_START"),
        ("dram 0 energy", None, "J", -6, "ACCUMULATED_START"),
        ("gpu 0 energy", None, "J", -6, "ACCUMULATED_START"),
        ("gpu 1 power", 0, "W", -3, "ABSOLUTE_POINT")]
    (metric_loc,) = [loc for loc in spec.ranks[0].locations if loc.kind == "metric"]
    assert len(metric_loc.records) == 7 * 4
    anchor = write_archive(spec, run)
    samples: dict[str, list[tuple[int, int]]] = {}
    with otf2.reader.open(str(anchor)) as r:
        scopes = {m.metric_class.members[0].name: m.scope.name for m in r.definitions.metrics
                  if isinstance(m, otf2.definitions.MetricInstance)}
        for loc, ev in r.events:
            if isinstance(ev, otf2.events.Metric):
                assert loc.type == otf2.LocationType.METRIC and loc.name == f"power {spec.ranks[0].host}"
                samples.setdefault(ev.metric.metric_class.members[0].name, []).append((ev.time, ev.value))
    assert scopes["gpu 1 power"] == "rank 0" and scopes["cpu_package 0 energy"] == spec.ranks[0].host
    # 60 W over the 0.55 s from the first to the last sample, in microjoules
    (t0, e0), (t1, e1) = samples["cpu_package 0 energy"][0], samples["cpu_package 0 energy"][-1]
    assert (t1 - t0, e1 - e0) == (550_000_000, 33_000_000)
    assert samples["gpu 0 energy"][-1][1] == 250 * 550_000  # 250 W x 0.55 s in uJ, from mJ
    assert {v for _, v in samples["gpu 1 power"]} == {100_000}  # mW


def test_attach_samples_on_local_rank_0_only_and_says_why_not(tmp_path: Path) -> None:
    clock = FakeClock()
    nothing = [("RAPL", lambda: RaplSource(tmp_path / "none")), ("NVML", lambda: NvmlSource(fake_nvml([], driver=False)))]
    tr = Tracer(0, 2, tmp_path / "a", clock=clock, flush_interval_s=None, local_rank=0)
    assert power.attach(tr, {}, nothing) is None
    info = tr.meta["extra"]["power"]
    assert info["sampled"] is False
    assert [u["source"] for u in info["unavailable"]] == ["RAPL", "NVML"]
    assert "no RAPL zones" in info["unavailable"][0]["reason"]
    other = Tracer(1, 2, tmp_path / "a", clock=clock, flush_interval_s=None, local_rank=1)
    assert power.attach(other, {}, nothing) is None and "power" not in other.meta["extra"]
    off = Tracer(0, 1, tmp_path / "b", clock=clock, flush_interval_s=None, local_rank=0)
    assert power.attach(off, {"DLTRACE_POWER": "off"}, nothing) is None
    assert off.meta["extra"]["power"]["reason"] == "--power off"
    # without a local rank, the first rank of the host to claim it samples
    first = Tracer(0, 2, tmp_path / "c", clock=clock, flush_interval_s=None)
    second = Tracer(1, 2, tmp_path / "c", clock=clock, flush_interval_s=None)
    power.attach(first, {}, nothing)
    power.attach(second, {}, nothing)
    assert "power" in first.meta["extra"] and "power" not in second.meta["extra"]
    for t in (tr, other, off, first, second):
        t.finalize("ok")


def test_a_non_positive_power_interval_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    from instrument.cli import main

    assert main(["run", "--power-interval", "0", "runs/ddp_resnet.py"]) == 2
    assert "--power-interval must be a positive number of seconds, not 0.0" in capsys.readouterr().err
