"""Every table ``analyze`` writes, declared once: the DDL and the documentation come from here.

Times are integer nanoseconds from the trace start (the archive's global clock offset), after
the archive's ClockOffset corrections. Missing values are NULL. Categorical columns hold the
readable values of the ``StrEnum`` types below.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

SCHEMA_VERSION = 2  # 2: tables stored as Parquet under RUN/tables, views in the database


class Phase(StrEnum):
    """Where a rank's time inside a step goes; the phases of a step add up to its duration."""

    COMPUTE = "compute"  # everything not below
    ALLREDUCE = "allreduce"  # transferring in allreduce collectives
    OTHER_COMM = "other_comm"  # transferring in other collectives and point-to-point
    IDLE = "idle"  # waiting for a late rank (collective) or a late sender
    OTHER = "other"  # measurement overhead, runtime setup (MPI_Init/Finalize)


class Category(StrEnum):
    """What a region is, as far as the phase model is concerned."""

    STEP = "step"
    TAIL = "tail"  # after the last optimizer step
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    DATALOADER = "dataloader"
    COLLECTIVE = "collective"
    P2P = "p2p"
    WAIT = "wait"  # the main thread blocks on asynchronous communication
    RUNTIME = "runtime"  # communication runtime setup and queries (MPI_Init, MPI_Comm_rank)
    OVERHEAD = "overhead"  # the measurement system's own work (buffer flushes, clock sync)
    USER = "user"  # user-marked regions
    FUNCTION = "function"  # anything else (Python or compiled functions)


class Rule(StrEnum):
    """Why a region got its category (``regions.rule``), in the order the rules are tried."""

    MARKER = "marker"  # one of our marker names (dltrace.step, ...)
    MEASUREMENT = "measurement"  # the measurement system's own work (TRACE BUFFER FLUSH)
    PARADIGM = "paradigm"  # its OTF2 paradigm (MPI; thread paradigms are not communication)
    ROLE = "role"  # its OTF2 region role (collective, point-to-point, task wait)
    PATTERN = "pattern"  # a name pattern (analyze/tables/patterns.py, or --patterns FILE)
    DEFAULT = "default"  # none of the above: compute (user regions: user)


class CollectiveSource(StrEnum):
    """What a ``collectives`` row comes from."""

    RECORD = "record"  # an OTF2 collective record (MpiCollectiveBegin/End): op, bytes, communicator
    NAME = "name"  # a region recognized as a collective by its name only: no bytes, inferred group


COMPUTE_CATEGORIES = (Category.FORWARD, Category.BACKWARD, Category.OPTIMIZER, Category.DATALOADER)


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    doc: str


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]
    # Stored as a Parquet dataset split hive-style by this column (RUN/tables/<name>/rank=N/),
    # so each rank's rows are written and read on their own; None: one file per table.
    partition_by: str | None = None

    def ddl(self, name: str | None = None) -> str:
        cols = ",\n    ".join(f"{c.name} {c.type}" for c in self.columns)
        return f"CREATE TABLE {name or self.name} (\n    {cols}\n)"

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]


def _t(name: str, doc: str, *cols: tuple[str, str, str], partition_by: str | None = None) -> Table:
    return Table(name, doc, tuple(Column(*c) for c in cols), partition_by)


RUNS = _t(
    "runs", "One row: the run and the archive it was read from.",
    ("run_name", "VARCHAR", "directory name of the run"),
    ("path", "VARCHAR", "absolute path of the OTF2 anchor file"),
    ("creator", "VARCHAR", "program that wrote the archive (dltrace, Score-P x.y)"),
    ("framework", "VARCHAR", "from run.json (pytorch-ddp, horovod-pytorch, ...); NULL if unknown"),
    ("ranks", "INTEGER", "number of ranks (process location groups)"),
    ("params", "JSON", "script parameters from run.json (batch_size, steps, ...)"),
    ("start_realtime", "TIMESTAMPTZ", "wall-clock time of the trace start, if recorded"),
    ("duration_ns", "BIGINT", "trace length"),
    ("timer_resolution", "BIGINT", "archive timer ticks per second"),
    ("global_offset", "BIGINT", "archive tick that is 0 ns here"),
    ("events", "BIGINT", "events read"),
    ("complete", "BOOLEAN", "run.json says every rank finished and flushed (NULL: no run.json)"),
    ("reader", "VARCHAR", "which OTF2 reader built the tables (python, native)"),
    ("schema_version", "INTEGER", "version of this schema"),
)

