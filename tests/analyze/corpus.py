"""Mutated OTF2 archives: a corpus generator and a worker that reads each mutant in isolation.

    .venv/bin/python -m tests.analyze.corpus --count 5000 [--reader python|native] [--seed 1]

Mutant ``i`` of a seed is always the same: a source archive (the Score-P fixtures and an
archive of our own writer) with one damage drawn from ``Random(seed * 1_000_003 + i)``:
a file truncated, bytes flipped, a file deleted or emptied, garbage appended, the anchor's
version fields changed, or two event files swapped. Each mutant is read by
``analyze.tables.database.build`` in a child process with a time and memory limit, and classified:

- ``ok``: read (a well-defined, possibly partial result);
- ``error``: one clear :class:`~analyze.tables.database.AnalyzeError`;
- ``bug``: any other exception (a traceback a user would see);
- ``crash``: the child died of a signal (a segfault in a C library);
- ``hang``: the time limit passed; ``memory``: the 2 GiB address-space limit was hit.

Only ``ok`` and ``error`` are acceptable.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "scorep"
MUTATIONS = ("truncate", "flip", "delete", "empty", "append", "anchor_version", "swap")
ACCEPTABLE = ("ok", "error")
TIME_LIMIT_S = 20
STARTUP_LIMIT_S = 180  # a worker's imports, on a loaded machine
MEMORY_LIMIT = 2 << 30


@dataclass(frozen=True)
class Mutant:
    index: int
    source: str
    mutation: str
    detail: str


def sources(workdir: Path) -> dict[str, Path]:
    """The archives mutants are made from: the Score-P fixtures and one of our own (with
    metric channels, as the power sampler writes them)."""
    from tests.literal import write_literal

    ours = workdir / "ours"
    if not (ours / "traces.otf2").exists():
        ms = 1_000_000
        write_literal(ours, [
            (0, "dltrace.step", 0, 10 * ms), (1, "dltrace.step", 0, 12 * ms),
            (0, "MPI_Allreduce", 2 * ms, 4 * ms, {"op": "allreduce", "bytes": 8}),
            (1, "MPI_Allreduce", 3 * ms, 4 * ms, {"op": "allreduce", "bytes": 8}),
            (0, "MPI_Send", 5 * ms, 6 * ms, {"send": 1, "tag": 3, "bytes": 64}),
            (1, "MPI_Recv", 5 * ms, 7 * ms, {"recv": 0, "tag": 3, "bytes": 64}),
        ], clock_offsets={1: [(0, 1000, 0.0), (12 * ms, 3000, 0.0)]},
            metrics=[{"name": "cpu_package 0 energy", "samples": [(t * ms, 40 * t * 1000) for t in range(0, 13, 2)]},
                     {"name": "gpu 1 power", "unit": "W", "exponent": -3, "mode": "ABSOLUTE_POINT", "rank": 1,
                      "samples": [(t * ms, 250_000) for t in range(0, 13, 3)]}])
    found = {p.name: p for p in sorted(FIXTURES.iterdir()) if (p / "traces.otf2").exists()}
    return {**found, "ours": ours}


def _files(archive: Path) -> list[Path]:
    return sorted(p for p in archive.rglob("*") if p.is_file() and p.suffix in (".otf2", ".def", ".evt"))


def make(index: int, seed: int, srcs: dict[str, Path], dest: Path) -> Mutant:
    """Write mutant ``index`` of ``seed`` into ``dest`` (a fresh directory)."""
    rng = random.Random(seed * 1_000_003 + index)
    name = rng.choice(sorted(srcs))
    shutil.copytree(srcs[name], dest, ignore=shutil.ignore_patterns("*.duckdb*", "*.cfg", "*.md"))
    files = _files(dest)
    target = rng.choice(files)
    data = target.read_bytes()
    mutation = rng.choice(MUTATIONS)
    rel = target.relative_to(dest)
    if mutation == "truncate":
        cut = rng.randrange(0, max(1, len(data)))
        target.write_bytes(data[:cut])
        detail = f"{rel} cut to {cut} of {len(data)} bytes"
    elif mutation == "flip":
        buf = bytearray(data)
        spots = [rng.randrange(len(buf)) for _ in range(rng.choice((1, 1, 2, 4, 16)))] if buf else []
        for at in spots:
            buf[at] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
        target.write_bytes(bytes(buf))
        detail = f"{rel} bytes changed at {spots}"
    elif mutation == "delete":
        target.unlink()
        detail = f"{rel} deleted"
    elif mutation == "empty":
        target.write_bytes(b"")
        detail = f"{rel} emptied"
    elif mutation == "append":
        extra = bytes(rng.randrange(256) for _ in range(rng.choice((1, 7, 64, 1000))))
        target.write_bytes(data + extra)
        detail = f"{rel} + {len(extra)} garbage bytes"
    elif mutation == "anchor_version":
        anchor = dest / "traces.otf2"
        buf = bytearray(anchor.read_bytes())
        # the anchor starts with its format and OTF2 version fields: make them say another version
        at = rng.randrange(0, min(16, len(buf)))
        buf[at] = (buf[at] + rng.randrange(1, 256)) % 256
        anchor.write_bytes(bytes(buf))
        detail = f"anchor byte {at} (version header) changed"
    else:  # swap two event files
        evts = [f for f in files if f.suffix == ".evt"]
        if len(evts) >= 2:
            a, b = rng.sample(evts, 2)
            da, db = a.read_bytes(), b.read_bytes()
            a.write_bytes(db)
            b.write_bytes(da)
            detail = f"{a.relative_to(dest)} <-> {b.relative_to(dest)}"
        else:
            target.write_bytes(data[::-1])
            detail = f"{rel} reversed"
    return Mutant(index, name, mutation, detail)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def classify(archive: Path, reader: str) -> tuple[str, str]:
    """Read ``archive`` in this process: (ok | error | memory | bug, message)."""
    from analyze.errors import AnalyzeError
    from analyze.tables.database import build

    try:
        build(archive, db=archive / "mutant.duckdb", reader=reader)
    except AnalyzeError as e:
        return "error", str(e)
    except MemoryError:
        return "memory", ""
    except Exception as e:  # noqa: BLE001 -- exactly what the corpus looks for
        return "bug", f"{type(e).__name__}: {e}"
    return "ok", ""


def _worker(seed: int, reader: str, workdir: Path, indices: list[int], native: Path | None) -> None:
    """Child process: make and read each mutant, one JSON line per result (BEGIN first, so the
    parent knows which mutant a crash or hang belongs to)."""
    if native is not None:  # a sanitized build of the extension, in place of the installed one
        from tests.analyze import sanitizer

        sanitizer.load(native)
    import analyze.tables.database  # noqa: F401 -- imports take seconds; the time limit is per mutant

    srcs = sources(workdir)
    print("READY", flush=True)
    for i in indices:
        dest = workdir / f"m{i}"
        m = make(i, seed, srcs, dest)
        print(f"BEGIN {json.dumps(m.__dict__)}", flush=True)
        outcome, message = classify(dest, reader)
        print(f"END {json.dumps({'outcome': outcome, 'message': message})}", flush=True)
        shutil.rmtree(dest, ignore_errors=True)


def _pump(stream: Any, lines: queue.Queue[str | None]) -> None:
    """Hand a child's output lines to the parent's loop; None at the end."""
    for line in stream:
        lines.put(line)
    lines.put(None)


def run(count: int, seed: int, reader: str, workdir: Path, start: int = 0,
        sanitized: Path | None = None) -> list[dict]:
    """Make and read mutants ``start .. start + count - 1``; one result dict per mutant.

    One child process reads mutants in turn (imports cost seconds; a mutant, milliseconds);
    when it dies or hangs, the mutant it was on is recorded and a new child goes on.
    ``sanitized``: a sanitized build of the extension (tests/analyze/sanitizer.py) for the
    children to read with; a finding is a ``crash`` with the sanitizer's summary. (ASan reserves
    terabytes of address space, so those children run without the address-space limit.)
    """
    todo = list(range(start, start + count))
    results: list[dict] = []
    sources(workdir)  # once, before children race to write it
    env, log = None, workdir / "worker-stderr.log"
    if sanitized is not None:
        from tests.analyze import sanitizer

        env = {**os.environ, **sanitizer.environment()}
    while todo:
        cmd = [sys.executable, "-m", "tests.analyze.corpus", "--worker", "--seed", str(seed),
               "--reader", reader, "--workdir", str(workdir), "--indices", ",".join(map(str, todo))]
        cmd += ["--native-module", str(sanitized)] if sanitized is not None else []
        with log.open("w") as stderr:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                    env=env, preexec_fn=None if sanitized is not None else _limit_memory)
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        current: dict | None = None
        ready = False
        while True:
            try:
                line = lines.get(timeout=TIME_LIMIT_S if ready else STARTUP_LIMIT_S)
            except queue.Empty:
                proc.kill()
                proc.wait()
                line, outcome = None, ("hang", f"no result after {TIME_LIMIT_S} s")
            else:
                outcome = None
            if line == "READY\n":
                ready = True
                continue
            if line is not None and line.startswith("BEGIN "):
                current = json.loads(line[6:])
                continue
            if line is not None and line.startswith("END ") and current is not None:
                results.append({**current, **json.loads(line[4:])})
                todo.remove(current["index"])
                current = None
                continue
            if line is not None:
                continue  # anything else the child printed
            if current is None:  # finished, or died between mutants
                proc.wait()
                if proc.returncode not in (0, None) and todo:
                    raise RuntimeError(f"corpus worker failed outside a mutant: {proc.returncode}")
                break
            if outcome is None:
                code = proc.wait()
                outcome = ("crash", f"killed by {signal.Signals(-code).name}") if code < 0 else \
                    ("bug", f"worker exited with status {code}")
                if sanitized is not None:
                    from tests.analyze import sanitizer

                    said = sanitizer.summary(log.read_text(errors="replace"))
                    outcome = ("crash", said) if said else outcome
            results.append({**current, "outcome": outcome[0], "message": outcome[1]})
            todo.remove(current["index"])
            shutil.rmtree(workdir / f"m{current['index']}", ignore_errors=True)
            break
    return sorted(results, key=lambda r: r["index"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--reader", default="python")
    p.add_argument("--out", type=Path, help="write every result as JSON lines")
    p.add_argument("--sanitize", action="store_true",
                   help="read with the native reader built with ASan and UBSan (needs gcc)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--indices", help=argparse.SUPPRESS)
    p.add_argument("--native-module", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        _worker(args.seed, args.reader, args.workdir, [int(i) for i in args.indices.split(",")],
                args.native_module)
        return
    with tempfile.TemporaryDirectory() as d:
        sanitized = None
        if args.sanitize:
            from tests.analyze import sanitizer

            args.reader = "native"
            sanitized = sanitizer.build(Path(d) / "sanitized")
        results = run(args.count, args.seed, args.reader, Path(d), sanitized=sanitized)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in results))
    print(f"{len(results)} mutants, reader {args.reader}{' (ASan, UBSan)' if args.sanitize else ''}, "
          f"seed {args.seed}:",
          dict(Counter(r["outcome"] for r in results)))
    for r in results:
        if r["outcome"] not in ACCEPTABLE:
            print(json.dumps(r))
    sys.exit(0 if all(r["outcome"] in ACCEPTABLE for r in results) else 1)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    main()
