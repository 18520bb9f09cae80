"""Poisoned chains, dead retries and the chain the harness kept, on hand-made capture trees.

Retry policy under test (``polar.trajectory.liveness``): the gateway keeps every generation of a retried call as
a sibling; only the one the harness continued is live (at the end of a session, where no later call witnesses
one: both masked, unless the copies are one record), and a dead branch is never trained, under both builders."""

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
    assert result.stats.unfinished == "last_call_poisoned"  # the filter masks the whole rollout
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
def test_a_final_retry_no_witness_settles_is_masked_whole_not_picked_by_seq(build, order) -> None:
    """Both arrival orders: the client read both copies of its last call and no later call says which it used,
    so neither is picked by ``seq``: both are masked, and the session has no clean last call."""
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    last = [*tree.sequence(root), 70]
    a = tree.add(last, [20, EOT] if order == "original_first" else [21, 22, EOT], root)
    b = tree.add(last, [21, 22, EOT] if order == "original_first" else [20, EOT], root)

    result = build(tree.records)

    assert trained(result) == tokens(root)
    assert result.stats.untrained_tokens == {"ambiguous_witness": len(a.output_ids) + len(b.output_ids)}
    assert result.stats.unfinished == "last_call_ambiguous"


@pytest.mark.parametrize("build", BUILDERS)
def test_a_conversation_sent_again_after_other_calls_supersedes_the_earlier_copy(build) -> None:
    """Codex re-sends its conversation after a compaction: the copies are not a hedge (the harness read the first,
    made another call, and asked anew), so the latest is the session's end and trains; the first is dead."""
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    last = [*tree.sequence(root), 70]
    first = tree.add(last, [20, EOT], root)
    side = tree.add([1, 99, EOT], [30, EOT])  # a call in between (a compaction, a title)
    again = tree.add(last, [21, 22, EOT], root)

    result = build(tree.records)

    assert trained(result) == tokens(root, side, again)
    assert result.stats.untrained_tokens == {"dead_branch": len(first.output_ids)}
    assert result.stats.unfinished is None


@pytest.mark.parametrize("build", BUILDERS)
def test_a_final_retry_whose_copies_are_one_record_trains_once(build) -> None:
    """Copies of the last call with the same ids and logprobs within the verify tolerance are one record."""
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    last = [*tree.sequence(root), 70]
    first = tree.add(last, [20, EOT], root, logprobs=[-0.25, -0.5])
    second = tree.add(last, [20, EOT], root, logprobs=[-0.25 + 4.8e-7, -0.5])

    result = build(tree.records)

    assert sum(t.n_loss_tokens for t in result.traces) == sum(tokens(root, second).values())
    assert result.stats.untrained_tokens == {"dead_branch": len(first.output_ids)}
    assert result.stats.unfinished is None


@pytest.mark.parametrize("build", BUILDERS)
@pytest.mark.parametrize(
    ("status", "unfinished"),
    [(CaptureStatus.ERROR, "last_call_failed"), (CaptureStatus.UNACKNOWLEDGED, "last_call_unacknowledged")],
)
def test_a_last_call_no_retry_answered_leaves_the_session_unfinished(build, status, unfinished) -> None:
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    tree.add(
        [*tree.sequence(root), 70], [20, EOT] if status is CaptureStatus.UNACKNOWLEDGED else [], root, status=status
    )

    assert build(tree.records).stats.unfinished == unfinished


@pytest.mark.parametrize("build", BUILDERS)
def test_a_failed_or_dropped_copy_a_clean_copy_answered_leaves_the_session_finished(build) -> None:
    """An ERROR retried cleanly, and a hedge whose dropped copy committed after the copy the client kept."""
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    step = [*tree.sequence(root), 70]
    tree.add(step, [], root, status=CaptureStatus.ERROR)
    clean = tree.add(step, [20, EOT], root)
    last = [*tree.sequence(clean), 71]
    kept = tree.add(last, [30, EOT], clean)
    tree.add(last, [31, EOT], clean, status=CaptureStatus.UNACKNOWLEDGED)

    result = build(tree.records)

    assert result.stats.unfinished is None
    assert trained(result) == tokens(root, clean, kept)


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


@pytest.mark.parametrize("build", BUILDERS)
def test_twins_whose_logprobs_differ_by_float_noise_are_one_record_and_one_trains(build) -> None:
    """The same retry, but the copies' logprobs differ by 4.8e-7 (float noise: the rule on GPU engines, within
    ``polar verify``'s tolerance): either is a faithful record of one sample, so the continued copy trains and the
    other is a dead branch, instead of both being masked as ambiguous."""
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    step = [*tree.sequence(root), 70]
    first = tree.add(step, [20, EOT], root, logprobs=[-0.25, -0.5])
    second = tree.add(step, [20, EOT], root, logprobs=[-0.25 + 4.8e-7, -0.5])
    after = tree.add([*tree.sequence(second), 71], [30, EOT], second)

    result = build(tree.records)

    assert result.stats.untrained_tokens == {"dead_branch": len(first.output_ids)}
    assert sum(t.n_loss_tokens for t in result.traces) == sum(tokens(root, second, after).values())


def test_stats_name_every_untrained_token_and_root_cause() -> None:
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT], admission="root", admission_cause="first_call")
    step = [*tree.sequence(root), 70]
    tree.add(step, [20, EOT], root, admission="match")
    tree.add(step, [21, EOT], root, admission="match")  # a retry no later call continued: both masked
    tree.add([1, 99, EOT, 1, 60], [30, EOT], admission="root", admission_cause="tools_changed")
    tree.add([1, 98, EOT, 1, 60], [40, EOT], admission="unresolved", admission_cause="history_edited")

    stats = prefix_merge(tree.records).stats

    assert stats.token_line() == (
        "sampled 10, trainable 4, untrained: ambiguous_witness 4, poisoned 2; "
        "root causes: history_edited 1, tools_changed 1"
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