LOCATIONS = _t(
    "locations", "Threads, communication lanes and device streams, each belonging to a rank.",
    ("location_id", "BIGINT", "OTF2 location reference"),
    ("rank", "INTEGER", "rank of the owning process (its location group, in definition order)"),
    ("thread", "INTEGER", "index within the rank, by location id; 0 is the main thread"),
    ("name", "VARCHAR", "location name"),
    ("kind", "VARCHAR", "cpu_thread, comm_lane, timeline (imported, e.g. Horovod's), tracer (our buffer flushes), accelerator_stream, metric or unknown"),
    ("is_main", "BOOLEAN", "the rank's main thread, on which steps and phases are computed"),
    ("events", "BIGINT", "events read on this location"),
)

REGIONS = _t(
    "regions", "Region definitions with the classification the phase model uses.",
    ("region_id", "BIGINT", "OTF2 region reference"),
    ("name", "VARCHAR", "region name as written"),
    ("canonical_name", "VARCHAR", "canonical (e.g. mangled) name"),
    ("paradigm", "VARCHAR", "OTF2 paradigm (mpi, user, measurement_system, ...)"),
    ("role", "VARCHAR", "OTF2 region role (coll_all2all, function, ...)"),
    ("category", "VARCHAR", "Category: step, forward, collective, wait, ..."),
    ("source_file", "VARCHAR", "source file, if recorded"),
    ("begin_line", "INTEGER", "first source line, if recorded"),
    ("match_name", "VARCHAR", "the name patterns are matched against: the demangled canonical "
     "name without return type and parameters (docs/frameworks.md)"),
    ("pattern_op", "VARCHAR", "operation the matching pattern names (allreduce, bcast, send, ...); for a "
     "wait whose pattern names none, the one operation all of its library's outermost "
     "non-blocking starts in the trace perform; NULL otherwise"),
    ("rule", "VARCHAR", "Rule: why the region got its category (marker, measurement, paradigm, "
     "role, pattern, default)"),
    ("pattern", "VARCHAR", "the first matching pattern as 'library: pattern' (rule = pattern)"),
)

INTERVALS = _t(
    "intervals", "One row per region instance (Enter..Leave) per location.",
    ("location_id", "BIGINT", "location"),
    ("rank", "INTEGER", "rank of the location"),
    ("idx", "BIGINT", "instance number on its location, in enter order"),
    ("parent_idx", "BIGINT", "idx of the enclosing instance on the same location; NULL at the top"),
    ("depth", "INTEGER", "nesting depth, 0 at the top"),
    ("region_id", "BIGINT", "region"),
    ("start_ns", "BIGINT", "enter time"),
    ("end_ns", "BIGINT", "leave time"),
    ("duration_ns", "BIGINT", "inclusive time, end_ns - start_ns"),
    ("exclusive_ns", "BIGINT", "duration minus the durations of direct children"),
    ("truncated", "BOOLEAN", "no Leave was recorded; closed at the location's last event"),
    partition_by="rank",
)

COMMUNICATORS = _t(
    "communicators", "Communicators (MPI communicators, process groups); with a negative comm_id, "
    "the group inferred for one library's collectives recognized by name only.",
    ("comm_id", "BIGINT", "OTF2 communicator reference"),
    ("name", "VARCHAR", "name"),
    ("size", "INTEGER", "number of members"),
    ("members", "INTEGER[]", "ranks in communicator order"),
)

COLLECTIVES = _t(
    "collectives",
    "One row per collective instance per rank, matched across ranks by communicator and "
    "sequence number. Handle creation/destruction records (MPI_Init) are not collectives.",
    ("rank", "INTEGER", "rank"),
    ("location_id", "BIGINT", "location the collective ran on"),
    ("is_async", "BOOLEAN", "not on the rank's main thread (asynchronous; lanes, other threads)"),
    ("interval_idx", "BIGINT", "the region instance performing it (on location_id)"),
    ("region_id", "BIGINT", "region performing it"),
    ("comm_id", "BIGINT", "communicator"),
    ("seq", "BIGINT", "per rank and communicator, 0-based, in enter order"),
    ("op", "VARCHAR", "allreduce, bcast, allgather, barrier, ..."),
    ("root", "INTEGER", "root rank within the communicator; NULL for rootless operations"),
    ("bytes", "BIGINT", "payload per rank: received for one-to-all, sent otherwise"),
    ("bytes_sent", "BIGINT", "bytes sent as recorded"),
    ("bytes_recv", "BIGINT", "bytes received as recorded"),
    ("enter_ns", "BIGINT", "enter of the performing region"),
    ("leave_ns", "BIGINT", "leave of the performing region"),
    ("last_arrival_ns", "BIGINT", "when the last rank it waits for arrived (root for one-to-all)"),
    ("wait_ns", "BIGINT", "time from this rank's arrival to last_arrival_ns, within the region"),
    ("transfer_ns", "BIGINT", "the rest of the region: leave - enter - wait"),
    ("ranks_matched", "INTEGER", "ranks whose instance with this comm/seq is in the trace"),
    ("source", "VARCHAR", "CollectiveSource: record (an OTF2 collective record) or name (a region "
     "recognized by a name pattern: op from the pattern, bytes and root NULL, comm_id a negative "
     "inferred group per library, matched by order)"),
    partition_by="rank",
)

