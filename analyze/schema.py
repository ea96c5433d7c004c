"""Every table ``analyze`` writes, declared once: the DDL and the documentation come from here.

Times are integer nanoseconds from the trace start (the archive's global clock offset), after
the archive's ClockOffset corrections. Missing values are NULL. Categorical columns hold the
readable values of the ``StrEnum`` types below.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from traceio.records import Device

# 2: metrics and energy tables; 3: the device, Kineto and cause tables; 4: tables stored as
# Parquet under RUN/tables, views in the database (older databases are rebuilt); 6:
# regions.pattern_blocking, and torch.profiler's gloo and c10d names classified; 7: gloo's
# work items in Kineto traces are collectives with their bytes (communicator "gloo: ...")
SCHEMA_VERSION = 7


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
    KERNEL = "kernel"  # an accelerator kernel (region role kernel)
    MEMORY = "memory"  # an accelerator memory copy or set (region role data_transfer)


class Rule(StrEnum):
    """Why a region got its category (``regions.rule``), in the order the rules are tried."""

    MARKER = "marker"  # one of our marker names (dltrace.step, ...) or torch.profiler's (ProfilerStep#N, ...)
    MEASUREMENT = "measurement"  # the measurement system's own work (TRACE BUFFER FLUSH)
    PARADIGM = "paradigm"  # its OTF2 paradigm (MPI; thread paradigms are not communication)
    ROLE = "role"  # its OTF2 region role (collective, point-to-point, task wait, kernel, copy)
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
    ("reader", "VARCHAR", "which reader built the tables (python, native: OTF2; kineto: Chrome trace JSON)"),
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
    ("pattern_blocking", "BOOLEAN", "for a region a pattern classified (rule = pattern): whether its "
     "calls complete what they do (true) or only start it, as a non-blocking start or a call "
     "enqueueing on a GPU stream (false; docs/patterns.md); NULL otherwise"),
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
    ("exclusive_ns", "BIGINT", "duration minus the durations of direct children (Chrome traces: up to "
     "chrome_events.own_end_ns where a later slice partly overlaps it)"),
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

# --- metrics, power and energy (docs/energy.md) ------------------------------------------


class Quantity(StrEnum):
    """What a metric channel measures, as far as energy is concerned."""

    ENERGY = "energy"  # a running total (an energy counter) or per-interval amounts, in J
    POWER = "power"  # readings of power, in W, integrated over time for energy
    OTHER = "other"  # anything else: hardware counters, utilization, frequencies, bytes


class EnergySource(StrEnum):
    """Where a device's energy comes from."""

    COUNTER = "counter"  # the device's energy counter (RAPL energy_uj, NVML total energy, ...)
    POWER = "power"  # its power readings, integrated


HOSTS = _t(
    "hosts", "The host (OTF2 system tree node) of each rank's process.",
    ("rank", "INTEGER", "rank"),
    ("host", "VARCHAR", "host name"),
)

