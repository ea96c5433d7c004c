"""Run directory names, clock offset measurement and the device-clock conversion."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from instrument.errors import UsageError
from instrument.launch import rundir
from instrument.launch.runinfo import params_from_args
from instrument.tracer.clock import ClockServer, measure_offset
from instrument.tracer.timing import CudaEventTimer, DeviceClockConverter, HostTimer


def test_automatic_names_are_unique_under_concurrency(tmp_path: Path) -> None:
    made: list[Path] = []
    lock = threading.Lock()

    def start() -> None:
        p = rundir.create(tmp_path, None)
        with lock:
            made.append(p)

    threads = [threading.Thread(target=start) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({p.name for p in made}) == 16
    assert sorted(p.name for p in made)[0] == "run-0001"


def test_taken_names_get_a_suffix(tmp_path: Path) -> None:
    assert rundir.create(tmp_path, "bs64").name == "bs64"
    assert rundir.create(tmp_path, "bs64").name == "bs64-2"
    assert rundir.create(tmp_path, "größe 'α'").name == "größe 'α'"


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".hidden", "two\nlines", "", " pad", "x" * 201])
def test_names_cannot_leave_the_output_directory(tmp_path: Path, name: str) -> None:
    with pytest.raises(UsageError, match="run name"):
        rundir.create(tmp_path / "out", name)
    assert not (tmp_path / "escape").exists()


def test_params_from_script_arguments() -> None:
    assert params_from_args(["--batch-size", "32", "--lr=0.1", "--amp", "--model", "compact", "pos"]) == {
        "batch_size": 32, "lr": 0.1, "amp": True, "model": "compact"}


class ShiftedClock:
    def __init__(self, base: int) -> None:
        self.base = base

    def now(self) -> int:
        import time

        return time.perf_counter_ns() + self.base


def test_offset_to_a_reference_clock_is_recovered() -> None:
    server = ClockServer(host="127.0.0.1", clock=ShiftedClock(5_000_000_000)).start()
    try:
        sample = measure_offset(("127.0.0.1", server.port), ShiftedClock(0), rounds=20)
    finally:
        server.stop()
    assert sample is not None
    # the true offset is 5 s; the error is bounded by half the best round trip
    assert abs(sample.offset_ns - 5_000_000_000) <= sample.rtt_ns // 2 + 1000


def test_unreachable_clock_server_gives_no_sample() -> None:
    from instrument.launch.rank_env import free_port

    assert measure_offset(("127.0.0.1", free_port()), rounds=2, timeout_s=0.05) is None


class FakeEvent:
    """Stands in for torch.cuda.Event: a device timestamp in ms, done or not."""

    def __init__(self, device_ms: float, done: bool = True) -> None:
        self.device_ms = device_ms
        self.done = done

    def record(self, stream: object = None) -> None:
        pass

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.device_ms - self.device_ms


def test_device_events_convert_to_host_time() -> None:
    conv = DeviceClockConverter()
    conv.add_point(1_000_000, FakeEvent(0.0))  # device 0 ms was host 1 ms
    assert conv.to_host_ns(FakeEvent(2.5)) == 3_500_000
    # a second calibration point 10 s later shows the device clock 1 ppm slow: rate fitted
    conv.add_point(10_001_000_000, FakeEvent(9999.99))
    assert conv.to_host_ns(FakeEvent(10_000.0)) == 10_001_000_000 + round(0.01 * 1e6 * (1e10 / (9999.99 * 1e6)))


def test_cuda_event_timer_logic_with_injected_events() -> None:
    device_time = iter([0.0, 5.0, 7.0])  # calibration, begin, end (ms)
    host = iter([100_000_000, 100_000_000, 200_000_000])
    made: list[FakeEvent] = []

    def factory() -> FakeEvent:
        ev = FakeEvent(next(device_time), done=False)
        made.append(ev)
        return ev

    class HostClock:
        def now(self) -> int:
            return next(host)

    timer = CudaEventTimer(factory, synchronize=lambda ev: setattr(ev, "done", True), clock=HostClock())
    token = timer.end(timer.begin())
    assert timer.resolve(token) is None  # the collective has not finished on the device
    made[-1].done = True
    assert timer.resolve(token) == (105_000_000, 107_000_000)


def test_host_timer() -> None:
    class C:
        t = 0

        def now(self) -> int:
            C.t += 5
            return C.t

    timer = HostTimer(C())
    token = timer.begin()
    assert timer.resolve(token) is None
    assert timer.resolve(timer.end(token)) == (5, 10)
