"""The report: ``summary.json`` (every figure, machine-readable) and one self-contained ``report.html``."""

from specledger.report.build import build_report, render_html

__all__ = ["build_report", "render_html"]
