"""prefix_merge on hand-made capture trees: the exact layout of merged traces and every edge case by name."""

from __future__ import annotations

import pytest
from traj_helpers import EOT, RecordTree

from db.capture_tree import CaptureTreeError
from db.enums import CaptureStatus
from polar.trajectory.per_request import per_request
from polar.trajectory.prefix_merge import BreakCause, detect_end_of_turn, prefix_merge
from polar.trajectory.records import PLACEHOLDER_LOGPROB, CaptureRecord, VersionRange
from polar.trajectory.tree import CaptureTree

P = PLACEHOLDER_LOGPROB
SYSTEM = [1, 50, 51, EOT, 1, 60]  # a rendered prompt ending in the assistant header


def lp(record: CaptureRecord) -> list[float]:
    return list(record.output_logprobs)


# §1 append mode


def test_append_chain_with_a_truncated_reply_merges_with_masked_glue() -> None:
    tree = RecordTree()
    a1 = tree.add(SYSTEM, [10, 11, EOT])
    # Tool result after a reply that stopped: "\n" + new turn + header.
    a2 = tree.add([*tree.sequence(a1), 70, 71, 72], [12, 13], a1)  # truncated: no end-of-turn
    # The reply was cut: append mode glues the end-of-turn the model never sampled.
    a3 = tree.add([*tree.sequence(a2), EOT, 70, 73], [14, EOT], a2)

    result = prefix_merge(tree.records)

    (trace,) = result.traces
    assert trace.prompt_ids == tuple(SYSTEM)
    assert trace.response_ids == (10, 11, EOT, 70, 71, 72, 12, 13, EOT, 70, 73, 14, EOT)
    assert trace.loss_mask == (1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1)
    assert list(trace.response_logprobs) == [*lp(a1), P, P, P, *lp(a2), P, P, P, *lp(a3)]
    assert trace.capture_ids == (a1.id, a2.id, a3.id)
    assert trace.finish_reason == "stop" and trace.turn_count == 3 and trace.n_inexact_merges == 0
    stats = result.stats
    assert (stats.captures_in, stats.traces_out, stats.roots, stats.exact_merges, stats.breaks) == (3, 1, 1, 2, 0)
    assert stats.merge_ratio == 3.0 and stats.exact_rate == 1.0


def test_retry_and_parallel_branches_train_shared_turns_once() -> None:
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    follow = [*tree.sequence(root), 70, 71]
    first = tree.add(follow, [20, EOT], root)
    retry = tree.add(follow, [21, 22, EOT], root)  # the identical prompt sent again
    deeper = tree.add([*tree.sequence(first), 80], [30, EOT], first)
    parallel = tree.add([*tree.sequence(root), 90], [40, EOT], root)

    result = prefix_merge(tree.records)

    # Depth first, children by seq: root->first->deeper, root->retry, root->parallel.
    assert [t.capture_ids for t in result.traces] == [
        (root.id, first.id, deeper.id),
        (root.id, retry.id),
        (root.id, parallel.id),
    ]
    other, dead, kept = result.traces
    # The session ended on ``parallel``: its chain, the one the harness kept, owns the shared root.
    assert kept.loss_mask == (1, 1, 0, 1, 1)
    assert other.loss_mask == (0, 0, 0, 0, 1, 1, 0, 1, 1)
    assert dead.response_ids == (10, EOT, 70, 71, 21, 22, EOT)
    # The retry the harness did not continue is a dead branch: never trained.
    assert dead.loss_mask == (0,) * 7
    # Shared context keeps its real logprobs; the mask alone says it is not trained here.
    assert list(dead.response_logprobs) == [*lp(root), P, P, *lp(retry)]
    assert result.stats.sampled_tokens == 11 and result.stats.loss_tokens == 8
    assert result.stats.untrained_tokens == {"dead_branch": 3}


def test_the_kept_chain_owns_the_parent_even_when_an_earlier_sibling_is_a_leaf() -> None:
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    short = tree.add([*tree.sequence(root), 70], [20, EOT], root)
    long = tree.add([*tree.sequence(root), 71], [21, EOT], root)
    tree.add([*tree.sequence(long), 72], [22, EOT], long)

    first, second = prefix_merge(tree.records).traces

    assert first.capture_ids == (root.id, short.id) and first.loss_mask[:2] == (0, 0) and first.n_loss_tokens == 2
    assert second.capture_ids[:2] == (root.id, long.id) and second.loss_mask[:2] == (1, 1)
    assert second.n_loss_tokens == 6


