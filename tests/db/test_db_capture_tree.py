"""Full prompts rebuilt from the capture tree equal the prompts that were sent, on SQLite and Postgres."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import sqlalchemy as sa
from db_factories import CaptureTreeBuilder, add_rollout
from sqlalchemy.orm import Session

from db.capture_tree import CaptureTreeError, chain_to_root, full_prompt_ids, prompt_from_chain
from db.models import Capture

CHAIN_DEPTH = 300


@contextmanager
def count_queries(engine: sa.Engine) -> Iterator[list[str]]:
    statements: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        statements.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


def _deep_chain(session: Session) -> tuple[CaptureTreeBuilder, list[Capture]]:
    """A 300-turn session: mostly append-mode turns, every 7th a canonical re-render that keeps only part."""
    rng = random.Random(20260530)
    tree = CaptureTreeBuilder(session, add_rollout(session))
    chain = [tree.add([rng.randrange(1000) for _ in range(8)], [rng.randrange(1000) for _ in range(3)])]
    for turn in range(1, CHAIN_DEPTH):
        sequence = tree.sequence_of(chain[-1])
        new_tokens = [1000 + rng.randrange(1000) for _ in range(rng.randint(1, 4))]
        if turn % 7 == 0:
            # Rewritten history: a strict prefix of the parent sequence, then new tokens.
            prompt = sequence[: rng.randrange(1, len(sequence))] + new_tokens
        else:
            prompt = sequence + new_tokens
        chain.append(tree.add(prompt, [rng.randrange(1000) for _ in range(rng.randint(1, 3))], parent=chain[-1]))
    return tree, chain


def test_full_prompts_of_a_300_deep_chain(db_session: Session) -> None:
    tree, chain = _deep_chain(db_session)
    db_session.commit()
    canonical = [(parent, c) for parent, c in itertools.pairwise(chain) if c.render_mode == "canonical"]
    assert len(canonical) >= 40
    assert all(c.prefix_len < len(tree.sequence_of(parent)) for parent, c in canonical)

    for capture in chain:
        assert full_prompt_ids(db_session, capture) == tree.full_prompts[capture.id]


def test_a_full_prompt_takes_one_query(db_engine: sa.Engine, db_session: Session) -> None:
    tree, chain = _deep_chain(db_session)
    db_session.commit()
    leaf = chain[-1]

    with count_queries(db_engine) as statements:
        prompt = full_prompt_ids(db_session, leaf)

    assert prompt == tree.full_prompts[leaf.id]
    assert len(statements) == 1


def test_chain_to_root_and_branches(db_session: Session) -> None:
    tree = CaptureTreeBuilder(db_session, add_rollout(db_session))
    root = tree.add([1, 2, 3], [4])
    child = tree.add([*tree.sequence_of(root), 5], [6], parent=root)
    grandchild = tree.add([*tree.sequence_of(child), 7], [8], parent=child)
    branch = tree.add([1, 2, 9], [10], parent=root)  # canonical re-render sharing 2 tokens
    sub_agent = tree.add([50, 51], [52])  # a second root in the same session

    assert chain_to_root(db_session, grandchild) == [grandchild, child, root]
    assert chain_to_root(db_session, branch) == [branch, root]
    assert chain_to_root(db_session, sub_agent) == [sub_agent]
    for capture in (root, child, grandchild, branch, sub_agent):
        assert full_prompt_ids(db_session, capture) == tree.full_prompts[capture.id]
    assert full_prompt_ids(db_session, grandchild) == [1, 2, 3, 4, 5, 6, 7]
    assert full_prompt_ids(db_session, branch) == [1, 2, 9]


def test_a_cycle_is_reported_not_looped(db_session: Session) -> None:
    tree = CaptureTreeBuilder(db_session, add_rollout(db_session))
    root = tree.add([1], [2])
    child = tree.add([1, 2, 3], [4], parent=root)
    root.parent_id = child.id  # corrupt the tree
    db_session.flush()

    with pytest.raises(CaptureTreeError, match="cycle"):
        full_prompt_ids(db_session, child)


def test_a_prefix_longer_than_the_parent_is_reported(db_session: Session) -> None:
    tree = CaptureTreeBuilder(db_session, add_rollout(db_session))
    root = tree.add([1, 2], [3])
    child = tree.add([1, 2, 3, 4], [5], parent=root, prefix_len=9)

    with pytest.raises(CaptureTreeError, match="prefix_len 9"):
        full_prompt_ids(db_session, child)


def test_an_unflushed_capture_is_refused(db_session: Session) -> None:
    with pytest.raises(ValueError, match="flush"):
        full_prompt_ids(db_session, Capture())


@dataclass(frozen=True)
class Link:
    id: int
    prefix_len: int
    prompt_delta_ids: list[int]
    output_ids: list[int]
    n_prompt: int


def test_prompt_from_chain_is_pure() -> None:
    chain = [Link(1, 0, [1, 2], [3], 2), Link(2, 3, [4], [5, 6], 4), Link(3, 2, [7], [], 3)]
    assert prompt_from_chain(chain[:2]) == [1, 2, 3, 4]
    assert prompt_from_chain(chain) == [1, 2, 7]


def test_prompt_from_chain_checks_the_stored_count() -> None:
    with pytest.raises(CaptureTreeError, match="n_prompt=5"):
        prompt_from_chain([Link(1, 0, [1, 2], [3], 5)])
    with pytest.raises(CaptureTreeError, match="is a root"):
        prompt_from_chain([Link(1, 1, [1, 2], [3], 2)])
