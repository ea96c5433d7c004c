"""The PyTorch rules: optimizers from ``torch.optim`` (or any object whose ``step()`` and
``zero_grad()`` the script calls), ``DataLoader``s, CUDA devices, checkpoints and TensorBoard.

Right after each optimizer is made: every param group's learning rate x ``hvd.size()``, the
optimizer wrapped in ``hvd.DistributedOptimizer`` with the model's named parameters, and
rank 0's parameters broadcast. Its state is broadcast after the script loads it; a fresh
optimizer is the same on every rank, and Horovod's ``broadcast_optimizer_state`` would take
a zero-gradient step on it (Adam's step count, weight decay), so one rank would no longer
reproduce the original script. The loaders are :mod:`.torch_data`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from instrument.convert import torch_data
from instrument.convert.checks import used_names
from instrument.convert.common_rules import Context
from instrument.convert.edits import replaced_by
from instrument.convert.facts import (
    argument,
    dotted,
    method_name,
    receiver,
)
from instrument.convert.report import Finding

HVD_MODULE = "horovod.torch"
OPTIMIZERS = {"SGD", "Adam", "AdamW", "Adadelta", "Adagrad", "Adamax", "ASGD", "NAdam", "RAdam",
              "RMSprop", "Rprop", "SparseAdam", "Adafactor", "LBFGS"}
_WRITERS = ("torch.utils.tensorboard.SummaryWriter", "torch.utils.tensorboard.writer.SummaryWriter",
            "tensorboardX.SummaryWriter")
_CLIPS = ("torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_",
          "torch.nn.utils.clip_grad_norm", "torch.nn.utils.clip_grad.clip_grad_norm_")


@dataclass
class Optimizer:
    """An optimizer the script makes: ``target = call`` in ``stmt``, over ``model``'s
    parameters (None: not visible); ``known``: a torch.optim class."""

    stmt: cst.SimpleStatementLine
    call: cst.Call
    target: str
    model: str | None
    known: bool


def convert(ctx: Context) -> Finding | None:
    """Record the PyTorch edits in ``ctx``; a refusal when no optimizer can be wrapped."""
    optimizers, lbfgs = find_optimizers(ctx)
    if not optimizers:
        if lbfgs is not None:
            return Finding("no_optimizer", ctx.facts.line(lbfgs),
                           "the only optimizer is LBFGS, whose step() runs backward several times "
                           "through a closure, which Horovod's DistributedOptimizer cannot average.")
        return Finding("no_optimizer", None,
                       "no optimizer found (a torch.optim optimizer assigned to a name, or an object "
                       "whose step() and zero_grad() the script calls), so there is nothing to "
                       "average across ranks.")
    if len(optimizers) > 1:
        ctx.warn("several_optimizers", optimizers[1].call,
                 f"{len(optimizers)} optimizers ({', '.join(o.target for o in optimizers)}): each is "
                 "wrapped, but a GAN-style loop whose backward reaches another optimizer's parameters "
                 "needs backward_passes_per_step or separate process sets; check the result.")
    for opt in optimizers:
        wrap(ctx, opt)
    pin_device(ctx)
    torch_data.shard_loaders(ctx)
    writers(ctx)
    return None


# -- optimizers ------------------------------------------------------------------------------

def find_optimizers(ctx: Context) -> tuple[list[Optimizer], cst.Call | None]:
    facts = ctx.facts
    out: list[Optimizer] = []
    lbfgs = None
    seen: set[str] = set()
    for call in facts.calls:
        name = facts.qname(call) or ""
        cls = name.rpartition(".")[2]
        if not name.startswith("torch.optim.") or cls not in OPTIMIZERS or ".lr_scheduler" in name:
            continue
        if cls == "LBFGS":
            lbfgs = call
            ctx.cannot_see("lbfgs", call, "LBFGS is left alone: Horovod cannot average its closure steps.")
            continue
        stmt, target = _assigned(ctx, call)
        if stmt is None or target is None:
            ctx.cannot_see("optimizer_not_assigned", call,
                           f"`{cls}(...)` is not assigned to a name, so it is not wrapped.")
            continue
        seen.add(target)
        out.append(Optimizer(stmt, call, target, _model_of(ctx, call), True))
    # Optimizers made elsewhere (another module, a factory): names whose step() the script
    # calls together with zero_grad(), or named like an optimizer.
    steps = {dotted(receiver(c)) for c in facts.calls if method_name(c) == "step"}
    zeros = {dotted(receiver(c)) for c in facts.calls if method_name(c) == "zero_grad"}
    for name in sorted(n for n in steps if n and n not in seen):
        if "sched" in name.lower() or not (name in zeros or "opt" in name.lower()):
            continue
        for call in facts.calls:
            stmt, target = _assigned(ctx, call)
            if target == name and stmt is not None and not (facts.qname(call) or "").startswith("torch.optim"):
                seen.add(name)
                out.append(Optimizer(stmt, call, name, _model_of(ctx, call), False))
                ctx.cannot_see("optimizer_made_elsewhere", call,
                               f"`{name}` comes from `{_short(ctx.code(call))}`, which the converter "
                               "cannot see into: it is wrapped as a torch.optim optimizer.")
                break
    out.sort(key=lambda o: facts.line(o.stmt))
    return out, lbfgs


def _assigned(ctx: Context, call: cst.Call) -> tuple[cst.SimpleStatementLine | None, str | None]:
    """The statement ``target = call`` (one target) and the target's dotted name."""
    stmt = ctx.facts.statement_of(call)
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None, None
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and small.value is call:
        return stmt, dotted(small.targets[0].target)
    if isinstance(small, cst.AnnAssign) and small.value is call:
        return stmt, dotted(small.target)
    return None, None


