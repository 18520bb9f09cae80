"""Poisoned chains, dead retries and the chain the harness kept, on hand-made capture trees.

Retry policy under test (``polar.trajectory.liveness``): the gateway keeps every generation of a retried call as
a sibling; only the one the harness continued is live (at the end of a session: the latest acknowledged one),
and a dead branch is never trained, under both builders."""

from __future__ import annotations

import pytest
from traj_helpers import EOT, RecordTree

from db.enums import CaptureStatus
from polar.trajectory.per_request import per_request
from polar.trajectory.prefix_merge import prefix_merge
from polar.trajectory.records import BuildResult, CaptureRecord

SYSTEM = [1, 50, 51, EOT, 1, 60]
BUILDERS = [pytest.param(prefix_merge, id="prefix_merge"), pytest.param(per_request, id="per_request")]


def trained(result: BuildResult) -> dict[int, int]:
    """capture id -> how many of its sampled tokens are trained, over all traces (logprobs name the capture)."""
    out: dict[int, int] = {}
    for trace in result.traces:
        for logprob, mask in zip(trace.response_logprobs, trace.loss_mask, strict=True):
            if mask:
                capture = int(-logprob * 1024) // 100
                out[capture] = out.get(capture, 0) + 1
    return out


def tokens(*records: CaptureRecord) -> dict[int, int]:
    return {r.id: len(r.output_ids) for r in records}


@pytest.mark.parametrize("build", BUILDERS)
def test_an_unresolved_call_poisons_its_chain_from_there_on(build) -> None:
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT], admission="root", admission_cause="first_call")
    edited = tree.add(
        [*tree.sequence(root), 70, 71], [20, 21, EOT], root, admission="unresolved", admission_cause="history_edited"
    )
    after = tree.add([*tree.sequence(edited), 72], [30, EOT], edited, admission="match")

    result = build(tree.records)

    assert trained(result) == tokens(root)
    assert result.stats.untrained_tokens == {"poisoned": len(edited.output_ids) + len(after.output_ids)}
    assert result.stats.root_causes == {"history_edited": 1}
    assert {i for t in result.traces for i in t.capture_ids} == {root.id, edited.id, after.id}  # kept, shown


@pytest.mark.parametrize("build", BUILDERS)
@pytest.mark.parametrize("continued", ["original", "retry"])
def test_a_retry_of_the_first_call_trains_the_one_continued(build, continued) -> None:
    tree = RecordTree()
    original = tree.add(SYSTEM, [10, EOT])
    retry = tree.add(SYSTEM, [11, 12, EOT])
    kept = original if continued == "original" else retry
    nxt = tree.add([*tree.sequence(kept), 70], [20, EOT], kept)

    result = build(tree.records)

    assert trained(result) == tokens(kept, nxt)
    dead = retry if kept is original else original
    assert result.stats.untrained_tokens == {"dead_branch": len(dead.output_ids)}


@pytest.mark.parametrize("build", BUILDERS)
@pytest.mark.parametrize("order", ["original_first", "retry_first"])
def test_a_retry_of_the_last_call_trains_the_last_acknowledged(build, order) -> None:
    """Both arrival orders: whichever committed last (the higher seq) is the reply the harness ended on."""
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    last = [*tree.sequence(root), 70]
    a = tree.add(last, [20, EOT] if order == "original_first" else [21, 22, EOT], root)
    b = tree.add(last, [21, 22, EOT] if order == "original_first" else [20, EOT], root)

    result = build(tree.records)

    assert trained(result) == tokens(root, b)
    assert result.stats.untrained_tokens == {"dead_branch": len(a.output_ids)}


@pytest.mark.parametrize("build", BUILDERS)
def test_a_retry_whose_first_reply_was_lost_trains_the_retry_only(build) -> None:
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    last = [*tree.sequence(root), 70]
    lost = tree.add(last, [20, EOT], root, status=CaptureStatus.UNACKNOWLEDGED, logprobs=[-0.5, -0.5])
    retry = tree.add(last, [21, EOT], root)

    result = build(tree.records)

    assert trained(result) == tokens(root, retry)
    assert result.stats.untrained_tokens == {"unacknowledged": len(lost.output_ids)}
    assert lost.id not in {i for t in result.traces for i in t.capture_ids}


