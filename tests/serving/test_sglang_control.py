"""Weights, versions and pauses over SGLang's control endpoints, on an engine of the module's own."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import torch
from safetensors.torch import save_file

LONG = {"max_new_tokens": 400, "ignore_eos": True, "temperature": 0}


def stream_events(client: httpx.Client, body: dict[str, Any], on_chunk=None) -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = []
    with client.stream("POST", "/generate", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
                if on_chunk is not None:
                    on_chunk(len(chunks))
    return chunks


def test_update_weights_from_disk_rejects_a_bad_path(served_control, tmp_path: Path):
    with served_control.client() as client:
        missing = client.post("/update_weights_from_disk", json={"model_path": str(tmp_path / "nope")})
        assert missing.status_code == 400
        body = missing.json()
        assert body["success"] is False and "safetensors" in body["message"] and body["num_paused_requests"] == 0
        wrong = tmp_path / "wrong"
        wrong.mkdir()
        save_file({"not.a.weight": torch.zeros(2)}, wrong / "model.safetensors")
        mismatch = client.post("/update_weights_from_disk", json={"model_path": str(wrong), "weight_version": "x"})
        assert mismatch.status_code == 400 and mismatch.json()["success"] is False
        assert "not.a.weight" in mismatch.json()["message"]
        assert client.get("/model_info").json()["weight_version"] == "default"
        assert client.post("/update_weights_from_disk", json={}).status_code == 400  # model_path is required


def test_update_weights_from_disk_relabels_and_reloads(served_control, tmp_path: Path):
    engine = served_control.engine
    folder = tmp_path / "same"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in engine.model.state_dict().items()}, folder / "model.safetensors")
    with served_control.client() as client:
        reply = client.post("/update_weights_from_disk", json={"model_path": str(folder), "weight_version": "w-same"})
        assert reply.status_code == 200
        assert reply.json() == {
            "success": True,
            "message": "Succeeded to update model weights. Weight version updated to w-same.",
            "num_paused_requests": 0,
        }
        assert client.get("/model_info").json()["weight_version"] == "w-same"
        body = client.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}).json()
        assert body["meta_info"]["weight_version"] == "w-same"


def test_update_weight_version_relabels(served_control):
    with served_control.client() as client:
        reply = client.post("/update_weight_version", json={"new_version": "step-7"}).json()
        assert reply == {"success": True, "message": "Weight version updated to step-7", "new_version": "step-7"}
        assert client.get("/model_info").json()["weight_version"] == "step-7"
        body = client.post("/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}).json()
        assert body["meta_info"]["weight_versions"] == [{"version": "step-7", "start": 0, "end": 2}]
        assert "at new_version:" in client.post("/update_weight_version", json={}).json()["error"]["message"]


def test_relabel_mid_stream_splits_the_version_spans(served_control):
    with served_control.client() as client, served_control.client() as control:
        before = control.get("/model_info").json()["weight_version"]

        def relabel_at_ten(n: int) -> None:
            if n == 10:
                control.post("/update_weight_version", json={"new_version": "relabelled", "abort_all_requests": False})

        chunks = stream_events(client, {"input_ids": [1, 2, 3], "sampling_params": LONG}, relabel_at_ten)
    spans = chunks[-1]["meta_info"]["weight_versions"]
    assert [s["version"] for s in spans] == [before, "relabelled"]
    assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] >= 10 and spans[1]["end"] == 400
    assert chunks[-1]["meta_info"]["weight_version"] == "relabelled"


def test_pause_abort_ends_running_requests_with_partial_output(served_control):
    with served_control.client() as client, served_control.client() as control:

        def pause_at_five(n: int) -> None:
            if n == 5:
                paused = control.post("/pause_generation", json={"mode": "abort"})
                assert paused.json() == {"message": "Generation paused successfully.", "status": "ok"}

        body = {"input_ids": [1, 2, 3], "sampling_params": LONG, "return_logprob": True}
        chunks = stream_events(client, body, pause_at_five)
        assert control.get("/health_generate").status_code == 200  # paused is not unhealthy
        resumed = control.post("/continue_generation")
        assert resumed.json() == {"message": "Generation continued successfully.", "status": "ok"}
    last = chunks[-1]
    finish = last["meta_info"]["finish_reason"]
    assert finish["type"] == "abort" and "pause" in finish["message"]
    assert finish["status_code"] is None and finish["err_type"] is None
    assert 5 <= len(last["output_ids"]) < 400
    assert len(last["meta_info"]["output_token_logprobs"]) == len(last["output_ids"])


def test_pause_in_place_then_continue_completes_unchanged(served_control):
    body = {"input_ids": [4, 5, 6], "sampling_params": {**LONG, "max_new_tokens": 60}}
    with served_control.client() as client, served_control.client() as control:
        reference = client.post("/generate", json=body).json()
        progress: list[int] = []

        def pause_then_resume_later(n: int) -> None:
            progress.append(n)
            if n == 5:
                control.post("/pause_generation", json={"mode": "in_place"})
                threading.Timer(0.3, lambda: httpx.post(served_control.url + "/continue_generation")).start()

        started = time.monotonic()
        chunks = stream_events(client, body, pause_then_resume_later)
        assert time.monotonic() - started >= 0.3  # it waited for continue_generation
    assert chunks[-1]["output_ids"] == reference["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 60}


def test_pause_rejects_an_unknown_mode(served_control):
    with served_control.client() as client:
        reply = client.post("/pause_generation", json={"mode": "sideways"})
        assert reply.status_code == 400 and "mode" in reply.json()["error"]["message"]
        assert client.post("/pause_generation").status_code == 200  # no body: SGLang's default, abort
        client.post("/continue_generation")
