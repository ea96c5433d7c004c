"""From a region's name to the name patterns are matched against (its *match name*).

A C++ function reaches a trace under several spellings: Score-P's GCC plugin writes the
compiler's printable name (``Al::Allreduce``, or ``void Al::Allreduce(const T*, ...) [with
Backend = NCCLBackend; ...]``) with the mangled name as the canonical name; clang-based
Score-P writes the demangled signature with the mangled one as canonical; sampling tools add
``[clone .cold]``. The match name is the same for all of them: the demangled canonical name
when the trace has a mangled one (else the name), without return type, parameter list and
suffixes, keeping template arguments and namespaces::

    _ZN2Al9AllreduceINS_11NCCLBackendEfEEvPKT0_PS3_mNS_17ReductionOperatorERNT_9comm_typeENS7_19allreduce_algo_typeE
    -> Al::Allreduce<Al::NCCLBackend, float>

Names that are not C++ signatures (Python ``module:function``, NVTX range names, C
functions) are their own match name.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
from collections.abc import Sequence
from typing import Any

_SUFFIX = re.compile(r"(?:\s+\[(?:clone|with|abi:)[^\]]*\])+$")


@functools.cache
def _cxa_demangle() -> tuple[Any, Any] | None:
    """libstdc++'s demangler (the one c++filt uses) and libc's free, or None where they
    cannot be loaded (then names are matched as written)."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
        libc = ctypes.CDLL(None)
        fn = lib.__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    libc.free.argtypes = [ctypes.c_void_p]
    return fn, libc.free


def demangle(symbol: str) -> str | None:
    """The demangled form of an Itanium C++ ABI symbol (``_Z...``), or None if it is not one."""
    if not symbol.startswith("_Z"):
        return None
    found = _cxa_demangle()
    if found is None:
        return None
    fn, free = found
    status = ctypes.c_int()
    out = fn(symbol.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not out:
        return None
    try:
        return ctypes.string_at(out).decode(errors="replace")
    finally:
        free(out)


_BRACKETS = re.compile(r"[<>()]")
_BRACKETS_OR_SPACE = re.compile(r"[<>() ]")


def _function_part(signature: str) -> str:
    """``void ns::f<T>(int) const`` -> ``ns::f<T>``; text without a parameter list unchanged.

    The parameter list is the first ``(`` outside template brackets that does not open
    ``(anonymous namespace)`` (which follows ``::`` or starts the name) or follow
    ``operator``; the return type is what comes before the last space outside brackets.
    """
    if "(" not in signature:
        return signature
    depth = 0
    cut = -1
    for m in _BRACKETS.finditer(signature):
        ch, i = m.group(), m.start()
        if ch == "(" and depth == 0 and i > 0 and not signature.startswith("(anonymous", i) \
                and not signature.endswith("operator", 0, i):
            cut = i
            break
        depth = depth + 1 if ch in "<(" else max(0, depth - 1)
    if cut < 0:
        return signature
    head = signature[:cut].rstrip()
    depth = 0
    start = 0
    for m in _BRACKETS_OR_SPACE.finditer(head):
        ch = m.group()
        if ch == " ":
            if depth == 0:
                start = m.start() + 1
        else:
            depth = depth + 1 if ch in "<(" else max(0, depth - 1)
    return head[start:]


@functools.lru_cache(maxsize=65536)
def match_name(name: str, canonical: str | None = None) -> str:
    """The name patterns are matched against (see the module docstring)."""
    text = demangle(canonical) if canonical else None
    if text is None:
        text = demangle(name) or name
    text = text.strip()
    if "[" in text:
        text = _SUFFIX.sub("", text)
    return _function_part(text)


_CLOSE = {"<": ">", "(": ")"}


def short_name(name: str, width: int = 72) -> str:
    """A region or kernel name that fits in ``width`` characters for a table or an axis: a
    mangled C++ symbol (``_Z...``, as CUPTI names kernels in Score-P traces) is demangled; a
    long C++ signature loses its leading ``void`` and the contents of its template arguments
    and parameter lists (``foo<...>(...)``), and what is still too long is cut, ending in
    ``...``. Shorter names are returned as they are."""
    name = _demangled(name)
    if len(name) <= width:
        return name
    text = _collapsed(name.removeprefix("void "), "<(")
    return text if len(text) <= width else text[: width - 3] + "..."


def short_names(names: Sequence[str], width: int = 72) -> list[str]:
    """:func:`short_name` of each of ``names``, such that different names stay different: where
    several shorten alike (template instances of one kernel, ``foo<float, 2ul>`` and
    ``foo<float, 5ul>``), those keep their template arguments and are cut in the middle
    instead; any still alike are numbered (`` #2``, ...) in order."""
    out = [short_name(n, width) for n in names]
    alike: dict[str, set[str]] = {}
    for name, short in zip(names, out, strict=True):
        alike.setdefault(short, set()).add(name)
    for i, name in enumerate(names):
        if len(alike[out[i]]) > 1:
            out[i] = cut_middle(_collapsed(_demangled(name).removeprefix("void "), "("), width)
    numbers: dict[str, dict[str, int]] = {}  # short -> name -> its number among them
    for i, name in enumerate(names):
        seen = numbers.setdefault(out[i], {})
        k = seen.setdefault(name, len(seen) + 1)
        if k > 1:
            out[i] = f"{out[i]} #{k}"
    return out


def _demangled(name: str) -> str:
    """A mangled C++ symbol (``_Z...``) demangled, any other name as it is."""
    return (demangle(name) or name) if name.startswith("_Z") else name


def _collapsed(text: str, opening: str) -> str:
    """``text`` with the contents of every outermost bracket that opens with a character of
    ``opening`` replaced by ``...``; unchanged if those brackets do not balance."""
    out: list[str] = []
    stack: list[str] = []
    for ch in text:
        if not stack and ch in opening:
            out.append(ch + "...")
            stack.append(_CLOSE[ch])
        elif stack and ch in _CLOSE:
            stack.append(_CLOSE[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                out.append(ch)
        elif not stack:
            out.append(ch)
    return text if stack else "".join(out)


def cut_middle(text: str, width: int) -> str:
    """``text`` in ``width`` characters: its start and its end, ``...`` between them."""
    if len(text) <= width:
        return text
    head = max(1, (width - 3) // 2)
    return text[:head] + "..." + text[len(text) - (width - 3 - head):]
