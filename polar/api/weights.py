"""Publishing a new weight version: push it to every gateway's backend, then record it as current.

A gateway target is its base URL; the push is its ``POST /v1/admin/weights`` (a checkpoint path, or the bytes
of a safetensors file for in-process local backends). The targets are every live registered gateway (the
``gateways`` table, where each replica keeps a heartbeat) plus any listed in ``POLAR_WEIGHT_TARGETS`` and the
embedded gateway. The name is checked first (a duplicate is a ``Conflict`` before any backend is touched); a
failed push to one target is retried (``POLAR_WEIGHT_PUSH_ATTEMPTS``, with backoff), and the version is
registered only once every target serves it, so the current version in the store is always one the fleet has.
A push that reached only some targets is a ``PartialPush`` naming which have the version and which do not;
publishing the same version again pushes it again (loading a version twice is harmless).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from db.models import WeightVersion
from polar.errors import Conflict, GatewayError, InvalidRequest, NotConfigured, PartialPush
from polar.feed import versions
from polar.feed.versions import VersionRecord

PUSH_TIMEOUT_S = 600.0
RETRY_DELAY_S = 0.5


@dataclass(frozen=True)
class WeightSource:
    version: str
    checkpoint_path: str | None = None
    tensors: bytes | None = None  # one safetensors file
    notes: str | None = None


async def push(target: str, source: WeightSource, control_token: str) -> str:
    """Load ``source`` into the backend behind gateway ``target``; returns the version it now serves."""
    headers = {"Authorization": f"Bearer {control_token}"} if control_token else {}
    url = target.rstrip("/") + "/v1/admin/weights"
    try:
        async with httpx.AsyncClient(timeout=PUSH_TIMEOUT_S, headers=headers, trust_env=False) as client:
            if source.tensors is not None:
                reply = await client.post(
                    url,
                    params={"version": source.version},
                    content=source.tensors,
                    headers={"content-type": "application/octet-stream"},
                )
            else:
                reply = await client.post(
                    url, json={"version": source.version, "checkpoint_path": source.checkpoint_path}
                )
    except httpx.HTTPError as exc:
        raise GatewayError(f"cannot push weights to the gateway at {target}: {exc.__class__.__name__}: {exc}") from None
    if reply.status_code != 200:
        try:
            message = reply.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = reply.text[:300]
        error = InvalidRequest if reply.status_code == 400 else GatewayError
        raise error(f"the gateway at {target} refused weights {source.version!r}: {message}", field="checkpoint_path")
    return str(reply.json()["weight_version"])


@dataclass(frozen=True)
class PushReport:
    target: str
    attempts: int
    error: str | None = None  # None: the target serves the version


async def push_with_retries(target: str, source: WeightSource, control_token: str, attempts: int) -> PushReport:
    """``push`` until it succeeds or ``attempts`` tries failed; a refused request (400) is not retried."""
    delay = RETRY_DELAY_S
    for attempt in range(1, attempts + 1):
        try:
            await push(target, source, control_token)
            return PushReport(target, attempt)
        except InvalidRequest:
            raise
        except GatewayError as exc:
            if attempt == attempts:
                return PushReport(target, attempt, exc.message)
            await asyncio.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")  # the loop returns on its last attempt


async def publish(
    factory: sessionmaker[Session],
    targets: list[str],
    source: WeightSource,
    control_token: str = "",
    *,
    attempts: int = 1,
) -> tuple[VersionRecord, list[PushReport]]:
    if not targets:
        raise NotConfigured(
            "no gateway to push weights to: none is registered and live (start gateways with the store), "
            "and neither POLAR_WEIGHT_TARGETS nor POLAR_GATEWAY_URL is set"
        )
    if not source.version or len(source.version) > 128:
        raise InvalidRequest("version must be 1 to 128 characters", field="version")
    if await asyncio.to_thread(_exists, factory, source.version):
        raise Conflict(f"weight version {source.version!r} is already registered", field="version")
    reports = await asyncio.gather(*(push_with_retries(t, source, control_token, attempts) for t in targets))
    failed = [r for r in reports if r.error is not None]
    if failed:
        served = [r.target for r in reports if r.error is None]
        raise PartialPush(
            f"weights {source.version!r} reached {len(served)} of {len(reports)} gateways and were not registered; "
            f"serving it: {served or 'none'}; failed after retries: "
            + "; ".join(f"{r.target} ({r.attempts} attempts: {r.error})" for r in failed),
            field="version",
        )
    uri = source.checkpoint_path or "tensors://uploaded"
    record = await asyncio.to_thread(versions.register, factory, source.version, checkpoint_uri=uri, notes=source.notes)
    return record, list(reports)


def _exists(factory: sessionmaker[Session], version: str) -> bool:
    with factory() as db:
        return (db.scalar(sa.select(sa.func.count()).where(WeightVersion.version == version)) or 0) > 0