def test_compaction_and_sub_agent_roots_are_chains_of_their_own() -> None:
    tree = RecordTree()
    main = tree.add(SYSTEM, [10, EOT])
    tree.add([*tree.sequence(main), 70], [11, EOT], main)
    compacted = tree.add([1, 55, EOT, 1, 60], [12, EOT])  # a summary replaces the history
    tree.add([*tree.sequence(compacted), 70], [13, EOT], compacted)
    tree.add([1, 56, EOT, 1, 60], [14, EOT])  # a sub-agent

    result = prefix_merge(tree.records)

    assert [t.prompt_ids for t in result.traces] == [tuple(SYSTEM), (1, 55, EOT, 1, 60), (1, 56, EOT, 1, 60)]
    assert [t.turn_count for t in result.traces] == [2, 2, 1]
    assert (result.stats.roots, result.stats.breaks, result.stats.exact_merges) == (3, 0, 2)


# §2 canonical mode


def test_canonical_re_render_merges_inexactly_with_the_sampled_ids() -> None:
    tree = RecordTree()
    # Sampled " hel"+"lo" (10, 11); the canonical re-render says " hello" (12).
    stopped = tree.add(SYSTEM, [10, 11, EOT])
    child = tree.add([*SYSTEM, 12, EOT, 70, 71], [20, 21], stopped)
    grandchild = tree.add([*tree.full_prompts[child.id], 12, 13, EOT, 70, 72], [30, EOT], child)  # child was truncated

    result = prefix_merge(tree.records)

    (trace,) = result.traces
    assert child.prefix_len == len(SYSTEM)
    # The sampled ids replace the re-rendered copy: the model's own end-of-turn stays, the copy's goes...
    assert trace.response_ids == (10, 11, EOT, 70, 71, 20, 21, EOT, 70, 72, 30, EOT)
    # ...and after the truncated reply the copy's end-of-turn is kept, masked, as glue.
    assert trace.loss_mask == (1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 1)
    assert trace.n_inexact_merges == 2
    assert (result.stats.exact_merges, result.stats.inexact_merges, result.stats.exact_rate) == (0, 2, 0.0)
    assert grandchild.id in trace.capture_ids


def test_part_of_the_reply_surviving_is_still_inexact() -> None:
    tree = RecordTree()
    parent = tree.add(SYSTEM, [10, 11, EOT])
    child = tree.add([*SYSTEM, 10, 13, EOT, 70], [20, EOT], parent)

    (trace,) = prefix_merge(tree.records).traces

    assert child.prefix_len == len(SYSTEM) + 1
    assert trace.response_ids == (10, 11, EOT, 70, 20, EOT) and trace.n_inexact_merges == 1


def test_rewritten_history_breaks_the_chain() -> None:
    tree = RecordTree()
    parent = tree.add(SYSTEM, [10, EOT])
    edited = [1, 50, 52, EOT, 1, 60, 10, EOT, 70]  # the system prompt changed under the same conversation
    child = tree.add(edited, [20, EOT], parent)

    result = prefix_merge(tree.records)

    assert [t.capture_ids for t in result.traces] == [(parent.id,), (child.id,)]
    assert result.traces[1].prompt_ids == tuple(edited)
    assert result.stats.break_causes == {BreakCause.PROMPT_REWRITTEN.value: 1} and result.stats.breaks == 1


def test_a_re_render_without_an_end_of_turn_breaks_instead_of_guessing() -> None:
    tree = RecordTree()
    parent = tree.add(SYSTEM, [10, 11, EOT])
    tree.add([*SYSTEM, 12, 70], [20, EOT], parent)  # no end-of-turn in the new tokens

    stats = prefix_merge(tree.records).stats

    assert stats.break_causes == {"reply_not_found": 1} and stats.traces_out == 2


def test_an_unknown_end_of_turn_breaks_and_an_explicit_one_merges() -> None:
    tree = RecordTree()
    parent = tree.add(SYSTEM, [10, 11])  # truncated: nothing says which id ends a turn
    tree.add([*SYSTEM, 12, EOT, 70], [20, 21], parent)
    assert detect_end_of_turn(CaptureTree(tree.records)) is None

    assert prefix_merge(tree.records).stats.break_causes == {"no_end_of_turn_id": 1}
    merged = prefix_merge(tree.records, end_of_turn_id=EOT)
    assert merged.stats.inexact_merges == 1 and merged.traces[0].response_ids == (10, 11, EOT, 70, 20, 21)


def test_end_of_turn_detection() -> None:
    stopped = RecordTree()
    stopped.add(SYSTEM, [10, 7])
    stopped.add(SYSTEM, [11, EOT])
    stopped.add(SYSTEM, [12, EOT])
    assert detect_end_of_turn(CaptureTree(stopped.records)) == EOT
    # Only truncated replies: the glue append mode put after one gives it away.
    glued = RecordTree()
    first = glued.add(SYSTEM, [10, 11])
    glued.add([*glued.sequence(first), 9, 70], [12], first)
    assert detect_end_of_turn(CaptureTree(glued.records)) == 9


