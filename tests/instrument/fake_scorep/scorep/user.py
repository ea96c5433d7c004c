"""Test stand-in for ``scorep.user``: records user regions, writes them as OTF2 at exit."""

import atexit
import json
import os
import threading
import time

import otf2
from otf2.enums import LocationGroupType, LocationType, Paradigm, RegionRole

RESOLUTION = 100_000_000  # ticks per second
SHIFT_NS = 7_000_000_000  # this clock runs 7 s ahead of the host clock
_calls: list[tuple[int, str, str, int]] = []  # (thread id, begin|end, name, tick)
_lock = threading.Lock()


def _tick() -> int:
    return (time.perf_counter_ns() + SHIFT_NS) * RESOLUTION // 1_000_000_000


def region_begin(name, file_name=None, line_number=None):
    with _lock:
        _calls.append((threading.get_ident(), "begin", "user:" + name, _tick()))


def region_end(name):
    with _lock:
        _calls.append((threading.get_ident(), "end", "user:" + name, _tick()))


@atexit.register
def _write() -> None:
    where = os.environ.get("SCOREP_EXPERIMENT_DIRECTORY")
    if not where:
        return
    os.makedirs(where, exist_ok=True)
    main = threading.main_thread().ident
    with open(os.path.join(where, "calls.json"), "w") as f:
        json.dump([(tid == main, kind, name) for tid, kind, name, _ in _calls], f)
    threads = sorted({c[0] for c in _calls}, key=lambda t: (t != main, t))
    with otf2.writer.open(where, archive_name="traces", timer_resolution=RESOLUTION) as trace:
        defs = trace.definitions
        node = defs.system_tree_node("fake node")
        group = defs.location_group("Process", system_tree_parent=node,
                                    location_group_type=LocationGroupType.PROCESS)
        regions = {}
        for i, tid in enumerate(threads):
            location = defs.location("Master thread" if i == 0 else f"Pthread thread {i}",
                                     group=group, type=LocationType.CPU_THREAD)
            writer = trace.event_writer_from_location(location)
            for _, kind, name, tick in (c for c in _calls if c[0] == tid):
                region = regions.get(name)
                if region is None:
                    region = regions[name] = defs.region(name, paradigm=Paradigm.USER,
                                                         region_role=RegionRole.FUNCTION)
                (writer.enter if kind == "begin" else writer.leave)(tick, region)
