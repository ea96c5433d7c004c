"""Experiment designs: a TOML file of factors and levels, expanded into a randomized run plan.

    name = "tiny"                      # the sweep directory's name (default: the file's stem)
    script = "runs/ddp_resnet.py"      # the training script of every run
    args = ["--steps", "5"]            # arguments every run gets, before the factors' arguments
    replications = 2                   # runs per configuration
    seed = 7                           # the same seed gives the same run order

    [factors]
    ranks = [1, 2]                     # processes (-np)
    batch_size = [16, 32]              # any other name is a script argument: --batch-size 16

    [factors.sync]                     # levels that set several things at once
    levels.allreduce = { args = ["--accumulate", "1"] }
    levels.accumulate4 = { args = ["--accumulate", "4"] }

A factor is a list of levels (numbers, strings, booleans: ``true`` passes ``--flag``, ``false``
nothing), or a table with ``levels`` and optionally ``arg`` (the script option, default
``--<name>`` with dashes), or a table whose ``levels`` are named tables of settings: ``args``,
``script``, ``launcher``, ``launcher_args``, ``env``, ``tracer``. Three names are special:
``ranks`` (processes), ``nodes`` (with a top-level ``ranks_per_node``: ranks = nodes x
ranks_per_node; the launcher places them, e.g. ``launcher = "srun"`` with
``launcher_args = ["--nodes={nodes}"]``) and ``script``. ``launcher_args`` may name any
factor in braces. ``include`` / ``exclude`` (lists of partial configurations, such as
``{ranks = 1, sync = "accumulate4"}``) run a subset of the full factorial.

Parsing checks everything a user can get wrong and raises :class:`UsageError` naming it, so
a sweep never stops half-way over a typo.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from instrument.errors import UsageError

TOP_KEYS = {"name", "description", "script", "args", "replications", "seed", "ranks",
            "ranks_per_node", "tracer", "launcher", "launcher_args", "env", "grace_s",
            "factors", "include", "exclude", "baselines"}
LEVEL_KEYS = {"args", "script", "launcher", "launcher_args", "env", "tracer"}
SPECIAL = ("ranks", "nodes", "script")
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")


@dataclass(frozen=True)
class Level:
    """One level of a factor: the value recorded in run.json and what it changes in a run."""

    value: Any  # int/float/str/bool for scalar levels, the level's name for table levels
    label: str  # file-name safe, used in run names
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Factor:
    name: str
    levels: tuple[Level, ...]

    def level(self, value: Any) -> Level:
        for lv in self.levels:
            if lv.value == value or lv.label == str(value):
                return lv
        raise KeyError(value)


@dataclass(frozen=True)
class RunSpec:
    """One planned run: a configuration (one level per factor) and a replication number."""

    order: int  # 1-based position in the randomized plan
    name: str  # run directory name inside the sweep directory
    config: int  # 1-based configuration number in factorial order
    replication: int  # 1-based
    factors: dict[str, Any]  # factor -> level value
    script: str
    args: list[str]
    nprocs: int
    tracer: str
    launcher: str
    launcher_args: list[str]
    env: dict[str, str]


@dataclass(frozen=True)
class Design:
    name: str
    path: Path
    raw: dict[str, Any]  # the parsed TOML, for sweep.json
    factors: tuple[Factor, ...]
    replications: int
    seed: int
    configs: tuple[dict[str, Level], ...]  # the configurations to run, in factorial order

    @property
    def digest(self) -> str:
        """Changes when anything that decides what runs changes (not comments or layout)."""
        text = json.dumps(self.raw, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def plan(self) -> list[RunSpec]:
        """Every (configuration, replication) in an order randomized from ``seed``."""
        pairs = [(c, r) for c in range(len(self.configs)) for r in range(1, self.replications + 1)]
        random.Random(self.seed).shuffle(pairs)
        return [self._spec(i, c, r) for i, (c, r) in enumerate(pairs, start=1)]

    def _spec(self, order: int, c: int, rep: int) -> RunSpec:
        levels = self.configs[c]
        raw = self.raw
        script, tracer, launcher = raw["script"], raw.get("tracer", "builtin"), raw.get("launcher", "local")
        args = [str(a) for a in raw.get("args", [])]
        launcher_args = [str(a) for a in raw.get("launcher_args", [])]
        env = {k: str(v) for k, v in raw.get("env", {}).items()}
        nprocs = int(raw.get("ranks", 1))
        for factor in self.factors:
            lv = levels[factor.name]
            s = lv.settings
            args += s.get("args", [])
            launcher_args += s.get("launcher_args", [])
            env.update(s.get("env", {}))
            script = s.get("script", script)
            tracer = s.get("tracer", tracer)
            launcher = s.get("launcher", launcher)
            if factor.name == "ranks":
                nprocs = int(lv.value)
            elif factor.name == "nodes":
                nprocs = int(lv.value) * int(raw["ranks_per_node"])
        values = {f.name: levels[f.name].value for f in self.factors}
        fill = {**values, "ranks": nprocs, "ranks_per_node": raw.get("ranks_per_node", nprocs)}
        launcher_args = [a.format_map(fill) for a in launcher_args]
        name = ",".join(f"{f.name}={levels[f.name].label}" for f in self.factors) + f",rep={rep}"
        if len(name) > 180:
            name = f"config{c + 1:03d},rep={rep}"
        return RunSpec(order, name, c + 1, rep, values, script, args, nprocs, tracer, launcher,
                       launcher_args, env)


def load(path: Path | str) -> Design:
    """Read and check a design file."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"design file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path} is not valid TOML ({e}); fix the line it names.") from None
    return parse(raw, path)