METRIC_CHANNELS = _t(
    "metric_channels", "One row per metric member as a metric (an OTF2 MetricClass, or a "
    "MetricInstance of one) references it: what the samples in `metrics` are, and how dltrace "
    "reads them for energy.",
    ("channel_id", "INTEGER", "dense number, referenced by metrics"),
    ("metric_id", "BIGINT", "OTF2 MetricClass or MetricInstance reference"),
    ("member_id", "BIGINT", "OTF2 MetricMember reference"),
    ("name", "VARCHAR", "member name (Score-P: the metric or plugin event name)"),
    ("description", "VARCHAR", "member description"),
    ("unit", "VARCHAR", "unit as written ('#' for none)"),
    ("base", "VARCHAR", "decimal or binary"),
    ("exponent", "INTEGER", "recorded value x base^exponent is in unit (metrics.value has it applied)"),
    ("mode", "VARCHAR", "OTF2 metric mode: accumulated_start, absolute_point, absolute_last, ..."),
    ("value_type", "VARCHAR", "int64, uint64 or double"),
    ("occurrence", "VARCHAR", "synchronous_strict (on a thread, at its events), synchronous or asynchronous"),
    ("scope", "VARCHAR", "what the samples are about: location, location_group, system_tree_node or "
     "group (a MetricInstance's scope); NULL for a metric class recorded on its own location"),
    ("scope_name", "VARCHAR", "name of the scope"),
    ("host", "VARCHAR", "host of the scope; NULL when the samples belong to the recording location"),
    ("rank", "INTEGER", "the rank the channel is charged to (a process or location scope, e.g. a GPU "
     "pinned to it); NULL for host-wide channels and for per-location metric classes"),
    ("quantity", "VARCHAR", "Quantity: energy, power or other (from the unit, else the name)"),
    ("device", "VARCHAR", "Device: cpu_package, dram, gpu, ... (from the name); NULL for other quantities"),
    ("device_index", "INTEGER", "device number on its host (package, GPU, hwmon index)"),
    ("to_si", "DOUBLE", "value x to_si is in J (energy) or W (power); NULL when the unit is unknown"),
    ("unit_from", "VARCHAR", "how to_si was found: unit, name (a plugin known to write uJ or uW "
     "with unit '#') or NULL"),
    ("samples", "BIGINT", "samples in metrics"),
)

METRICS = _t(
    "metrics", "Every metric sample of the trace (dltrace's power sampler, Score-P's PAPI "
    "counters and metric plugins): one row per value of an OTF2 Metric event.",
    ("location_id", "BIGINT", "location that recorded it (a METRIC location or a thread)"),
    ("rank", "INTEGER", "rank of that location"),
    ("channel_id", "INTEGER", "metric_channels row"),
    ("member", "VARCHAR", "member name"),
    ("unit", "VARCHAR", "unit as written"),
    ("mode", "VARCHAR", "metric mode"),
    ("time_ns", "BIGINT", "sample time"),
    ("value", "DOUBLE", "the sample in unit (x base^exponent applied)"),
    partition_by="rank",
)

POWER = _t(
    "power", "Power over time: per energy or power series (a channel on its recording "
    "location), the mean power between consecutive samples.",
    ("channel_id", "INTEGER", "channel"),
    ("location_id", "BIGINT", "recording location"),
    ("start_ns", "BIGINT", "previous sample"),
    ("end_ns", "BIGINT", "this sample"),
    ("energy_j", "DOUBLE", "energy between the two samples (counter difference, or power integrated)"),
    ("power_w", "DOUBLE", "energy_j / duration"),
)

ENERGY_DEVICES = _t(
    "energy_devices", "Per energy or power series: energy over its samples and how it is "
    "attributed. A device with both an energy counter and power readings has two rows "
    "(energy_agreement compares them); the counter's is the one counted.",
    ("channel_id", "INTEGER", "channel"),
    ("location_id", "BIGINT", "recording location"),
    ("name", "VARCHAR", "member name"),
    ("host", "VARCHAR", "host"),
    ("device", "VARCHAR", "Device"),
    ("device_index", "INTEGER", "device number on the host"),
    ("source", "VARCHAR", "EnergySource: counter or power"),
    ("rank", "INTEGER", "rank it is charged to; NULL: shared by the ranks on its host"),
    ("active", "BOOLEAN", "charged to a rank, or host-wide and not a GPU (a GPU no rank is pinned to "
     "is idle; in traces without pinning, every GPU is active)"),
    ("counted", "BOOLEAN", "included in totals: the device's preferred series, and a device kind that "
     "does not contain others (packages, DRAM, GPUs; a node or platform channel only on hosts without those)"),
    ("samples", "BIGINT", "samples"),
    ("start_ns", "BIGINT", "first sample"),
    ("end_ns", "BIGINT", "last sample"),
    ("interval_ms", "DOUBLE", "median time between samples"),
    ("energy_j", "DOUBLE", "energy from first to last sample"),
    ("mean_power_w", "DOUBLE", "energy_j / (end - start)"),
    ("integrated_reading", "BOOLEAN", "energy from power readings that may be averages (NVML's is a "
     "1 s average on recent GPUs): not meaningful for phases shorter than that"),
)

