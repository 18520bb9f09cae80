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
from fastapi import Request
from pydantic import ValidationError
from sqlalchemy.orm import Session, sessionmaker

from db import gateways
from db.models import WeightVersion
from polar.api.schemas import WeightsRequest
from polar.clock import now
from polar.errors import Conflict, GatewayError, InvalidRequest, NotConfigured, PartialPush, invalid_from
from polar.feed import versions
from polar.feed.versions import VersionRecord
from polar.httpserve.body import MAX_WEIGHT_BYTES, read_body, tensor_upload_version
from polar.settings import Settings
from polar.store_bound import in_store

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
    store_timeout_s: float = 30.0,
) -> tuple[VersionRecord, list[PushReport]]:
    """Push ``source`` to every target, then register it; the name check waits at most ``store_timeout_s`` for
    the store (a frozen store is a 503 before any push)."""
    if not targets:
        raise NotConfigured(
            "no gateway to push weights to: none is registered and live (start gateways with the store), "
            "and neither POLAR_WEIGHT_TARGETS nor POLAR_GATEWAY_URL is set"
        )
    if not source.version or len(source.version) > 128:
        raise InvalidRequest("version must be 1 to 128 characters", field="version")
    if await in_store(_exists, factory, source.version, timeout_s=store_timeout_s):
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
    # Not bounded: every gateway already serves the version, and a 503 here would leave the caller unsure
    # whether it was registered (a retry of a registration that then went through is a 409).
    record = await asyncio.to_thread(versions.register, factory, source.version, checkpoint_uri=uri, notes=source.notes)
    return record, list(reports)


def _exists(factory: sessionmaker[Session], version: str) -> bool:
    with factory() as db:
        return (db.scalar(sa.select(sa.func.count()).where(WeightVersion.version == version)) or 0) > 0


def weight_targets(settings: Settings, gateway_url: str | None, registered: list[str] | None = None) -> list[str]:
    """Every gateway new weights go to: the live registered ones, those listed in POLAR_WEIGHT_TARGETS and the
    rollouts' gateway, each once."""
    listed = [url.strip() for url in settings.weight_targets.split(",") if url.strip()]
    candidates = [*(registered or []), *listed, *(url for url in (gateway_url or settings.gateway_url,) if url)]
    seen: dict[str, str] = {}
    for url in candidates:
        seen.setdefault(url.rstrip("/"), url)
    return list(seen.values())


def live_gateways(factory: sessionmaker[Session], settings: Settings) -> list[str]:
    return [url for _, url in gateways.live(factory, now(), settings.gateway_stale_s)]


async def weight_source(request: Request) -> WeightSource:
    """The new version a ``POST /v1/weights`` names: JSON ``{version, checkpoint_path?, notes?}``, or safetensors
    bytes with ``?version=`` (up to ``MAX_WEIGHT_BYTES``; ``polar.api.guard`` lets that upload past the usual limit)."""
    version = tensor_upload_version(request)
    if version is not None:
        body = await read_body(request, MAX_WEIGHT_BYTES)
        return WeightSource(version, tensors=body, notes=request.query_params.get("notes"))
    try:
        parsed = WeightsRequest.model_validate_json(await request.body() or b"{}")
    except ValidationError as exc:
        raise invalid_from(exc, "weights request") from None
    return WeightSource(parsed.version, checkpoint_path=parsed.checkpoint_path, notes=parsed.notes)