def parse(raw: dict[str, Any], path: Path | str = Path("design.toml")) -> Design:
    """Check a parsed design (a dict as ``tomllib`` returns it) and expand its configurations."""
    path = Path(path)
    where = path.name

    def bad(msg: str) -> UsageError:
        return UsageError(f"{where}: {msg}")

    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise bad(f"unknown key {unknown[0]!r}; the keys are {', '.join(sorted(TOP_KEYS))}.")
    raw = dict(raw)
    raw.setdefault("name", path.stem)
    if not isinstance(raw.get("factors"), dict) or not raw["factors"]:
        raise bad("no [factors] table; a design needs at least one factor with its levels.")
    replications = raw.get("replications", 1)
    if not isinstance(replications, int) or isinstance(replications, bool) or replications < 1:
        raise bad(f"replications must be a positive integer, not {replications!r}.")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise bad(f"seed must be an integer, not {seed!r}.")
    for key in ("args", "launcher_args"):
        if not isinstance(raw.get(key, []), list):
            raise bad(f"{key} must be a list of strings, such as [\"--steps\", \"5\"].")
    factors = tuple(_factor(name, spec, bad) for name, spec in raw["factors"].items())
    names = [f.name for f in factors]
    if "ranks" in names and "nodes" in names:
        raise bad("use either a ranks or a nodes factor, not both (ranks = nodes x ranks_per_node).")
    if "nodes" in names and not isinstance(raw.get("ranks_per_node"), int):
        raise bad("a nodes factor needs ranks_per_node = N at the top level.")
    if "script" not in raw and "script" not in names and not any(
            "script" in lv.settings for f in factors for lv in f.levels):
        raise bad("no script: set script = \"runs/....py\" at the top level or in a factor.")
    raw.setdefault("script", "")
    configs = [dict(zip(names, combo, strict=True))
               for combo in itertools.product(*(f.levels for f in factors))]
    for key in ("include", "exclude"):
        patterns = raw.get(key)
        if patterns is None:
            continue
        if not isinstance(patterns, list) or not all(isinstance(p, dict) for p in patterns):
            raise bad(f"{key} must be a list of tables such as [{{ ranks = 1 }}].")
        checked = [_pattern(p, factors, key, bad) for p in patterns]
        keep = key == "include"
        configs = [c for c in configs if any(_matches(c, p) for p in checked) == keep]
    if not configs:
        raise bad("include/exclude leave no configuration to run.")
    baselines = raw.get("baselines", {})
    if not isinstance(baselines, dict) or not all(isinstance(b, dict) for b in baselines.values()):
        raise bad("baselines must be a table of named partial configurations, such as "
                  "cpu = { device = \"cpu\", ranks = 1 }.")
    for b in baselines.values():
        _pattern(b, factors, "baselines", bad)
    design = Design(str(raw["name"]), path, raw, factors, replications, seed, tuple(configs))
    for c in range(len(configs)):
        try:
            spec = design._spec(0, c, 1)
        except (KeyError, IndexError, ValueError) as e:
            raise bad(f"launcher_args: cannot fill in {e}; braces may name factors, ranks and "
                      "ranks_per_node.") from None
        if not spec.script:
            raise bad(f"configuration {spec.name} has no script.")
    return design


