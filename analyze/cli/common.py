"""What several verbs share: argument types and how paths are shown."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def display(path: Path) -> str:
    """``path`` relative to the working directory when it is under it; links are kept (a
    run's ``tables`` link, not the build folder it points to, which the next build replaces)."""
    for candidate in (Path(os.path.abspath(path)), path.resolve()):
        try:
            return str(candidate.relative_to(Path.cwd()))
        except ValueError:
            pass
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
