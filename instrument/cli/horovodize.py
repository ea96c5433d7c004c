"""``instrument horovodize``: turn a single-process training script into a Horovod one."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from instrument.errors import UsageError

KERAS_DATA = ("shard", "steps")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "horovodize",
        help="convert a single-process PyTorch/Keras/TF2 training script into a Horovod one",
        description="Convert SCRIPT (PyTorch, Keras or a TensorFlow 2 GradientTape loop, on one "
        "device) into a Horovod script, keeping every line it does not change. Exit status: 0 "
        "converted (or already converted), 2 refused (nothing written), 3 converted with "
        "warnings. See docs/horovodize.md.",
    )
    p.add_argument("script", help="the training script to convert")
    p.add_argument("-o", "--output", type=Path, metavar="OUT",
                   help="write the converted script here (default: print it)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--diff", action="store_true", help="print the unified diff; write nothing")
    what.add_argument("--check", action="store_true",
                      help="only say (and exit with the status) whether it converts cleanly")
    p.add_argument("--report", type=Path, metavar="FILE.json",
                   help="write the report (rules applied with their lines, warnings, refusals) as JSON")
    p.add_argument("--keras-data", choices=KERAS_DATA, default="shard",
                   help="Keras fit and tf.data inputs: shard them (each rank every size-th sample, "
                   "default) or divide steps_per_epoch by the number of ranks")
    p.set_defaults(command=run)


def load(script: str) -> str:
    path = Path(script)
    if not path.is_file():
        raise UsageError(f"training script not found: {script}")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {script}: {e}") from None


def run(ns: argparse.Namespace, argv: list[str]) -> int:
    from instrument.convert import Options, convert

    source = load(ns.script)
    if ns.output is not None and ns.output.resolve() == Path(ns.script).resolve():
        raise UsageError("-o names the script itself; write the Horovod version to another file.")
    result = convert(source, filename=Path(ns.script).name, options=Options(keras_data=ns.keras_data))
    if ns.report is not None:
        write_report(ns.report, result.to_json())
    if result.refusals:
        print(f"instrument horovodize: {ns.script}: refused: {result.refusals[0].text()}", file=sys.stderr)
        return result.exit_status
    if ns.check:
        print(result.summary())
    elif ns.diff:
        sys.stdout.write(result.diff())
        print(result.summary(), file=sys.stderr)
    elif ns.output is not None:
        ns.output.write_text(result.output, encoding="utf-8")
        print(result.summary())
        print(f"written: {ns.output}")
    else:
        sys.stdout.write(result.output)
        print(result.summary(), file=sys.stderr)
    return result.exit_status


def write_report(path: Path, report: dict[str, Any]) -> None:
    try:
        path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot write the report to {path}: {e.strerror}") from None


def for_run(script: str) -> tuple[str, dict[str, Any], Any]:
    """For ``instrument run --horovodize``: the converted text, what run.json records about
    the conversion, and the result; a refusal raises :class:`UsageError` before any rank
    starts."""
    from instrument.convert import convert

    source = load(script)
    result = convert(source, filename=Path(script).name)
    if result.refusals:
        raise UsageError(f"--horovodize: {script}: refused: {result.refusals[0].text()}")
    for w in result.warnings:
        print(f"instrument run --horovodize: warning: {w.text()}", file=sys.stderr, flush=True)
    info = {"source": str(Path(script).resolve()), "report": result.to_json(), "diff": result.diff()}
    return result.output, info, result
