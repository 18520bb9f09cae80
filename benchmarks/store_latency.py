"""What the machine's disk and store cost a commit, printed beside the capture writer's throughput
(``bench_gateway_scale.py`` section 4), so a slow disk shows as one rather than as slow code."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from db import make_engine


def fsync_ms(folder: Path, n: int = 50) -> float:
    """Median milliseconds to write 8 KiB and fsync it in ``folder``."""
    times = []
    with tempfile.NamedTemporaryFile(dir=folder) as f:
        for _ in range(n):
            f.write(b"x" * 8192)
            f.flush()
            started = time.perf_counter()
            os.fsync(f.fileno())
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def pg_data_dir(pg_url: str) -> Path:
    """The folder of the Postgres data directory when this process may write there (a local server run as root),
    else the temporary folder (the same disk on most machines)."""
    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:
            folder = Path(conn.exec_driver_sql("SHOW data_directory").scalar_one())
    except sa.exc.SQLAlchemyError:
        folder = Path(tempfile.gettempdir())
    finally:
        engine.dispose()
    return folder if folder.is_dir() and os.access(folder, os.W_OK) else Path(tempfile.gettempdir())


def commit_s(engine: sa.Engine, rollout_id: str) -> float:
    """Seconds for one transaction updating one row: the round trip and the WAL flush each group commit pays."""
    with engine.connect() as conn:
        started = time.perf_counter()
        with conn.begin():
            conn.execute(
                sa.text("UPDATE rollouts SET next_capture_seq = next_capture_seq WHERE id = :i"), {"i": rollout_id}
            )
        return time.perf_counter() - started