P2P = _t(
    "p2p", "Point-to-point messages (MPI_Send/Recv and non-blocking forms), sends matched to receives.",
    ("rank", "INTEGER", "rank recording the event"),
    ("location_id", "BIGINT", "location"),
    ("direction", "VARCHAR", "send or recv"),
    ("peer", "INTEGER", "the other rank (global)"),
    ("comm_id", "BIGINT", "communicator"),
    ("tag", "BIGINT", "message tag"),
    ("bytes", "BIGINT", "message length"),
    ("time_ns", "BIGINT", "time of the send / receive-completion event"),
    ("interval_idx", "BIGINT", "enclosing region instance (MPI_Send, MPI_Recv, MPI_Wait...)"),
    ("enter_ns", "BIGINT", "enter of the enclosing region"),
    ("leave_ns", "BIGINT", "leave of the enclosing region"),
    ("seq", "BIGINT", "n-th message between this sender and receiver with this comm and tag"),
    ("partner_enter_ns", "BIGINT", "enter of the matching event's region on the peer; NULL if unmatched"),
    ("wait_ns", "BIGINT", "late sender: receive-side time waiting for the send to start"),
    partition_by="rank",
)

STEPS = _t(
    "steps", "Training steps per rank.",
    ("rank", "INTEGER", "rank"),
    ("step", "INTEGER", "0-based step number"),
    ("start_ns", "BIGINT", "start"),
    ("end_ns", "BIGINT", "end"),
    ("duration_ns", "BIGINT", "end - start"),
    ("source", "VARCHAR", "marker (dltrace.step regions), region:<name> (--step-region), or whole_run"),
    partition_by="rank",
)

PHASES = _t(
    "phases", "Per rank and step, time per phase; the phases of a step sum to its duration exactly.",
    ("rank", "INTEGER", "rank"),
    ("step", "INTEGER", "step"),
    ("phase", "VARCHAR", "Phase: compute, allreduce, other_comm, idle or other"),
    ("duration_ns", "BIGINT", "time"),
    partition_by="rank",
)

TABLES = (RUNS, LOCATIONS, REGIONS, COMMUNICATORS, INTERVALS, COLLECTIVES, P2P, STEPS, PHASES)
BY_NAME = {t.name: t for t in TABLES}

# --- written by `analyze compare SWEEP` into SWEEP/compare.duckdb --------------------------

_CI = "95% t confidence interval over the replications"
COMPARISON = _t(
    "comparison", "One row per run of the sweep; steady-state means (warm-up steps excluded, as "
    "in analyze phases). The factor levels are in `factors`; `comparison_wide` adds one column "
    "per factor.",
    ("run_name", "VARCHAR", "run directory name"),
    ("config", "INTEGER", "configuration number (the design's factorial order, 1-based)"),
    ("config_label", "VARCHAR", "the configuration's factor levels, e.g. batch_size=32, ranks=2"),
    ("replication", "INTEGER", "replication number, 1-based"),
    ("run_order", "INTEGER", "position in the randomized run order; NULL outside a sweep"),
    ("factors", "JSON", "factor -> level"),
    ("status", "VARCHAR", "ok, failed, interrupted, incomplete, no_trace or unreadable"),
    ("framework", "VARCHAR", "from run.json"),
    ("ranks", "INTEGER", "processes"),
    ("samples_per_step", "BIGINT", "ranks x batch_size x accumulate; NULL without --batch-size"),
    ("steps", "INTEGER", "steady-state steps averaged over"),
    ("step_ms", "DOUBLE", "mean step time over steady-state steps and ranks"),
    ("throughput_sps", "DOUBLE", "samples per second: samples_per_step / step time"),
    ("compute_ms", "DOUBLE", "compute phase per step"),
    ("allreduce_ms", "DOUBLE", "allreduce phase per step (communication not hidden by compute)"),
    ("other_comm_ms", "DOUBLE", "other communication phase per step"),
    ("comm_ms", "DOUBLE", "allreduce_ms + other_comm_ms"),
    ("idle_ms", "DOUBLE", "idle (waiting for a late rank) per step"),
    ("other_ms", "DOUBLE", "measurement overhead and runtime setup per step"),
    ("allreduce_calls", "DOUBLE", "allreduce calls per step per rank"),
    ("allreduce_bytes", "DOUBLE", "allreduce payload per step per rank"),
    ("allreduce_transfer_ms", "DOUBLE", "summed allreduce transfer time per step (hidden or not)"),
    ("path", "VARCHAR", "run directory"),
)