ENERGY_AGREEMENT = _t(
    "energy_agreement", "Devices with both an energy counter and power readings: the energy "
    "each gives over the same window, one row per power channel of the device. Power readings are often averages over a trailing window "
    "and so lag the counter; the lag is estimated (least squares on the running totals, 0-2 s) "
    "and the readings aligned by it.",
    ("host", "VARCHAR", "host"),
    ("device", "VARCHAR", "Device"),
    ("device_index", "INTEGER", "device number"),
    ("counter_channel", "INTEGER", "the counter's channel"),
    ("power_channel", "INTEGER", "the power readings' channel"),
    ("start_ns", "BIGINT", "window where both have samples"),
    ("end_ns", "BIGINT", "window end"),
    ("counter_j", "DOUBLE", "energy from the counter over the window"),
    ("power_j", "DOUBLE", "energy from the integrated power readings over the window"),
    ("difference_pct", "DOUBLE", "100 (power_j - counter_j) / counter_j"),
    ("lag_ms", "DOUBLE", "how far the power readings trail the counter"),
    ("aligned_counter_j", "DOUBLE", "counter over the window shortened by the lag"),
    ("aligned_power_j", "DOUBLE", "power readings shifted back by the lag, integrated over it"),
    ("aligned_difference_pct", "DOUBLE", "100 (aligned_power_j - aligned_counter_j) / aligned_counter_j"),
)

ENERGY_STEPS = _t(
    "energy_steps", "Per rank, step and counted series: the energy of the step's window "
    "(running totals linear between samples); a host-wide series is shared equally by its "
    "host's ranks.",
    ("rank", "INTEGER", "rank"),
    ("step", "INTEGER", "step"),
    ("channel_id", "INTEGER", "channel"),
    ("location_id", "BIGINT", "recording location"),
    ("device", "VARCHAR", "Device"),
    ("device_index", "INTEGER", "device number"),
    ("active", "BOOLEAN", "as in energy_devices"),
    ("share", "DOUBLE", "1 for the rank's own devices, 1/ranks on the host for host-wide ones"),
    ("energy_j", "DOUBLE", "energy in the step x share"),
    ("covered_ns", "BIGINT", "part of the step inside the series' first..last sample"),
)

ENERGY_PHASES = _t(
    "energy_phases", "Per rank, step, phase and counted series: the energy of the phase's "
    "pieces of the step (as energy_steps; the phases of a step sum to its energy).",
    ("rank", "INTEGER", "rank"),
    ("step", "INTEGER", "step"),
    ("phase", "VARCHAR", "Phase"),
    ("channel_id", "INTEGER", "channel"),
    ("location_id", "BIGINT", "recording location"),
    ("device", "VARCHAR", "Device"),
    ("device_index", "INTEGER", "device number"),
    ("active", "BOOLEAN", "as in energy_devices"),
    ("energy_j", "DOUBLE", "energy in the phase x share"),
    ("duration_ns", "BIGINT", "time in the phase"),
    ("short_ns", "BIGINT", "of it, pieces shorter than the series' sampling interval: there the "
     "energy is split in proportion to time, not measured"),
)

ENERGY_TABLES = (HOSTS, METRIC_CHANNELS, METRICS, POWER, ENERGY_DEVICES, ENERGY_AGREEMENT, ENERGY_STEPS,
                 ENERGY_PHASES)

TABLES: tuple[Table, ...] = (RUNS, LOCATIONS, REGIONS, COMMUNICATORS, INTERVALS, COLLECTIVES, P2P, STEPS,
                             PHASES) + ENERGY_TABLES

# --- GPUs and Chrome / Kineto trace JSON (docs/gpu.md) --------------------------------------


class DevicePhase(StrEnum):
    """Where a rank's accelerator time inside a step goes (union over all its streams); the
    device phases of a step add up to its duration."""

    COMPUTE = "compute"  # compute kernels run, no communication kernel
    COMM_HIDDEN = "comm_hidden"  # communication kernels overlapped by compute kernels
    COMM_EXPOSED = "comm_exposed"  # communication kernels with no compute kernel running
    MEMORY = "memory"  # only memory copies / sets
    IDLE = "idle"  # nothing on any stream


