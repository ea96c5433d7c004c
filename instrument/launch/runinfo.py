"""``run.json``: what a run was (command, ranks, versions, parameters) and how it ended."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RUN_JSON = "run.json"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def params_from_args(args: list[str]) -> dict[str, Any]:
    """Script parameters from ``--name value`` / ``--name=value`` / ``--flag`` arguments.

    Names are normalized to snake_case (``--batch-size 32`` -> ``batch_size: 32``) and numbers
    parsed, so reports can label runs by batch size without the script's cooperation.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--") and len(arg) > 2:
            key, eq, value = arg[2:].partition("=")
            if not eq:
                if i + 1 < len(args) and not args[i + 1].startswith("--"):
                    value = args[i + 1]
                    i += 1
                else:
                    value = "true"
            out[key.replace("-", "_")] = _number(value)
        i += 1
    return out


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text, text)


def write(run_dir: Path, info: dict[str, Any]) -> None:
    """Write ``run.json`` atomically (a reader never sees half of it)."""
    path = Path(run_dir) / RUN_JSON
    tmp = path.with_name(RUN_JSON + ".tmp")
    tmp.write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read(run_dir: Path) -> dict[str, Any]:
    """The run's ``run.json``, or an empty dict when there is none (e.g. a Score-P archive)."""
    try:
        return json.loads((Path(run_dir) / RUN_JSON).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return {}
