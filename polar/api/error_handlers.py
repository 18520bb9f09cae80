"""Every error of the control API, shaped in one place: ``{"error": {"type", "message", "field"}}`` with the
status of its ``PolarError`` class, and ``Retry-After`` on a retryable one (a store outage: the client backs
off, as from the gateway). Request validation errors are 400s naming the field, and so is a value the store
refuses (a NUL byte in a string, which Postgres refuses: the caller's input, not a server fault). The body
guard's refusals (``polar.api.guard``) are shaped by ``error_response`` too."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError

from polar import errors, metrics
from polar.api.schemas import ErrorDetail, ErrorReply
from polar.errors import InvalidRequest, PolarError, StoreError


def error_response(exc: PolarError) -> JSONResponse:
    body = ErrorReply(error=ErrorDetail(type=exc.error_type, message=exc.message, field=exc.field))
    wait = errors.retry_after(exc)
    return JSONResponse(body.model_dump(), exc.status_code, {"Retry-After": str(wait)} if wait is not None else None)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(PolarError)
    async def polar_error(request: Request, exc: PolarError) -> JSONResponse:
        if isinstance(exc, StoreError):
            metrics.STORE_ERRORS.labels("api").inc()
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"] if p != "body") or "body"
        message = str(first["msg"]).removeprefix("Value error, ")
        return error_response(InvalidRequest(f"invalid {field}: {message}", field=field))

    @app.exception_handler(DataError)
    async def bad_data(request: Request, exc: DataError) -> JSONResponse:
        return error_response(
            InvalidRequest(f"the store refused a value: {str(exc.orig).splitlines()[0]}", field="body")
        )


# The error replies the OpenAPI spec documents for every route (besides each route's own reply).
ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    "4XX": {"model": ErrorReply, "description": "the request was refused; the error names the field at fault"},
    "5XX": {"model": ErrorReply, "description": "a server-side failure (503: the store is unavailable, retry)"},
}
