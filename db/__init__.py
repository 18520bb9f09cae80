"""Polar's store: typed SQLAlchemy models, portable column types, engines and Alembic migrations.

Import absolutely (``from db.models import Capture``); ``db`` is a generic top-level name. Modules:
``db.models`` (tables), ``db.enums`` (statuses), ``db.types`` (portable columns), ``db.engine`` (engines and
sessions), ``db.capture_tree`` (rebuilding prompts from the capture tree), ``db.migrate`` (Alembic).
"""

from db.capture_tree import CaptureTreeError, chain_to_root, full_prompt_ids, prompt_from_chain
from db.engine import make_engine, make_session_factory, normalize_url, session_scope
from db.enums import CaptureStatus, RolloutStatus, TaskStatus
from db.models import Base, Capture, Evaluation, Rollout, Task, Trajectory, WeightVersion

__all__ = [
    "Base",
    "Capture",
    "CaptureStatus",
    "CaptureTreeError",
    "Evaluation",
    "Rollout",
    "RolloutStatus",
    "Task",
    "TaskStatus",
    "Trajectory",
    "WeightVersion",
    "chain_to_root",
    "full_prompt_ids",
    "make_engine",
    "make_session_factory",
    "normalize_url",
    "prompt_from_chain",
    "session_scope",
]