CONFIGURATIONS = _t(
    "configurations", "One row per configuration: means over its successful replications with "
    f"{_CI}, and speedup against the baseline (the same levels with the fewest ranks). "
    "`configurations_wide` adds one column per factor.",
    ("config", "INTEGER", "configuration number"),
    ("config_label", "VARCHAR", "factor levels"),
    ("factors", "JSON", "factor -> level"),
    ("ranks", "INTEGER", "processes"),
    ("n", "INTEGER", "successful replications"),
    ("step_ms", "DOUBLE", "mean step time"),
    ("step_ms_ci_low", "DOUBLE", _CI),
    ("step_ms_ci_high", "DOUBLE", _CI),
    ("throughput_sps", "DOUBLE", "mean samples per second"),
    ("throughput_sps_ci_low", "DOUBLE", _CI),
    ("throughput_sps_ci_high", "DOUBLE", _CI),
    ("compute_ms", "DOUBLE", "mean compute per step"),
    ("comm_ms", "DOUBLE", "mean visible communication per step"),
    ("comm_ms_ci_low", "DOUBLE", _CI),
    ("comm_ms_ci_high", "DOUBLE", _CI),
    ("idle_ms", "DOUBLE", "mean idle per step"),
    ("other_ms", "DOUBLE", "mean other per step"),
    ("allreduce_transfer_ms", "DOUBLE", "mean summed allreduce transfer per step"),
    ("speedup", "DOUBLE", "throughput / the baseline configuration's throughput"),
    ("efficiency", "DOUBLE", "speedup / (ranks / baseline ranks)"),
    ("baseline_config", "INTEGER", "the configuration speedup is measured against"),
)

SPEEDUPS = _t(
    "speedups", "Speedup of every configuration against each baseline: `ranks` (fewest ranks, "
    "other levels equal) and every baseline the design names (e.g. a CPU-only one).",
    ("config", "INTEGER", "configuration"),
    ("baseline", "VARCHAR", "ranks, or the design's baseline name"),
    ("baseline_config", "INTEGER", "configuration measured against; NULL if not measured"),
    ("speedup", "DOUBLE", "throughput ratio"),
    ("efficiency", "DOUBLE", "speedup / (ranks / baseline ranks)"),
)

VARIATION = _t(
    "variation", "Allocation of variation (Jain): how much of the variation of a response each "
    "factor and interaction explains; the percentages of a response, error included, sum to 100.",
    ("response", "VARCHAR", "step_ms or throughput_sps"),
    ("method", "VARCHAR", "2k_r (all factors at two levels: effects from the sign table) or anova"),
    ("term", "VARCHAR", "factor, interaction (a:b) or error"),
    ("dof", "INTEGER", "degrees of freedom"),
    ("effect", "DOUBLE", "2k_r: half the change the term makes (q); NULL for anova"),
    ("effect_ci_low", "DOUBLE", "2k_r: 95% t confidence interval of the effect"),
    ("effect_ci_high", "DOUBLE", "2k_r: 95% t confidence interval of the effect"),
    ("ss", "DOUBLE", "sum of squares"),
    ("percent", "DOUBLE", "100 ss / SST"),
    ("f_value", "DOUBLE", "mean square / error mean square"),
    ("p_value", "DOUBLE", "F test; NULL without replications"),
)

