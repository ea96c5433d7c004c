"""The rules every framework shares: ``init`` (import Horovod, ``hvd.init()`` after the
imports) and ``rank0_only`` for progress output, saves and file writes; and the
:class:`Context` the framework rules record their edits and findings in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from instrument.convert.checks import Flow
from instrument.convert.detect import INIT_COMMENT
from instrument.convert.edits import Plan
from instrument.convert.facts import Facts, keyword, method_name, receiver, root_name
from instrument.convert.report import Applied, Finding

KERAS_DATA = ("shard", "steps")


@dataclass(frozen=True)
class Options:
    """``keras_data``: how Keras ``fit`` and tf.data inputs are split: ``shard`` (each rank
    takes every size-th sample) or ``steps`` (each rank runs steps_per_epoch // size steps)."""

    keras_data: str = "shard"


@dataclass
class Context:
    facts: Facts
    plan: Plan
    flow: Flow
    options: Options
    framework: str
    hvd_module: str
    applied: list[Applied] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    unseen: list[Finding] = field(default_factory=list)
    extra_imports: dict[str, str] = field(default_factory=dict)  # alias -> module to import
    after_init: list[str] = field(default_factory=list)  # code to run right after hvd.init()
    guarded: set[int] = field(default_factory=set)

    def apply(self, rule: str, node: cst.CSTNode, detail: str) -> None:
        self.applied.append(Applied(rule, self.facts.line(node), detail))

    def cannot_see(self, code: str, node: cst.CSTNode | None, message: str) -> None:
        self.unseen.append(Finding(code, self.facts.line(node) if node is not None else None, message))

    def warn(self, code: str, node: cst.CSTNode | None, message: str) -> None:
        self.warnings.append(Finding(code, self.facts.line(node) if node is not None else None, message))

    def module_alias(self, module: str, preferred: str) -> str:
        """The script's name for ``module`` (``torch``, ``tf``), importing it if unbound."""
        alias = self.facts.local_alias(module)
        if alias:
            return alias
        for a, m in self.extra_imports.items():
            if m == module:
                return a
        alias = self.facts.fresh(preferred, preferred + "_")
        self.extra_imports[alias] = module
        return alias

    def code(self, node: cst.CSTNode) -> str:
        return self.facts.code(node)

    def rank0(self, stmt: cst.BaseStatement, rule_node: cst.CSTNode, detail: str) -> None:
        """Run ``stmt`` on rank 0 only (once: not again inside a statement already guarded)."""
        if id(stmt) in self.guarded or any(id(a) in self.guarded for a in self.facts.ancestors(stmt)):
            return
        self.guarded.add(id(stmt))
        self.plan.on_rank0(stmt)
        self.apply("rank0_only", rule_node, detail)


# -- init ------------------------------------------------------------------------------------

def add_init(ctx: Context) -> None:
    """``import horovod.X as hvd`` and ``hvd.init()`` (marked as ours) after the last import
    that runs before the first module-level statement that needs Horovod."""
    facts, plan = ctx.facts, ctx.plan
    body = list(facts.module.body)
    edited = _edited_ids(plan)
    first_needing = len(body)
    own = {f.name.value for f in facts.functions}
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.FunctionDef | cst.ClassDef):
            continue
        if _contains(stmt, edited) or any(isinstance(c.func, cst.Name) and c.func.value in own
                                          for c in facts.calls_in(stmt)):
            first_needing = i
            break
    anchor = None
    for stmt in body[:first_needing]:
        if _is_import(stmt):
            anchor = stmt
    lines = [f"import {m} as {a}" if a != m else f"import {m}" for a, m in ctx.extra_imports.items()]
    lines += [f"import {ctx.hvd_module} as hvd", f"hvd.init()  {INIT_COMMENT}", *ctx.after_init]
    new = plan.statements("\n".join(lines) + "\n", None)
    if anchor is not None:
        plan.insert_after(anchor, new)
        ctx.apply("init", anchor, f"import {ctx.hvd_module} as hvd; hvd.init() after this import")
    else:
        target = body[min(first_needing, len(body) - 1)]
        plan.insert_before(target, new)
        ctx.apply("init", target, f"import {ctx.hvd_module} as hvd; hvd.init() before this line")


def _is_import(stmt: cst.BaseStatement) -> bool:
    if isinstance(stmt, cst.SimpleStatementLine):
        return all(isinstance(s, cst.Import | cst.ImportFrom) for s in stmt.body)
    if isinstance(stmt, cst.Try):  # try: import x / except ImportError: ...
        return all(isinstance(s, cst.SimpleStatementLine) and _is_import(s) for s in stmt.body.body)
    return False


def _edited_ids(plan: Plan) -> set[int]:
    return set(plan.replace) | set(plan.before) | set(plan.after) | plan.rank0


