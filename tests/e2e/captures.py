"""Read a run's captures back from its SQLite store and describe the capture tree.

``python -m tests.e2e.captures RUN_DIR`` prints one line per capture (for debugging a run by hand).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from db import (
    Capture,
    full_prompt_ids,
    make_engine,
    make_session_factory,
    session_scope,
)
from db.request_json import full_request_json


@dataclass(frozen=True)
class Call:
    id: int
    seq: int
    parent_id: int | None
    render_mode: str
    status: str
    error: str | None
    protocol: str
    model: str
    prefix_len: int
    n_prompt: int
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str | None
    latency_s: float | None
    tools: tuple[str, ...]  # names of the tools the request offered
    system: str  # the request's system text (first 200 chars), to tell auxiliary calls apart
    request_json: dict


def load_calls(database_url: str, session_id: str) -> list[Call]:
    from polar.wire import get_codec

    engine = make_engine(database_url)
    try:
        with session_scope(make_session_factory(engine)) as db:
            rows = db.scalars(sa.select(Capture).where(Capture.rollout_id == session_id).order_by(Capture.seq)).all()
            calls = []
            for row in rows:
                body = full_request_json(db, row)  # stored relative to the parent's request
                request = get_codec(row.protocol).parse_request(body, path_model=row.model, path_stream=False)
                system = next((m.content for m in request.messages if m.role.value in ("system", "developer")), "")
                calls.append(
                    Call(
                        id=row.id,
                        seq=row.seq,
                        parent_id=row.parent_id,
                        render_mode=row.render_mode,
                        status=row.status.value,
                        error=row.error,
                        protocol=row.protocol,
                        model=row.model,
                        prefix_len=row.prefix_len,
                        n_prompt=row.n_prompt,
                        prompt_ids=full_prompt_ids(db, row),
                        output_ids=list(row.output_ids),
                        output_logprobs=list(row.output_logprobs),
                        finish_reason=row.finish_reason,
                        latency_s=row.latency_s,
                        tools=tuple(t.name for t in request.tools),
                        system=str(system)[:200],
                        request_json=body,
                    )
                )
            return calls
    finally:
        engine.dispose()


def _decode(reader, ids: list[int]) -> str:
    """A tokenizer's decode (special tokens kept), or a test's reader's (tests/e2e/test_harnesses.py)."""
    if hasattr(reader, "parse"):
        return reader.decode(ids)
    return reader.decode(ids, skip_special_tokens=False)


def describe(calls: list[Call], tokenizer=None) -> str:
    lines = []
    for c in calls:
        out = _decode(tokenizer, c.output_ids)[:120] if tokenizer else f"{len(c.output_ids)} ids"
        lines.append(
            f"#{c.id} seq={c.seq} parent={c.parent_id} {c.render_mode:9} {c.status} {c.protocol} model={c.model} "
            f"prompt={c.n_prompt} prefix={c.prefix_len} out={len(c.output_ids)} finish={c.finish_reason} "
            f"latency={c.latency_s if c.latency_s is None else round(c.latency_s, 2)}s "
            f"tools={len(c.tools)} system={c.system[:60]!r} output={out!r}" + (f" error={c.error}" if c.error else "")
        )
    return "\n".join(lines)


def main() -> None:
    from polar.tokens.tokenizer import load_tokenizer

    run = Path(sys.argv[1])
    result = json.loads((run / "result.json").read_text())
    cache = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/tmp/e2e-cache")
    calls = load_calls(result["database_url"], result["session_id"])
    print(describe(calls, load_tokenizer("small", cache)))
    for c in calls:
        print(f"#{c.id} tools: {', '.join(c.tools)}")


if __name__ == "__main__":
    main()
