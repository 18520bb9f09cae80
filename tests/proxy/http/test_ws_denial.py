"""Codex's WebSocket upgrade gets 426 (so it falls back to HTTP at once) and the refusal logs no ERROR."""

from __future__ import annotations

import logging

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect


def test_the_upgrade_is_refused_with_426_and_no_error_is_logged(gateway, caplog) -> None:
    url = gateway.url.replace("http://", "ws://") + "/v1/responses"
    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        for _ in range(2):
            with pytest.raises(InvalidStatus) as info:
                connect(url, open_timeout=10)
            assert info.value.response.status_code == 426
            assert b"HTTP POST only" in info.value.response.body
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