FITS = _t(
    "fits", "Least-squares models of a response against ranks, per group of the other factors' "
    "levels: linear a + b p and quadratic a + b p + c p^2, fitted to every run.",
    ("response", "VARCHAR", "step_ms or comm_ms"),
    ("group_label", "VARCHAR", "the other factors' levels"),
    ("model", "VARCHAR", "linear or quadratic"),
    ("intercept", "DOUBLE", "a [ms]"),
    ("slope", "DOUBLE", "b [ms per rank]"),
    ("quadratic", "DOUBLE", "c [ms per rank^2]; NULL for linear"),
    ("r2", "DOUBLE", "coefficient of determination"),
    ("n", "INTEGER", "runs fitted"),
)

ALLREDUCE_POINTS = _t(
    "allreduce_points", "Per run and message size: the allreduce calls the cost model is fitted to.",
    ("run_name", "VARCHAR", "run"),
    ("config", "INTEGER", "configuration"),
    ("ranks", "INTEGER", "processes"),
    ("bytes", "BIGINT", "payload per rank"),
    ("ring_bytes", "DOUBLE", "2 (p-1)/p x bytes: what each rank sends in a ring allreduce"),
    ("calls_per_step", "DOUBLE", "calls of this size per step per rank"),
    ("transfer_ms", "DOUBLE", "mean transfer time per call (waiting for late ranks excluded)"),
    ("wait_ms", "DOUBLE", "mean wait for the last rank per call"),
)

ALLREDUCE_MODEL = _t(
    "allreduce_model", "t = latency + ring_bytes / bandwidth, fitted to allreduce_points.",
    ("latency_ms", "DOUBLE", "intercept"),
    ("ms_per_byte", "DOUBLE", "slope"),
    ("bandwidth_gbs", "DOUBLE", "1 / slope in GB/s (NULL if the slope is not positive)"),
    ("r2", "DOUBLE", "coefficient of determination"),
    ("n", "INTEGER", "points fitted"),
)

PREDICTIONS = _t(
    "predictions", "Predictions for data a model was not fitted to: a held-out configuration, "
    "rank count or model size (measured known), or rank counts not run (measured NULL).",
    ("target", "VARCHAR", "allreduce_ms (allreduce time per step) or step_ms"),
    ("holdout", "VARCHAR", "what was left out of the fit (config N, ranks=P, model=M) or extrapolation"),
    ("config", "INTEGER", "configuration predicted (for extrapolation: the one whose messages were used)"),
    ("ranks", "INTEGER", "rank count predicted"),
    ("predicted_ms", "DOUBLE", "prediction"),
    ("measured_ms", "DOUBLE", "mean over the configuration's runs; NULL for extrapolation"),
    ("error_pct", "DOUBLE", "100 (predicted - measured) / measured"),
    ("note", "VARCHAR", "why there is no prediction, when there is none"),
)

SWEEP_TABLES = (COMPARISON, CONFIGURATIONS, SPEEDUPS, VARIATION, FITS, ALLREDUCE_POINTS,
                ALLREDUCE_MODEL, PREDICTIONS)


def markdown() -> str:
    """The schema as Markdown (docs/schema.md is generated from this)."""
    out = ["# Tables written by `analyze phases`", "", __doc__.strip().split("\n\n", 1)[1], "",
           "Each table is a Parquet dataset, `RUN/tables/<table>/`; those marked *per rank* are "
           "split into one folder per rank (`rank=N/`, hive style: the rank is in the folder "
           "name, not in the files). `RUN/trace.duckdb` holds a view of each (docs/scale.md).", ""]
    out += _markdown_tables(TABLES)
    out += ["## Categorical values", ""]
    out += [f"- `phase`: {', '.join(p.value for p in Phase)}"]
    out += [f"- `regions.category`: {', '.join(c.value for c in Category)}"]
    out += [f"- `regions.rule`: {', '.join(r.value for r in Rule)}"]
    out += [f"- `collectives.source`: {', '.join(s.value for s in CollectiveSource)}", ""]
    out += ["# Tables written by `analyze compare`", "",
            "In `SWEEP/compare.duckdb`, across the runs of a sweep (docs/experiments.md).", ""]
    out += _markdown_tables(SWEEP_TABLES)
    return "\n".join(out)


def _markdown_tables(tables: tuple[Table, ...]) -> list[str]:
    out = []
    for t in tables:
        where = f" Per {t.partition_by}: `{t.name}/{t.partition_by}=N/`." if t.partition_by else ""
        out += [f"## `{t.name}`", "", t.doc + where, "", "| column | type | meaning |", "|---|---|---|"]
        out += [f"| `{c.name}` | {c.type} | {c.doc} |" for c in t.columns]
        out.append("")
    return out
