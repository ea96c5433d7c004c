"""Training steps per rank: our step markers, a user-named region, or the whole run.

In that order of preference: ``dltrace.step`` regions (the built-in tracer's and, as
``user:dltrace.step``, the Score-P backend's); otherwise the outermost instances of the region
named by ``--step-region`` on each rank's main thread; otherwise one step spanning each
rank's whole trace. The choice is made for the whole trace (analyze/tables/stages.py counts
each candidate on every rank first), so that all ranks' steps come from the same source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import duckdb
import pandas as pd

from analyze.errors import AnalyzeError
from analyze.schema import Category

SOURCES = ("marker", "region", "whole_run")


def candidate(source: str, step_region: str | None = None) -> str:
    """The steps of every rank in the views intervals, regions and locations, as ``source``
    would give them (``region``: outermost instances of the region ``step_region``)."""
    if source == "marker":
        return f"""
            SELECT i.rank, row_number() OVER (PARTITION BY i.rank ORDER BY i.start_ns, i.idx) - 1 AS step,
                   i.start_ns, i.end_ns, i.end_ns - i.start_ns AS duration_ns, 'marker' AS source
            FROM intervals i JOIN regions r USING (region_id) JOIN locations l USING (location_id)
            WHERE l.is_main AND r.category = '{Category.STEP}'
        """
    if source == "region":
        name = "'" + str(step_region).replace("'", "''") + "'"
        return f"""
            WITH c AS (
                SELECT i.* FROM intervals i JOIN regions r USING (region_id)
                JOIN locations l USING (location_id)
                WHERE l.is_main AND (r.name = {name} OR r.name = 'user:' || {name})
            ),
            outer_only AS (
                SELECT c.* FROM c WHERE NOT EXISTS (
                    SELECT 1 FROM c o WHERE o.location_id = c.location_id AND o.idx <> c.idx
                      AND o.start_ns <= c.start_ns AND o.end_ns >= c.end_ns AND o.depth < c.depth)
            )
            SELECT rank, row_number() OVER (PARTITION BY rank ORDER BY start_ns, idx) - 1 AS step,
                   start_ns, end_ns, end_ns - start_ns AS duration_ns, 'region:' || {name} AS source
            FROM outer_only
        """
    if source == "whole_run":
        return """
            SELECT rank, 0 AS step, min(start_ns) AS start_ns, max(end_ns) AS end_ns,
                   max(end_ns) - min(start_ns) AS duration_ns, 'whole_run' AS source
            FROM intervals GROUP BY rank
        """
    raise ValueError(f"unknown step source {source!r}")


def choose(counts: dict[str, int], step_region: str | None) -> str:
    """The source for the whole trace, given how many steps each candidate found on all ranks."""
    if step_region is None and counts.get("marker", 0):
        return "marker"
    if step_region is not None and counts.get("region", 0):
        return "region"
    return "whole_run"


def label(source: str, step_region: str | None) -> str:
    """What ``build_info.step_source`` says: marker, region:<name> or whole_run."""
    return f"region:{step_region}" if source == "region" else source


MAX_STEP_BARS = 400  # bars a panel of a per-step figure before consecutive steps are binned


@dataclass(frozen=True)
class StepBins:
    """Consecutive steps grouped for a per-step figure, in SQL: bins of ``per`` steps from
    ``first``, the last ending at ``last``; a bin's value is its mean per step (a step without
    a row counts as zero), at the bin's first step. ``per`` 1: every step its own."""

    first: int
    last: int
    per: int

    def start(self, col: str = "step") -> str:
        """SQL: the first step of ``col``'s bin."""
        return f"({self.first} + ({col} - {self.first}) // {self.per} * {self.per})"

    def width(self, start: str) -> str:
        """SQL: how many steps the bin starting at ``start`` holds."""
        return "1" if self.per == 1 else f"least({self.per}, {self.last} - {start} + 1)"

    def sums(self, con: duckdb.DuckDBPyConnection, source: str, keys: list[str], ns: str) -> pd.DataFrame:
        """step (a bin's first step), ``keys``, ms: ``source``'s ``ns`` column summed per bin
        and key, as the mean per step of each bin."""
        cols = ", ".join(keys)
        return con.execute(f"""SELECT b AS step, {cols}, sum({ns}) / 1e6 / {self.width('b')} AS ms
                               FROM (SELECT {self.start()} AS b, {cols}, {ns} FROM {source})
                               GROUP BY b, {cols}""").df()


