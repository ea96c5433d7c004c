"""The patterns a build uses: a user's file (``--patterns FILE.toml``) before the defaults.

The file holds ``[[pattern]]`` tables, tried in file order before the default table
(:mod:`analyze.tables.patterns`), so a file can add names and override defaults::

    [[pattern]]
    library = "mylib"                 # shown by `analyze patterns` (default: the file name)
    glob = "mylib::allreduce*"        # or: regex = 'mylib::(?:all)?reduce(?:<.*>)?'
    category = "allreduce"            # allreduce, collective, p2p, wait, runtime or compute
    op = "allreduce"                  # optional: the operation (allreduce, bcast, ...)
    blocking = true                   # optional: false for calls that only start an operation
    source = "mylib/include/comm.h:42"  # optional: where the name comes from

A glob or regular expression must match the whole match name (:mod:`analyze.tables.names`);
``category = "compute"`` switches a default off for the names it matches.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from analyze.errors import AnalyzeError
from analyze.tables.patterns import ANCHORS, DEFAULTS, OPS, Kind, Pattern

_ANCHORS = re.compile("|".join(re.escape(a) for a in ANCHORS))
_BACKREF = re.compile(r"\\[1-9]|\(\?P=")
_KEYS = {"library", "glob", "regex", "category", "op", "blocking", "source"}


def compile_pattern(p: Pattern) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(p.pattern) if p.syntax == "glob" else p.pattern)


class _Matcher:
    """The first of ``patterns`` whose expression matches a whole name."""

    def __init__(self, patterns: tuple[Pattern, ...]):
        self.patterns = patterns
        self.compiled = [compile_pattern(p) for p in patterns]
        # One alternation tried in C is several times as fast as a loop over the patterns
        # (traces of compiled code define 10^4-10^5 regions); fullmatch takes the first
        # alternative that matches the whole name, as the loop does. Backreferences would
        # change meaning inside the alternation, so a set with any keeps the loop.
        self.combined: re.Pattern[str] | None = None
        if patterns and not any(_BACKREF.search(rx.pattern) for rx in self.compiled):
            try:
                self.combined = re.compile("|".join(f"(?P<p{i}>{rx.pattern})" for i, rx in enumerate(self.compiled)))
            except re.error:
                self.combined = None

    def __call__(self, name: str) -> Pattern | None:
        if self.combined is not None:
            m = self.combined.fullmatch(name)
            return self.patterns[int(m.lastgroup[1:])] if m and m.lastgroup else None
        for rx, p in zip(self.compiled, self.patterns, strict=True):
            if rx.fullmatch(name):
                return p
        return None


_DEFAULTS = _Matcher(DEFAULTS)


@dataclass
class PatternSet:
    """A user's patterns (maybe none), then the defaults: :meth:`match` gives the first match."""

    mine: tuple[Pattern, ...] = ()
    origin: str = "defaults"  # what to call it in messages and build_info
    _mine: _Matcher = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._mine = _Matcher(self.mine)

    @property
    def patterns(self) -> tuple[Pattern, ...]:
        return self.mine + DEFAULTS

    def match(self, match_name: str) -> Pattern | None:
        found = self._mine(match_name) if self.mine else None
        if found is None and _ANCHORS.search(match_name):  # most names hold no library's name
            found = _DEFAULTS(match_name)
        return found

    def digest(self) -> str:
        """A hash of every pattern in order: part of a database's build signature (every
        ``analyze`` verb computes it; the defaults' part is made once per process)."""
        text = json.dumps([*map(_fields, self.mine), *_defaults_fields()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _fields(pattern: Pattern) -> dict[str, Any]:
    """``dataclasses.asdict`` for a pattern, whose fields are all plain values (without its
    deep copies: 10 ms for the defaults)."""
    return {f.name: getattr(pattern, f.name) for f in fields(Pattern)}


@functools.cache
def _defaults_fields() -> tuple[dict[str, Any], ...]:
    return tuple(map(_fields, DEFAULTS))


DEFAULT_SET = PatternSet()


def load(path: Path | str | None) -> PatternSet:
    """The defaults, preceded by the patterns of ``path`` when given (AnalyzeError if bad)."""
    if path is None:
        return DEFAULT_SET
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise AnalyzeError(f"cannot read the patterns file {path}: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise AnalyzeError(f"{path} is not a valid TOML file ({e}); see docs/frameworks.md for the format") from None
    extra = sorted(set(data) - {"pattern"})
    tables = data.get("pattern")
    if extra or not isinstance(tables, list) or not tables:
        raise AnalyzeError(f"{path} must hold [[pattern]] tables only (found {', '.join(extra) or 'none'}); "
                           "see docs/frameworks.md for the format")
    mine = tuple(_pattern(path, i + 1, t) for i, t in enumerate(tables))
    return PatternSet(mine, origin=str(path))


def _pattern(path: Path, n: int, t: Any) -> Pattern:
    def bad(what: str) -> AnalyzeError:
        return AnalyzeError(f"{path}: pattern {n}: {what}")

    if not isinstance(t, dict):
        raise bad("is not a table; write [[pattern]] followed by key = value lines")
    unknown = sorted(set(t) - _KEYS)
    if unknown:
        raise bad(f"unknown key {', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})")
    if ("glob" in t) == ("regex" in t):
        raise bad("give exactly one of glob = '...' or regex = '...'")
    syntax = "glob" if "glob" in t else "regex"
    text = t[syntax]
    if not isinstance(text, str) or not text:
        raise bad(f"{syntax} must be a non-empty string")
    try:
        re.compile(fnmatch.translate(text) if syntax == "glob" else text)
    except re.error as e:
        raise bad(f"regex {text!r} does not compile ({e})") from None
    kinds = [k.value for k in Kind]
    if t.get("category") not in kinds:
        raise bad(f"category {t.get('category')!r} is not one of {', '.join(kinds)}")
    op = t.get("op")
    if op is not None and op not in OPS:
        raise bad(f"op {op!r} is not one of {', '.join(OPS)}")
    kind = Kind(t["category"])
    if kind == Kind.ALLREDUCE:
        op = op or "allreduce"
    if kind == Kind.COLLECTIVE and op is None:
        raise bad(f"a collective needs op = one of {', '.join(OPS[:9])}")
    blocking = t.get("blocking", True)
    if not isinstance(blocking, bool):
        raise bad("blocking must be true or false")
    for key in ("library", "source"):
        if not isinstance(t.get(key, ""), str):
            raise bad(f"{key} must be a string")
    return Pattern(t.get("library") or path.stem, text, kind, op, blocking, syntax,
                   t.get("source") or f"{path.name}, pattern {n}", "")


def _rows(patterns: PatternSet) -> list[tuple[str, ...]]:
    return [(p.library, p.pattern if p.syntax == "regex" else f"glob {p.pattern}", str(p.kind), p.op or "",
             "" if p.blocking else "start", p.source) for p in patterns.patterns]


def text(patterns: PatternSet) -> str:
    """The patterns in the order they are tried, one per line, for a terminal."""
    lines = [f"{len(patterns.patterns)} patterns ({patterns.origin}), tried in this order; the first match wins.",
             "'start': the call only starts the operation (not matched across ranks).", ""]
    rows = _rows(patterns)
    width = max(len(r[0]) for r in rows)
    for library, pattern, kind, op, start, source in rows:
        lines.append(f"{library:<{width}}  {kind:<10}  {op:<14}  {start:<5}  {pattern}")
        lines.append(f"{'':<{width}}  {source}")
    return "\n".join(lines)


def markdown() -> str:
    """The default table as Markdown (docs/patterns.md is generated from this by make docs)."""
    out = ["# Default name patterns", "",
           "Generated from `analyze/tables/patterns.py` by `make docs`; docs/frameworks.md explains "
           "how they are used. Tried in this order, the first match wins; each must match the "
           "whole match name. *start*: the call only starts the operation (a non-blocking start, or a "
           "GPU library's enqueue), so it is communication time but not matched across ranks.", "",
           "| library | pattern | category | op | | source | example |", "|---|---|---|---|---|---|---|"]
    for p, r in zip(DEFAULT_SET.patterns, _rows(DEFAULT_SET), strict=True):
        cells = [c.replace("|", "\\|") for c in (*r, p.example)]
        cells[1] = f"`{cells[1]}`"
        cells[6] = f"`{cells[6]}`"
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"
