"""The web UI's routes under ``/ui``: server-rendered pages (Jinja2 templates shipped in this package), a few
JSON and HTML fragments the page scripts fetch, and the static CSS/JS. Nothing is loaded from elsewhere.

``install_ui(app, settings, factory)`` adds them to the control API. Every route is behind ``ui_guard`` (the
control token); none is in the OpenAPI schema. A bad query parameter is a 400 page naming it, an unknown id a
404 page; the store is read in a worker thread, like the API's own routes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from sqlalchemy.orm import Session, sessionmaker

from db.enums import RolloutStatus
from polar.auth import control_token
from polar.errors import NotFound
from polar.live import LiveView
from polar.settings import Settings
from polar.store_bound import in_store
from polar.ui.auth import COOKIE, UIRefused, UITokenAccepted, ui_guard
from polar.ui.detail import RolloutDetail, capture_json, rollout_detail, trajectory_row
from polar.ui.listing import RolloutFilter, filter_choices, group_view, list_rollouts
from polar.ui.live import add_live_routes
from polar.ui.tokens import TokenPage, TokenText, token_html, token_page

STATIC = Path(__file__).parent / "static"
PAGE_SIZE = 50
INLINE_TRAJECTORIES = 3
T = TypeVar("T")


class UIPageError(Exception):
    """Answered with the UI's error page (``status`` 400 or 404)."""

    def __init__(self, status: int, title: str, message: str):
        super().__init__(message)
        self.status, self.title, self.message = status, title, message


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("polar.ui", "templates"), autoescape=select_autoescape(["html"]))
    env.filters["reward"] = lambda v: "–" if v is None else f"{v:.2f}"
    env.filters["secs"] = lambda v: "–" if v is None else (f"{v * 1e3:.0f} ms" if v < 1 else f"{v:.1f} s")
    env.filters["short"] = lambda v: (v or "")[:8]
    env.filters["token_html"] = lambda tp: Markup(token_html(tp))
    env.filters["pct"] = lambda v: "–" if v is None else f"{v:.0%}"
    env.filters["when"] = lambda v: "–" if v is None else v.strftime("%Y-%m-%d %H:%M:%S")
    return env


def _float(params: Any, name: str) -> float | None:
    raw = (params.get(name) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise UIPageError(400, "Bad filter", f"{name} must be a number, not {raw!r}") from None
    if not math.isfinite(value):
        raise UIPageError(400, "Bad filter", f"{name} must be a finite number")
    return value


def _date(params: Any, name: str) -> datetime | None:
    raw = (params.get(name) or "").strip()
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise UIPageError(400, "Bad filter", f"{name} must be a date (YYYY-MM-DD or ISO 8601), not {raw!r}") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)  # a plain date is UTC


def _int(params: Any, name: str, default: int) -> int:
    raw = (params.get(name) or "").strip()
    if not raw:
        return default
    if not raw.isdigit() or len(raw) > 9:
        raise UIPageError(400, "Bad parameter", f"{name} must be a non-negative integer, not {raw!r}")
    return int(raw)


def parse_filter(params: Any) -> RolloutFilter:
    """The table's filters from query parameters (empty means unset); a bad value is a 400 page naming it."""
    statuses = []
    for raw in params.getlist("status"):
        if not raw:
            continue
        try:
            statuses.append(RolloutStatus(raw.upper()))
        except ValueError:
            known = ", ".join(s.value for s in RolloutStatus)
            raise UIPageError(400, "Bad filter", f"status {raw!r} is not one of {known}") from None

    def text(name: str) -> str | None:
        return (params.get(name) or "").strip() or None

    return RolloutFilter(
        task=text("task"),
        harness=text("harness"),
        status=tuple(statuses),
        min_reward=_float(params, "min_reward"),
        max_reward=_float(params, "max_reward"),
        version=text("version"),
        since=_date(params, "since"),
        until=_date(params, "until"),
        group=text("group"),
    )


