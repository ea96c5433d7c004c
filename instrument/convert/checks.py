"""What makes a script unsafe to convert (refusals) or needs a person's eye (warnings).

Refusals: TF1 sessions; control flow that makes ranks diverge: a ``break``, ``continue`` or
``return`` taken on a value derived from the loss, or a ``while`` loop that runs until the
loss says so, where the loop (or function) it ends trains. Each rank computes its own loss on
its own shard, so one rank would stop while the others wait in the next allreduce forever.
A ``break`` on a fixed step count or a flag is the same on every rank and is fine.

Warnings: data downloads (every rank downloads at once), a custom Keras ``train_step``, and
``apply_gradients`` on gradients no wrapped tape computed (both are not averaged by Horovod's
optimizer wrapper). Several optimizers are counted by the framework rules.
"""

from __future__ import annotations

import libcst as cst

from instrument.convert.facts import Facts, keyword, method_name, receiver, root_name
from instrument.convert.report import Finding

_TF1 = ("tensorflow.Session", "tensorflow.compat.v1.Session", "tensorflow.InteractiveSession",
        "tensorflow.compat.v1.InteractiveSession", "tensorflow.train.MonitoredTrainingSession",
        "tensorflow.compat.v1.train.MonitoredTrainingSession", "tensorflow.compat.v1.disable_eager_execution",
        "tensorflow.compat.v1.disable_v2_behavior", "tensorflow.placeholder",
        "tensorflow.compat.v1.placeholder", "tensorflow.estimator.Estimator")
_TRAINING_CALLS = {"backward", "apply_gradients", "fit", "fit_generator", "train_on_batch", "minimize"}
_DOWNLOADS = ("keras.utils.get_file", "tensorflow_datasets.load", "urllib.request.urlretrieve",
              "torch.hub.load", "torch.hub.download_url_to_file", "torch.hub.load_state_dict_from_url",
              "torchvision.datasets.utils.download_url", "torchvision.datasets.utils.download_and_extract_archive",
              "wget.download", "requests.get", "datasets.load_dataset")


def tf1(facts: Facts) -> Finding | None:
    for call in facts.calls:
        name = facts.qname(call) or ""
        if name in _TF1 or (name.startswith(("tensorflow.train.", "tensorflow.compat.v1.train."))
                            and name.endswith("Optimizer")):
            return Finding("tf1_session", facts.line(call),
                           f"the script uses TensorFlow 1 graphs and sessions ({name.replace('tensorflow', 'tf')}); "
                           "only TensorFlow 2 (eager, tf.function, Keras) scripts convert.")
    return None


# -- training, and values derived from the loss ----------------------------------------------

