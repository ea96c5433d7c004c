"""Figures for papers: plotnine builders (pure functions from tables to a ggplot) and the PDF.

Owns the theme and palette (:mod:`.theme`), the figures of a run (:mod:`.figures`) and of a
sweep (:mod:`.scaling`), and the PDF assembly (:mod:`.report`, :mod:`.page`).

May import: :mod:`analyze` (the tables come from :mod:`analyze.views` and the analyses;
nothing here computes anything about a trace), never ``analyze.cli`` or ``instrument``.
"""
