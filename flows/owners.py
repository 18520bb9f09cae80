"""Whether a rollout's owning flow run is still running, as the Prefect server knows it (``state.OwnerProbe``).

A takeover needs the owner's heartbeat silent and this probe to say its flow run is not running:

- an owner that is not a Prefect flow run id (a driver without Prefect), or a flow run the server does not know,
  is not running: the stale heartbeat decides;
- a flow run in a final state (Completed, Failed, Crashed, Cancelled) is not running;
- a flow run Prefect still has Running, Pending or Cancelling is running, unless its heartbeat has been silent
  for the retry's ``stale_after_s`` (``polar retry --stale-after``; default the fleet's ``POLAR_STALE_AFTER_S``):
  a flow process killed with its worker never reports its end, and every live owner refreshes its heartbeat
  every ``POLAR_HEARTBEAT_S`` from claim to end. Such a run is marked Crashed on the server, so the Prefect UI
  tells the same story. A retry's silence is never shorter than ``LIVE_BEATS`` heartbeats: a live owner is
  never that silent, which is what keeps a second retry run off a rollout a first one drives.
"""

from __future__ import annotations

import logging
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect.states import Crashed

from polar.rollout.state.ownership import OwnerProbe
from polar.settings import Settings

log = logging.getLogger(__name__)
LIVE_BEATS = 3
"""Heartbeats a running owner may miss (a slow store, a busy loop) and still be taken for alive."""


def prefect_owner_probe(settings: Settings, stale_after_s: float | None = None) -> OwnerProbe:
    """The probe of a claim; ``stale_after_s``: the retry's (None: ``POLAR_STALE_AFTER_S``)."""
    if stale_after_s is None:
        silence_s = settings.stale_after_s
    else:
        silence_s = max(stale_after_s, LIVE_BEATS * settings.heartbeat_s)

    def gone(owner: str, silent_s: float) -> bool:
        try:
            flow_run_id = UUID(owner)
        except ValueError:
            return True
        with get_client(sync_client=True) as client:
            try:
                run = client.read_flow_run(flow_run_id)
            except ObjectNotFound:
                return True
            if run.state is None or run.state.is_final():
                return True
            if silent_s < silence_s:
                return False
            message = f"polar: no rollout heartbeat for {silent_s:.0f} s (over {silence_s:g} s); its process is gone"
            log.warning("flow run %s: %s", owner, message)
            client.set_flow_run_state(flow_run_id, Crashed(message=message), force=True)
            return True

    return gone
