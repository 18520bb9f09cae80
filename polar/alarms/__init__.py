"""Alarms: a batch that goes silently wrong (rewards all 0 or all 1, empty patches, harnesses that never called the
model, infrastructure failures) and gateways that stopped sending heartbeats.

``checks`` reads the store and decides (``batch_alarms`` over a batch's rollouts, ``recent_alarms`` over the live
view's window); ``notify`` counts each alarm in ``/metrics`` and posts it to its tasks' webhooks. The batch flow
also writes them as a Prefect artifact (``flows.alarms``). Thresholds are settings (``POLAR_ALARM_*``).
"""

from polar.alarms.checks import Outcome, batch_alarms, evaluate, gateway_alarms, outcomes, recent_alarms
from polar.alarms.kinds import Alarm, AlarmKind
from polar.alarms.notify import count_alarms, notify_fleet, notify_webhooks

__all__ = [
    "Alarm",
    "AlarmKind",
    "Outcome",
    "batch_alarms",
    "count_alarms",
    "evaluate",
    "gateway_alarms",
    "notify_fleet",
    "notify_webhooks",
    "outcomes",
    "recent_alarms",
]
