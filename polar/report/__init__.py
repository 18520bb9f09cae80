"""``polar report``: a run or a date range summarised as PNG plots and one self-contained HTML page."""

from polar.report.build import Report, build_report

__all__ = ["Report", "build_report"]