def _contains(node: cst.CSTNode, ids: set[int]) -> bool:
    found = False

    class V(cst.CSTVisitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            nonlocal found
            if id(n) in ids:
                found = True
            return not found

    node.visit(V())
    return found


# -- rank 0 only: progress output, saves, file writes --------------------------------------

_SAVE_FUNCS = {"torch.save", "torchvision.utils.save_image", "numpy.save", "numpy.savez",
               "numpy.savez_compressed", "numpy.savetxt", "matplotlib.pyplot.savefig",
               "tensorflow.saved_model.save", "keras.models.save_model", "keras.saving.save_model",
               "pickle.dump", "json.dump"}
_SAVE_METHODS = {"save", "save_weights", "savefig", "save_pretrained", "to_csv", "export"}
_LOG_METHODS = {"debug", "info", "warning", "warn", "log"}


def rank0_output(ctx: Context) -> None:
    """Progress output (prints and logs inside loops, or in functions called in loops), every
    save, file writes, and tqdm bars: rank 0 only. Prints that run once (setup, final results)
    stay on every rank, so per-rank results remain visible."""
    facts = ctx.facts
    repeating = _repeating_functions(ctx)
    for w in facts.withs:
        if _writes_file(facts, w) and not ctx.flow.node_trains(w):
            ctx.rank0(w, w, "file written on rank 0 only")
    for call in facts.calls:
        name = facts.qname(call) or ""
        m = method_name(call)
        stmt = facts.statement_of(call)
        if name in ("tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.trange", "tqdm.auto.trange"):
            if keyword(call, "disable") is None:
                ctx.plan.rewrite(call, lambda c: _add_kwarg(c, "disable", "hvd.rank() != 0"))
                ctx.apply("rank0_only", call, "progress bar shown on rank 0 only")
            continue
        if not _is_expression_statement(stmt, call):
            continue
        assert stmt is not None
        saves = name in _SAVE_FUNCS or (m in _SAVE_METHODS and isinstance(call.func, cst.Attribute)
                                        and not name.startswith("builtins"))
        prints = isinstance(call.func, cst.Name) and call.func.value == "print" and "print" not in {
            f.name.value for f in facts.functions}
        logs = (m in _LOG_METHODS and "log" in (root_name(receiver(call)) or "").lower())
        if saves:
            if _trains(ctx, call):
                continue
            ctx.rank0(stmt, call, f"`{_short(ctx.code(call))}` on rank 0 only")
        elif prints or logs:
            fn = facts.function_of(call)
            progress = bool(facts.loops_around(call)) or (fn is not None and id(fn) in repeating)
            if not progress:
                continue
            if _trains(ctx, call):
                ctx.cannot_see("rank0_only", call, "this print calls a function that trains, so it "
                               "stays on every rank")
                continue
            ctx.rank0(stmt, call, "progress output on rank 0 only")


def _repeating_functions(ctx: Context) -> set[int]:
    """The script's functions that run again and again: called inside a loop, or from such a
    function (``train()`` and ``test()`` called each epoch; not ``main()``)."""
    facts = ctx.facts
    out: set[int] = set()
    for _ in range(5):
        for fn in facts.functions:
            if id(fn) in out:
                continue
            for call in facts.calls_of(fn):
                if facts.loops_around(call) or id(facts.function_of(call)) in out:
                    out.add(id(fn))
                    break
    return out


def _is_expression_statement(stmt: cst.BaseStatement | None, call: cst.Call) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr) and stmt.body[0].value is call)


def _trains(ctx: Context, call: cst.Call) -> bool:
    return any(isinstance(c.func, cst.Name) and c.func.value in ctx.flow.trains
               for c in ctx.facts.calls_in(call))


def _writes_file(facts: Facts, w: cst.With) -> bool:
    for item in w.items:
        c = item.item
        if isinstance(c, cst.Call) and isinstance(c.func, cst.Name) and c.func.value == "open":
            mode = keyword(c, "mode") or (c.args[1] if len(c.args) > 1 and c.args[1].keyword is None else None)
            if mode is not None and isinstance(mode.value, cst.SimpleString) and any(
                    ch in mode.value.evaluated_value for ch in "wax"):
                return True
    return False


def _add_kwarg(call: cst.CSTNode, name: str, code: str) -> cst.CSTNode:
    assert isinstance(call, cst.Call)
    return add_argument(call, kwarg(name, code))


def add_argument(call: cst.Call, arg: cst.Arg, before_star: bool = True) -> cst.Call:
    """``call`` with ``arg`` appended (before any ``**kwargs``), in the call's own layout: after
    a trailing comma (one argument per line) the new argument gets a line of its own."""
    args = list(call.args)
    pos = len(args)
    if before_star:
        while pos > 0 and args[pos - 1].star == "**":
            pos -= 1
    space = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if pos < len(args):
        arg = arg.with_changes(comma=space)
    elif pos > 0:
        prev = args[pos - 1]
        if isinstance(prev.comma, cst.Comma):
            arg = arg.with_changes(comma=prev.comma)
        else:
            args[pos - 1] = prev.with_changes(comma=space)
    args.insert(pos, arg)
    return call.with_changes(args=args)


def kwarg(name: str, code: str) -> cst.Arg:
    """``name=code`` as a call argument."""
    return cst.Arg(keyword=cst.Name(name), value=cst.parse_expression(code),
                   equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))


def _short(code: str, limit: int = 50) -> str:
    code = " ".join(code.split())
    return code if len(code) <= limit else code[: limit - 3] + "..."

