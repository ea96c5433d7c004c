"""What the script says, read once: every call with the library name it resolves to through
the imports (``optim.SGD`` -> ``torch.optim.SGD``), parents, lines, loops, functions and the
names bound anywhere. The rules and checks ask questions of a :class:`Facts`; none edits.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import libcst as cst
from libcst.metadata import (
    MetadataWrapper,
    ParentNodeProvider,
    PositionProvider,
    QualifiedNameProvider,
    QualifiedNameSource,
)

# Spellings of one library under several names, mapped to one (Keras is ``keras.*`` however
# it was imported).
_ALIASES = (
    ("tensorflow.python.keras.", "keras."),
    ("tensorflow.keras.", "keras."),
    ("tensorflow.compat.v2.keras.", "keras."),
    ("tensorflow.optimizers.", "keras.optimizers."),
    ("tf_keras.", "keras."),
    ("keras.src.", "keras."),
)

Loop = cst.For | cst.While
Function = cst.FunctionDef | cst.Lambda


def normalize(name: str) -> str:
    for old, new in _ALIASES:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def dotted(node: cst.CSTNode | None) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def root_name(node: cst.CSTNode | None) -> str | None:
    """The first name of an attribute chain, through calls and subscripts (``a`` of
    ``a.b().c[0]``)."""
    while True:
        if isinstance(node, cst.Name):
            return node.value
        if isinstance(node, cst.Attribute):
            node = node.value
        elif isinstance(node, cst.Call):
            node = node.func
        elif isinstance(node, cst.Subscript):
            node = node.value
        else:
            return None


def method_name(call: cst.Call) -> str | None:
    """``step`` of ``optimizer.step()``; the name of a plain call ``f()``."""
    if isinstance(call.func, cst.Attribute):
        return call.func.attr.value
    if isinstance(call.func, cst.Name):
        return call.func.value
    return None


def receiver(call: cst.Call) -> cst.BaseExpression | None:
    """``optimizer`` of ``optimizer.step()``."""
    return call.func.value if isinstance(call.func, cst.Attribute) else None


def keyword(call: cst.Call, name: str) -> cst.Arg | None:
    return next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def positional(call: cst.Call, index: int) -> cst.Arg | None:
    plain = [a for a in call.args if a.keyword is None and not a.star]
    return plain[index] if index < len(plain) else None


def argument(call: cst.Call, index: int, name: str) -> cst.Arg | None:
    """The argument given by position ``index`` or keyword ``name``."""
    return keyword(call, name) or positional(call, index)


def has_star_kwargs(call: cst.Call) -> cst.Arg | None:
    return next((a for a in call.args if a.star == "**"), None)


@dataclass
class Facts:
    """The script read with libcst's metadata (qualified names, parents, positions)."""

    source: str
    wrapper: MetadataWrapper = field(init=False)
    module: cst.Module = field(init=False)

    def __post_init__(self) -> None:
        self.wrapper = MetadataWrapper(cst.parse_module(self.source))
        self.module = self.wrapper.module
        self._qnames = self.wrapper.resolve(QualifiedNameProvider)
        self._parents = self.wrapper.resolve(ParentNodeProvider)
        self._positions = self.wrapper.resolve(PositionProvider)
        collector = _Collector()
        self.module.visit(collector)
        self.calls: list[cst.Call] = collector.calls
        self.loops: list[Loop] = collector.loops
        self.withs: list[cst.With] = collector.withs
        self.functions: list[cst.FunctionDef] = collector.functions
        self.classes: list[cst.ClassDef] = collector.classes
        self.imports: list[cst.Import | cst.ImportFrom] = collector.imports
        self.bound: set[str] = collector.bound
        self.control: list[cst.Break | cst.Continue | cst.Return] = collector.control

    # -- where things are ----------------------------------------------------------------
    def line(self, node: cst.CSTNode) -> int:
        return int(_value(self._positions[node]).start.line)

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return _value(self._parents.get(node))

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        p = self.parent(node)
        while p is not None:
            yield p
            p = self.parent(p)

    def function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        """The innermost function definition holding ``node`` (None at module level)."""
        return next((a for a in self.ancestors(node) if isinstance(a, cst.FunctionDef)), None)

    def loops_around(self, node: cst.CSTNode) -> list[Loop]:
        """The loops holding ``node`` inside its own function, innermost first. A loop counts
        when ``node`` is in its body (not in its iterable, condition or ``else``)."""
        out: list[Loop] = []
        child: cst.CSTNode = node
        for a in self.ancestors(node):
            if isinstance(a, cst.FunctionDef | cst.Lambda | cst.ClassDef):
                break
            if isinstance(a, cst.For | cst.While) and child is a.body:
                out.append(a)
            child = a
        return out

    def statement_of(self, node: cst.CSTNode) -> cst.BaseStatement | None:
        """The statement in a block's body list that holds ``node``; None inside a one-line
        suite (``if x: a; b``), where no statement can be put before or after it alone."""
        child: cst.CSTNode = node
        for a in [node, *self.ancestors(node)]:
            if isinstance(a, cst.Module | cst.IndentedBlock):
                return child if isinstance(child, cst.BaseStatement) else None
            if isinstance(a, cst.SimpleStatementSuite):
                return None
            child = a
        return None

    # -- what things are -----------------------------------------------------------------
    def qname(self, node: cst.CSTNode) -> str | None:
        """The library name a call, name or attribute resolves to through the imports
        (normalized: ``tf.keras.X`` -> ``keras.X``), or None for the script's own names."""
        target = node.func if isinstance(node, cst.Call) else node
        names = _value(self._qnames.get(target, set()))
        imported = sorted(q.name for q in names if q.source is QualifiedNameSource.IMPORT)
        return normalize(imported[0]) if imported else None

    def calls_in(self, node: cst.CSTNode) -> list[cst.Call]:
        """The calls inside ``node`` (``node`` itself too), in source order."""
        collector = _Collector()
        node.visit(collector)
        return collector.calls

    def callers_names(self, name: str, site: cst.CSTNode, depth: int = 0) -> list[tuple[str, cst.CSTNode]]:
        """(name, place) pairs for what ``name`` is where it comes from: itself at ``site``,
        or, for a parameter of the function holding ``site``, the argument each caller
        passes (followed up to four calls), with the call."""
        fn = self.function_of(site)
        params = [p.name.value for p in fn.params.params] if fn is not None else []
        if fn is None or name not in params or depth > 3:
            return [(name, site)]
        index = params.index(name) - (1 if params[0] == "self" else 0)
        out = []
        for call in self.calls_of(fn):
            arg = argument(call, index, name)
            value = dotted(arg.value) if arg is not None else None
            if value:
                out.extend(self.callers_names(value, call, depth + 1))
        return out

    def calls_of(self, fn: cst.FunctionDef) -> list[cst.Call]:
        """The calls of the script's function ``fn``: ``f(...)``, and ``self.f(...)`` for a
        method (``model.train()`` is not a call of a function named ``train``)."""
        method = any(isinstance(a, cst.ClassDef) for a in self.ancestors(fn))
        name = fn.name.value
        return [c for c in self.calls
                if (isinstance(c.func, cst.Name) and c.func.value == name and not method)
                or (method and isinstance(c.func, cst.Attribute) and c.func.attr.value == name
                    and isinstance(c.func.value, cst.Name) and c.func.value.value == "self")]

    def imported_roots(self) -> set[str]:
        """Top-level packages the script imports (``torch``, ``tensorflow``, ``keras`` ...)."""
        out: set[str] = set()
        for imp in self.imports:
            if isinstance(imp, cst.Import):
                for alias in imp.names:
                    name = dotted(alias.name)
                    if name:
                        out.add(name.split(".")[0])
            elif imp.module is not None and not imp.relative:
                name = dotted(imp.module)
                if name:
                    out.add(name.split(".")[0])
        return out

    def local_alias(self, module: str) -> str | None:
        """The name the script binds to ``module`` (``tf`` for ``import tensorflow as tf``)."""
        for imp in self.imports:
            if isinstance(imp, cst.Import):
                for a in imp.names:
                    if dotted(a.name) == module:
                        if a.asname is not None and isinstance(a.asname.name, cst.Name):
                            return a.asname.name.value
                        if "." not in module:
                            return module
            elif imp.module is not None and not isinstance(imp.names, cst.ImportStar):
                base = dotted(imp.module) or ""
                for a in imp.names:
                    if isinstance(a.name, cst.Name) and normalize(f"{base}.{a.name.value}.") == normalize(module + "."):
                        if a.asname is not None and isinstance(a.asname.name, cst.Name):
                            return a.asname.name.value
                        return a.name.value
        return None

    def fresh(self, *candidates: str) -> str:
        """The first candidate name the script does not bind anywhere."""
        for c in candidates:
            if c not in self.bound:
                return c
        n = 2
        while f"{candidates[-1]}{n}" in self.bound:
            n += 1
        return f"{candidates[-1]}{n}"


