"""Run directories: unique names, safe from concurrent starts and from path tricks."""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

from instrument.errors import UsageError

_AUTO = re.compile(r"run-(\d+)$")


def check_name(name: str) -> str:
    """Return ``name`` if it is a plain directory name, else raise :class:`UsageError`.

    Letters of any script, digits, spaces, quotes and punctuation are fine; what could place
    output elsewhere or break a file listing is not: path separators, ``.``/``..``, a leading
    dot, control characters (newlines included), and names longer than 200 characters.
    """
    problem = None
    if not name or name.strip() != name:
        problem = "is empty or starts or ends with whitespace"
    elif "/" in name or "\\" in name or "\x00" in name:
        problem = "contains a path separator"
    elif name.startswith("."):
        problem = "starts with a dot"
    elif any(unicodedata.category(c).startswith("C") for c in name):
        problem = "contains a control character"
    elif len(name) > 200:
        problem = "is longer than 200 characters"
    if problem:
        raise UsageError(f"run name {name!r} {problem}; use a plain name such as 'bs64-np4'.")
    return name


def create(out: Path, name: str | None) -> Path:
    """Create and return a new run directory under ``out``.

    Without ``name`` the run is ``run-NNNN`` with the next free number. With a name that is
    taken, ``-2``, ``-3``... is appended. ``os.mkdir`` is atomic, so runs that start at the
    same moment never share a directory.
    """
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create the output directory {out}: {e.strerror}.") from None
    if name is not None:
        base = check_name(name)
        candidates = (base if i == 1 else f"{base}-{i}" for i in range(1, 100_000))
    else:
        taken = [int(m.group(1)) for p in out.iterdir() if (m := _AUTO.match(p.name))]
        start = max(taken, default=0) + 1
        candidates = (f"run-{i:04d}" for i in range(start, start + 100_000))
    for candidate in candidates:
        path = out / candidate
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise UsageError(f"cannot create the run directory {path}: {e.strerror}.") from None
    raise UsageError(f"no free run name left in {out}.")