class _Names(cst.CSTVisitor):
    """Names used as values inside a node (not attribute names nor keyword names)."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.calls: list[cst.Call] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False


def used_names(node: cst.CSTNode) -> set[str]:
    v = _Names()
    node.visit(v)
    return v.names


def _lossy(name: str) -> bool:
    low = name.lower()
    return "loss" in low or "criterion" in low


class Flow:
    """Per scope (a function, or the module), the names whose values derive from the loss,
    and which of the script's functions train or return such a value."""

    def __init__(self, facts: Facts):
        self.facts = facts
        self.scopes: list[cst.CSTNode] = [facts.module, *facts.functions]
        self.assigns: dict[int, list[tuple[set[str], cst.CSTNode]]] = {id(s): [] for s in self.scopes}
        self.tainted: dict[int, set[str]] = {id(s): set() for s in self.scopes}
        self.returns_loss: set[str] = set()
        self.trains: set[str] = set()
        self._collect()
        self._propagate()

    def scope_of(self, node: cst.CSTNode) -> cst.CSTNode:
        return self.facts.function_of(node) or self.facts.module

    def _collect(self) -> None:
        facts = self.facts

        class V(cst.CSTVisitor):
            def __init__(self, flow: Flow):
                self.flow = flow

            def _add(self, node: cst.CSTNode, targets: set[str], value: cst.CSTNode) -> None:
                self.flow.assigns[id(self.flow.scope_of(node))].append((targets, value))

            def visit_Assign(self, node: cst.Assign) -> None:
                targets = set().union(*(used_names(t.target) for t in node.targets))
                self._add(node, targets, node.value)

            def visit_AugAssign(self, node: cst.AugAssign) -> None:
                self._add(node, used_names(node.target), node.value)

            def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
                if node.value is not None:
                    self._add(node, used_names(node.target), node.value)

            def visit_For(self, node: cst.For) -> None:
                self._add(node, used_names(node.target), node.iter)

            def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
                self._add(node, used_names(node.target), node.value)

        facts.module.visit(V(self))
        # Seeds: whatever is differentiated (loss.backward(), tape.gradient(loss, ...)).
        for call in facts.calls:
            m = method_name(call)
            scope = id(self.scope_of(call))
            if m == "backward" and receiver(call) is not None:
                self.tainted[scope].update(used_names(receiver(call)))  # type: ignore[arg-type]
            elif m == "gradient" and call.args:
                self.tainted[scope].update(used_names(call.args[0].value))

    def derived(self, scope: cst.CSTNode, node: cst.CSTNode) -> bool:
        """Does ``node`` (an expression) use a value derived from the loss?"""
        v = _Names()
        node.visit(v)
        if v.names & self.tainted[id(scope)] or any(_lossy(n) for n in v.names):
            return True
        return any(_lossy(method_name(c) or "")
                   or (isinstance(c.func, cst.Name) and c.func.value in self.returns_loss)
                   for c in v.calls)

    def _propagate(self) -> None:
        for _ in range(10):
            changed = False
            for scope in self.scopes:
                for targets, value in self.assigns[id(scope)]:
                    if not targets <= self.tainted[id(scope)] and self.derived(scope, value):
                        self.tainted[id(scope)] |= targets
                        changed = True
            for fn in self.facts.functions:
                if fn.name.value not in self.returns_loss and any(
                        isinstance(c, cst.Return) and c.value is not None and self.derived(fn, c.value)
                        and self.facts.function_of(c) is fn for c in self.facts.control):
                    self.returns_loss.add(fn.name.value)
                    changed = True
                if fn.name.value not in self.trains and self.node_trains(fn):
                    self.trains.add(fn.name.value)
                    changed = True
            if not changed:
                return

    def node_trains(self, node: cst.CSTNode) -> bool:
        """Does running ``node`` take a training step (directly or through the script's own
        functions)?"""
        for call in self.facts.calls_in(node):
            m = method_name(call)
            if m in _TRAINING_CALLS and isinstance(call.func, cst.Attribute):
                return True
            if m == "step" and "opt" in (root_name(receiver(call)) or "").lower() + _last(call):
                return True
            if (isinstance(call.func, cst.Name) and call.func.value in self.trains) or (
                    m in self.trains and isinstance(call.func, cst.Attribute)
                    and isinstance(call.func.value, cst.Name) and call.func.value.value == "self"):
                return True
        return False


def _last(call: cst.Call) -> str:
    """The attribute before ``.step`` (``optimizer`` of ``self.optimizer.step()``)."""
    r = receiver(call)
    return r.attr.value.lower() if isinstance(r, cst.Attribute) else ""


def divergent_exits(facts: Facts, flow: Flow) -> list[Finding]:
    """``break``/``continue``/``return`` under a loss-derived condition that ends training
    early on one rank, and ``while`` loops that train until the loss says stop."""
    out = []
    for node in facts.control:
        loops = facts.loops_around(node)
        fn = facts.function_of(node)
        if isinstance(node, cst.Return):
            ends = loops[-1] if loops else fn
        else:
            ends = loops[0] if loops else None
        if ends is None or not flow.node_trains(ends):
            continue
        scope = fn or facts.module
        cond = _condition_on_loss(facts, flow, scope, node, ends)
        if cond is not None:
            word = type(node).__name__.lower()
            out.append(Finding("loss_dependent_exit", facts.line(node),
                               f"a `{word}` taken when `{facts.code(cond).strip()}` holds ends training on "
                               "one rank while the others wait for it in the next allreduce (each "
                               "rank has its own loss); make the decision on rank 0 and broadcast it, "
                               "or stop after a fixed number of steps."))
    for loop in facts.loops:
        if isinstance(loop, cst.While) and flow.node_trains(loop.body):
            scope = facts.function_of(loop) or facts.module
            if flow.derived(scope, loop.test):
                out.append(Finding("loss_dependent_exit", facts.line(loop),
                                   f"the loop `while {facts.code(loop.test).strip()}` ends on a value "
                                   "derived from the loss, which differs between ranks, so one rank "
                                   "would stop while the others wait for it; loop a fixed number of steps."))
    return out


def _condition_on_loss(facts: Facts, flow: Flow, scope: cst.CSTNode, node: cst.CSTNode,
                       until: cst.CSTNode) -> cst.BaseExpression | None:
    child: cst.CSTNode = node
    for a in facts.ancestors(node):
        if a is until:
            return None
        if isinstance(a, cst.If) and child is not a.test and flow.derived(scope, a.test):
            return a.test
        child = a
    return None


# -- warnings ----------------------------------------------------------------------------

