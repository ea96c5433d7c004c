"""Designed experiments: factors and levels from a TOML design (:mod:`.design`), every
configuration run replicated in a randomized, resumable order (:mod:`.sweep`).

May import: :mod:`instrument.launch` (each run is an ``instrument run``) and
:mod:`instrument.errors`. Analysis of a sweep is ``analyze compare``'s, in ``analyze``.
"""