def top_and_rest(per_step: pd.DataFrame, labels: list[str], keep: list[str], rest: str) -> pd.DataFrame:
    """step, cause, ms of a per-step figure: ``per_step``'s rows (step, ms) under their
    ``labels``, those not in ``keep`` as ``rest``; cause a categorical in the order of
    ``keep``, then ``rest`` where it occurs."""
    out = per_step.assign(cause=[lab if lab in keep else rest for lab in labels])
    out = out.groupby(["step", "cause"], as_index=False)["ms"].sum()
    out["cause"] = pd.Categorical(out["cause"], categories=keep + ([rest] if rest in set(out["cause"]) else []))
    return out


MAX_RANK_PANELS = 16  # panels of a per-rank figure before consecutive ranks are grouped


@dataclass(frozen=True)
class RankGroups:
    """Consecutive ranks grouped for a per-rank figure, in SQL: groups of ``per`` ranks of
    ``ranks``; a group's value is the mean over its ranks. ``per`` 1: every rank its own."""

    per: int
    ranks: int

    def start(self, col: str = "rank") -> str:
        """SQL: the first rank of ``col``'s group."""
        return f"({col} // {self.per} * {self.per})"

    def sizes(self, source: str) -> str:
        """SQL: a CTE ``n`` of each group ``g`` of ``source`` (columns g, rank) and its ranks
        there, ``n``: what the sums over a group are divided by for its mean rank."""
        return f"n AS (SELECT g, count(DISTINCT rank) AS n FROM {source} GROUP BY g)"

    def label(self, first: int, short: bool = False) -> str:
        """The panel or axis name of the group starting at rank ``first`` (``short``: without
        the word, for tick labels side by side)."""
        last = min(first + self.per, self.ranks) - 1
        if last <= first:
            return f"rank {first}"
        return f"{first}-{last}" if short else f"ranks {first}-{last}"

    def panel(self, first: int) -> str:
        """A panel's name (:meth:`label`), without the word where the run has rank numbers of
        four digits: 'ranks 1024-1279' ran into the next panel's (the subtitle says what a
        panel holds)."""
        return self.label(first, short=self.per > 1 and self.ranks > 1000)

    def note(self) -> str:
        """What a figure's subtitle says of the groups ('' when a group is one rank)."""
        return f"\neach panel: the mean of {self.per} consecutive ranks" if self.per > 1 else ""


def rank_group_sql(per: int) -> tuple[str, str, str]:
    """SQL of a per-rank summary printed per rank (``per`` 1) or per group of ``per``
    consecutive rank numbers: (the key to group by, the first column: ``rank`` or the
    group's ``ranks`` first-last, and its steps: ``steps`` or ``"steps/rank"``), for a
    GROUP BY over rows with columns rank and step."""
    if per == 1:
        return "rank", "rank", "count(*) AS steps"
    return (f"rank // {int(per)}",
            "CASE WHEN min(rank) = max(rank) THEN min(rank)::VARCHAR ELSE min(rank) || '-' || max(rank) END AS ranks",
            'round(count(*) / count(DISTINCT rank), 1) AS "steps/rank"')


def per_bin(count: int, most: int) -> int:
    """How many consecutive items (steps, ranks) one bin holds so that ``count`` of them fit
    in ``most`` bins: 1 while they fit."""
    return max(1, -(-int(count) // most))


def rank_groups(con: duckdb.DuckDBPyConnection, most: int = MAX_RANK_PANELS) -> RankGroups:
    """The groups of the run's ranks: one rank each while they fit in ``most`` panels."""
    (ranks,) = con.execute("SELECT coalesce(max(rank) + 1, 0) FROM steps").fetchone() or (0,)
    return RankGroups(per_bin(ranks, most), int(ranks))


def step_bins(con: duckdb.DuckDBPyConnection, most: int = MAX_STEP_BARS) -> StepBins:
    """The bins of the run's steps: one step each while they fit in ``most`` bars."""
    first, last = con.execute("SELECT min(step), max(step) FROM steps").fetchone() or (None, None)
    if first is None:
        return StepBins(0, 0, 1)
    return StepBins(int(first), int(last), per_bin(int(last) - int(first) + 1, most))


def parse_steps(text: str) -> tuple[int, int]:
    """``A:B`` -> (A, B): steps A to B-1, like a Python slice; ``A`` alone is step A."""
    m = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", text)
    if not m:
        raise AnalyzeError(f"--steps {text!r}: expected A:B (steps A to B-1) or a single step A")
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) is not None else a + 1
    if b <= a:
        raise AnalyzeError(f"--steps {text!r}: B must be larger than A (A:B shows steps A to B-1)")
    return a, b