def _value(v: Any) -> Any:
    """libcst hands some metadata out lazily, as callables."""
    return v() if callable(v) else v


class _Collector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.calls: list[cst.Call] = []
        self.loops: list[Loop] = []
        self.withs: list[cst.With] = []
        self.functions: list[cst.FunctionDef] = []
        self.classes: list[cst.ClassDef] = []
        self.imports: list[cst.Import | cst.ImportFrom] = []
        self.bound: set[str] = set()
        self.control: list[cst.Break | cst.Continue | cst.Return] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def visit_For(self, node: cst.For) -> None:
        self.loops.append(node)

    def visit_While(self, node: cst.While) -> None:
        self.loops.append(node)

    def visit_With(self, node: cst.With) -> None:
        self.withs.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)
        self.bound.add(node.name.value)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node)
        self.bound.add(node.name.value)

    def visit_Import(self, node: cst.Import) -> None:
        self.imports.append(node)
        for a in node.names:
            if a.asname is not None and isinstance(a.asname.name, cst.Name):
                self.bound.add(a.asname.name.value)
            else:
                self.bound.add((dotted(a.name) or "").split(".")[0])

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.imports.append(node)
        if not isinstance(node.names, cst.ImportStar):
            for a in node.names:
                if a.asname is not None and isinstance(a.asname.name, cst.Name):
                    self.bound.add(a.asname.name.value)
                elif isinstance(a.name, cst.Name):
                    self.bound.add(a.name.value)

    def visit_Name(self, node: cst.Name) -> None:
        self.bound.add(node.value)  # every name seen: fresh names must not shadow any

    def visit_Break(self, node: cst.Break) -> None:
        self.control.append(node)

    def visit_Continue(self, node: cst.Continue) -> None:
        self.control.append(node)

    def visit_Return(self, node: cst.Return) -> None:
        self.control.append(node)