class HostActivity(StrEnum):
    """What the rank's main thread did meanwhile (the innermost of these regions)."""

    COLLECTIVE = "collective"  # in a collective or point-to-point call
    WAIT = "wait"  # blocked on communication or on the device (cudaStreamSynchronize...)
    DATALOADER = "dataloader"
    OPTIMIZER = "optimizer"
    BACKWARD = "backward"
    FORWARD = "forward"
    OTHER = "other"  # none of these (or no main-thread markers in the trace)


DEVICE_PHASES = _t(
    "device_phases", "Per rank, step and host activity, the rank's accelerator time per device "
    "phase; for each step the rows sum to its duration. Ranks without accelerator streams have no rows.",
    ("rank", "INTEGER", "rank"),
    ("step", "INTEGER", "step (the windows of the steps table, as for phases)"),
    ("phase", "VARCHAR", "DevicePhase: compute, comm_hidden, comm_exposed, memory or idle"),
    ("host", "VARCHAR", "HostActivity: what the main thread was in meanwhile (dataloader, backward, ...)"),
    ("duration_ns", "BIGINT", "time"),
    partition_by="rank",
)

CORRELATIONS = _t(
    "correlations", "Launch to device activity: the CPU call (cudaLaunchKernel, a memcpy...) that "
    "queued each kernel, copy or set, from Kineto's correlation ids or ac2g flows.",
    ("rank", "INTEGER", "rank"),
    ("correlation", "BIGINT", "Kineto correlation id (or flow id)"),
    ("launch_location_id", "BIGINT", "CPU thread of the launch"),
    ("launch_idx", "BIGINT", "the launching interval (intervals.idx on that location)"),
    ("launch_start_ns", "BIGINT", "launch call start"),
    ("launch_end_ns", "BIGINT", "launch call end"),
    ("location_id", "BIGINT", "accelerator stream"),
    ("idx", "BIGINT", "the device interval"),
    ("start_ns", "BIGINT", "device activity start"),
    ("end_ns", "BIGINT", "device activity end"),
    ("source", "VARCHAR", "correlation (args.correlation) or flow (an ac2g flow)"),
    partition_by="rank",
)

CHROME_EVENTS = _t(
    "chrome_events", "Per interval imported from Chrome / Kineto JSON: what the event said besides "
    "its name and times (empty for OTF2 traces).",
    ("location_id", "BIGINT", "location"),
    ("idx", "BIGINT", "interval (intervals.idx)"),
    ("cat", "VARCHAR", "the event's cat (kernel, cpu_op, cuda_runtime, ...); NULL if absent"),
    ("args", "JSON", "its args as written (NCCL: Collective name, In msg nelems, dtype, ...)"),
    ("extra", "JSON", "any other keys of the event; name: the name as written where the region's "
     "name leaves out a Python object's address (with_stack's '<built-in method get of dict object at 0x7fd6...>')"),
    ("own_end_ns", "BIGINT", "where its exclusive time ends, when a later slice that only partly overlaps it "
     "(or an enclosing slice) starts before its end_ns: the overlap is that slice's time; NULL otherwise"),
)

CHROME_TRACKS = _t(
    "chrome_tracks", "Which Chrome trace track (pid, tid) each imported location was.",
    ("location_id", "BIGINT", "location"),
    ("rank", "INTEGER", "rank"),
    ("pid", "JSON", "pid as written (OS process id; device index on GPU tracks)"),
    ("tid", "JSON", "tid as written (thread id; stream id on GPU tracks)"),
)

CHROME_FILES = _t(
    "chrome_files", "One row per imported Chrome / Kineto file (one per rank).",
    ("rank", "INTEGER", "rank"),
    ("path", "VARCHAR", "file"),
    ("base_time_ns", "BIGINT", "baseTimeNanoseconds (0 when absent: ts are epoch microseconds)"),
    ("header", "JSON", "the top-level keys but traceEvents (distributedInfo, deviceProperties, ...)"),
    ("other_events", "JSON", "every event that is not a slice (metadata, flows, instants, counters), as written"),
)

