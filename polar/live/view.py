"""The live view as one snapshot: the fleet read from the store, each gateway's load scraped from its
``/metrics``, the alarms of the window, and (when asked) the learning curves. The web UI's ``/ui/live`` and
``polar status`` both render it; ``LiveView`` keeps the scraper (rates need the previous scrape) between calls.

A silent gateway's alarm is counted in ``/metrics`` once per silence by the process that first shows it; the
batch alarms are counted by the batch flow that raised them, not here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from polar.alarms import Alarm, AlarmKind, count_alarms, notify_fleet, recent_alarms
from polar.clock import now
from polar.live.curves import Curves, learning_curves
from polar.live.fleet import FleetState, GatewayEntry, GatewayState, fleet_state, state_of
from polar.live.scrape import GatewayLoad, Scraper
from polar.settings import Settings
from polar.store_bound import in_store


@dataclass(frozen=True)
class GatewayView:
    entry: GatewayEntry
    state: GatewayState
    load: GatewayLoad | None


@dataclass(frozen=True)
class LiveSnapshot:
    fleet: FleetState
    gateways: list[GatewayView]
    alarms: list[Alarm]
    curves: Curves | None


class LiveView:
    def __init__(self, settings: Settings, factory: sessionmaker[Session], token: str | None):
        self.settings = settings
        self.factory = factory
        self.scraper = Scraper(token)

    def _read(self, curves: bool) -> tuple[FleetState, list[Alarm], Curves | None]:
        at = now()
        with self.factory() as db:
            fleet = fleet_state(db, self.settings, at)
            alarms = recent_alarms(db, self.settings, at)
            return fleet, alarms, learning_curves(db) if curves else None

    async def snapshot(self, *, curves: bool = False) -> LiveSnapshot:
        # Bounded like every store read of ``polar serve``: a frozen store is a shaped 503, never a page that hangs.
        fleet, alarms, learned = await in_store(self._read, curves, timeout_s=self.settings.store_statement_timeout_s)
        stale = self.settings.gateway_stale_s
        reachable = [(g.id, g.url) for g in fleet.gateways if not g.stopped and g.silent_s <= stale]
        loads = await self.scraper.scrape(reachable) if reachable else {}
        gateways = [
            GatewayView(g, state_of(g, stale, loads.get(g.id) is not None), loads.get(g.id)) for g in fleet.gateways
        ]
        silent = [a for a in alarms if a.kind is AlarmKind.GATEWAY_SILENT]
        count_alarms(silent, once=True)
        if silent and self.settings.fleet_webhook_url:  # no batch, no task: the fleet's own webhook
            await asyncio.to_thread(notify_fleet, self.settings.fleet_webhook_url, silent)
        return LiveSnapshot(fleet, gateways, alarms, learned)
