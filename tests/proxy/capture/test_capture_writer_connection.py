"""The capture writer keeps its own connection (no pre-ping per transaction): one the server dropped between two
batches costs a retry of the batch on a new connection, never the callers' captures."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa

from db import Capture, Rollout, make_engine, make_session_factory, session_scope
from polar.proxy.capture.writer import CaptureWriter
from tests.pg import migrated_store, needs_postgres


def _row(rollout_id: str) -> Capture:
    return Capture(
        rollout_id=rollout_id,
        seq=-1,
        protocol="openai_chat",
        model="tiny",
        request_json={"messages": [{"role": "user", "content": "hi"}]},
        prompt_delta_ids=[1, 2],
        output_ids=[3],
        output_logprobs=[-0.5],
        render_mode="append",
        backend="local",
        n_prompt=2,
        n_prompt_delta=2,
        n_output=1,
    )


@needs_postgres
def test_a_dropped_connection_is_replaced_and_the_batch_retried(tmp_path, caplog):
    with migrated_store("postgres", tmp_path) as url:
        engine = make_engine(url)
        admin = make_engine(url)
        factory = make_session_factory(engine)
        writer = CaptureWriter(factory)
        try:
            with session_scope(factory) as db:
                rollout = Rollout()
                db.add(rollout)
                db.flush()
                rollout_id = rollout.id

            async def scenario() -> list[int]:
                first = await writer.store(_row(rollout_id), timeout_s=30)
                conn = writer._conn
                assert conn is not None  # white-box: the writer's own connection, kept between batches
                pid = conn.connection.dbapi_connection.info.backend_pid
                with admin.begin() as other:
                    assert other.scalar(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
                second = await writer.store(_row(rollout_id), timeout_s=30)
                return [first.seq, second.seq]

            assert asyncio.run(scenario()) == [0, 1]
            assert "retrying the batch on a new one" in caplog.text
            with session_scope(factory) as db:
                assert db.scalars(sa.select(Capture.seq).where(Capture.rollout_id == rollout_id)).all() == [0, 1]
        finally:
            writer.close()
            engine.dispose()
            admin.dispose()