GPU_TABLES = (DEVICE_PHASES, CORRELATIONS, CHROME_EVENTS, CHROME_TRACKS, CHROME_FILES)
TABLES = TABLES + GPU_TABLES

# --- why a step is slow: analyze/tables/causes/ (docs/causes.md) ---------------------------


class CauseKind(StrEnum):
    """What a delay is attributed to."""

    REGION = "region"  # the cause rank spent longer than the waiting rank in a region
    LATE_START = "late_start"  # the cause rank's synchronization interval began later (propagated)
    UNKNOWN = "unknown"  # the rank that ended the wait is not in the trace


OVERLAP = _t(
    "overlap", "Per rank, step and kind of communication (a collective's op, p2p, and all): "
    "the host's communication time and how much of it the main thread's compute hid (collective "
    "kernels on accelerator streams are the device's view: device_phases). exposed_ns of kind "
    "all equals the step's allreduce + other_comm + idle phases (plus communication under "
    "measurement overhead, which the phase model calls other).",
    ("rank", "INTEGER", "rank"),
    ("step", "INTEGER", "step"),
    ("kind", "VARCHAR", "the collective's op (allreduce, bcast, ...; a collective region without a "
     "record, or a wait known by a name pattern, is allreduce if its name or pattern says so, as in "
     "phases, else other; other too for a collective of unknown op), p2p (messages), or all"),
    ("calls", "BIGINT", "operations of this kind starting in the step"),
    ("comm_ns", "BIGINT", "wall time with at least one operation of the kind in flight, on any host location"),
    ("busy_ns", "BIGINT", "operation time summed over concurrent operations (all lanes)"),
    ("hidden_ns", "BIGINT", "part of comm_ns the phase model counts as compute (asynchronous, under "
     "forward/backward/optimizer/data loading, not waited for)"),
    ("exposed_ns", "BIGINT", "comm_ns - hidden_ns"),
    ("overlap_ratio", "DOUBLE", "hidden_ns / comm_ns; NULL without communication"),
)

DELAYS = _t(
    "delays", "Root causes of waiting: each idle interval of the phase model, attributed to the rank "
    "that arrived last and to the regions of its synchronization interval in which it spent longer "
    "than the waiting rank (Scalasca's delay analysis). idle_ns sums to the phases' idle time per rank "
    "and step.",
    ("rank", "INTEGER", "the rank that was idle"),
    ("step", "INTEGER", "its step"),
    ("op", "VARCHAR", "the operation it waited in: a collective's op, or p2p (a receive)"),
    ("is_async", "BOOLEAN", "an asynchronous collective (communication lane)"),
    ("comm_id", "BIGINT", "communicator"),
    ("seq", "BIGINT", "the collective's sequence number (the message's, for p2p)"),
    ("wait_enter_ns", "BIGINT", "when the idle rank entered (issued) the operation"),
    ("idle_start_ns", "BIGINT", "first instant of the idle time attributed to this wait in the step"),
    ("idle_end_ns", "BIGINT", "last instant of it"),
    ("cause_rank", "INTEGER", "the rank whose arrival ended the wait; NULL if unknown"),
    ("cause_step", "INTEGER", "the cause rank's step at its arrival"),
    ("cause_enter_ns", "BIGINT", "the cause rank's arrival (enter or issue; a message's send)"),
    ("cause_kind", "VARCHAR", "CauseKind: region, late_start or unknown"),
    ("cause_region", "VARCHAR", "region name (its exclusive time); (no region) for time outside "
     "every region; NULL unless cause_kind is region"),
    ("cause_category", "VARCHAR", "the region's Category (dataloader, forward, ...)"),
    ("excess_ns", "BIGINT", "the cause rank's time in the region minus the idle rank's, in their "
     "synchronization intervals (late_start: how much later its interval began)"),
    ("idle_ns", "BIGINT", "idle time attributed to this cause"),
)

