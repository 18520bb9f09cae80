"""Several processes starting at once may all run the migrations; exactly one does the work."""

from __future__ import annotations

import subprocess
import sys

from db.migrate import current, head
from tests.pg import needs_postgres, postgres_schema, schema_url


@needs_postgres
def test_concurrent_upgrades_on_postgres():
    with postgres_schema() as schema:
        url = schema_url(schema)
        code = f"from db.migrate import upgrade; upgrade({url!r})"
        procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE) for _ in range(3)]
        errors = [p.communicate(timeout=120)[1].decode() for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], errors
        assert current(url) == head()
