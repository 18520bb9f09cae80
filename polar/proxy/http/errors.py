"""Every error the gateway answers, shaped here and nowhere else.

A PolarError becomes its protocol's status and body (``ProtocolCodec.error_response``; the protocol is the
route's, from ``polar.proxy.http.routes``), with ``Retry-After`` when it is retryable. A bug becomes a logged
internal error in the caller's protocol: nothing reaches the harness as a bare 500 traceback. A model call's
failure is also counted (``polar.metrics``), whether it is answered as a response, as the body after keep-alive
bytes, or as a stream's error event before its first token.
"""

from __future__ import annotations

import logging

from fastapi.responses import JSONResponse

from polar import metrics
from polar.errors import BackendError, PolarError, StoreError, retry_after
from polar.httpserve.body import FastJSONResponse
from polar.proxy.call.plan import CallPlan
from polar.proxy.call.stream import error_event
from polar.wire import ProtocolCodec

log = logging.getLogger(__name__)
INTERNAL = "internal error in the gateway; see its log"


def error_response(codec: ProtocolCodec, exc: PolarError) -> JSONResponse:
    """``exc`` in ``codec``'s shape: its status, its body, ``Retry-After`` when retryable."""
    status, body = codec.error_response(exc)
    wait = retry_after(exc)
    headers = {"Retry-After": str(wait)} if wait is not None else None
    return FastJSONResponse(body, status_code=status, headers=headers)


def internal_error(codec: ProtocolCodec, what: str) -> JSONResponse:
    """A bug, not the caller's fault: the exception being handled is logged, and answered in ``codec``'s shape."""
    log.exception("unexpected error in %s", what)
    return error_response(codec, PolarError(INTERNAL))


def unhandled(codec: ProtocolCodec, what: str, exc: Exception) -> JSONResponse:
    """A bug in a route without its own guard (the app's last resort): logged with ``exc``, answered in
    ``codec``'s shape."""
    log.error("unhandled error in %s", what, exc_info=exc)
    return error_response(codec, PolarError(INTERNAL))


def upgrade_refused(codec: ProtocolCodec, exc: PolarError) -> JSONResponse:
    """A WebSocket upgrade refused with 426 Upgrade Required (the client falls back to HTTP), ``exc`` in
    ``codec``'s body shape."""
    return JSONResponse(codec.error_response(exc)[1], status_code=426)


def count_failure(codec: ProtocolCodec, exc: PolarError) -> None:
    """A model call that failed with ``exc``, in the call, store and backend counters."""
    metrics.CALLS.labels(codec.name, exc.error_type).inc()
    if isinstance(exc, StoreError):
        metrics.STORE_ERRORS.labels("gateway").inc()
    elif isinstance(exc, BackendError):
        metrics.BACKEND_ERRORS.labels(exc.error_type).inc()


def call_failed(codec: ProtocolCodec, exc: PolarError) -> JSONResponse:
    """A model call's failure, counted, as its response."""
    count_failure(codec, exc)
    return error_response(codec, exc)


def call_crashed(codec: ProtocolCodec) -> JSONResponse:
    """A model call that hit a bug (the exception being handled), counted and logged, as its response."""
    metrics.CALLS.labels(codec.name, "internal_error").inc()
    return internal_error(codec, f"a {codec.name} call")


def call_failed_body(codec: ProtocolCodec, exc: PolarError) -> bytes:
    """A model call's failure, counted, as the body after keep-alive bytes (its 200 status is already out)."""
    count_failure(codec, exc)
    return bytes(FastJSONResponse(codec.error_response(exc)[1]).body)


def stream_failed_frames(plan: CallPlan, exc: PolarError) -> list[bytes]:
    """A stream's failure before its first token, counted, as the protocol's error event (after keep-alive
    lines: its 200 status is already out)."""
    count_failure(plan.codec, exc)
    event = error_event(plan.codec.stream_encoder(plan.meta, request=plan.request), exc)
    return [event.encode()] if event else []