DELAY_TOTALS = _t(
    "delay_totals", "Delays summed per cause across the run, largest first.",
    ("cause_rank", "INTEGER", "rank that made others wait; NULL if unknown"),
    ("cause_kind", "VARCHAR", "CauseKind"),
    ("cause_region", "VARCHAR", "region; NULL unless cause_kind is region"),
    ("cause_category", "VARCHAR", "the region's Category"),
    ("idle_ns", "BIGINT", "idle time caused on all ranks"),
    ("share", "DOUBLE", "idle_ns / all idle time in phases"),
    ("waiting_ranks", "INTEGER", "distinct ranks made idle"),
    ("steps", "INTEGER", "distinct steps of the cause rank involved"),
    ("first_step", "INTEGER", "first of them"),
    ("last_step", "INTEGER", "last of them"),
    ("main_steps", "INTEGER[]", "the fewest steps holding 90% of idle_ns, in step order"),
)

CRITICAL_PATH = _t(
    "critical_path", "Per step, the chain of stretches across ranks that determines the step's "
    "duration, walked back from the step's end through waits to the rank that ended them; "
    "stretches touch end to end.",
    ("step", "INTEGER", "step"),
    ("hop", "INTEGER", "position along the path, 0 first in time"),
    ("rank", "INTEGER", "rank the path runs on"),
    ("start_ns", "BIGINT", "start of the stretch"),
    ("end_ns", "BIGINT", "end of the stretch"),
    ("duration_ns", "BIGINT", "end_ns - start_ns"),
    ("via", "VARCHAR", "op of the wait through which the path reached this rank (going back in "
     "time); NULL for the rank that ended the step"),
)

CRITICAL_PATH_REGIONS = _t(
    "critical_path_regions", "The critical path's time per step, rank and region (exclusive time); "
    "a step's rows sum to its step_balance.duration_ns.",
    ("step", "INTEGER", "step"),
    ("rank", "INTEGER", "rank"),
    ("region", "VARCHAR", "region name; (no region) for time outside every region"),
    ("category", "VARCHAR", "the region's Category"),
    ("duration_ns", "BIGINT", "time on the path"),
)

STEP_BALANCE = _t(
    "step_balance", "Per step: the critical path's length and the step time perfect balance would "
    "give (every rank doing the mean of the ranks' non-idle time).",
    ("step", "INTEGER", "step"),
    ("ranks", "INTEGER", "ranks with this step"),
    ("start_ns", "BIGINT", "start of the critical path"),
    ("end_ns", "BIGINT", "end of the step (the last rank to finish)"),
    ("duration_ns", "BIGINT", "critical path length, end_ns - start_ns"),
    ("slowest_rank_ns", "BIGINT", "longest step duration of a rank"),
    ("balanced_ns", "BIGINT", "mean over ranks of step duration minus idle"),
    ("imbalance_ns", "BIGINT", "duration_ns - balanced_ns: the cost of imbalance"),
    ("end_rank", "INTEGER", "rank that finished the step last"),
    ("path_ranks", "INTEGER", "distinct ranks on the path"),
    ("critical_rank", "INTEGER", "rank with the most time on the path"),
    ("critical_region", "VARCHAR", "region with the most time on the path"),
)

