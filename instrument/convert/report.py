"""What a conversion did: the rules applied (each with the line of the original script it
touched), the warnings, the refusals, and what the converter could not see.

A :class:`Result` is what :func:`instrument.convert.convert` returns; ``--report FILE.json``
writes :meth:`Result.to_json`. Exit statuses of ``instrument horovodize``: 0 converted
cleanly (or already converted), 2 refused (nothing written), 3 converted with warnings.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

# The named rules, in the order the report lists them, with what each does.
RULES: dict[str, str] = {
    "init": "import Horovod and call hvd.init() after the imports",
    "pin_device": "one GPU per process: the local rank's (CPU stays CPU)",
    "scale_lr": "learning rate x hvd.size()",
    "wrap_optimizer": "average gradients across ranks (DistributedOptimizer / DistributedGradientTape)",
    "broadcast_state": "every rank starts from rank 0's parameters and optimizer state",
    "shard_data": "each rank trains on its own 1/size of the samples",
    "rank0_only": "checkpoints, saves, TensorBoard and progress output on rank 0 only",
    "average_metrics": "metrics computed on a rank's shard are averaged across ranks",
}

EXIT_CLEAN, EXIT_REFUSED, EXIT_WARNINGS = 0, 2, 3


class Status(StrEnum):
    CONVERTED = "converted"
    ALREADY_CONVERTED = "already_converted"
    REFUSED = "refused"


@dataclass(frozen=True)
class Applied:
    """One application of a rule: ``line`` is the line of the original script it touched."""

    rule: str
    line: int
    detail: str


@dataclass(frozen=True)
class Finding:
    """A refusal, a warning, or something the converter cannot see (``line`` None: the whole
    script)."""

    code: str
    line: int | None
    message: str

    def text(self) -> str:
        return f"line {self.line}: {self.message}" if self.line else self.message


@dataclass
class Result:
    """The converted source (``output``; equal to ``source`` when refused or already
    converted) and the report."""

    source: str
    output: str
    status: Status
    framework: str | None = None
    applied: list[Applied] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    refusals: list[Finding] = field(default_factory=list)
    unseen: list[Finding] = field(default_factory=list)
    filename: str = "train.py"

    @property
    def exit_status(self) -> int:
        if self.refusals:
            return EXIT_REFUSED
        return EXIT_WARNINGS if self.warnings else EXIT_CLEAN

    @property
    def changed(self) -> bool:
        return self.output != self.source

    def rules(self) -> list[str]:
        """The names of the rules applied, each once, in :data:`RULES` order."""
        used = {a.rule for a in self.applied}
        return [r for r in RULES if r in used]

    def diff(self, output_name: str | None = None) -> str:
        """The unified diff from the original to the converted script ("" when unchanged)."""
        out = output_name or _hvd_name(self.filename)
        return "".join(difflib.unified_diff(
            self.source.splitlines(keepends=True), self.output.splitlines(keepends=True),
            fromfile=self.filename, tofile=out))

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.filename,
            "status": str(self.status),
            "framework": self.framework,
            "exit_status": self.exit_status,
            "rules": self.rules(),
            "applied": [asdict(a) for a in sorted(self.applied, key=_order)],
            "warnings": [asdict(w) for w in self.warnings],
            "refusals": [asdict(r) for r in self.refusals],
            "cannot_see": [asdict(u) for u in self.unseen],
        }

    def summary(self) -> str:
        """The report as text, for the terminal."""
        if self.refusals:
            return f"{self.filename}: refused: {self.refusals[0].text()}"
        if self.status is Status.ALREADY_CONVERTED:
            return f"{self.filename}: already converted by instrument horovodize; nothing to do"
        lines = [f"{self.filename}: {self.framework} script, {len(self.applied)} edits"]
        for a in sorted(self.applied, key=_order):
            lines.append(f"  {a.rule:<16} line {a.line:<5} {a.detail}")
        for w in self.warnings:
            lines.append(f"  warning: {w.text()}")
        for u in self.unseen:
            lines.append(f"  cannot see: {u.text()}")
        return "\n".join(lines)


def _order(a: Applied) -> tuple[int, int]:
    return (list(RULES).index(a.rule), a.line)


def _hvd_name(filename: str) -> str:
    stem, dot, ext = filename.rpartition(".")
    return f"{stem}_hvd.{ext}" if dot else f"{filename}_hvd"