def downloads(facts: Facts) -> list[Finding]:
    out = []
    for call in facts.calls:
        name = facts.qname(call) or ""
        dl = keyword(call, "download")
        pretrained = keyword(call, "pretrained")
        weights = keyword(call, "weights")
        hit = (
            (dl is not None and _truthy(dl.value))
            or name in _DOWNLOADS
            or (name.startswith("keras.datasets.") and name.endswith(".load_data"))
            or (name.startswith("keras.applications.") and name.count(".") == 2 and name[19:20].isupper()
                and not (weights is not None and _is_none(weights.value)))
            or (name.startswith("torchvision.models.") and (
                (pretrained is not None and _truthy(pretrained.value))
                or (weights is not None and not _is_none(weights.value))))
            or name.endswith(".from_pretrained")
        )
        if hit:
            out.append(Finding("data_download", facts.line(call),
                               f"`{_short(facts.code(call))}` downloads data, and every rank would "
                               "download it at the same time into the same place: download it once "
                               "before starting the ranks, or hold a file lock around it "
                               "(filelock.FileLock(path + '.lock'))."))
    return out


def custom_train_steps(facts: Facts) -> list[Finding]:
    out = []
    for cls in facts.classes:
        for stmt in cls.body.body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == "train_step":
                out.append(Finding("custom_train_step", facts.line(stmt),
                                   f"`{cls.name.value}.train_step` is a custom Keras training step: "
                                   "Horovod's DistributedOptimizer averages gradients only inside "
                                   "Keras's own step (optimizer.minimize), so check that this one "
                                   "averages them (hvd.DistributedGradientTape around its tape)."))
    return out


def bare_apply_gradients(facts: Facts, tapes: set[str], skip: set[int]) -> list[Finding]:
    """``apply_gradients`` on gradients that no (wrapped) ``tape.gradient`` produced."""
    out = []
    flows: dict[int, set[str]] = {}
    for call in facts.calls:
        if method_name(call) != "apply_gradients" or id(call) in skip or not call.args:
            continue
        scope = facts.function_of(call) or facts.module
        if id(scope) not in flows:
            flows[id(scope)] = _gradient_names(facts, scope, tapes)
        direct = any(method_name(c) == "gradient" and root_name(receiver(c)) in tapes
                     for c in facts.calls_in(call.args[0].value))
        if not direct and not used_names(call.args[0].value) & flows[id(scope)]:
            out.append(Finding("bare_apply_gradients", facts.line(call),
                               f"`{_short(facts.code(call))}` applies gradients that no "
                               "GradientTape computed here, so Horovod does not average them "
                               "across ranks: average them with hvd.allreduce before applying."))
    return out


def _gradient_names(facts: Facts, scope: cst.CSTNode, tapes: set[str]) -> set[str]:
    names: set[str] = set()
    assigns = []

    class V(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            if (facts.function_of(node) or facts.module) is scope:
                assigns.append((set().union(*(used_names(t.target) for t in node.targets)), node.value))

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            if (facts.function_of(node) or facts.module) is scope:
                assigns.append((used_names(node.target), node.value))

    scope.visit(V())
    # the script's functions that compute gradients with a tape and return something
    makers = {f.name.value for f in facts.functions
              if any(method_name(c) == "gradient" and root_name(receiver(c)) in tapes for c in facts.calls_in(f))
              and any(isinstance(r, cst.Return) and r.value is not None and facts.function_of(r) is f
                      for r in facts.control)}
    for _ in range(5):
        for targets, value in assigns:
            grads = any((method_name(c) == "gradient" and root_name(receiver(c)) in tapes)
                        or (isinstance(c.func, cst.Name) and c.func.value in makers)
                        for c in facts.calls_in(value))
            if (grads or used_names(value) & names) and not targets <= names:
                names |= targets
    return names


def _truthy(node: cst.BaseExpression) -> bool:
    return not (isinstance(node, cst.Name) and node.value in ("False", "None"))


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _short(code: str, limit: int = 60) -> str:
    code = " ".join(code.split())
    return code if len(code) <= limit else code[: limit - 3] + "..."


_SEEDS = ("numpy.random.seed", "random.seed", "torch.manual_seed", "tensorflow.random.set_seed",
          "keras.utils.set_random_seed", "tensorflow.keras.utils.set_random_seed", "tensorflow.set_random_seed")
_SHUFFLES = ("numpy.random.permutation", "numpy.random.shuffle", "random.shuffle")


def unseeded_shuffles(facts: Facts) -> list[Finding]:
    """Data shuffled before it is split across ranks, with no seed: each rank draws its own
    order, so the shards overlap and some samples are never seen."""
    if any((facts.qname(c) or "") in _SEEDS for c in facts.calls):
        return []
    out = []
    for call in facts.calls:
        name = facts.qname(call) or ""
        if name in _SHUFFLES or (name == "sklearn.model_selection.train_test_split"
                                 and keyword(call, "random_state") is None):
            out.append(Finding("unseeded_shuffle", facts.line(call),
                               f"`{_short(facts.code(call))}` shuffles without a seed, so each rank gets "
                               "another order and the shards overlap: seed it the same on every rank."))
    return out