RANK_BALANCE = _t(
    "rank_balance", "Per rank: steady-state medians over steps (the first step left out), "
    "throughput, and the shares of the global batch that would give every rank the same compute "
    "time. Time in data loading, forward and backward scales with the samples; the rest of "
    "compute is fixed (docs/causes.md).",
    ("rank", "INTEGER", "rank"),
    ("steps", "INTEGER", "steps the medians are over"),
    ("share", "DOUBLE", "this rank's share of the global batch (run.json's shares parameter; equal otherwise)"),
    ("samples", "DOUBLE", "samples per step: the global batch split by the shares in whole samples "
     "(largest remainders); NULL if the batch size is unknown"),
    ("step_ms", "DOUBLE", "step time"),
    ("compute_ms", "DOUBLE", "compute phase per step"),
    ("scaled_ms", "DOUBLE", "compute inside data loading, forward and backward (all compute if the "
     "trace has none of them)"),
    ("fixed_ms", "DOUBLE", "compute_ms - scaled_ms (optimizer, the step's own code)"),
    ("comm_ms", "DOUBLE", "allreduce + other_comm + other phases"),
    ("idle_ms", "DOUBLE", "idle phase"),
    ("throughput_sps", "DOUBLE", "samples / scaled_ms in samples per second of compute; NULL without samples"),
    ("balanced_share", "DOUBLE", "share that equalizes compute: fixed_ms + share x scaled_ms / "
     "share is the same on every rank"),
    ("balanced_samples", "BIGINT", "balanced_share x global batch, rounded (largest remainders)"),
    ("predicted_compute_ms", "DOUBLE", "every rank's compute with the balanced shares"),
    ("predicted_step_ms", "DOUBLE", "predicted_compute_ms + the ranks' mean comm_ms (no idle)"),
)

CAUSE_TABLES = (OVERLAP, DELAYS, DELAY_TOTALS, CRITICAL_PATH, CRITICAL_PATH_REGIONS, STEP_BALANCE,
                RANK_BALANCE)

TABLES = TABLES + CAUSE_TABLES
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


# --- energy across a sweep (analyze compare; docs/energy.md) ------------------------------

ENERGY_RUNS = _t(
    "energy_runs", "One row per run with power: its energy over the steps (from the first "
    "step's start to the last step's end, all ranks), with and without idle devices.",
    ("run_name", "VARCHAR", "run directory name"),
    ("config", "INTEGER", "configuration"),
    ("ranks", "INTEGER", "processes"),
    ("run_s", "DOUBLE", "the steps' window"),
    ("energy_j", "DOUBLE", "energy of the active devices in that window (counted series)"),
    ("energy_all_j", "DOUBLE", "the same including idle devices (GPUs no rank is pinned to)"),
    ("mean_power_w", "DOUBLE", "energy_j / run_s"),
    ("energy_per_step_j", "DOUBLE", "active devices, per steady-state step (warm-up excluded)"),
    ("energy_per_sample_j", "DOUBLE", "energy_per_step_j / samples_per_step; NULL without --batch-size"),
    ("edp_js", "DOUBLE", "energy-delay product run_s x energy_j"),
    ("edp_all_js", "DOUBLE", "run_s x energy_all_j"),
)

ENERGY_CONFIGURATIONS = _t(
    "energy_configurations", "One row per configuration with power: means over its runs, and the "
    "EDP normalized to a baseline configuration (analyze compare --baseline FACTOR=LEVEL; default: "
    f"the one with the fewest ranks, other levels equal). EDP compares runs doing the same work. {_CI}.",
    ("config", "INTEGER", "configuration"),
    ("config_label", "VARCHAR", "factor levels"),
    ("n", "INTEGER", "runs with power"),
    ("run_s", "DOUBLE", "mean run time"),
    ("energy_j", "DOUBLE", "mean energy, active devices"),
    ("energy_j_ci_low", "DOUBLE", _CI),
    ("energy_j_ci_high", "DOUBLE", _CI),
    ("energy_all_j", "DOUBLE", "mean energy including idle devices"),
    ("energy_per_sample_j", "DOUBLE", "mean energy per training sample"),
    ("mean_power_w", "DOUBLE", "mean power, active devices"),
    ("edp_js", "DOUBLE", "mean EDP, active devices"),
    ("edp_all_js", "DOUBLE", "mean EDP including idle devices"),
    ("baseline", "VARCHAR", "what EDP is normalized to: ranks, or the --baseline levels"),
    ("baseline_config", "INTEGER", "the baseline configuration; NULL if not measured"),
    ("time_speedup", "DOUBLE", "baseline run_s / run_s"),
    ("edp_norm", "DOUBLE", "edp_js / the baseline's"),
    ("edp_all_norm", "DOUBLE", "edp_all_js / the baseline's"),
)

SWEEP_ENERGY_TABLES = (ENERGY_RUNS, ENERGY_CONFIGURATIONS)

