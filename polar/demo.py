"""The embedded main job for the token path: a multi-turn tool-using session on the local model.

Each turn renders the conversation (append mode after the first), generates with the configured backend,
parses the reply, and commits one capture to the store (SQLite by default). At the end it checks that
every capture's full prompt is rebuilt exactly from the capture tree, and prints a table.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import sqlalchemy as sa

from db import Capture, Rollout, full_prompt_ids, make_engine, make_session_factory, session_scope
from db import migrate
from db.enums import RolloutStatus
from polar.backends.base import GenerateRequest, SamplingParams
from polar.backends.registry import make_backend
from polar.capture import capture_row
from polar.models.tiny import get_spec
from polar.settings import Settings
from polar.tokens.messages import Message, Role, ToolSpec, system, tool_result, user
from polar.tokens.parsers import get_format
from polar.tokens.render import PriorCall, PromptBuilder
from polar.tokens.tokenizer import load_tokenizer
from polar.trajectory import build_and_store

BASH = ToolSpec("bash", "Run a shell command", {"type": "object", "properties": {"cmd": {"type": "string"}}})


async def run_demo(settings: Settings, turns: int = 4) -> None:
    url = settings.resolved_database_url
    migrate.upgrade(url)
    factory = make_session_factory(make_engine(url))
    tokenizer = load_tokenizer(get_spec(settings.model).tokenizer, settings.cache_dir)
    builder = PromptBuilder(tokenizer)
    parser = get_format(builder.template.tool_format)
    backend = await make_backend(settings)
    sampling = SamplingParams(max_new_tokens=48, temperature=1.0)
    with session_scope(factory) as session:
        rollout = Rollout(status=RolloutStatus.RUNNING, policy={"demo": "token-path"})
        session.add(rollout)
    messages: list[Message] = [system("You are a coding agent."), user("Create hello.txt containing 'hi'.")]
    prior: list[PriorCall] = []
    print(f"polar demo: backend={backend.name} model={settings.model} store={url} render={settings.render_mode}")
    print(f"{'turn':>4} {'mode':>9} {'parent':>6} {'prompt':>6} {'new':>5} {'out':>4} {'finish':>7} {'version':>8} {'tok/s':>6}")
    try:
        for turn in range(turns):
            prompt = builder.build(messages, (BASH,), prior, mode=settings.render_mode)
            started = time.perf_counter()
            result = await backend.generate(GenerateRequest(prompt.ids, sampling))
            elapsed = time.perf_counter() - started
            reply = parser.parse(tokenizer.decode(result.output_ids, skip_special_tokens=True), tools=[BASH])
            reply_message = Message(Role.ASSISTANT, reply.content, reply.reasoning, reply.tool_calls)
            with session_scope(factory) as session:
                row = capture_row(
                    rollout_id=rollout.id, seq=turn, protocol="raw", model=settings.model, backend=backend.name,
                    request_json={"turn": turn, "messages": len(messages)}, prompt=prompt, sampling=sampling, result=result,
                )  # fmt: skip
                session.add(row)
                session.flush()
                capture_id = row.id
            prior.append(PriorCall(tuple(messages), (BASH,), reply_message, prompt.ids, result.output_ids, ref=capture_id))
            parent = prompt.parent.ref if prompt.parent else "-"
            print(
                f"{turn:>4} {prompt.mode.value:>9} {parent!s:>6} {len(prompt.ids):>6} {len(prompt.delta_ids):>5} "
                f"{len(result.output_ids):>4} {result.finish_reason.value:>7} {result.weight_version!s:>8} "
                f"{len(result.output_ids) / elapsed:>6.0f}"
            )
            # A harness would run the tools; the random model rarely calls any, so the user nudges instead.
            follow = [tool_result("ok", c.id) for c in reply.tool_calls] or [user(f"Continue (step {turn + 1}).")]
            messages += [reply_message, *follow]
    finally:
        await backend.aclose()
    with session_scope(factory) as session:
        row = session.get(Rollout, rollout.id)
        row.status, row.finished_at = RolloutStatus.COMPLETED, datetime.now(UTC)
    with session_scope(factory) as session:
        built = build_and_store(session, rollout.id, builder="prefix_merge")
        captures = session.scalars(sa.select(Capture).where(Capture.rollout_id == rollout.id).order_by(Capture.seq)).all()
        exact = all(full_prompt_ids(session, c) == list(p.prompt_ids) for c, p in zip(captures, prior))
        stored = session.execute(
            sa.select(sa.func.sum(Capture.n_prompt_delta), sa.func.sum(Capture.n_prompt)).where(Capture.rollout_id == rollout.id)
        ).one()
    print(f"captures: {len(captures)} in one chain; prompts rebuilt from the capture tree: {'exact' if exact else 'MISMATCH'}")
    print(f"prompt tokens stored as deltas: {stored[0]} (vs {stored[1]} if every prompt were stored whole)")
    print(
        f"prefix_merge: {built.stats.captures_in} captures -> {built.stats.traces_out} trajectory, "
        f"{built.stats.exact_merges} exact merges, {built.stats.breaks} breaks"
    )
    if not exact:
        raise SystemExit(1)
