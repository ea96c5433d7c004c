"""Run a callback right after a module is imported, so hooks attach to unmodified scripts.

A meta-path finder delegates the search to the other finders and wraps the loader of the
watched module names; the callback runs once the module body has executed and before the
importing code sees the module. Modules already imported get their callback at once.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, callback: Callback):
        self._inner = inner
        self._callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._callback(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._inner, name)


class PostImportHooks(importlib.abc.MetaPathFinder):
    """``hooks.on("torch", fn)``: call ``fn(torch)`` once torch has been imported."""

    def __init__(self) -> None:
        self._callbacks: dict[str, Callback] = {}
        self._searching = threading.local()

    def on(self, name: str, callback: Callback) -> None:
        module = sys.modules.get(name)
        if module is not None:
            callback(module)
            return
        self._callbacks[name] = callback
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        callback = self._callbacks.get(fullname)
        if callback is None or getattr(self._searching, fullname, False):
            return None
        setattr(self._searching, fullname, True)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            setattr(self._searching, fullname, False)
        if spec is None or spec.loader is None:
            return spec
        del self._callbacks[fullname]
        spec.loader = _Loader(spec.loader, callback)
        return spec