class Pages:
    """Renders the package's templates into HTML responses."""

    def __init__(self, settings: Settings):
        self.env = _environment()
        self.prefect_ui = settings.prefect_ui_url.rstrip("/")

    def __call__(self, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        html = self.env.get_template(name).render(prefect_ui=self.prefect_ui, **values)
        return HTMLResponse(html, status_code=status)


class _Reader:
    """The UI's reads of the store: each in its own session, off the event loop, bounded by the statement timeout."""

    def __init__(self, settings: Settings, factory: sessionmaker[Session]):
        self.factory = factory
        self.timeout_s = settings.store_statement_timeout_s
        self.text = TokenText.for_settings(settings)

    async def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        def run() -> T:
            with self.factory() as db:
                return fn(db, *args, **kwargs)

        try:
            # bounded: a frozen store is a 503 with Retry-After (polar.store_bound), not a page that never loads
            return await in_store(run, timeout_s=self.timeout_s)
        except NotFound as exc:
            raise UIPageError(404, "Not found", exc.message) from None

    def with_pages(self, db: Session, rollout_id: str) -> tuple[RolloutDetail, dict[int, TokenPage]]:
        """The rollout and the first token page of its first few trajectories (inside the session: their token
        arrays are deferred and load here); the rest load when asked, as a long session has dozens."""
        detail = rollout_detail(db, rollout_id)
        return detail, {t.id: token_page(t, self.text, 0) for t in detail.trajectories[:INLINE_TRAJECTORIES]}


def ui_router(settings: Settings, factory: sessionmaker[Session], page: Pages, token: str) -> APIRouter:
    router = APIRouter(prefix="/ui", dependencies=[Depends(ui_guard(token))], include_in_schema=False)
    read = _Reader(settings, factory)
    _add_listing_routes(router, read, page)
    _add_detail_routes(router, read, page)
    add_live_routes(router, LiveView(settings, factory, control_token(settings, create=False) or None), page)

    @router.get("/{rest:path}")
    async def unknown(rest: str) -> Response:
        raise UIPageError(404, "Not found", f"there is no page /ui/{rest}")

    return router


def _add_listing_routes(router: APIRouter, read: _Reader, page: Pages) -> None:
    @router.get("")
    @router.get("/")
    @router.get("/rollouts")
    async def rollouts(request: Request) -> Response:
        params = request.query_params
        filters = parse_filter(params)
        offset = _int(params, "offset", 0)
        listing = await read(list_rollouts, filters, limit=PAGE_SIZE, offset=offset)
        kept = [(k, v) for k, v in params.multi_items() if k not in ("offset", "fragment") and v]
        query = urlencode(kept)
        if params.get("fragment") == "rows":
            return page("_rows.html", listing=listing)
        choices = await read(filter_choices)
        return page(
            "rollouts.html",
            listing=listing,
            choices=choices,
            f=filters,
            statuses=[s.value for s in RolloutStatus],
            query=query,
            page_size=PAGE_SIZE,
        )

    @router.get("/groups/{task_id}")
    async def group(task_id: str) -> Response:
        return page("group.html", group=await read(group_view, task_id))


def _add_detail_routes(router: APIRouter, read: _Reader, page: Pages) -> None:
    @router.get("/rollouts/{rollout_id}")
    async def rollout(request: Request, rollout_id: str) -> Response:
        if request.query_params.get("fragment") == "stages":
            return page("_stages.html", d=await read(rollout_detail, rollout_id))
        detail, pages = await read(read.with_pages, rollout_id)
        return page("rollout.html", d=detail, pages=pages)

    @router.get("/trajectories/{trajectory_id}/tokens")
    async def tokens(request: Request, trajectory_id: str) -> Response:
        if not trajectory_id.isdigit() or len(trajectory_id) > 18:
            raise UIPageError(404, "Not found", f"no trajectory {trajectory_id}")
        row = await read(trajectory_row, int(trajectory_id))
        number = _int(request.query_params, "page", 0)
        return page("_tokens.html", tp=token_page(row, read.text, number))

    @router.get("/captures/{capture_id}.json")
    async def capture(request: Request, capture_id: str) -> Response:
        if not capture_id.isdigit() or len(capture_id) > 18:
            return JSONResponse({"error": f"no capture {capture_id}"}, status_code=404)
        full = request.query_params.get("full") in ("1", "true")
        try:
            body = await read(capture_json, int(capture_id), full=full)
        except UIPageError as exc:
            return JSONResponse({"error": exc.message}, status_code=exc.status)
        return JSONResponse(body)

    @router.get("/compare")
    async def compare(request: Request) -> Response:
        a, b = request.query_params.get("a") or "", request.query_params.get("b") or ""
        if not a or not b:
            raise UIPageError(400, "Compare needs two rollouts", "give them as /ui/compare?a=ROLLOUT&b=ROLLOUT")
        sides = [await read(read.with_pages, a), await read(read.with_pages, b)]
        if sides[0][0].rollout.task_id != sides[1][0].rollout.task_id:
            raise UIPageError(400, "Not one task", f"rollouts {a} and {b} belong to different tasks")
        return page("compare.html", sides=sides, task=sides[0][0].task)


def install_ui(app: FastAPI, settings: Settings, factory: sessionmaker[Session], token: str) -> None:
    """Serve the web UI from ``app`` at ``/ui``, with its static files and its HTML error pages, to the holders of
    ``token`` (the control token the app enforces)."""
    page = Pages(settings)
    # The static mount goes first: the router ends with a catch-all 404 page for any other /ui path.
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")
    app.include_router(ui_router(settings, factory, page, token))

    @app.exception_handler(UIRefused)
    async def refused(request: Request, exc: UIRefused) -> Response:
        return page("error.html", 401, title="Control token needed", message=exc.message)

    @app.exception_handler(UITokenAccepted)
    async def accepted(request: Request, exc: UITokenAccepted) -> Response:
        reply = RedirectResponse(exc.location, status_code=303)
        reply.set_cookie(COOKIE, exc.value, httponly=True, samesite="strict", path="/ui")
        return reply

    @app.exception_handler(UIPageError)
    async def page_error(request: Request, exc: UIPageError) -> Response:
        return page("error.html", exc.status, title=exc.title, message=exc.message)
