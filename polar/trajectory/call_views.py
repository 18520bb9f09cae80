"""``CallView``s of a stored rollout, and the role hints of its harness, for ``polar.trajectory.roles``.

Requests are stored relative to their parents (``db.request_json``): they are expanded in ``seq`` order in one
pass, decoded with their protocol's codec, and each reply is read back from its stored response JSON
(``polar.wire.replies``), so labelling needs no tokenizer. A request that no longer decodes gives an
empty view (the call is then judged by tree shape alone) rather than failing the build.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from db.models import Capture, Rollout, Task
from db.request_json import expand_request
from polar.errors import PolarError
from polar.tokens.messages import Role as MessageRole
from polar.trajectory.roles import CallView, RoleHints
from polar.wire import get_codec
from polar.wire.replies import reply_from_response


def load_call_views(session: Session, rollout_id: str) -> dict[int, CallView]:
    """One view per capture of ``rollout_id`` (failed ones included), by capture id."""
    rows = session.execute(
        sa.select(
            Capture.id, Capture.parent_id, Capture.protocol, Capture.model, Capture.request_json, Capture.response_json
        )
        .where(Capture.rollout_id == rollout_id)
        .order_by(Capture.seq)
    ).all()
    bodies: dict[int, Any] = {}
    views: dict[int, CallView] = {}
    for row in rows:
        parent = bodies.get(row.parent_id) if row.parent_id is not None else None
        body = expand_request(row.request_json, parent)
        bodies[row.id] = body
        views[row.id] = call_view(row.id, row.protocol, row.model, body, row.response_json)
    return views


def call_view(capture_id: int, protocol: str, model: str, body: Any, response: Any) -> CallView:
    """The view of one call from its full request body and stored response."""
    try:
        request = get_codec(protocol).parse_request(body, path_model=model, path_stream=False)
    except PolarError:
        return CallView(capture_id)
    reply = reply_from_response(protocol, response)
    return CallView(
        capture_id=capture_id,
        system="\n".join(m.content for m in request.messages if m.role is MessageRole.SYSTEM),
        user_texts=tuple(m.content for m in request.messages if m.role is MessageRole.USER),
        assistant_texts=tuple(m.content for m in request.messages if m.role is MessageRole.ASSISTANT),
        tools=tuple(tool.name for tool in request.tools),
        reply_text=reply.content,
        reply_tool_calls=tuple((call.name, call.parsed_arguments()) for call in reply.tool_calls),
    )


def role_hints_for(session: Session, rollout_id: str) -> RoleHints:
    """The role hints its harness adapter declares, for the rollout's task; none for a task-less session or a
    harness no adapter knows."""
    harness = session.scalar(
        sa.select(Task.harness).join(Rollout, Rollout.task_id == Task.id).where(Rollout.id == rollout_id)
    )
    name = (harness or {}).get("name")
    if not isinstance(name, str):
        return RoleHints()
    from harness_adapters import ADAPTERS  # the adapters import this package's records; import at use

    adapter = ADAPTERS.get(name)
    return getattr(adapter, "role_hints", RoleHints()) if adapter is not None else RoleHints()
