"""Chain roles through the store, on SQLite and Postgres: OpenAI Chat request/response JSON as the gateway
stores it, labelled with the task harness's hints, stored in the role columns, counted in the merge stats and
the views, and trained and rewarded as the task's builder options say (issue 16)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from db.engine import session_scope
from db.enums import RolloutStatus
from db.models import Capture, Evaluation, MergeStat, Rollout, Task
from polar.trajectory.choices import BuilderOptions, RewardRouting
from polar.trajectory.roles import Role
from polar.trajectory.store import build_and_store, load_traces

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
SUB_TASK = "Count the lines of data.txt and say how many."
SUMMARY = "Summary so far: data.txt was read; the count is next."


def _call(
    db,
    rollout_id: str,
    seq: int,
    messages: list[dict[str, Any]],
    reply: dict[str, Any],
    *,
    tools: bool = True,
    parent: Capture | None = None,
) -> Capture:
    prompt = [seq * 100 + i for i in range(5)]
    output = [seq * 100 + 50 + i for i in range(3)]
    prefix = (parent.n_prompt + parent.n_output) if parent is not None else 0
    row = Capture(
        rollout_id=rollout_id,
        seq=seq,
        protocol="openai_chat",
        model="m",
        request_json={"model": "m", "messages": messages, **({"tools": TOOLS} if tools else {})},
        response_json={"choices": [{"index": 0, "message": {"role": "assistant", **reply}}]},
        parent_id=parent.id if parent is not None else None,
        prefix_len=prefix,
        prompt_delta_ids=prompt,
        output_ids=output,
        output_logprobs=[-0.5] * len(output),
        finish_reason="stop",
        sampling_params={},
        render_mode="append" if parent is not None else "canonical",
        backend="test",
        n_prompt=prefix + len(prompt),
        n_prompt_delta=len(prompt),
        n_output=len(output),
    )
    db.add(row)
    db.flush()
    return row


def add_session(factory, options: BuilderOptions | None = None) -> tuple[str, dict[str, int]]:
    """Title, main (launches a sub-agent), sub-agent, compaction, post-compaction main, under harness opencode."""
    launch = {
        "id": "c1",
        "type": "function",
        "function": {"name": "task", "arguments": json.dumps({"prompt": SUB_TASK})},
    }
    with session_scope(factory) as db:
        task = Task(
            instruction="count",
            harness={"name": "opencode"},
            runtime={},
            evaluator={},
            num_samples=1,
            builder_options=options.model_dump(mode="json") if options else None,
        )
        db.add(task)
        db.flush()
        rollout = Rollout(task_id=task.id, status=RolloutStatus.COMPLETED, reward=1.0)
        db.add(rollout)
        db.flush()
        system = {"role": "system", "content": "You are the agent."}
        user = {"role": "user", "content": "count the lines"}
        title = _call(
            db,
            rollout.id,
            0,
            [{"role": "system", "content": "You are a title generator."}, user],
            {"content": "Line count"},
            tools=False,
        )
        main = _call(db, rollout.id, 1, [system, user], {"content": "Delegating.", "tool_calls": [launch]})
        sub = _call(db, rollout.id, 2, [system, {"role": "user", "content": SUB_TASK}], {"content": "It has 3 lines."})
        echoed = {"role": "assistant", "content": "Delegating.", "tool_calls": [launch]}
        main2 = _call(
            db,
            rollout.id,
            3,
            [system, user, echoed, {"role": "tool", "tool_call_id": "c1", "content": "It has 3 lines."}],
            {"content": "Noted."},
            parent=main,
        )
        compaction = _call(
            db,
            rollout.id,
            4,
            [{"role": "system", "content": "Summarise."}, {"role": "user", "content": "count the lines ... Noted."}],
            {"content": SUMMARY},
            tools=False,
        )
        after = _call(db, rollout.id, 5, [system, user, {"role": "user", "content": SUMMARY}], {"content": "3."})
        ids = {"title": title.id, "main": main.id, "sub": sub.id, "main2": main2.id}
        ids |= {"compaction": compaction.id, "after": after.id}
        return rollout.id, ids


def test_roles_are_stored_counted_and_trained_by_the_options(session_factory) -> None:
    rollout_id, ids = add_session(session_factory)
    with session_scope(session_factory) as db:
        built = build_and_store(db, rollout_id)
    with session_factory() as db:
        stored = load_traces(db, rollout_id, "prefix_merge")
        stats = db.scalars(sa.select(MergeStat).where(MergeStat.rollout_id == rollout_id)).one()
        view = db.execute(
            sa.text(
                "SELECT role, compacted, trajectories, trainable, linked FROM trajectory_roles "
                "WHERE harness = 'opencode' AND builder = 'prefix_merge' ORDER BY role, compacted"
            )
        ).all()
    assert stored == list(built.traces)
    by_start = {t.capture_ids[0]: t for t in stored}
    assert (by_start[ids["title"]].role, by_start[ids["title"]].n_loss_tokens) == ("title", 0)
    assert by_start[ids["title"]].filter_reason == "role_not_trained"
    assert (by_start[ids["main"]].role, by_start[ids["main"]].capture_ids) == ("main", (ids["main"], ids["main2"]))
    sub = by_start[ids["sub"]]
    assert (sub.role, sub.source_capture_id, sub.reward) == ("sub_agent", ids["main"], 1.0) and sub.n_loss_tokens
    compaction = by_start[ids["compaction"]]
    assert (compaction.role, compaction.source_capture_id, compaction.n_loss_tokens) == ("compaction", ids["main2"], 0)
    after = by_start[ids["after"]]
    assert (after.role, after.source_capture_id, after.compacted, after.reward) == (
        "main",
        ids["compaction"],
        True,
        1.0,
    )
    assert stats.roots_by_role == {"compaction": 1, "main": 2, "sub_agent": 1, "title": 1}
    assert stats.traces_out == stats.roots + stats.breaks
    assert [tuple(row) for row in view] == [
        ("compaction", False, 1, 0, 1),
        ("main", False, 1, 1, 0),
        ("main", True, 1, 1, 1),
        ("sub_agent", False, 1, 1, 1),
        ("title", False, 1, 0, 0),
    ]


def test_reward_routing_per_task(session_factory) -> None:
    main_only, _ = add_session(session_factory, BuilderOptions(reward=RewardRouting.MAIN_ONLY))
    options = BuilderOptions(reward=RewardRouting.PER_ROLE, train_roles=(Role.MAIN, Role.TITLE))
    per_role, _ = add_session(session_factory, options)
    with session_scope(session_factory) as db:
        db.add(Evaluation(rollout_id=per_role, evaluator="judge", reward=1.0, details={"role_rewards": {"main": 0.5}}))
        db.flush()
        routed = {t.role + ("+" if t.compacted else ""): t for t in build_and_store(db, main_only).traces}
        by_role = {t.role + ("+" if t.compacted else ""): t for t in build_and_store(db, per_role).traces}
    assert routed["main"].reward == 1.0 and routed["main"].n_loss_tokens
    for key in ("sub_agent", "main+"):
        assert routed[key].reward is None and not routed[key].n_loss_tokens
        assert routed[key].filter_reason == "reward_not_routed"
    assert by_role["main"].reward == 0.5 and by_role["main"].n_loss_tokens
    # No post_compaction key in the evaluator's rewards: that chain does not train (fail-closed).
    assert by_role["main+"].reward is None and not by_role["main+"].n_loss_tokens
    assert by_role["title"].filter_reason == "reward_not_routed"  # trainable by role, but no reward reached it
