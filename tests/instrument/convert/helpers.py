"""Shared by the horovodize tests: convert a literal script, and look at what changed."""

from __future__ import annotations

import difflib
import textwrap

from instrument.convert import Options, Result, convert


def conv(source: str, keras_data: str = "shard") -> Result:
    """Convert ``source`` (dedented); a converted script must compile."""
    result = convert(textwrap.dedent(source).lstrip("\n"), options=Options(keras_data=keras_data))
    compile(result.output, "converted.py", "exec")
    return result


def added(result: Result) -> list[str]:
    """The lines the conversion added or changed, stripped, in order."""
    return [line[2:].strip() for line in difflib.ndiff(result.source.splitlines(), result.output.splitlines())
            if line.startswith("+ ")]


def removed(result: Result) -> list[str]:
    """The original lines that no longer appear as they were."""
    return [line[2:] for line in difflib.ndiff(result.source.splitlines(), result.output.splitlines())
            if line.startswith("- ")]


def rules(result: Result) -> list[tuple[str, int]]:
    """(rule, line) of every edit, in report order."""
    return [(a["rule"], a["line"]) for a in result.to_json()["applied"]]


def codes(findings: list) -> list[str]:  # type: ignore[type-arg]
    return [f.code for f in findings]
