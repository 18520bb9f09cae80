"""A Python client of the control API for trainers: submit, wait, claim, ack, register weights.

    client = PolarClient("http://127.0.0.1:8800", token="...")
    ids = client.submit([task_request, ...])
    client.wait(ids)
    batch = client.claim("trainer-0", max_groups=4, max_staleness=1)
    ...train on batch["groups"]...
    client.ack(batch["claim_id"], "trainer-0")
    client.register_weights("step-1", state_dict=model.state_dict())

Errors the API returns are raised as ``ApiError`` with the API's status, type, message and field.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from polar.errors import PolarError

FINISHED = {"COMPLETED", "FAILED", "CANCELLED"}


class ApiError(PolarError):
    def __init__(self, status_code: int, error_type: str, message: str, field: str | None):
        super().__init__(message, field=field)
        self.status_code = status_code
        self.error_type = error_type

    def __str__(self) -> str:
        return f"{self.status_code} {self.error_type}: {self.message}"


KEEPALIVE_S = 2.0  # how long an idle connection to the server is reused: under the server's keep-alive


class PolarClient:
    """``token`` None: ``POLAR_CONTROL_TOKEN``, else the token file in ``POLAR_HOME`` (a server on this machine)."""

    def __init__(self, url: str, *, token: str | None = None, timeout_s: float = 600.0):
        if token is None:
            from polar.auth import control_token
            from polar.settings import get_settings

            token = control_token(get_settings(), create=False)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # An idle connection is given up well before the server's keep-alive (uvicorn's 5 s) ends it: at the same
        # moment, a request sent on it as the server closes it is reset unanswered (seen on a step's ack).
        limits = httpx.Limits(keepalive_expiry=KEEPALIVE_S)
        self._http = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, timeout=timeout_s, trust_env=False, limits=limits
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PolarClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """One request; the reply's JSON object (every route answers an object), or ``ApiError``."""
        reply = self._http.request(method, path, **kwargs)
        if reply.status_code >= 400:
            try:
                error = reply.json()["error"]
                raise ApiError(
                    reply.status_code, error.get("type", "error"), error.get("message", ""), error.get("field")
                )
            except (ValueError, KeyError, TypeError):
                raise ApiError(reply.status_code, "error", reply.text[:500], None) from None
        body: dict[str, Any] = reply.json()
        return body

    # ---- tasks --------------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health")

    def model(self) -> dict[str, Any]:
        """The served model and its tokenizer's ``name``, ``vocab_size`` and ``fingerprint``."""
        return self._call("GET", "/v1/model")

    def submit(self, tasks: Iterable[Mapping[str, Any]], *, idempotency_key: str | None = None) -> list[str]:
        """Submit TaskRequest dicts; returns their task ids in order. Resubmitting with the same
        ``idempotency_key`` (after a timeout, say) returns the first submission's ids instead of new tasks."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
        body = {"tasks": list(tasks)}
        return [t["task_id"] for t in self._call("POST", "/v1/tasks", json=body, headers=headers)["tasks"]]

    def import_tasks(self, path: str, *, idempotency_key: str | None = None, **options: Any) -> list[dict[str, Any]]:
        """Submit the benchmark tasks at ``path`` on the API's host (a Harbor task folder, a folder of them, or a
        SWE-bench .jsonl file; ``options``: harness, samples, policies, image_template, repos, metadata); returns
        each task's ``task_id``, ``name`` and ``rollout_ids``."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else {}
        body = {"path": path, **options}
        tasks: list[dict[str, Any]] = self._call("POST", "/v1/tasks/import", json=body, headers=headers)["tasks"]
        return tasks

    def task(self, task_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/tasks/{task_id}")

    def rollout(self, rollout_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/rollouts/{rollout_id}")

    def rollout_stats(self, rollout_id: str) -> dict[str, Any]:
        """What each build did with the rollout's sampled tokens: trainable, untrained by reason, root causes."""
        return self._call("GET", f"/v1/rollouts/{rollout_id}/stats")

    def cancel(self, task_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/tasks/{task_id}/cancel")

    def wait(self, task_ids: Iterable[str], *, timeout_s: float = 3600.0, poll_s: float = 0.5) -> list[dict[str, Any]]:
        """Poll until every task has finished; returns their final views. Raises TimeoutError past ``timeout_s``."""
        pending, done = list(task_ids), {}
        deadline = time.monotonic() + timeout_s
        while pending:
            for task_id in list(pending):
                view = self.task(task_id)
                if view["status"] in FINISHED:
                    done[task_id] = view
                    pending.remove(task_id)
            if pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{len(pending)} tasks still running after {timeout_s:g} s: {pending[:5]}")
                time.sleep(poll_s)
        return [done[t] for t in done]

    def trajectories(self, **filters: Any) -> list[dict[str, Any]]:
        params = {k: v for k, v in filters.items() if v is not None}
        rows: list[dict[str, Any]] = self._call("GET", "/v1/trajectories", params=params)["trajectories"]
        return rows

    def trajectory_extras(self, trajectory_id: int) -> dict[str, Any]:
        """Top-k logprobs and routed experts of a trajectory (``polar.trajectory.extras.extras_from_json`` reads
        them as arrays); null where its session did not capture them."""
        return self._call("GET", f"/v1/trajectories/{trajectory_id}/extras")

    # ---- trainer feed -------------------------------------------------------------------------------

    def claim(
        self, trainer: str, *, max_groups: int = 1, lease_s: float | None = None, max_staleness: int | None = None
    ) -> dict[str, Any]:
        """A batch of complete groups (``claim_id`` is None when none is ready)."""
        body = {"trainer": trainer, "max_groups": max_groups, "lease_s": lease_s, "max_staleness": max_staleness}
        return self._call("POST", "/v1/claims", json={k: v for k, v in body.items() if v is not None})

    def ack(self, claim_id: str, trainer: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/claims/{claim_id}/ack", json={"trainer": trainer})

    def release(self, claim_id: str, trainer: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/claims/{claim_id}/release", json={"trainer": trainer})

    def renew(self, claim_id: str, trainer: str, lease_s: float) -> dict[str, Any]:
        return self._call("POST", f"/v1/claims/{claim_id}/renew", json={"trainer": trainer, "lease_s": lease_s})

    # ---- weights ------------------------------------------------------------------------------------

    def register_weights(
        self,
        version: str,
        *,
        checkpoint_path: str | None = None,
        state_dict: Mapping[str, Any] | None = None,
        notes: str | None = None,
    ) -> dict[str, Any]:
        """Publish a new version: a checkpoint folder the backends can read, or in-memory tensors (uploaded as
        one safetensors file, for the local backend). Returns once every gateway serves it."""
        if state_dict is not None:
            from safetensors.torch import save

            data = save({k: v.detach().contiguous() for k, v in state_dict.items()})
            params = {"version": version, **({"notes": notes} if notes else {})}
            return self._call(
                "POST", "/v1/weights", params=params, content=data, headers={"content-type": "application/octet-stream"}
            )
        return self._call(
            "POST", "/v1/weights", json={"version": version, "checkpoint_path": checkpoint_path, "notes": notes}
        )

    def weights(self) -> dict[str, Any]:
        return self._call("GET", "/v1/weights")
