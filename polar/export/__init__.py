"""Exports of trajectories for training: RL rows and SFT conversations, as JSONL or parquet, streamed.

``export(factory, settings, path, kind=..., filters=ExportFilter(...))``; ``ExportFilter`` and ``Acceptance``
choose the rows (``filters``); ``conversations`` rebuilds OpenAI-style messages from captures. ``sft`` is SFT data
generation without Prefect (a task dataset in, accepted conversations out; ``flows.sft`` wraps it).
"""

from polar.export.filters import Acceptance, ExportFilter
from polar.export.writer import ExportKind, ExportReport, export, rows

__all__ = ["Acceptance", "ExportFilter", "ExportKind", "ExportReport", "export", "rows"]