# §3 failed calls, versions, malformed calls


def test_failed_calls_are_left_out_and_linked_through() -> None:
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT])
    failed = tree.add([*tree.sequence(root), 70], [], root, status=CaptureStatus.ERROR)
    retried = tree.add([*tree.full_prompts[failed.id], 71], [20, EOT], failed)  # a child of the failed call
    tree.add([*tree.sequence(retried), 72], [], retried, status=CaptureStatus.ERROR)  # a failed leaf

    result = prefix_merge(tree.records)

    (trace,) = result.traces
    assert trace.capture_ids == (root.id, retried.id)
    assert trace.response_ids == (10, EOT, 70, 71, 20, EOT) and trace.loss_mask == (1, 1, 0, 0, 1, 1)
    assert (result.stats.captures_in, result.stats.error_captures, result.stats.exact_merges) == (4, 2, 1)


def test_a_child_of_failed_roots_only_starts_a_chain() -> None:
    tree = RecordTree()
    failed = tree.add(SYSTEM, [], status=CaptureStatus.ERROR)
    child = tree.add([*SYSTEM, 70], [20, EOT], failed)

    result = prefix_merge(tree.records)

    assert result.traces[0].capture_ids == (child.id,) and result.traces[0].prompt_ids == (*SYSTEM, 70)
    assert result.stats.break_causes == {"parent_failed": 1}


def test_weight_versions_span_the_sampled_tokens() -> None:
    tree = RecordTree()
    first = tree.add(SYSTEM, [10, 11, 12, EOT], version_spans=(VersionRange("v1", 0, 2), VersionRange("v2", 2, 4)))
    second = tree.add([*tree.sequence(first), 70], [20, EOT], first, weight_version="v3")  # no spans: whole output
    tree.add([*tree.sequence(second), 71], [30, EOT], second, version_spans=(VersionRange("v3", 0, 2),))

    (trace,) = prefix_merge(tree.records).traces

    assert trace.version_spans == (
        VersionRange("v1", 0, 2),
        VersionRange("v2", 2, 4),
        VersionRange("v3", 5, 7),
        VersionRange("v3", 8, 10),
    )
    assert trace.token_versions() == ["v1", "v1", "v2", "v2", None, "v3", "v3", None, "v3", "v3"]
    assert (trace.weight_version_min, trace.weight_version_max) == ("v1", "v3")
    (single,) = per_request(tree.records).traces[:1]
    assert (single.weight_version_min, single.weight_version_max) == ("v1", "v2")


def test_malformed_tool_calls_are_summed_per_chain() -> None:
    tree = RecordTree()
    root = tree.add(SYSTEM, [10, EOT], n_malformed_tool_calls=2)
    tree.add([*tree.sequence(root), 70], [20, EOT], root, n_malformed_tool_calls=1)
    tree.add([*tree.sequence(root), 71], [21, EOT], root)

    assert [t.n_malformed_tool_calls for t in prefix_merge(tree.records).traces] == [3, 2]
    assert [t.n_malformed_tool_calls for t in per_request(tree.records).traces] == [2, 1, 0]


def test_an_empty_rollout_builds_nothing() -> None:
    result = prefix_merge([])
    assert result.traces == () and result.stats.traces_out == 0 and result.stats.exact_rate is None


# §4 records that break the contract are refused


def _record(**fields) -> CaptureRecord:
    base = dict(
        id=1, seq=0, parent_id=None, prefix_len=0, prompt_delta_ids=(1,), output_ids=(2,), output_logprobs=(-0.5,)
    )
    return CaptureRecord(**(base | fields))


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([_record(prefix_len=1)], "is a root but has prefix_len"),
        ([_record(id=2, seq=1, parent_id=9, prefix_len=1)], "is not an earlier capture"),
        ([_record(), _record(id=2, seq=1, parent_id=1, prefix_len=3)], "parent sequence has 2 tokens"),
        ([_record(), _record(seq=1)], "repeats an id or a seq"),
        ([_record(id=2, seq=0, parent_id=1, prefix_len=1), _record(id=1, seq=1)], "is not an earlier capture"),
    ],
)
def test_broken_trees_are_refused(records, message) -> None:
    with pytest.raises(CaptureTreeError, match=message):
        prefix_merge(records)


def test_records_validate_their_arrays() -> None:
    with pytest.raises(ValueError, match="2 output ids but 1 logprobs"):
        _record(output_ids=(2, 3))
    with pytest.raises(ValueError, match="beyond its 1 output tokens"):
        _record(version_spans=(VersionRange("v1", 0, 2),))
    _record(status=CaptureStatus.ERROR, output_ids=(), output_logprobs=())  # a failed call has nothing to align