_MODULE_METHODS = {"parameters", "named_parameters", "state_dict", "train", "eval", "to", "cuda", "zero_grad"}


def _model_of(ctx: Context, call: cst.Call) -> str | None:
    """The module whose parameters the optimizer gets (``model`` of ``model.parameters()``;
    for a factory of the script's own, ``model`` of ``make_optimizer(model)`` when the script
    uses ``model`` as a module)."""
    arg = argument(call, 0, "params")
    if arg is None:
        return None
    owner = _params_owner(ctx, arg.value, depth=0)
    name = dotted(arg.value)
    if owner is None and name and not (ctx.facts.qname(call) or "").startswith("torch.optim."):
        used = any(dotted(receiver(c)) == name and method_name(c) in _MODULE_METHODS or dotted(c.func) == name
                   for c in ctx.facts.calls)
        owner = name if used else None
    return owner


def _params_owner(ctx: Context, expr: cst.BaseExpression, depth: int) -> str | None:
    found = [dotted(receiver(c)) for c in ctx.facts.calls_in(expr)
             if method_name(c) in ("parameters", "named_parameters")]
    owners = [o for o in found if o]
    if owners:
        parts = [o.split(".") for o in owners]
        common = []
        for group in zip(*parts, strict=False):
            if len(set(group)) != 1:
                break
            common.append(group[0])
        return ".".join(common) or None
    if depth < 3:  # params = [p for p in model.parameters() if ...]; [{"params": params}, ...]
        for name in sorted(used_names(expr)):
            for value in _assignments(ctx, name):
                owner = _params_owner(ctx, value, depth + 1)
                if owner:
                    return owner
    return None


