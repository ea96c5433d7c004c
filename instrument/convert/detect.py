"""Which framework a script trains with, read from its imports and calls; whether it is
already distributed; whether it is our own output.

Our output carries a marker on its ``hvd.init()`` line, so converting it again is a no-op,
while any other script that imports Horovod (or torch.distributed, DataParallel, mp.spawn, a
tf.distribute strategy, MPI) is refused: converting it would distribute it twice.
"""

from __future__ import annotations

import re

import libcst as cst

from instrument.convert.facts import Facts, dotted, method_name
from instrument.convert.report import Finding

MARK = "instrument horovodize"
INIT_COMMENT = f"# added by {MARK}"
_MARKED = re.compile(r"^[ \t]*hvd\.init\(\)[ \t]*#.*" + re.escape(MARK), re.MULTILINE)

PYTORCH, KERAS, TENSORFLOW = "pytorch", "keras", "tensorflow"

# Library names that mean "already distributed" (prefixes), with what to call them.
_DISTRIBUTED = (
    ("horovod", "Horovod"),
    ("torch.distributed", "torch.distributed"),
    ("torch.nn.parallel.DistributedDataParallel", "DistributedDataParallel"),
    ("torch.nn.parallel.distributed", "DistributedDataParallel"),
    ("torch.nn.DataParallel", "DataParallel"),
    ("torch.nn.parallel.DataParallel", "DataParallel"),
    ("torch.nn.parallel.data_parallel", "DataParallel"),
    ("torch.multiprocessing.spawn", "torch.multiprocessing.spawn"),
    ("torch.multiprocessing.start_processes", "torch.multiprocessing.start_processes"),
    ("mpi4py", "mpi4py"),
    ("accelerate.Accelerator", "Hugging Face Accelerate"),
)


def already_converted(source: str) -> bool:
    """True for a script ``instrument horovodize`` wrote (its ``hvd.init()`` line is marked)."""
    return _MARKED.search(source) is not None


def distributed(facts: Facts) -> Finding | None:
    """The first sign that the script already runs on several processes, as a refusal."""
    for imp in facts.imports:
        names = _imported_names(imp)
        for name in names:
            what = _distributed_name(name)
            if what:
                return _refuse(facts, imp, what)
    for call in facts.calls:
        name = facts.qname(call) or ""
        what = _distributed_name(name)
        if not what and name.startswith("tensorflow.distribute.") and name.endswith("Strategy"):
            what = f"a tf.distribute strategy ({name.rpartition('.')[2]})"
        if not what and name.startswith("tensorflow.distribute.experimental.") and name.endswith("Strategy"):
            what = f"a tf.distribute strategy ({name.rpartition('.')[2]})"
        if what:
            return _refuse(facts, call, what)
    return None


def _imported_names(imp: cst.Import | cst.ImportFrom) -> list[str]:
    if isinstance(imp, cst.Import):
        return [n for n in (dotted(a.name) for a in imp.names) if n]
    base = dotted(imp.module) if imp.module is not None and not imp.relative else None
    if not base:
        return []
    if isinstance(imp.names, cst.ImportStar):
        return [base]
    return [base] + [f"{base}.{a.name.value}" for a in imp.names if isinstance(a.name, cst.Name)]


def _distributed_name(name: str) -> str | None:
    for prefix, what in _DISTRIBUTED:
        if name == prefix or name.startswith(prefix + "."):
            return what
    return None


def _refuse(facts: Facts, node: cst.CSTNode, what: str) -> Finding:
    return Finding("already_distributed", facts.line(node),
                   f"the script is already distributed (it uses {what}); convert the "
                   "single-process version instead.")


def framework(facts: Facts) -> tuple[str | None, Finding | None]:
    """``pytorch``, ``keras`` (compile and fit) or ``tensorflow`` (a GradientTape loop), or a
    refusal when the imports say none or more than one."""
    roots = facts.imported_roots()
    torch = "torch" in roots
    tf = bool(roots & {"tensorflow", "keras", "tf_keras"})
    if torch and tf:
        return None, Finding("ambiguous_framework", None,
                             "the script imports both PyTorch and TensorFlow/Keras; convert a "
                             "script that trains with one of them.")
    if torch:
        return PYTORCH, None
    if not tf:
        return None, Finding("no_framework", None,
                             "the script imports neither PyTorch nor TensorFlow/Keras, so there "
                             "is nothing to convert.")
    tapes = [w for w in facts.withs if gradient_tapes(facts, w) and not in_keras_train_step(facts, w)]
    fits = [c for c in facts.calls if method_name(c) in ("fit", "fit_generator") and isinstance(c.func, cst.Attribute)]
    if tapes and fits:
        return None, Finding("ambiguous_framework", facts.line(tapes[0]),
                             f"the script trains both with model.fit (line {facts.line(fits[0])}) "
                             "and with a GradientTape loop; convert one training loop at a time.")
    return (TENSORFLOW if tapes else KERAS), None


def gradient_tapes(facts: Facts, with_node: cst.With) -> list[str]:
    """The names a ``with tf.GradientTape() as tape`` statement binds (several for GANs)."""
    out = []
    for item in with_node.items:
        if (isinstance(item.item, cst.Call) and facts.qname(item.item) == "tensorflow.GradientTape"
                and item.asname is not None and isinstance(item.asname.name, cst.Name)):
            out.append(item.asname.name.value)
    return out


def in_keras_train_step(facts: Facts, node: cst.CSTNode) -> bool:
    """Inside a ``train_step`` method of a class (a custom Keras ``Model.train_step``)."""
    fn = facts.function_of(node)
    return fn is not None and fn.name.value == "train_step" and any(
        isinstance(a, cst.ClassDef) for a in facts.ancestors(fn))
