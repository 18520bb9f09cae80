"""Property tests over generated sessions (real prompts from the PromptBuilder and the small tokenizer).

Append-mode sessions with branches, retries, failed calls, compactions and sub-agents (new roots), truncated
replies (end-of-turn glue), non-canonical sampled tokenisations and weight changes between and inside replies;
then canonical-mode and mixed sessions, where re-rendered replies drift from the sampled ids. Whatever the
session, every sampled token trains exactly once with its own logprob and version, arrays align, every OK
capture is in a trace, and each merged trace reproduces its leaf's conversation.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from traj_helpers import DrawChooser, check_per_request, check_prefix_merge

from polar.settings import RenderMode
from polar.trajectory.per_request import per_request
from polar.trajectory.prefix_merge import prefix_merge
from tests.trajectory.synthetic import RandomChooser, SessionShape, SessionSimulator

PROPERTY_SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Denser events than the default shape, so short generated sessions still hold several of each.
BUSY = SessionShape(
    branch=0.2,
    retry=0.15,
    compact=0.1,
    subagent=0.1,
    fail=0.1,
    truncate=0.25,
    drift=0.3,
    version_bump=0.2,
    version_mid_reply=0.2,
    malformed=0.1,
)
MIXED = SessionShape(
    branch=0.2, retry=0.1, compact=0.05, subagent=0.05, fail=0.05, truncate=0.2, drift=0.4, rerender=0.3
)
CASES = (
    "branch",
    "retry",
    "new root",
    "failed call",
    "truncated",
    "version inside a reply",
    "version between calls",
    "malformed tool call",
    "inexact merge",
    "prompt_rewritten",
)


@PROPERTY_SETTINGS
@given(data=st.data())
def test_prefix_merge_on_append_mode_sessions(small_tokenizer, data) -> None:
    calls = data.draw(st.integers(1, 14), label="calls")
    session = SessionSimulator(small_tokenizer, DrawChooser(data), shape=BUSY).run(calls)

    result = prefix_merge(session.captures)

    check_prefix_merge(session, result, small_tokenizer)
    # Append mode conditions every call on exactly what was sampled: every merge is exact, and the only splits
    # are branches (a second child of one call), counted as such.
    assert result.stats.inexact_merges == 0 and set(result.stats.break_causes) <= {"branch"}
    assert all(trace.n_inexact_merges == 0 for trace in result.traces)


@PROPERTY_SETTINGS
@given(data=st.data(), mode=st.sampled_from([RenderMode.CANONICAL, RenderMode.APPEND]))
def test_prefix_merge_on_canonical_and_mixed_sessions(small_tokenizer, data, mode) -> None:
    calls = data.draw(st.integers(1, 14), label="calls")
    shape = MIXED if mode is RenderMode.APPEND else BUSY  # append + rerender: some calls re-tokenise history
    session = SessionSimulator(small_tokenizer, DrawChooser(data), shape=shape, mode=mode).run(calls)

    result = prefix_merge(session.captures)

    check_prefix_merge(session, result, small_tokenizer)


@PROPERTY_SETTINGS
@given(data=st.data(), mode=st.sampled_from(list(RenderMode)))
def test_per_request_traces_are_the_captures(small_tokenizer, data, mode) -> None:
    calls = data.draw(st.integers(1, 10), label="calls")
    session = SessionSimulator(small_tokenizer, DrawChooser(data), shape=BUSY, mode=mode).run(calls)

    check_per_request(session, per_request(session.captures))


def test_generated_sessions_hold_every_case(small_tokenizer) -> None:
    """Guards the properties above: the generator really makes the cases they claim to cover."""
    seen: Counter[str] = Counter()
    for seed in range(40):
        for mode, shape in ((RenderMode.APPEND, BUSY), (RenderMode.CANONICAL, BUSY), (RenderMode.APPEND, MIXED)):
            session = SessionSimulator(small_tokenizer, RandomChooser(seed), shape=shape, mode=mode).run(12)
            records = session.captures
            children = Counter(r.parent_id for r in records if r.parent_id is not None)
            prompts = Counter((r.parent_id, session.full_prompts[r.id]) for r in records if r.ok)
            seen["branch"] += any(n > 1 for n in children.values())
            seen["retry"] += any(n > 1 for n in prompts.values())
            seen["new root"] += sum(r.parent_id is None for r in records) > 1
            seen["failed call"] += any(not r.ok for r in records)
            seen["truncated"] += any(r.finish_reason == "length" for r in records)
            seen["version inside a reply"] += any(len(r.version_spans) > 1 for r in records)
            seen["version between calls"] += len({r.weight_version for r in records if r.ok}) > 1
            seen["malformed tool call"] += any(r.n_malformed_tool_calls for r in records)
            stats = prefix_merge(records).stats
            seen["inexact merge"] += stats.inexact_merges > 0
            seen["prompt_rewritten"] += stats.break_causes.get("prompt_rewritten", 0) > 0
    assert all(seen[case] >= 5 for case in CASES), seen
