"""Classify regions for the phase model, from their names, paradigms and roles.

Our own markers are recognised by name (``dltrace.step`` ...), also with the ``user:`` prefix
Score-P gives user regions, so traces from both backends classify alike; so are the names
PyTorch's profiler gives steps, data loading, optimizer steps and device synchronization.
Everything else goes by OTF2 paradigm and role, as Score-P writes them (see
docs/phase-model.md); accelerator kernels and copies by their roles (docs/gpu.md). A region
none of these decides is matched against the name patterns (:mod:`analyze.tables.patterns`,
and a user's ``--patterns`` file before them), so what an OTF2 definition says always wins
over a name; a region no pattern matches is compute.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import duckdb
import pandas as pd

from analyze.schema import Category, Rule
from analyze.tables.names import match_name
from analyze.tables.pattern_set import DEFAULT_SET, PatternSet
from analyze.tables.patterns import Kind, Pattern

MARKERS = {
    "dltrace.step": Category.STEP,
    "dltrace.tail": Category.TAIL,
    "dltrace.forward": Category.FORWARD,
    "dltrace.backward": Category.BACKWARD,
    "dltrace.optimizer": Category.OPTIMIZER,
    "dltrace.dataloader": Category.DATALOADER,
    "dltrace.flush": Category.OVERHEAD,
    "dltrace.clock_sync": Category.OVERHEAD,
}
# Score-P's own work: buffer flushes and switched-off recording.
OVERHEAD_NAMES = {"TRACE BUFFER FLUSH", "MEASUREMENT OFF"}
COLLECTIVE_ROLES = {"coll_all2all", "coll_one2all", "coll_all2one", "coll_other", "barrier"}
# Thread-level synchronization (OpenMP, pthreads) is not communication between ranks.
THREAD_PARADIGMS = {"openmp", "pthread", "winthread", "qtthread", "acethread", "tbbthread"}
KIND_CATEGORY = {Kind.ALLREDUCE: Category.COLLECTIVE, Kind.COLLECTIVE: Category.COLLECTIVE,
                 Kind.P2P: Category.P2P, Kind.WAIT: Category.WAIT, Kind.RUNTIME: Category.RUNTIME,
                 Kind.COMPUTE: Category.FUNCTION}
# What PyTorch's profiler (Kineto) names steps, data loading, optimizer steps, the data-parallel
# wrappers' forward (torch 2.13.0: nn/parallel/distributed.py:1885, data_parallel.py:173), the
# autograd engine's backward ops (libtorch_cpu.so) and the runtime calls that block the host
# until the device is done.
KINETO_NAMES = (
    (re.compile(r"ProfilerStep#\d+"), Category.STEP),
    (re.compile(r"(Distributed)?DataParallel\.forward"), Category.FORWARD),
    (re.compile(r"autograd::engine::evaluate_function: .*"), Category.BACKWARD),
    (re.compile(r"enumerate\(DataLoader\)#.*"), Category.DATALOADER),
    (re.compile(r"Optimizer\.step#.*"), Category.OPTIMIZER),
    (re.compile(r"(cuda|hip)(Device|Stream|Event)Synchronize"), Category.WAIT),
    (re.compile(r"synchronize(Stream|Device|Event)?"), Category.WAIT),  # MTIA's runtime (mtia_runtime)
)


@dataclass(frozen=True)
class Classification:
    category: Category
    rule: Rule
    match_name: str
    pattern: Pattern | None = None

    @property
    def op(self) -> str | None:
        return self.pattern.op if self.pattern else None


def explain(name: str, paradigm: str, role: str, canonical: str | None = None,
            patterns: PatternSet = DEFAULT_SET) -> Classification:
    """The category of a region and the rule that gave it (paradigm and role as lowercase
    OTF2 enum names; ``canonical`` the canonical, e.g. mangled, name)."""
    key = match_name(name, canonical if canonical != name else None)
    base = name[5:] if name.startswith("user:") else name
    if base in MARKERS:
        return Classification(MARKERS[base], Rule.MARKER, key)
    if name in OVERHEAD_NAMES:
        return Classification(Category.OVERHEAD, Rule.MEASUREMENT, key)
    if role == "kernel":
        return Classification(Category.KERNEL, Rule.ROLE, key)
    if role == "data_transfer":
        return Classification(Category.MEMORY, Rule.ROLE, key)
    for regex, category in KINETO_NAMES:
        if regex.fullmatch(name):
            return Classification(category, Rule.MARKER, key)
    if paradigm in THREAD_PARADIGMS:
        return Classification(Category.FUNCTION, Rule.PARADIGM, key)
    if role in COLLECTIVE_ROLES:
        return Classification(Category.COLLECTIVE, Rule.ROLE, key)
    if role in ("point2point", "rma"):
        return Classification(Category.P2P, Rule.ROLE, key)
    if role == "task_wait" and paradigm == "user":
        return Classification(Category.WAIT, Rule.ROLE, key)
    if paradigm == "mpi":
        # Completion of non-blocking operations is communication time.
        if base.startswith(("MPI_Wait", "MPI_Test")):
            return Classification(Category.P2P, Rule.PARADIGM, key)
        if role in ("function", "unknown"):
            return Classification(Category.RUNTIME, Rule.PARADIGM, key)
        return Classification(Category.FUNCTION, Rule.PARADIGM, key)
    pattern = patterns.match(key)
    if pattern is not None:
        return Classification(KIND_CATEGORY[pattern.kind], Rule.PATTERN, key, pattern)
    if name.startswith("user:"):
        return Classification(Category.USER, Rule.DEFAULT, key)
    return Classification(Category.FUNCTION, Rule.DEFAULT, key)


def classify(name: str, paradigm: str, role: str, canonical: str | None = None,
             patterns: PatternSet = DEFAULT_SET) -> Category:
    """The :class:`Category` of a region (see :func:`explain`)."""
    return explain(name, paradigm, role, canonical, patterns).category


COMM_WORDS = ("allreduce", "all_reduce", "reduce", "bcast", "broadcast", "barrier", "gather",
              "scatter", "alltoall", "all_to_all", "send", "recv", "wait", "sync", "exchange")


def region_table(con: duckdb.DuckDBPyConnection, everything: bool = False) -> pd.DataFrame:
    """Per region entered in the trace: its category and why, with instances and time.

    Columns: region (name), category, op, why, instances, main_ms (inclusive time on the
    ranks' main threads), records (instances carrying an OTF2 collective record), by_name
    (collectives rows recognized by name), suspect (compute whose name has a communication
    word: a candidate for a pattern). Communication and runtime first, then by time.
    ``everything`` lists defined regions never entered too.
    """
    df = con.execute(f"""
        WITH inst AS (
            SELECT i.region_id, count(*) AS instances,
                   sum(CASE WHEN l.is_main THEN i.duration_ns ELSE 0 END) / 1e6 AS main_ms
            FROM intervals i JOIN locations l USING (location_id) GROUP BY i.region_id),
        coll AS (
            SELECT region_id, count(*) FILTER (WHERE source = 'record') AS records,
                   count(*) FILTER (WHERE source = 'name') AS by_name
            FROM collectives GROUP BY region_id)
        SELECT r.name AS region, r.category, r.pattern_op AS op, r.rule, r.pattern, r.paradigm, r.role, r.match_name,
               coalesce(inst.instances, 0) AS instances, coalesce(inst.main_ms, 0) AS main_ms,
               coalesce(coll.records, 0) AS records, coalesce(coll.by_name, 0) AS by_name
        FROM regions r LEFT JOIN inst USING (region_id) LEFT JOIN coll USING (region_id)
        {"" if everything else "WHERE inst.instances > 0"}
    """).df()
    df["why"] = [_why(row) for row in df.itertuples()]
    lowered = df["match_name"].str.lower()
    df["suspect"] = (df["rule"] == str(Rule.DEFAULT)) & lowered.apply(
        lambda n: any(w in n for w in COMM_WORDS))
    comm = df["category"].isin([str(c) for c in (Category.COLLECTIVE, Category.P2P, Category.WAIT,
                                                   Category.RUNTIME)])
    df = df.assign(_order=(~comm).astype(int) * 2 - df["suspect"].astype(int))
    df = df.sort_values(["_order", "main_ms", "region"], ascending=[True, False, True])
    return df[["region", "category", "op", "why", "instances", "main_ms", "records", "by_name", "suspect"]] \
        .reset_index(drop=True)


def _why(row: Any) -> str:
    """One row of :func:`region_table`'s frame (a pandas itertuples tuple) -> its reason."""
    if row.rule == Rule.PATTERN:
        text = f"pattern {row.pattern}"
        if row.match_name != row.region:
            text += f" (matched as {row.match_name})"
        return text
    text = {
        Rule.MARKER: "our marker name",
        Rule.MEASUREMENT: "measurement system's own work",
        Rule.PARADIGM: f"OTF2 paradigm {row.paradigm} (role {row.role})",
        Rule.ROLE: f"OTF2 region role {row.role}",
        Rule.DEFAULT: "default: user region" if row.category == Category.USER else "default: compute",
    }[Rule(row.rule)]
    if row.records:
        text += f"; OTF2 collective records on {row.records} instances"
    return text
