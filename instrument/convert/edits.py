"""The edits a conversion makes, collected first and applied in one pass, so that every node
nobody edits is printed back from libcst's tree as it was read: comments, blank lines, odd
spacing and all.

Edits are keyed by the identity of nodes of the tree the rules read (``Facts.module``):
replace an expression, put statements before or after a statement, or run a group of
statements on rank 0 only (``if hvd.rank() == 0:``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import libcst as cst

Rewrite = Callable[[cst.CSTNode], cst.CSTNode]

RANK0_TEST = "hvd.rank() == 0"


def replaced_by(new: cst.CSTNode) -> Rewrite:
    """A rewrite to a fixed node."""
    return lambda _old: new


def appended(plan_module: cst.Module, code: str) -> Rewrite:
    """A rewrite that appends ``code`` to an expression's text (``X`` -> ``X.shard(...)``)."""
    return lambda old: cst.parse_expression(plan_module.code_for_node(old) + code)


@dataclass
class Plan:
    module: cst.Module
    replace: dict[int, list[Rewrite]] = field(default_factory=dict)
    before: dict[int, list[cst.BaseStatement]] = field(default_factory=dict)
    after: dict[int, list[cst.BaseStatement]] = field(default_factory=dict)
    rank0: set[int] = field(default_factory=set)

    # -- recording -----------------------------------------------------------------------
    def rewrite(self, node: cst.CSTNode, fn: Rewrite) -> None:
        """Replace ``node`` by ``fn(node as updated by other edits)``."""
        self.replace.setdefault(id(node), []).append(fn)

    def insert_before(self, stmt: cst.BaseStatement, new: Sequence[cst.BaseStatement]) -> None:
        self.before.setdefault(id(stmt), []).extend(new)

    def insert_after(self, stmt: cst.BaseStatement, new: Sequence[cst.BaseStatement]) -> None:
        self.after.setdefault(id(stmt), []).extend(new)

    def on_rank0(self, stmt: cst.BaseStatement) -> None:
        self.rank0.add(id(stmt))

    # -- building new code ---------------------------------------------------------------
    def statements(self, code: str, comment: str | None = None) -> list[cst.BaseStatement]:
        """``code`` parsed as statements in the script's own indentation and line endings,
        the first preceded by ``# comment``."""
        body: list[cst.BaseStatement] = list(cst.parse_module(code, config=self.module.config_for_parsing).body)
        if comment and body:
            line = cst.EmptyLine(comment=cst.Comment(f"# {comment}"))
            body[0] = body[0].with_changes(leading_lines=[line])
        return body

    # -- applying ------------------------------------------------------------------------
    def apply(self) -> cst.Module:
        result = self.module.visit(_Apply(self))
        assert isinstance(result, cst.Module)
        return result


class _Apply(cst.CSTTransformer):
    def __init__(self, plan: Plan):
        super().__init__()
        self.plan = plan

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # type: ignore[no-untyped-def, override]
        updated = super().on_leave(original_node, updated_node)
        for fn in self.plan.replace.get(id(original_node), ()):
            assert isinstance(updated, cst.CSTNode)
            updated = fn(updated)
        return updated

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return updated_node.with_changes(body=self._body(original_node.body, updated_node.body, None))

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated_node.with_changes(
            body=self._body(original_node.body, updated_node.body, original_node.indent))

    def _body(self, original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement],
              indent: str | None) -> list[cst.BaseStatement]:
        """A block's statements with the insertions and rank-0 groups; new nested blocks are
        indented as this block is (``indent``; None: the script's default)."""
        out: list[cst.BaseStatement] = []
        guarded: list[cst.BaseStatement] = []
        for orig, upd in zip(original, updated, strict=True):
            before = [_indented(s, indent) for s in self.plan.before.get(id(orig), [])]
            after = [_indented(s, indent) for s in self.plan.after.get(id(orig), [])]
            if before:
                before, upd = _take_blank_lines(before, upd)
            if id(orig) in self.plan.rank0 and not before:
                guarded.append(upd)
            else:
                out.extend(self._guard(guarded, indent))
                guarded = []
                out.extend(before)
                if id(orig) in self.plan.rank0:
                    guarded.append(upd)
                else:
                    out.append(upd)
            if after:
                out.extend(self._guard(guarded, indent))
                guarded = []
                out.extend(after)
        out.extend(self._guard(guarded, indent))
        return out

    def _guard(self, stmts: list[cst.BaseStatement], indent: str | None) -> list[cst.BaseStatement]:
        """``if hvd.rank() == 0:`` around ``stmts``; the first one's comments stay above."""
        if not stmts:
            return []
        # libcst keeps continuation lines relative to their block, so they move along
        first = stmts[0]
        leading = _leading(first)
        body = [first.with_changes(leading_lines=[]), *stmts[1:]]
        guard = cst.parse_statement(f"if {RANK0_TEST}:\n    pass\n",
                                    config=self.plan.module.config_for_parsing)
        assert isinstance(guard, cst.If)
        return [guard.with_changes(leading_lines=leading,
                                   body=cst.IndentedBlock(body=body, indent=indent))]


class _Indent(cst.CSTTransformer):
    def __init__(self, indent: str | None):
        super().__init__()
        self.indent = indent

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return updated_node.with_changes(indent=self.indent)


def _indented(stmt: cst.BaseStatement, indent: str | None) -> cst.BaseStatement:
    """A new statement's nested blocks indented like the block it goes into."""
    out = stmt.visit(_Indent(indent))
    assert isinstance(out, cst.BaseStatement)
    return out


def _take_blank_lines(before: list[cst.BaseStatement], stmt: cst.BaseStatement
                      ) -> tuple[list[cst.BaseStatement], cst.BaseStatement]:
    """Statements put before ``stmt`` go below the blank lines that separate it from what
    precedes it, and above the comments right on top of it (which are about it)."""
    lines = list(_leading(stmt))
    cut = max((i + 1 for i, line in enumerate(lines) if line.comment is None), default=0)
    if cut == 0:
        return before, stmt
    first = before[0].with_changes(leading_lines=[*lines[:cut], *_leading(before[0])])
    return [first, *before[1:]], stmt.with_changes(leading_lines=lines[cut:])


def _leading(stmt: cst.BaseStatement) -> Sequence[cst.EmptyLine]:
    """The blank and comment lines above a statement (simple and compound ones have them)."""
    lines: Sequence[cst.EmptyLine] = getattr(stmt, "leading_lines", ())
    return lines