def _assignments(ctx: Context, name: str) -> list[cst.BaseExpression]:
    out = []

    class V(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            if any(dotted(t.target) == name for t in node.targets):
                out.append(node.value)

    ctx.facts.module.visit(V())
    return out


def wrap(ctx: Context, opt: Optimizer) -> None:
    plan, t = ctx.plan, opt.target
    group = ctx.facts.fresh("group", "param_group", "hvd_group")
    lines = [f"for {group} in {t}.param_groups:", f"    {group}[\"lr\"] *= hvd.size()"]
    if opt.model:
        lines.append(f"{t} = hvd.DistributedOptimizer({t}, named_parameters={opt.model}.named_parameters())")
        lines.append(f"hvd.broadcast_parameters({opt.model}.state_dict(), root_rank=0)")
    else:
        lines.append(f"{t} = hvd.DistributedOptimizer({t})")
        lines.append(f"hvd.broadcast_parameters([(f\"{{i}}.{{j}}\", p) for i, g in enumerate({t}.param_groups)"
                     f" for j, p in enumerate(g[\"params\"])], root_rank=0)")
        ctx.cannot_see("model_not_found", opt.call,
                       f"the model behind `{t}` is not visible, so only the optimizer's parameters are "
                       "broadcast (not buffers such as BatchNorm statistics).")
    plan.insert_after(opt.stmt, plan.statements(
        "\n".join(lines) + "\n",
        "Horovod: learning rate x ranks, gradients averaged across ranks, rank 0's parameters everywhere"))
    ctx.apply("scale_lr", opt.call, f"every param group of `{t}`: lr x hvd.size()")
    ctx.apply("wrap_optimizer", opt.call, f"`{t}` wrapped in hvd.DistributedOptimizer"
              + (f" with {opt.model}.named_parameters()" if opt.model else ""))
    ctx.apply("broadcast_state", opt.call, "rank 0's parameters broadcast"
              + (f" ({opt.model}.state_dict())" if opt.model else " (the optimizer's parameters)"))
    _broadcast_loaded_state(ctx, opt)
    _synchronize_before_clipping(ctx, opt)


def _broadcast_loaded_state(ctx: Context, opt: Optimizer) -> None:
    found = False
    for call in ctx.facts.calls:
        if method_name(call) == "load_state_dict" and dotted(receiver(call)) == opt.target:
            stmt = ctx.facts.statement_of(call)
            if stmt is None:
                continue
            found = True
            ctx.plan.insert_after(stmt, ctx.plan.statements(
                f"hvd.broadcast_optimizer_state({opt.target}, root_rank=0)\n",
                "Horovod: every rank continues from rank 0's optimizer state"))
            ctx.apply("broadcast_state", call, f"rank 0's state of `{opt.target}` broadcast after it is loaded")
    if not found:
        ctx.cannot_see("fresh_optimizer_state", opt.call,
                       f"`{opt.target}` starts fresh on every rank, so its state is not broadcast "
                       "(hvd.broadcast_optimizer_state would take a zero-gradient step on it).")


def _synchronize_before_clipping(ctx: Context, opt: Optimizer) -> None:
    """Horovod reduces gradients in the background during backward: clipping must wait for
    it (``synchronize()``), and ``step()`` must then not wait again (``skip_synchronize``)."""
    facts = ctx.facts
    for clip in facts.calls:
        if facts.qname(clip) not in _CLIPS:
            continue
        fn = facts.function_of(clip)
        steps = [c for c in facts.calls if method_name(c) == "step" and dotted(receiver(c)) == opt.target
                 and facts.function_of(c) is fn and facts.line(c) > facts.line(clip)]
        clip_stmt = facts.statement_of(clip)
        step_stmt = facts.statement_of(steps[0]) if steps else None
        if clip_stmt is None or not isinstance(step_stmt, cst.SimpleStatementLine):
            ctx.cannot_see("clipping", clip, "gradient clipping: call optimizer.synchronize() before it "
                           "and step() inside optimizer.skip_synchronize() (not done here).")
            continue
        ctx.plan.insert_before(clip_stmt, ctx.plan.statements(
            f"{opt.target}.synchronize()\n", "Horovod: wait for the averaged gradients before clipping"))
        t = opt.target

        def skip(s: cst.CSTNode, t: str = t) -> cst.CSTNode:
            return _inside_with(ctx, s, f"{t}.skip_synchronize()")

        ctx.plan.rewrite(step_stmt, skip)
        ctx.apply("wrap_optimizer", clip, f"`{t}.synchronize()` before clipping, step() in skip_synchronize()")


def _inside_with(ctx: Context, stmt: cst.CSTNode, item: str) -> cst.CSTNode:
    assert isinstance(stmt, cst.SimpleStatementLine)
    with_stmt = cst.parse_statement(f"with {item}:\n    pass\n", config=ctx.plan.module.config_for_parsing)
    assert isinstance(with_stmt, cst.With)
    return with_stmt.with_changes(leading_lines=stmt.leading_lines,
                                  body=cst.IndentedBlock(body=[stmt.with_changes(leading_lines=[])]))


# -- devices ---------------------------------------------------------------------------------

def pin_device(ctx: Context) -> None:
    facts = ctx.facts
    uses = [c for c in facts.calls if (facts.qname(c) or "").startswith(("torch.cuda", "torch.accelerator"))
            or method_name(c) == "cuda" or any(_cuda_string(a.value) for a in c.args)]
    if not uses:
        return
    torch = ctx.module_alias("torch", "torch")
    ctx.after_init += [f"if {torch}.cuda.is_available():", f"    {torch}.cuda.set_device(hvd.local_rank())"]
    ctx.apply("pin_device", uses[0], "one GPU per process: torch.cuda.set_device(hvd.local_rank())")
    for call in facts.calls:
        name = facts.qname(call) or ""
        m = method_name(call)
        if name == "torch.device" and len(call.args) >= 2 and _cuda_string(call.args[0].value) \
                and _is_zero(call.args[1].value):
            ctx.plan.rewrite(call.args[1].value, lambda _n: cst.parse_expression("hvd.local_rank()"))
            ctx.apply("pin_device", call, "device index 0 -> hvd.local_rank()")
        elif (m == "cuda" or name == "torch.cuda.set_device") and call.args and _is_zero(call.args[0].value):
            ctx.plan.rewrite(call.args[0].value, lambda _n: cst.parse_expression("hvd.local_rank()"))
            ctx.apply("pin_device", call, "device 0 -> hvd.local_rank()")
    for string in _strings(facts.module):
        if string.evaluated_value == "cuda:0":
            local = cst.parse_expression(f"f{string.quote}cuda:{{hvd.local_rank()}}{string.quote}")
            ctx.plan.rewrite(string, replaced_by(local))
            ctx.apply("pin_device", string, "\"cuda:0\" -> the local rank's GPU")


def _strings(module: cst.Module) -> list[cst.SimpleString]:
    found: list[cst.SimpleString] = []

    class V(cst.CSTVisitor):
        def visit_SimpleString(self, node: cst.SimpleString) -> None:
            found.append(node)

    module.visit(V())
    return found


def _cuda_string(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.SimpleString) and str(node.evaluated_value).startswith("cuda")


def _is_zero(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Integer) and node.value == "0"


# -- TensorBoard -----------------------------------------------------------------------------

def writers(ctx: Context) -> None:
    facts = ctx.facts
    for call in facts.calls:
        if facts.qname(call) not in _WRITERS:
            continue
        stmt = facts.statement_of(call)
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
        target = dotted(small.targets[0].target) if isinstance(small, cst.Assign) and small.value is call else None
        if target is None:
            ctx.cannot_see("tensorboard", call, "a SummaryWriter not assigned to a name: left on every rank.")
            continue
        ctx.plan.rewrite(call, lambda c: cst.parse_expression(
            f"{ctx.plan.module.code_for_node(c)} if hvd.rank() == 0 else None"))
        ctx.apply("rank0_only", call, f"`{target}` (TensorBoard) created on rank 0 only")
        for use in facts.calls:
            if dotted(receiver(use)) == target:
                s = facts.statement_of(use)
                if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 and isinstance(s.body[0], cst.Expr):
                    ctx.rank0(s, use, f"`{target}.{method_name(use)}` on rank 0 only")


def _short(code: str, limit: int = 50) -> str:
    code = " ".join(code.split())
    return code if len(code) <= limit else code[: limit - 3] + "..."
