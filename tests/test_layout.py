"""The layout holds: no import circles, and every import runs in an allowed direction.

The rooms and what each may import are declared in :data:`ROOMS` (the same table as the
package docstrings and docs/how-it-works.md). Imports are read from the source with ``ast``,
including those inside functions (a lazy import is still a dependency), so a circle or a
forbidden direction fails here before anyone runs the code.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("traceio", "instrument", "analyze", "reports")

# room -> the rooms it may import besides itself (a room is a module or a package prefix; a
# module belongs to the longest room its dotted name starts with).
ROOMS: dict[str, set[str]] = {
    # shared by both sides: imports neither
    "traceio": set(),
    # the instrumentation side
    "instrument": {"instrument.tracer"},  # the package face: the lazy ``region`` marker
    "instrument.errors": set(),
    "instrument.tracer": {"traceio"},
    "instrument.launch": {"instrument.tracer", "instrument.scorep", "instrument.errors", "traceio"},
    "instrument.launch.rank_env": set(),
    "instrument.hooks": {"instrument.tracer", "instrument.launch.rank_env", "traceio"},
    "instrument.scorep": {"instrument.tracer", "instrument.launch.rank_env", "instrument.errors",
                          "traceio"},
    "instrument.experiments": {"instrument.launch", "instrument.errors"},
    "instrument.convert": {"instrument.errors"},  # source-to-source conversion (libcst)
    "instrument.bootstrap": {"instrument.tracer", "instrument.hooks", "instrument.scorep",
                             "instrument.launch.rank_env", "instrument.power", "traceio"},
    "instrument.power": {"instrument.tracer", "traceio"},
    "instrument.cli": {"instrument", "traceio"},
    # the analysis side
    "analyze": {"analyze.tables", "analyze.errors"},  # the package face: lazy ``analyze.open``
    "analyze.errors": set(),
    "analyze.heap": set(),  # how the analyze command's process allocates
    "analyze.schema": {"traceio"},  # the device names our power channels carry
    "analyze.readers": {"traceio", "analyze.errors"},
    "analyze.tables": {"analyze.readers", "analyze.schema", "analyze.errors", "analyze.engine",
                       "analyze.energy", "traceio"},
    "analyze.engine": {"analyze.errors"},  # runs tasks it is given; knows nothing of tables
    "analyze.energy": {"analyze.schema", "traceio"},
    "analyze.power": {"analyze.tables", "analyze.views", "analyze.schema", "analyze.energy"},
    "analyze.tables.causes": {"analyze.tables", "analyze.schema"},
    "analyze.views": {"analyze.tables", "analyze.schema"},
    "analyze.background": {"analyze.tables", "analyze.schema"},
    "analyze.experiments": {"analyze.tables", "analyze.views", "analyze.schema", "analyze.errors",
                            "analyze.energy", "analyze.power"},
    "analyze.export": {"analyze.tables", "analyze.schema", "analyze.errors", "traceio"},
    "analyze.cli": {"analyze", "reports"},
    # figures: from the analysis' tables
    "reports": {"analyze.views", "analyze.tables", "analyze.experiments", "analyze.errors",
                "analyze.schema", "analyze.power"},
}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, known: set[str], root: Path = ROOT) -> set[str]:
    """Our modules that ``path`` imports (``from pkg import sub`` counts as importing ``sub``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                     for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # `import a.b.c` of a function or attribute
                name = name.rpartition(".")[0]
            if name and name.split(".")[0] in PACKAGES and name != me:
                found.add(name)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))]
    known = {module_name(p, root) for p in files}
    return {module_name(p, root): imports_of(p, known, root) for p in files}


def room(module: str) -> str:
    best = ""
    for r in ROOMS:
        if (module == r or module.startswith(r + ".")) and len(r) > len(best):
            best = r
    return best


def _within(target_room: str, allowed: str) -> bool:
    return target_room == allowed or target_room.startswith(allowed + ".")


def forbidden(g: dict[str, set[str]]) -> list[str]:
    """Every import that leaves its room in a direction :data:`ROOMS` does not allow."""
    out = []
    for src, targets in sorted(g.items()):
        mine = room(src)
        if not mine:
            out.append(f"{src}: in no room of ROOMS (add it, with what it may import)")
            continue
        for dst in sorted(targets):
            theirs = room(dst)
            if theirs == mine or _within(theirs, mine) and mine not in ("instrument", "analyze"):
                continue
            side = {src.split(".")[0], dst.split(".")[0]}
            if side == {"instrument", "analyze"}:
                out.append(f"{src} -> {dst}: instrumentation and analysis meet only in traceio")
            elif not any(_within(theirs, a) for a in ROOMS[mine]):
                out.append(f"{src} -> {dst}: {mine} may not import {theirs}")
    return out


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles() -> None:
    assert circles(graph()) == []


def test_imports_run_in_allowed_directions() -> None:
    assert forbidden(graph()) == []


def test_every_package_says_what_it_owns_and_may_import() -> None:
    for init in sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert doc, f"{init.relative_to(ROOT)} has no docstring"
        if init.parent.name not in ("cli",):
            assert "import" in doc.lower(), f"{init.relative_to(ROOT)}: say what it may import"


def write_package(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_catch_a_circle_and_a_forbidden_direction(tmp_path: Path) -> None:
    """The checks can fail: a planted circle and a planted cross-side import are reported."""
    write_package(tmp_path, {
        "traceio/__init__.py": "", "traceio/a.py": "from traceio import b\n",
        "traceio/b.py": "def f():\n    from traceio.a import x\n",
        "instrument/__init__.py": "", "instrument/tracer/__init__.py": "",
        "instrument/tracer/t.py": "import analyze.tables.phases\n",
        "analyze/__init__.py": "", "analyze/tables/__init__.py": "", "analyze/tables/phases.py": "",
        "analyze/readers/__init__.py": "", "analyze/readers/r.py": "from analyze.tables import phases\n",
        "reports/__init__.py": "",
    })
    g = graph(tmp_path)
    assert circles(g) == [["traceio.a", "traceio.b"]]
    problems = forbidden(g)
    assert any("instrument.tracer.t -> analyze.tables.phases" in p for p in problems)
    assert any("analyze.readers.r -> analyze.tables.phases: analyze.readers may not" in p for p in problems)


@pytest.mark.parametrize("command", ["instrument", "analyze"])
def test_cli_loads_no_heavy_library(command: str) -> None:
    """``--help`` and argument errors answer without numpy, DuckDB, pandas, plotnine or torch:
    the command's modules import them only inside the verb that runs (bench/cli_start.py times
    it)."""
    heavy = ["numpy", "duckdb", "pandas", "plotnine", "matplotlib", "scipy", "torch", "otf2", "libcst"]
    probe = (f"import sys, {command}.cli; {command}.cli.build_parser(); "
             f"print([m for m in {heavy!r} if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"{command} --help loads {proc.stdout.strip()}"


@pytest.mark.parametrize("command", ["instrument", "analyze"])
def test_every_verbs_help_reads_as_written(command: str) -> None:
    """argparse formats ``%`` only in arguments' help (and ``%(prog)s``): a description's
    ``95%%`` would print as such."""
    import argparse
    import importlib

    parser = importlib.import_module(f"{command}.cli").build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    verbs = {name: p for s in subs for name, p in s.choices.items()}
    assert verbs
    for name, p in [(command, parser), *verbs.items()]:
        text = p.format_help()
        assert "%%" not in text and "%(" not in text, f"{command} {name} --help: {text}"
