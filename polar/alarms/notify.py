"""Where alarms go besides the live view: ``polar_alarms_total{kind}`` in ``/metrics`` and the webhooks of the
tasks they are about (one POST per task's ``callback_url``, ``X-Polar-Event: alarm``, tried once: an alarm is a
signal, not a delivery the receiver must get; the batch's Prefect artifact and the live view keep it)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import httpx
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.models import Task
from polar import metrics
from polar.alarms.kinds import Alarm

log = logging.getLogger(__name__)
TIMEOUT_S = 5.0
_counted: set[tuple[str, str, str]] = set()


def count_alarms(alarms: Sequence[Alarm], *, once: bool = False) -> None:
    """Count each alarm in ``polar_alarms_total``; with ``once``, one this process has counted before is not
    counted again (the live view re-evaluates on every refresh)."""
    for alarm in alarms:
        key = (alarm.kind.value, alarm.scope, alarm.message)
        if once and key in _counted:
            continue
        _counted.add(key)
        metrics.ALARMS.labels(alarm.kind.value).inc()


def notify_webhooks(factory: sessionmaker[Session], alarms: Sequence[Alarm]) -> int:
    """POST each alarm to the webhook of every task it names that has one (blocking); returns how many arrived."""
    task_ids = sorted({t for alarm in alarms for t in alarm.task_ids})
    if not task_ids:
        return 0
    with factory() as db:
        urls = {
            row.id: row.callback_url
            for row in db.execute(sa.select(Task.id, Task.callback_url).where(Task.id.in_(task_ids)))
        }
    delivered = 0
    with httpx.Client(timeout=TIMEOUT_S) as client:
        for alarm in alarms:
            for task_id in alarm.task_ids:
                url = urls.get(task_id)
                if not url:
                    continue
                body = {"event": "alarm", "task_id": task_id, **alarm.as_json()}
                try:
                    reply = client.post(url, json=body, headers={"X-Polar-Event": "alarm"})
                    delivered += 200 <= reply.status_code < 300
                except httpx.HTTPError as exc:
                    log.warning("alarm %s: webhook of task %s failed: %s", alarm.kind.value, task_id, exc)
    return delivered


_posted: set[tuple[str, str, str]] = set()


def notify_fleet(url: str, alarms: Sequence[Alarm]) -> int:
    """POST each fleet alarm (one about no task: a silent gateway) to ``POLAR_FLEET_WEBHOOK_URL`` once per process
    (``{"event": "fleet_alarm", ...}``, ``X-Polar-Event: fleet_alarm``; the live view re-evaluates on every refresh
    and a silence keeps its message while it lasts); returns how many arrived. Blocking; tried once."""
    delivered = 0
    with httpx.Client(timeout=TIMEOUT_S) as client:
        for alarm in alarms:
            key = (alarm.kind.value, alarm.scope, alarm.message)
            if key in _posted:
                continue
            _posted.add(key)
            try:
                reply = client.post(
                    url, json={"event": "fleet_alarm", **alarm.as_json()}, headers={"X-Polar-Event": "fleet_alarm"}
                )
                delivered += 200 <= reply.status_code < 300
            except httpx.HTTPError as exc:
                log.warning("alarm %s: fleet webhook failed: %s", alarm.kind.value, exc)
    return delivered
