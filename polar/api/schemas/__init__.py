"""The control API's wire models (pydantic): request bodies (``requests``) and a reply model per route, by
resource. Every route declares its reply, so the OpenAPI spec at ``/openapi.json`` shows real bodies."""

from polar.api.schemas.base import Reply
from polar.api.schemas.requests import (
    ClaimRequest,
    RenewRequest,
    RequestBody,
    TaskBatch,
    TrainerBody,
    WeightsRequest,
)
from polar.api.schemas.rollouts import EvaluationView, RolloutDetail, RolloutStats, RolloutView, TokenRecord
from polar.api.schemas.service import ErrorDetail, ErrorReply, Health, ModelInfo, TokenizerInfo
from polar.api.schemas.tasks import (
    Cancelled,
    Submitted,
    SubmittedTask,
    TaskList,
    TaskRollout,
    TaskSummary,
    TaskView,
)
from polar.api.schemas.trainer import Acked, ClaimedBatch, FeedGroup, FeedTrajectory, Released, Renewed
from polar.api.schemas.trajectories import (
    RoutedExperts,
    TopLogprobs,
    TrajectoryExtrasView,
    TrajectoryList,
    TrajectoryView,
)
from polar.api.schemas.weights import Published, PushView, Versions, VersionView

__all__ = [
    "Acked",
    "Cancelled",
    "ClaimRequest",
    "ClaimedBatch",
    "ErrorDetail",
    "ErrorReply",
    "EvaluationView",
    "FeedGroup",
    "FeedTrajectory",
    "Health",
    "ModelInfo",
    "Published",
    "PushView",
    "Released",
    "RenewRequest",
    "Renewed",
    "Reply",
    "RequestBody",
    "RolloutDetail",
    "RolloutStats",
    "RolloutView",
    "RoutedExperts",
    "Submitted",
    "SubmittedTask",
    "TaskBatch",
    "TaskList",
    "TaskRollout",
    "TaskSummary",
    "TaskView",
    "TokenRecord",
    "TokenizerInfo",
    "TopLogprobs",
    "TrainerBody",
    "TrajectoryExtrasView",
    "TrajectoryList",
    "TrajectoryView",
    "Versions",
    "VersionView",
    "WeightsRequest",
]