# --- returned by `analyze diff A B` (analyze/experiments/diff.py) --------------------------

DIFF = _t(
    "diff", "What `analyze diff A B` returns (not stored in a database): per item, the time per "
    "step (mean over ranks, steady-state steps) on each side and the change B - A with a 95% "
    "Welch t confidence interval, over the steps of one run per side or over the runs (replications) "
    "of each side; largest change first.",
    ("kind", "VARCHAR", "phase (step, compute, allreduce, ...), region (exclusive time on main "
     "threads), collective (an op's time in collectives; '<op> wait': its waiting), device (a device "
     "phase) or kernel (a kernel, copy or set on accelerator streams)"),
    ("name", "VARCHAR", "the phase, region, op, device phase or kernel"),
    ("a_ms", "DOUBLE", "mean per step on side A"),
    ("b_ms", "DOUBLE", "mean per step on side B"),
    ("delta_ms", "DOUBLE", "b_ms - a_ms"),
    ("ci_low", "DOUBLE", "95% confidence interval of delta_ms (NULL with fewer than 2 samples a side)"),
    ("ci_high", "DOUBLE", "95% confidence interval of delta_ms"),
    ("change_pct", "DOUBLE", "100 delta_ms / a_ms; NULL where a_ms is 0"),
    ("n_a", "INTEGER", "samples on side A"),
    ("n_b", "INTEGER", "samples on side B"),
    ("over", "VARCHAR", "steps (one run per side) or runs (replications)"),
    ("significant", "BOOLEAN", "the interval excludes 0"),
)


def markdown() -> str:
    """The schema as Markdown (docs/schema.md is generated from this)."""
    out = ["# Tables written by `analyze phases`", "", __doc__.strip().split("\n\n", 1)[1], "",
           "Each table is a Parquet dataset, `RUN/tables/<table>/`; those marked *per rank* are "
           "split into one folder per rank (`rank=N/`, hive style: the rank is in the folder "
           "name, not in the files). `RUN/trace.duckdb` holds a view of each (docs/scale.md), except "
           "for the cause tables (overlap ... rank_balance), which are its own tables.", ""]
    out += _markdown_tables(TABLES)
    out += ["## Categorical values", ""]
    out += [f"- `phase`: {', '.join(p.value for p in Phase)}"]
    out += [f"- `regions.category`: {', '.join(c.value for c in Category)}"]
    out += [f"- `regions.rule`: {', '.join(r.value for r in Rule)}"]
    out += [f"- `collectives.source`: {', '.join(s.value for s in CollectiveSource)}"]
    out += [f"- `metric_channels.quantity`: {', '.join(q.value for q in Quantity)}"]
    out += [f"- `device` (metric_channels, energy tables): {', '.join(d.value for d in Device)}"]
    out += [f"- `energy_devices.source`: {', '.join(s.value for s in EnergySource)}"]
    out += [f"- `device_phases.phase`: {', '.join(p.value for p in DevicePhase)}"]
    out += [f"- `device_phases.host`: {', '.join(h.value for h in HostActivity)}"]
    out += [f"- `delays.cause_kind`: {', '.join(c.value for c in CauseKind)}", ""]
    out += ["# Tables written by `analyze compare`", "",
            "In `SWEEP/compare.duckdb`, across the runs of a sweep (docs/experiments.md).", ""]
    out += _markdown_tables(SWEEP_TABLES)
    out += _markdown_tables(SWEEP_ENERGY_TABLES)
    out += ["# What `analyze diff` returns", ""]
    out += _markdown_tables((DIFF,))
    return "\n".join(out)


def _markdown_tables(tables: tuple[Table, ...]) -> list[str]:
    out = []
    for t in tables:
        where = f" Per {t.partition_by}: `{t.name}/{t.partition_by}=N/`." if t.partition_by else ""
        out += [f"## `{t.name}`", "", t.doc + where, "", "| column | type | meaning |", "|---|---|---|"]
        out += [f"| `{c.name}` | {c.type} | {c.doc} |" for c in t.columns]
        out.append("")
    return out
