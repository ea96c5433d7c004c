"""What several verbs share: argument types and how paths are shown."""

from __future__ import annotations

import argparse
from pathlib import Path


def display(path: Path) -> str:
    """``path`` relative to the working directory when it is under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def int_list(text: str) -> list[int]:
    """``4,8`` -> [4, 8]: positive rank counts."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rank counts such as 4,8, not {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive rank counts such as 4,8, not {text!r}")
    return values
