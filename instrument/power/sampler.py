"""One power sampler per host: a thread that reads every source at an interval and records
the readings as metric samples through the rank's tracer.

The rank with local rank 0 samples (or, where the launcher gives no local rank, the first
rank of the host to claim ``ranks/power-<host>.claim``). Its tracer gets a METRIC location
``power <host>`` and one channel per source channel: energy as a running total in microjoules
(unit J, exponent -6, ACCUMULATED_START), power readings in milliwatts (unit W, exponent -3,
ABSOLUTE_POINT). Samples are taken at start, every interval (default 100 ms), and once more
when the rank finalizes, each stamped with the tracer's clock at the middle of its source's
read. A value that could not be read is left out, never recorded as zero.

Every rank also notes the GPU it is pinned to (``gpu`` in its metadata), so the merge can
charge each GPU's channel to its rank. What the sampler found (channels, unusable sources and
why, read errors) goes into the sampling rank's metadata under ``power`` and from there into
``run.json``.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from instrument.power.nvml import NvmlSource
from instrument.power.rapl import RaplSource
from instrument.power.sources import PowerSource, Unavailable, Unusable
from instrument.tracer.builtin import Tracer
from traceio.records import ENERGY

DEFAULT_INTERVAL_S = 0.1
ENV_POWER = "DLTRACE_POWER"  # "off": no sampling
ENV_INTERVAL = "DLTRACE_POWER_INTERVAL_S"
# quantity -> (unit, exponent, OTF2 metric mode, value -> recorded integer factor)
RECORDED = {ENERGY: ("J", -6, "ACCUMULATED_START", 1e6)}
POWER_RECORDED = ("W", -3, "ABSOLUTE_POINT", 1e3)

Opener = tuple[str, Callable[[], PowerSource]]
OPENERS: list[Opener] = [("RAPL", RaplSource), ("NVML", NvmlSource)]


def open_sources(openers: list[Opener] | None = None) -> tuple[list[PowerSource], list[Unavailable]]:
    """The usable sources, and every source (or zone, or device) that is not, with why."""
    sources: list[PowerSource] = []
    unavailable: list[Unavailable] = []
    for name, make in openers or OPENERS:
        try:
            source = make()
        except Unusable as e:
            unavailable.append(Unavailable(name, str(e)))
            continue
        except Exception as e:  # a broken driver or library must not stop the training
            unavailable.append(Unavailable(name, f"failed to open: {type(e).__name__}: {e}"))
            continue
        sources.append(source)
        unavailable += source.unavailable
    return sources, unavailable


class Sampler:
    """Reads ``sources`` every ``interval_s`` in a daemon thread, recording through ``tracer``."""

    def __init__(self, tracer: Tracer, sources: list[PowerSource], interval_s: float, host: str):
        self.tracer = tracer
        self.sources = sources
        self.interval_ns = int(interval_s * 1e9)
        self.host = host
        self.loc = tracer.named_loc(f"power {host}", kind="metric")
        self._ids: list[list[tuple[int, float]]] = []
        for source in sources:
            ids = []
            for ch in source.channels:
                unit, exponent, mode, factor = RECORDED.get(ch.quantity, POWER_RECORDED)
                cid = tracer.metric_channel({
                    "name": ch.name, "description": ch.description, "unit": unit, "exponent": exponent,
                    "mode": mode, "device": str(ch.device), "index": ch.index, "uuid": ch.uuid,
                    "quantity": ch.quantity, "source": source.name, "loc": self.loc})
                ids.append((cid, factor))
            self._ids.append(ids)
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dltrace-power", daemon=True)

    def sample(self) -> None:
        """Read every source once and record what it gave."""
        now = self.tracer.now
        for source, ids in zip(self.sources, self._ids, strict=True):
            t0 = now()
            try:
                values = source.read()
            except Exception as e:  # a source that breaks mid-run stops being read, loudly in run.json
                source.read_errors.setdefault(-1, f"{type(e).__name__}: {e}")
                continue
            t = (t0 + now()) // 2
            for (cid, factor), value in zip(ids, values, strict=True):
                if value is not None:
                    self.tracer.metric_sample(self.loc, cid, t, round(value * factor))
        self.samples += 1

    def _run(self) -> None:
        due = self.tracer.now()
        while True:
            # on a fixed grid, without catching up in a burst after a stall (a loaded machine)
            due = max(due + self.interval_ns, self.tracer.now())
            if self._stop.wait(max(0.0, (due - self.tracer.now()) / 1e9)):
                return
            self.sample()

    def start(self) -> Sampler:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, take the last sample, close the sources, note read errors."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()
        for source in self.sources:
            source.close()
        info = dict(self.tracer.meta["extra"].get("power", {}))
        info["samples"] = self.samples
        info["read_errors"] = [{"source": s.name, "reason": r} for s in self.sources for r in s.read_errors.values()]
        self.tracer.set_meta("power", info)


def pinned_gpu(env: Mapping[str, str], local_rank: int | None,
               modules: Mapping[str, Any] | None = None) -> str | None:
    """The GPU this rank uses, as CUDA_VISIBLE_DEVICES names it (an index or a UUID), or None.

    If the script initialized CUDA through torch, its current device; if it imported torch
    without initializing CUDA, none (a CPU run). Otherwise the usual convention: local rank k
    uses the k-th visible device. Not verified on a GPU machine (docs/energy.md)."""
    modules = sys.modules if modules is None else modules
    raw = env.get("CUDA_VISIBLE_DEVICES")
    visible = [v.strip() for v in raw.split(",") if v.strip()] if raw is not None else None
    torch = modules.get("torch")
    if torch is not None:
        try:
            if not torch.cuda.is_initialized():
                return None
            device = int(torch.cuda.current_device())
        except Exception:
            return None
    elif local_rank is None:
        return None
    else:
        device = local_rank
    if visible is None:
        return str(device)
    if not visible:
        return None
    return visible[device % len(visible)]


def _claims_host(run_dir: Path, host: str) -> bool:
    """Whether this rank is the first of its host to claim the sampling (no local rank known)."""
    path = run_dir / "ranks" / f"power-{host}.claim"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    except OSError:
        return False
    return True


def attach(tracer: Tracer, env: Mapping[str, str], openers: list[Opener] | None = None,
           modules: Mapping[str, Any] | None = None) -> Sampler | None:
    """Set up power for this rank: note its GPU at the end (``modules``: where to look for
    torch, default sys.modules), and on the host's sampling rank start the sampler (stopped by
    the tracer's finalize). Returns the sampler, if any."""
    local_rank = tracer.meta.get("local_rank")
    tracer.add_finalizer(lambda: tracer.set_meta("gpu", {"device": pinned_gpu(env, local_rank, modules),
                                                         "local_rank": local_rank}))
    host = socket.gethostname()
    if local_rank is not None and local_rank != 0:
        return None
    if local_rank is None and not _claims_host(tracer.run_dir, host):
        return None
    if env.get(ENV_POWER, "").lower() == "off":
        tracer.set_meta("power", {"host": host, "sampled": False, "reason": "--power off"})
        return None
    try:
        interval = float(env.get(ENV_INTERVAL) or DEFAULT_INTERVAL_S)
    except ValueError:
        interval = DEFAULT_INTERVAL_S
    sources, unavailable = open_sources(openers)
    info: dict[str, Any] = {
        "host": host, "sampled": bool(sources), "interval_s": interval,
        "channels": [{"name": ch.name, "source": s.name, "description": ch.description}
                     for s in sources for ch in s.channels],
        "unavailable": [u.as_dict() for u in unavailable],
    }
    tracer.set_meta("power", info)
    if not sources:
        return None
    sampler = Sampler(tracer, sources, max(interval, 0.001), host).start()
    tracer.add_finalizer(sampler.stop)
    return sampler
