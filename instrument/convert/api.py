"""``convert(source) -> Result``: the one entry, for the command line and notebooks alike."""

from __future__ import annotations

import libcst as cst

from instrument.convert import checks, detect, keras_rules, tf_rules, torch_rules
from instrument.convert.common_rules import Context, Options, add_init, rank0_output
from instrument.convert.edits import Plan
from instrument.convert.facts import Facts
from instrument.convert.report import Finding, Result, Status

_RULES = {
    detect.PYTORCH: (torch_rules.HVD_MODULE, torch_rules.convert),
    detect.KERAS: (keras_rules.HVD_MODULE, keras_rules.convert),
    detect.TENSORFLOW: (tf_rules.HVD_MODULE, tf_rules.convert),
}


def convert(source: str, *, filename: str = "train.py", options: Options | None = None) -> Result:
    """Convert a single-process training script (its text) into a Horovod one.

    Returns the converted text and the report. Nothing is written: a refused script comes
    back unchanged with ``refusals`` set (``exit_status`` 2), a converted one with warnings
    has ``exit_status`` 3. A script this function wrote comes back unchanged with status
    ``already_converted``.
    """
    options = options or Options()
    if detect.already_converted(source):
        return Result(source, source, Status.ALREADY_CONVERTED, filename=filename)
    try:
        facts = Facts(source)
    except cst.ParserSyntaxError as e:
        return _refused(source, filename, None, Finding(
            "syntax_error", e.raw_line, f"the script does not parse ({e.message.rstrip('.')}); "
            "fix it so that python can run it, then convert it."))
    refusal = detect.distributed(facts)
    if refusal:
        return _refused(source, filename, None, refusal)
    framework, refusal = detect.framework(facts)
    if refusal or framework is None:
        return _refused(source, filename, None, refusal or Finding("no_framework", None, "no framework found."))
    refusal = checks.tf1(facts)
    if refusal:
        return _refused(source, filename, framework, refusal)
    flow = checks.Flow(facts)
    exits = checks.divergent_exits(facts, flow)
    if exits:
        return _refused(source, filename, framework, exits[0])

    hvd_module, rules = _RULES[framework]
    ctx = Context(facts, Plan(facts.module), flow, options, framework, hvd_module)
    refusal = rules(ctx)
    if refusal:
        return _refused(source, filename, framework, refusal)
    rank0_output(ctx)
    ctx.warnings += checks.downloads(facts)
    ctx.unseen += checks.unseeded_shuffles(facts)
    add_init(ctx)
    output = ctx.plan.apply().code
    warnings = sorted(ctx.warnings, key=lambda w: w.line or 0)
    unseen = sorted(ctx.unseen, key=lambda u: u.line or 0)
    return Result(source, output, Status.CONVERTED, framework, ctx.applied, warnings, [], unseen, filename)


def _refused(source: str, filename: str, framework: str | None, refusal: Finding) -> Result:
    return Result(source, source, Status.REFUSED, framework, refusals=[refusal], filename=filename)
