"""The gateway's route table: every HTTP route it serves, once. ``create_app`` registers each entry, its errors
take the entry's protocol's shape (``route_table.error_shape``; a path no route serves, that of its neighbours),
and the access log names a request by its entry's ``log_as`` (``polar.proxy.access_log``). A new route is an entry
here and a handler ``(request, route) -> Response``.

Model routes speak their protocol; the session, admin and probe routes answer errors in OpenAI's shape. Only the
model calls are in the access log (one line per call: ``log_as``), and only they are ``direct`` (served before
FastAPI: ``polar.proxy.http.direct``).
"""

from __future__ import annotations

from polar.proxy.http import admin, health, model_routes, session_routes
from polar.proxy.http.route_table import Route
from polar.wire import ANTHROPIC, GEMINI, OPENAI_CHAT, OPENAI_RESPONSES

POST, GET = ("POST",), ("GET",)

ROUTES: tuple[Route, ...] = (
    # the provider protocols
    Route(POST, "/v1/chat/completions", model_routes.model_call, OPENAI_CHAT, "/v1/chat/completions", direct=True),
    Route(POST, "/v1/responses", model_routes.model_call, OPENAI_RESPONSES, "/v1/responses", direct=True),
    Route(POST, "/v1/messages", model_routes.model_call, ANTHROPIC, "/v1/messages", direct=True),
    Route(POST, "/v1/messages/count_tokens", model_routes.count_tokens, ANTHROPIC, direct=True),
    Route(POST, "/v1beta/models/{target}", model_routes.gemini, GEMINI, "/v1beta/models/{target}", direct=True),
    # probes and the model list (open)
    Route(("GET", "HEAD"), "/", health.root, in_schema=False),
    Route(GET, "/health/live", health.live),
    Route(GET, "/health/ready", health.ready),
    Route(GET, "/health", health.health),
    Route(GET, "/v1/models", model_routes.models),
    # session control
    Route(POST, "/v1/sessions", session_routes.create_session),
    Route(GET, "/v1/sessions/{session_id}", session_routes.get_session),
    Route(POST, "/v1/sessions/{session_id}/close", session_routes.close_session),
    Route(("DELETE",), "/v1/sessions/{session_id}", session_routes.close_session),
    Route(GET, "/v1/sessions/{session_id}/captures", session_routes.list_captures),
    # admin
    Route(POST, "/v1/admin/weights", admin.update_weights),
    Route(GET, "/metrics", admin.prometheus),
)
