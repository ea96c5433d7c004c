"""How the ``analyze`` command's process keeps the memory it frees (glibc's malloc only).

A build hands the same large arrays round again and again: every chunk of events becomes
columns of hundreds of thousands of rows in C, numpy temporaries and Parquet pages, a few
hundred MB per 10M events, freed a moment later. With glibc's defaults most of that memory
goes back to the kernel when it is freed (arrays over the mmap threshold are unmapped, each
thread's arena is trimmed) and the next chunk faults it in again, zeroed: measured on this
project's 2-core VM, a 10M-event build spent 30% of its CPU time in the kernel, on 150k page
faults. :func:`keep_freed_memory` makes the process keep it instead:

- ``M_ARENA_MAX`` 1: the build's threads share the main heap (thread arenas are trimmed with
  ``madvise`` whenever their top is free);
- ``M_MMAP_THRESHOLD`` 32 MiB (glibc's largest dynamic threshold): blocks below it come from
  the heap, whose freed memory the next block reuses, instead of their own mapping;
- ``M_TRIM_THRESHOLD`` 512 MiB: the heap's free top goes back to the kernel only beyond that.

Measured (bench/HISTORY.md, "Issue 19, fifth pass"; the build alone, interleaved): page faults
160k -> 93k, kernel time 0.65 -> 0.46 s, CPU time 2.25 -> 2.13 s. The cost is memory held
after a peak (up to the trim threshold), which suits a command that builds and exits. DuckDB
allocates its buffers with its own jemalloc, but its idle background threads call glibc's
``malloc_trim``, which undoes all of this: a build's DuckDB instances have none
(analyze/tables/stages.py, ``ONE_THREAD``).

The ``analyze`` command applies this when it starts, before any thread exists (a thread that
has made its own arena keeps it). A library user's process is left alone: ``analyze.build``
from a notebook does not change how the notebook's process allocates. Elsewhere than glibc
(macOS, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import os
import threading

# glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

SETTINGS = ((M_ARENA_MAX, 1), (M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 512 << 20))
WARM_BLOCK = 16 << 20  # under the mmap threshold: the blocks come from the heap, and stay in it
_kept = False  # whether keep_freed_memory took effect in this process


def keep_freed_memory() -> bool:
    """Apply :data:`SETTINGS` to this process's malloc; True where glibc took all of them."""
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return False
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already uses
    except (ValueError, OSError, AttributeError):  # no such name (not glibc), no symbol
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    global _kept
    _kept = all(mallopt(param, value) == 1 for param, value in SETTINGS)
    return _kept


def warm(nbytes: int) -> threading.Thread | None:
    """Fault in about ``nbytes`` of heap on a thread of its own, then free it: once freed it
    stays in the heap (:func:`keep_freed_memory`), and what a build allocates next is mapped
    already. The ``analyze`` command calls it before it imports its libraries, which take one
    core for half a second while the other ones idle: a 10M-event build then takes 6-9k page
    faults instead of 55k, and about 5% less time (bench/HISTORY.md, "Session 25"). Nothing where
    :func:`keep_freed_memory` did not take effect (the freed blocks would go back at once).
    Returns the thread (None: nothing to do); nobody needs to wait for it."""
    if not _kept or nbytes < WARM_BLOCK:
        return None
    libc = ctypes.CDLL(None)
    malloc, free = libc.malloc, libc.free
    malloc.argtypes, malloc.restype = (ctypes.c_size_t,), ctypes.c_void_p
    free.argtypes, free.restype = (ctypes.c_void_p,), None

    def touch() -> None:
        blocks = []
        try:
            for _ in range(nbytes // WARM_BLOCK):
                block = malloc(WARM_BLOCK)
                if not block:  # no memory to spare: what is touched so far will do
                    break
                blocks.append(block)
                ctypes.memset(block, 0, WARM_BLOCK)  # every page written (calloc would skip them)
        finally:
            for block in blocks:
                free(block)

    thread = threading.Thread(target=touch, name="analyze-heap-warm", daemon=True)
    thread.start()
    return thread
