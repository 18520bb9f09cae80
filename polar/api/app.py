"""The control API (``polar serve``): tasks, rollouts, trajectories, trainer claims and weight versions.

Every error leaves through one handler as ``{"error": {"type", "message", "field"}}`` with the status of its
``PolarError`` class; request validation errors are 400s naming the field. Every ``/v1`` route needs the control
token (``polar.auth``: ``POLAR_CONTROL_TOKEN``, or the one generated in ``$POLAR_HOME/control-token``) as a Bearer
token, checked before a byte of the body is read, and every body is size-limited (``polar.api.guard``); store work
waits at most ``POLAR_STORE_STATEMENT_TIMEOUT_S`` (then a 503 with ``Retry-After``). A background loop admits and
starts submitted tasks (``TaskRunner``) and delivers completion callbacks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import asdict
from datetime import datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

import sqlalchemy as sa
from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DataError
from sqlalchemy.orm import Session, sessionmaker

from db.enums import TaskStatus
from db.models import MergeStat, Rollout
from polar import errors, feed, metrics
from polar.api import queries
from polar.api.callbacks import deliver_due
from polar.api.guard import api_screen
from polar.api.imports import TaskImport, import_requests
from polar.api.runner import InlineDispatch, TaskRunner
from polar.api.schemas import (
    ClaimRequest,
    RenewRequest,
    RolloutStats,
    TaskBatch,
    TokenRecord,
    TrainerBody,
    WeightsRequest,
)
from polar.api.weights import live_gateways, publish, weight_source, weight_targets
from polar.auth import announce, bearer_of, install_access_log_redaction, matches
from polar.errors import AuthenticationError, InvalidRequest, NotFound, PolarError, StoreError
from polar.export.filters import ExportFilter
from polar.http_guard import BodyGuard
from polar.models.tiny import named_tokenizer
from polar.prefect_adapter import flow_run_states
from polar.rollout.spec import TaskRequest
from polar.rollout.submit import submit_tasks
from polar.settings import Settings, TaskDispatch
from polar.store_bound import in_store
from polar.tokens.tokenizer import ChatTokenizer
from polar.trajectory.extras import trajectory_extras_view
from polar.ui import install_ui

log = logging.getLogger(__name__)
# Row ids are 64-bit integers in both stores: a larger id is a 400 naming the field, not a 500 from the driver.
MAX_ROW_ID = 2**63 - 1
P = ParamSpec("P")
T = TypeVar("T")


def _scripted(field: str) -> InvalidRequest:
    return InvalidRequest(
        f"{field}: scripted policies are for tests and demos and are refused here; "
        "set POLAR_ALLOW_SCRIPTED_POLICIES=1 on the control API to accept them",
        field=field,
    )


def _error(exc: PolarError) -> JSONResponse:
    body = {"error": {"type": exc.error_type, "message": exc.message, "field": exc.field}}
    wait = errors.retry_after(exc)  # a store outage: the client backs off, as from the gateway
    return JSONResponse(body, exc.status_code, {"Retry-After": str(wait)} if wait is not None else None)


def model_tokenizer(settings: Settings) -> ChatTokenizer:
    """The tokenizer every gateway with ``settings`` renders prompts with (``polar.proxy.gateway`` picks it so)."""
    return named_tokenizer(settings.model, settings.cache_dir)


def create_api(
    settings: Settings,
    factory: sessionmaker[Session],
    *,
    gateway_url: str | None = None,
    run_inline: InlineDispatch | None = None,
) -> FastAPI:
    """The app over the store ``factory``; ``gateway_url`` is the rollouts' gateway (default weight target);
    ``run_inline`` runs rollouts in this process, required when tasks are dispatched inline."""
    runner = TaskRunner(settings, factory, run_inline)
    wake = asyncio.Event()

    async def background() -> None:
        while True:
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), settings.api_poll_s)
            wake.clear()
            try:
                await runner.tick()
                await asyncio.to_thread(deliver_due, factory, settings)
            except Exception:
                log.exception("control API background pass failed")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.create_task(background())
        async with metrics.loop_lag_monitor("api"):
            yield
        loop.cancel()
        with suppress(asyncio.CancelledError):
            await loop
        await runner.aclose()

    app = FastAPI(title="Polar control API", version="1", lifespan=lifespan)
    app.state.runner = runner

    @app.exception_handler(PolarError)
    async def polar_error(request: Request, exc: PolarError) -> JSONResponse:
        if isinstance(exc, StoreError):
            metrics.STORE_ERRORS.labels("api").inc()
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if p != "body") or "body"
        message = str(first["msg"]).removeprefix("Value error, ")
        return _error(InvalidRequest(f"invalid {field}: {message}", field=field))

    @app.exception_handler(DataError)
    async def bad_data(request: Request, exc: DataError) -> JSONResponse:
        # e.g. a NUL byte in a string, which Postgres refuses: the caller's input, not a server fault
        return _error(InvalidRequest(f"the store refused a value: {str(exc.orig).splitlines()[0]}", field="body"))

    token = announce(settings)  # closed by default: generated on first start when none is set
    install_access_log_redaction()
    # The token and the body's size are checked before FastAPI reads a byte of a body (polar.api.guard).
    app.add_middleware(BodyGuard, screen=api_screen(settings, token), shape=_error)
    wait_s = settings.store_statement_timeout_s  # every store wait of a request: a frozen store is a 503 by then

    def bounded(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Awaitable[T]:
        return in_store(fn, *args, timeout_s=wait_s, **kwargs)

    async def control(request: Request) -> None:
        if not matches(bearer_of(request.headers.get("authorization")), token):
            raise AuthenticationError("this endpoint needs the control token as a Bearer token")

    def read(fn: Callable[Concatenate[Session, P], T], *args: P.args, **kwargs: P.kwargs) -> Awaitable[T]:
        def run() -> T:
            with factory() as db:
                return fn(db, *args, **kwargs)

        return in_store(run, timeout_s=wait_s)

    def current_version() -> str | None:
        with factory() as db:
            current = feed.current(db)
        return current.version if current else None

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness: always 200 while the process serves; the store's part waits at most POLAR_HEALTH_TIMEOUT_S."""
        try:
            version = await in_store(current_version, timeout_s=settings.health_timeout_s)
        except StoreError:
            return {"status": "ok", "dispatch": runner.mode.value, "store": "unavailable", "current_version": None}
        return {"status": "ok", "dispatch": runner.mode.value, "store": "ok", "current_version": version}

    v1 = [Depends(control)]

    @app.get("/metrics", dependencies=v1)
    async def prometheus() -> Response:
        """Prometheus text format (``polar.metrics``): the process's event-loop lag and store errors."""
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    @app.get("/v1/model", dependencies=v1)
    async def model() -> dict[str, Any]:
        """The model the gateways serve under these settings and its tokenizer (trainers check theirs matches)."""
        tokenizer = await asyncio.to_thread(model_tokenizer, settings)
        return {
            "model": settings.model,
            "tokenizer": {
                "name": tokenizer.name,
                "vocab_size": tokenizer.vocab_size,
                "fingerprint": tokenizer.fingerprint,
            },
        }

    @app.post("/v1/tasks", status_code=201, dependencies=v1)
    async def submit(
        batch: TaskBatch,
        idempotency_key: str | None = Header(
            None, max_length=255, description="a retry with the same key returns the same tasks, never duplicates"
        ),
    ) -> dict[str, Any]:
        if not settings.allow_scripted_policies:
            for index, request in enumerate(batch.tasks):
                if request.policies:
                    raise _scripted(f"tasks.{index}.policies")
        return await store(batch.tasks, idempotency_key)

    @app.post("/v1/tasks/import", status_code=201, dependencies=v1)
    async def submit_import(
        body: TaskImport,
        idempotency_key: str | None = Header(
            None, max_length=255, description="a retry with the same key returns the same tasks, never duplicates"
        ),
    ) -> dict[str, Any]:
        """Harbor task folders or a SWE-bench .jsonl file on this host (inside POLAR_COPY_ROOTS) as tasks."""
        if body.policies and not settings.allow_scripted_policies:
            raise _scripted("policies")
        requests = await asyncio.to_thread(import_requests, body, settings)
        return await store(requests, idempotency_key)

    async def store(requests: list[TaskRequest], idempotency_key: str | None) -> dict[str, Any]:
        submitted = await bounded(submit_tasks, factory, requests, idempotency_key=idempotency_key)
        wake.set()
        return {
            "tasks": [{"task_id": t.task_id, "name": t.name, "rollout_ids": list(t.rollout_ids)} for t in submitted]
        }

    @app.get("/v1/tasks", dependencies=v1)
    async def tasks(
        status: TaskStatus | None = None,
        limit: int = Query(100, ge=1, le=1000),
        offset: int = Query(0, ge=0, le=1_000_000_000),
    ) -> dict[str, Any]:
        return {"tasks": await read(queries.list_tasks, status=status, limit=limit, offset=offset)}

    @app.get("/v1/tasks/{task_id}", dependencies=v1)
    async def task(task_id: str) -> dict[str, Any]:
        view = await read(queries.task_view, task_id, settings.max_async_level)
        if runner.mode is TaskDispatch.DEPLOYMENT:
            states = await flow_run_states([r["flow_run_id"] for r in view["rollouts"] if r["flow_run_id"]])
            for rollout in view["rollouts"]:
                rollout["flow_run_state"] = states.get(rollout["flow_run_id"] or "")
        return view

    @app.post("/v1/tasks/{task_id}/cancel", dependencies=v1)
    async def cancel(task_id: str) -> dict[str, Any]:
        return await runner.cancel(task_id)

    @app.get("/v1/rollouts/{rollout_id}", dependencies=v1)
    async def rollout(rollout_id: str) -> dict[str, Any]:
        def one(db: Session) -> dict[str, Any]:
            row = db.get(Rollout, rollout_id)
            if row is None:
                raise NotFound(f"no rollout {rollout_id}", field="rollout_id")
            return {**queries.rollout_view(row), "evaluations": queries.evaluations_view(db, rollout_id)}

        return await read(one)

    @app.get("/v1/rollouts/{rollout_id}/stats", dependencies=v1, response_model=RolloutStats)
    async def rollout_stats(rollout_id: str) -> RolloutStats:
        """Each build's token record of one rollout: sampled, trainable, and every untrained token by reason."""

        def one(db: Session) -> RolloutStats:
            if db.get(Rollout, rollout_id) is None:
                raise NotFound(f"no rollout {rollout_id}", field="rollout_id")
            rows = db.scalars(
                sa.select(MergeStat).where(MergeStat.rollout_id == rollout_id).order_by(MergeStat.builder)
            )
            builds = [
                TokenRecord.model_validate(
                    {
                        **{k: getattr(row, k) for k in TokenRecord.model_fields},
                        "roots_by_role": row.roots_by_role or {},
                        "root_causes": row.root_causes or {},
                        "untrained_tokens": row.untrained_tokens or {},
                    }
                )
                for row in rows
            ]
            return RolloutStats(rollout_id=rollout_id, builds=builds)

        return await read(one)

    @app.get("/v1/trajectories", dependencies=v1)
    async def trajectories(
        task_id: str | None = None,
        rollout_id: str | None = None,
        builder: str | None = None,
        status: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        weight_version: str | None = None,
        since: datetime | None = None,
        consumed: bool | None = None,
        include_scripted: bool = Query(False, description="also trajectories of scripted policies (never trainable)"),
        tokens: bool = Query(False, description="include token arrays"),
        limit: int = Query(100, ge=1, le=10_000),
        offset: int = Query(0, ge=0, le=1_000_000_000),
    ) -> dict[str, Any]:
        filters = ExportFilter(
            task_ids=[task_id] if task_id is not None else None,
            rollout_id=rollout_id,
            builder=builder,
            all_builders=True,
            status=[status] if status is not None else None,
            min_reward=min_reward,
            max_reward=max_reward,
            weight_version=weight_version,
            since=since,
            consumed=consumed,
            include_scripted=include_scripted,
        )
        rows = await read(queries.list_trajectories, filters, limit=limit, offset=offset, tokens=tokens)
        return {"trajectories": rows}

    @app.get("/v1/trajectories/{trajectory_id}/extras", dependencies=v1)
    async def trajectory_extras(trajectory_id: int = Path(ge=1, le=MAX_ROW_ID)) -> dict[str, Any]:
        """Top-k logprobs and routed experts of one trajectory (polar.trajectory.extras), null where not captured."""
        return await read(trajectory_extras_view, trajectory_id)

    @app.post("/v1/claims", dependencies=v1)
    async def claim(body: ClaimRequest) -> dict[str, Any]:
        batch = await bounded(
            feed.claim,
            factory,
            body.trainer,
            max_groups=body.max_groups,
            lease_s=body.lease_s or settings.claim_lease_s,
            max_staleness=body.max_staleness,
            min_samples=settings.claim_min_samples,
        )
        out = asdict(batch)
        out["lease_expires_at"] = batch.lease_expires_at.isoformat() if batch.lease_expires_at else None
        return out

    @app.post("/v1/claims/{claim_id}/ack", dependencies=v1)
    async def ack(claim_id: str, body: TrainerBody) -> dict[str, Any]:
        return await bounded(feed.ack, factory, claim_id, body.trainer)

    @app.post("/v1/claims/{claim_id}/release", dependencies=v1)
    async def release(claim_id: str, body: TrainerBody) -> dict[str, Any]:
        return await bounded(feed.release, factory, claim_id, body.trainer)

    @app.post("/v1/claims/{claim_id}/renew", dependencies=v1)
    async def renew(claim_id: str, body: RenewRequest) -> dict[str, Any]:
        until = await bounded(feed.renew, factory, claim_id, body.trainer, body.lease_s)
        return {"claim_id": claim_id, "lease_expires_at": until.isoformat()}

    @app.get("/v1/weights", dependencies=v1)
    async def weights() -> dict[str, Any]:
        rows = await bounded(feed.list_versions, factory)
        items = [{**asdict(r), "created_at": r.created_at.isoformat()} for r in rows]
        return {"versions": items, "current": items[-1]["version"] if items else None}

    @app.post(
        "/v1/weights",
        status_code=201,
        dependencies=v1,
        openapi_extra={
            "requestBody": {
                "content": {
                    "application/json": {"schema": WeightsRequest.model_json_schema()},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                }
            }
        },
    )
    async def register_weights(request: Request) -> dict[str, Any]:
        """JSON ``{version, checkpoint_path?, notes?}``, or one safetensors file's bytes with ``?version=``."""
        source = await weight_source(request)
        registered = await bounded(live_gateways, factory, settings)
        targets = weight_targets(settings, gateway_url, registered)
        record, pushes = await publish(
            factory, targets, source, token, attempts=settings.weight_push_attempts, store_timeout_s=wait_s
        )
        wake.set()  # tasks held by admission control may start now
        return {
            **asdict(record),
            "created_at": record.created_at.isoformat(),
            "targets": targets,
            "pushes": [asdict(p) for p in pushes],
        }

    install_ui(app, settings, factory, token)  # the web UI at /ui, behind the same control token
    return app
