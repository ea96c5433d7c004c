"""Figures for papers: plotnine builders (pure functions from tables to a ggplot) and the PDF.

The tables come from :mod:`analyze.views`; nothing here computes anything about a trace.
"""
