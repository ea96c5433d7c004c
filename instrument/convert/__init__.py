"""Source-to-source conversion: ``instrument horovodize`` turns a single-process PyTorch,
Keras or TensorFlow 2 training script into a Horovod one.

Owns the conversion only: reading the script (:mod:`.facts`), deciding what to refuse or warn
about (:mod:`.detect`, :mod:`.checks`), the rules per framework (:mod:`.torch_rules` and
:mod:`.torch_data`, :mod:`.keras_rules`, :mod:`.tf_rules` and :mod:`.tf_common`, what all
share in :mod:`.common_rules`), applying the edits so that every untouched byte stays as it
was (:mod:`.edits`), and the report (:mod:`.report`). The entry a notebook calls is
:func:`convert` (:mod:`.api`).

May import libcst and :mod:`instrument.errors` only; nothing here runs or traces a script.
"""

from __future__ import annotations

from instrument.convert.api import convert
from instrument.convert.common_rules import Options
from instrument.convert.report import Applied, Finding, Result

__all__ = ["Applied", "Finding", "Options", "Result", "convert"]
