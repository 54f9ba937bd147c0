"""The report: renders a run's summary (:mod:`specledger.report.summary`, written as ``summary.json``) as one
self-contained ``report.html``, and prints it on the console (``cli.py``)."""

from specledger.report.build import build_report, render_html

__all__ = ["build_report", "render_html"]
