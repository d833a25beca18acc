"""`rltrace report`: every analysis of a run as one dict (`build`), sentences (`findings`),
a terminal rendering (`render`) and a side-by-side comparison of two runs (`compare`)."""

from rltrace.report.build import build, plain
from rltrace.report.compare import compare
from rltrace.report.render import render, render_compare

__all__ = ["build", "plain", "compare", "render", "render_compare"]