def test_the_kept_chain_owns_the_prefix_it_shares_with_a_dead_branch() -> None:
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    step = [*tree.sequence(root), 70]
    first = tree.add(step, [20, EOT], root, logprobs=[-0.25, -0.5])
    # The same reply again, sampled alike (greedy): the harness continued this one, and either trains the same.
    second = tree.add(step, [20, EOT], root, logprobs=[-0.25, -0.5])
    tree.add([*tree.sequence(second), 71], [30, EOT], second)

    dead_trace, kept_trace = prefix_merge(tree.records).traces

    assert dead_trace.capture_ids == (root.id, first.id) and dead_trace.n_loss_tokens == 0
    assert kept_trace.capture_ids[:2] == (root.id, second.id)
    assert kept_trace.n_loss_tokens == 6  # root, second and its child, each once


@pytest.mark.parametrize("build", BUILDERS)
def test_a_retry_the_echo_cannot_single_out_is_masked_not_guessed(build) -> None:
    """Two generations of one call with the same reply ids but other logprobs: the next call's history echoes
    both alike, so which one the harness kept is unknown. Both are masked with the reason; the rest trains."""
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    step = [*tree.sequence(root), 70]
    first = tree.add(step, [20, EOT], root)
    second = tree.add(step, [20, EOT], root)  # other logprobs (sampled): the twins would train differently
    after = tree.add([*tree.sequence(second), 71], [30, EOT], second)

    result = build(tree.records)

    assert trained(result) == tokens(root, after)
    assert result.stats.untrained_tokens == {"ambiguous_witness": len(first.output_ids) + len(second.output_ids)}
    assert sum(t.kept for t in result.traces) == 1


def test_stats_name_every_untrained_token_and_root_cause() -> None:
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT], admission="root", admission_cause="first_call")
    step = [*tree.sequence(root), 70]
    tree.add(step, [20, EOT], root, admission="match")
    tree.add(step, [21, EOT], root, admission="match")  # a retry of the last call: the first is dead
    tree.add([1, 99, EOT, 1, 60], [30, EOT], admission="root", admission_cause="tools_changed")
    tree.add([1, 98, EOT, 1, 60], [40, EOT], admission="unresolved", admission_cause="history_edited")

    stats = prefix_merge(tree.records).stats

    assert stats.token_line() == (
        "sampled 10, trainable 6, untrained: dead_branch 2, poisoned 2; root causes: history_edited 1, tools_changed 1"
    )


@pytest.mark.parametrize("build", BUILDERS)
@pytest.mark.parametrize("witnessed", ["first", "second"])
def test_a_retry_the_echoed_ids_single_out_trains_that_twin_and_marks_the_other_dead(build, witnessed) -> None:
    """The same twins, but the next call echoed the ids the gateway minted for one of them (its tool-call ids:
    the gateway linked it there with the cause ``echoed_ids``): that one trains, the other is a dead branch."""
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    step = [*tree.sequence(root), 70]
    first = tree.add(step, [20, EOT], root)
    second = tree.add(step, [20, EOT], root)  # other logprobs (sampled)
    kept, dead = (first, second) if witnessed == "first" else (second, first)
    after = tree.add([*tree.sequence(kept), 71], [30, EOT], kept, admission="match", admission_cause="echoed_ids")

    result = build(tree.records)

    assert trained(result) == tokens(root, kept, after)
    assert result.stats.untrained_tokens == {"dead_branch": len(dead.output_ids)}
    assert result.stats.root_causes == {}  # a witnessed match is no root
    assert [t.capture_ids[-1] for t in result.traces if t.kept] == [after.id]  # the chain the harness kept