def _factor(name: str, spec: Any, bad: Any) -> Factor:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise bad(f"factor name {name!r} must be a plain identifier such as batch_size.")
    arg = None if name in SPECIAL else "--" + name.replace("_", "-")
    if isinstance(spec, dict):
        extra = sorted(set(spec) - {"levels", "arg"})
        if extra or "levels" not in spec:
            raise bad(f"factor {name}: a factor table has levels = [...] and optionally arg = \"--x\".")
        arg = spec.get("arg", arg)
        spec = spec["levels"]
    if isinstance(spec, dict):
        levels = [_table_level(name, key, settings, bad) for key, settings in spec.items()]
    elif isinstance(spec, list):
        levels = [_scalar_level(name, v, arg, bad) for v in spec]
    else:
        raise bad(f"factor {name}: levels must be a list such as [1, 2] or a table of named levels.")
    if not levels:
        raise bad(f"factor {name} has no levels.")
    labels = [lv.label for lv in levels]
    if len(set(labels)) != len(labels):
        raise bad(f"factor {name} lists a level twice: {labels}.")
    return Factor(name, tuple(levels))


def _scalar_level(name: str, value: Any, arg: str | None, bad: Any) -> Level:
    if isinstance(value, dict | list):
        raise bad(f"factor {name}: level {value!r} must be a number, string or boolean "
                  "(use named levels for settings).")
    if name == "ranks" or name == "nodes":
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise bad(f"factor {name}: levels must be positive integers, not {value!r}.")
        return Level(value, str(value))
    if name == "script":
        return Level(str(value), _label(Path(str(value)).stem), {"script": str(value)})
    if isinstance(value, bool):
        args = [arg] if value and arg else []
        return Level(value, str(value).lower(), {"args": args})
    return Level(value, _label(str(value)), {"args": [arg, str(value)] if arg else []})


def _table_level(name: str, key: str, settings: Any, bad: Any) -> Level:
    if not isinstance(settings, dict):
        raise bad(f"factor {name}: level {key} must be a table of settings ({', '.join(sorted(LEVEL_KEYS))}).")
    unknown = sorted(set(settings) - LEVEL_KEYS)
    if unknown:
        raise bad(f"factor {name}, level {key}: unknown setting {unknown[0]!r}; "
                  f"use {', '.join(sorted(LEVEL_KEYS))}.")
    clean: dict[str, Any] = {}
    for k, v in settings.items():
        if k in ("args", "launcher_args"):
            if not isinstance(v, list):
                raise bad(f"factor {name}, level {key}: {k} must be a list of strings.")
            clean[k] = [str(a) for a in v]
        elif k == "env":
            clean[k] = {str(a): str(b) for a, b in dict(v).items()}
        else:
            clean[k] = str(v)
    return Level(key, _label(key), clean)


def _label(text: str) -> str:
    return _UNSAFE.sub("_", text).strip("_") or "level"


def _pattern(p: dict[str, Any], factors: tuple[Factor, ...], key: str, bad: Any) -> dict[str, Level]:
    by_name = {f.name: f for f in factors}
    out = {}
    for name, value in p.items():
        if name not in by_name:
            raise bad(f"{key} names {name!r}, which is not a factor.")
        try:
            out[name] = by_name[name].level(value)
        except KeyError:
            raise bad(f"{key}: {value!r} is not a level of {name}.") from None
    return out


def _matches(config: dict[str, Level], pattern: dict[str, Level]) -> bool:
    return all(config[name] == level for name, level in pattern.items())
