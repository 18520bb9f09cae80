"""A batch's alarms (``polar.alarms``) once its rollouts have finished: counted in ``/metrics``, posted to the
webhooks of the tasks they name, and written as a markdown artifact (``polar-alarms``) on the batch's flow run,
where the Prefect UI shows it next to the batch's table. A healthy batch writes none."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from prefect.artifacts import acreate_markdown_artifact
from sqlalchemy.orm import Session, sessionmaker

from polar.alarms import Alarm, batch_alarms, count_alarms, notify_webhooks
from polar.settings import Settings

log = logging.getLogger(__name__)


def alarms_markdown(alarms: Sequence[Alarm]) -> str:
    lines = ["# Polar alarms", "", "| kind | scope | what | value | threshold |", "|---|---|---|---|---|"]
    for alarm in alarms:
        message = alarm.message.replace("|", "\\|")
        lines.append(f"| {alarm.kind.value} | {alarm.scope} | {message} | {alarm.value:g} | {alarm.threshold:g} |")
    return "\n".join(lines) + "\n"


async def raise_batch_alarms(
    factory: sessionmaker[Session], settings: Settings, rollout_ids: Sequence[str]
) -> list[Alarm]:
    """Decide the batch's alarms and send them everywhere they go; returns them."""

    def decide() -> list[Alarm]:
        with factory() as db:
            return batch_alarms(db, settings, rollout_ids)

    alarms = await asyncio.to_thread(decide)
    if not alarms:
        return []
    count_alarms(alarms)
    for alarm in alarms:
        log.warning("alarm %s: %s", alarm.kind.value, alarm.message)
    try:
        await acreate_markdown_artifact(
            alarms_markdown(alarms), key="polar-alarms", description=f"{len(alarms)} Polar alarms of this batch"
        )
    except Exception:
        log.warning("could not publish the alarms artifact", exc_info=True)
    await asyncio.to_thread(notify_webhooks, factory, alarms)
    return alarms
