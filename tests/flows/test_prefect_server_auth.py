"""Prefect's temporary server, as a ``polar`` command starts it (``flows.prefect_server.temporary_server``), is
locked with a per-start basic-auth secret: its API refuses a request without it (401), while the command's own
flows, which hold the secret, run on it.

The server runs in a child process of its own: Prefect keeps one temporary server per process and reads its
settings into process-wide state, which this test must not share with the other flow tests' server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import base64, json, os, sys
import httpx
from prefect import flow
from flows.prefect_server import AUTH_VARIABLES, temporary_server
from polar.settings import Settings

@flow
def doubled(x: int) -> int:
    return 2 * x

def basic(secret):
    return {"Authorization": "Basic " + base64.b64encode(secret.encode()).decode()}

out = {}
with temporary_server(Settings()) as url:
    out["flow"] = doubled(21)
    secret = os.environ["PREFECT_API_AUTH_STRING"]
    out["same_secret"] = os.environ["PREFECT_SERVER_API_AUTH_STRING"] == secret
    out["bare"] = httpx.post(f"{url}/flows/filter", json={}).status_code
    out["wrong"] = httpx.post(f"{url}/flows/filter", json={}, headers=basic("polar:wrong")).status_code
    out["with_secret"] = httpx.post(f"{url}/flows/filter", json={}, headers=basic(secret)).status_code
    out["health"] = httpx.get(f"{url}/health").status_code
    out["flow_names"] = [f["name"] for f in httpx.post(f"{url}/flows/filter", json={}, headers=basic(secret)).json()]
out["left_in_environment"] = [name for name in AUTH_VARIABLES if name in os.environ]
print("RESULT " + json.dumps(out))
"""


def test_the_temporary_server_refuses_requests_without_its_secret_and_runs_flows(tmp_path):
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PREFECT_", "POLAR_")) or key == "POLAR_TEST_POSTGRES_URL"
    }
    env.update({"POLAR_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO)})
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))
    assert out["flow"] == 42 and "doubled" in out["flow_names"]
    assert out["same_secret"]
    assert (out["bare"], out["wrong"], out["with_secret"], out["health"]) == (401, 401, 200, 200)
    assert out["left_in_environment"] == []
