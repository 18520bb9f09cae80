"""Chain roles over generated multi-agent sessions (issue 16), plus the training choices and the reply readers.

Property: whatever the mix of sub-agents, compactions (as roots or extending the chain they summarise),
titles, failed calls and retries, the labels are the generator's truth; under both builders every sampled token
trains in exactly one trace, every OK capture is in a trace, every split is counted (``traces_out == roots +
breaks``), each trace carries its chain start's role and link, a compaction call never shares a trace with the
chain it summarised, and the default choices train exactly the main and sub-agent tokens.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multiagent_sessions import HINTS, MultiAgentSession, multiagent_session
from traj_helpers import untrained_retries

from polar.trajectory.choices import BuilderOptions, RewardRouting, route_rewards, select_roles
from polar.trajectory.per_request import per_request
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.records import BuildResult
from polar.trajectory.roles import Role, label_session
from polar.wire.replies import reply_from_response

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def sampled(session: MultiAgentSession) -> Counter[float]:
    """Logprobs (unique per token) of every live sampled token: dead and ambiguous retries never train."""
    dead = untrained_retries(session.records, session.tree.full_prompts)
    return Counter(lp for r in session.records if r.ok and r.id not in dead for lp in r.output_logprobs)


def trained(result: BuildResult) -> Counter[float]:
    return Counter(lp for t in result.traces for lp, m in zip(t.response_logprobs, t.loss_mask, strict=True) if m)


def check_build(session: MultiAgentSession, result: BuildResult) -> None:
    roles = label_session(session.records, session.views, HINTS)
    stats = result.stats
    assert trained(result) == sampled(session), "every sampled token trains in exactly one trace"
    assert {i for t in result.traces for i in t.capture_ids} == {r.id for r in session.records if r.ok}
    assert stats.traces_out == len(result.traces) == stats.roots + stats.breaks
    assert stats.roots_by_role == dict(Counter(label.role.value for label in session.truth.values()))
    compactions = roles.compaction_calls
    for trace in result.traces:
        label = roles.label_of(trace.capture_ids[0])
        assert (trace.role, trace.source_capture_id, trace.compacted) == (
            label.role.value,
            label.link_id,
            label.compacted,
        )
        assert not compactions & set(trace.capture_ids[1:]), "a compaction call always starts its own trace"
        assert {roles.label_of(i) for i in trace.capture_ids} == {label}, "a trace never mixes chains"


@PROPERTY_SETTINGS
@given(data=st.data())
def test_roles_and_links_are_the_truth(data) -> None:
    session = multiagent_session(data, data.draw(st.integers(0, 12), label="events"))
    roles = label_session(session.records, session.views, HINTS)
    assert dict(roles.starts) == session.truth
    # Nothing dropped: every capture belongs to a labelled chain start above it.
    assert set(roles.start_of) == {r.id for r in session.records}
    for start in roles.starts.values():
        if start.link_id is not None:
            assert start.link_id < start.capture_id, "a chain links to an earlier call"


@PROPERTY_SETTINGS
@given(data=st.data())
def test_builders_keep_every_token_once_with_its_role(data) -> None:
    session = multiagent_session(data, data.draw(st.integers(0, 12), label="events"))
    roles = label_session(session.records, session.views, HINTS)
    merged = prefix_merge(session.records, roles=roles)
    check_build(session, merged)
    check_build(session, per_request(session.records, roles=roles))
    # Default choices: main and sub-agent tokens train, titles and compaction summaries do not.
    options = BuilderOptions()
    chosen = select_roles(route_rewards(merged.traces, 1.0, options.reward), options.train_roles)
    dead = untrained_retries(session.records, session.tree.full_prompts)
    keep = {
        r.id
        for r in session.records
        if r.ok and r.id not in dead and roles.label_of(r.id).role in (Role.MAIN, Role.SUB_AGENT)
    }
    expected = Counter(lp for r in session.records if r.id in keep for lp in r.output_logprobs)
    assert Counter(lp for t in chosen for lp, m in zip(t.response_logprobs, t.loss_mask, strict=True) if m) == expected


def test_generated_sessions_hold_every_case() -> None:
    """Guards the properties: the generator makes each role and split it claims to. Derandomized: the same 40
    examples every run (drawn afresh each run, a case could come up fewer than three times by chance)."""
    seen: Counter[str] = Counter()

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
    @given(data=st.data())
    def collect(data) -> None:
        session = multiagent_session(data, 10)
        stats = prefix_merge(session.records, roles=label_session(session.records, session.views, HINTS)).stats
        seen.update(stats.roots_by_role.keys())
        seen.update(stats.break_causes.keys())
        seen["compacted"] += any(label.compacted for label in session.truth.values())
        seen["failed"] += any(not r.ok for r in session.records)
        seen["through failed"] += any(r.parent_id and not session.records[r.parent_id - 1].ok for r in session.records)

    collect()
    for case in ("main", "sub_agent", "compaction", "title", "branch", "compacted", "failed", "through failed"):
        assert seen[case] >= 3, seen


def _traces(session: MultiAgentSession) -> BuildResult:
    return prefix_merge(session.records, roles=label_session(session.records, session.views, HINTS))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_reward_routing(data) -> None:
    traces = _traces(multiagent_session(data, data.draw(st.integers(0, 10)))).traces
    broadcast = route_rewards(traces, 1.0, RewardRouting.BROADCAST)
    assert all(t.reward == 1.0 and t.loss_mask == u.loss_mask for t, u in zip(broadcast, traces, strict=True))
    main_only = route_rewards(traces, 1.0, RewardRouting.MAIN_ONLY)
    for trace in main_only:
        reached = trace.role == "main" and not trace.compacted
        assert (trace.reward == 1.0) if reached else (trace.reward is None and not trace.n_loss_tokens)
    per_role = route_rewards(traces, None, RewardRouting.PER_ROLE, {"main": 0.5, "post_compaction": 0.25})
    for trace in per_role:
        expected = 0.25 if trace.compacted else 0.5 if trace.role == "main" else None
        assert trace.reward == expected
        if expected is None:
            assert trace.filter_reason == "reward_not_routed" and not trace.n_loss_tokens


def test_reply_readers_read_each_protocol() -> None:
    calls = {
        "openai_chat": {
            "choices": [
                {"message": {"content": "hi", "tool_calls": [{"function": {"name": "Agent", "arguments": '{"a": 1}'}}]}}
            ]
        },
        "openai_responses": {
            "output": [
                {"type": "message", "content": [{"type": "output_text", "text": "hi"}]},
                {"type": "function_call", "name": "Agent", "arguments": '{"a": 1}', "call_id": "c"},
            ]
        },
        "anthropic_messages": {
            "content": [
                {"type": "text", "text": "hi"},
                {"type": "tool_use", "id": "t", "name": "Agent", "input": {"a": 1}},
            ]
        },
        "gemini": {
            "candidates": [
                {"content": {"parts": [{"text": "hi"}, {"functionCall": {"name": "Agent", "args": {"a": 1}}}]}}
            ]
        },
    }
    for protocol, body in calls.items():
        message = reply_from_response(protocol, body)
        assert message.content == "hi" and [(c.name, c.parsed_arguments()) for c in message.tool_calls] == [
            ("Agent", {"a": 1})
        ], protocol
    assert reply_from_response("unknown", {}).content == "" and reply_from_response("gemini", None).tool_calls == ()
