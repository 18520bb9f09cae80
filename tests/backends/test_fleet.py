"""The fleet backend over two real SGLang-shaped servers (``polar serve-model``'s app on loopback HTTP): sessions
stick to one server, a dead server's sessions move (and the results say where they ran), weight updates reach
every server, and a server that missed one gets it before it serves again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.backends.fleet import FleetBackend, parse_urls
from polar.backends.registry import make_backend
from polar.backends.sglang import SGLangBackend
from polar.errors import BackendError, BackendUnavailable, InvalidRequest
from polar.inference import GenerateRequest, SamplingParams, WeightUpdate, collect
from polar.models.engine import LocalEngine
from polar.serving.sglang_app import create_app
from polar.serving.threaded import ServerThread
from polar.settings import BackendKind, Settings


class Server:
    """A served engine that can be stopped and started again on the same port."""

    def __init__(self, engine: LocalEngine, port: int = 0):
        self.engine = engine
        self.thread = ServerThread(create_app(engine, served_model_name="tiny"), port=port).start()
        self.url = self.thread.url

    def stop(self) -> None:
        self.thread.stop()

    def restart(self) -> None:
        self.thread = ServerThread(create_app(self.engine, served_model_name="tiny"), port=self.thread.port).start()


@pytest.fixture
def servers(tiny_model_dir: Path, small_tokenizer) -> Iterator[list[Server]]:
    engines = [LocalEngine(tiny_model_dir, small_tokenizer) for _ in range(2)]
    running = [Server(engine) for engine in engines]
    yield running
    for server in running:
        server.stop()
    for engine in engines:
        engine.close()


async def connect(url: str) -> SGLangBackend:
    return await SGLangBackend.connect(url, timeout_s=30)


def request(session: str, prompt: list[int]) -> GenerateRequest:
    return GenerateRequest(tuple(prompt), SamplingParams(max_new_tokens=3, temperature=0.0), session_id=session)


@pytest.fixture
def prompt(small_tokenizer) -> list[int]:
    return small_tokenizer.encode("<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n")


def test_the_url_list_is_parsed_strictly():
    assert parse_urls(" http://a:1/, http://b:2 ,") == ["http://a:1", "http://b:2"]
    with pytest.raises(InvalidRequest, match="twice"):
        parse_urls("http://a:1,http://a:1")
    with pytest.raises(InvalidRequest, match="no server"):
        parse_urls(" , ")


async def test_sessions_stick_to_one_server_and_spread_over_the_fleet(servers, prompt):
    fleet = await make_backend(Settings(backend=BackendKind.SGLANG, backend_url=f"{servers[0].url},{servers[1].url}"))
    try:
        assert isinstance(fleet, FleetBackend) and fleet.name == "sglang"
        used = {}
        for index in range(16):
            session = f"session-{index}"
            first = await fleet.generate(request(session, prompt))
            again = await collect(fleet.stream(request(session, prompt)))
            assert first.server == again.server  # the same server every call: its prefix cache holds the session
            used[session] = first.server
        assert set(used.values()) == {servers[0].url, servers[1].url}
        assert fleet.moves == 0
    finally:
        await fleet.aclose()


async def test_a_dead_server_is_skipped_and_its_sessions_move(servers, prompt):
    fleet = await FleetBackend.connect([s.url for s in servers], connect, retry_after_s=60)
    try:
        sessions = [f"s{i}" for i in range(12)]
        before = {s: (await fleet.generate(request(s, prompt))).server for s in sessions}
        servers[0].stop()
        after = {s: (await fleet.generate(request(s, prompt))).server for s in sessions}
        streamed = {s: (await collect(fleet.stream(request(s, prompt)))).server for s in sessions}
        assert set(after.values()) == set(streamed.values()) == {servers[1].url}
        moved = [s for s in sessions if before[s] == servers[0].url]
        assert moved and fleet.moves == len(moved)  # only the dead server's sessions moved
    finally:
        await fleet.aclose()


async def test_weights_go_to_every_server_and_a_missed_one_catches_up(servers, prompt):
    fleet = await FleetBackend.connect([s.url for s in servers], connect, retry_after_s=0.01)
    try:
        await fleet.update_weights(WeightUpdate("v1"))
        assert [s.engine.weight_version for s in servers] == ["v1", "v1"]

        servers[1].stop()
        with pytest.raises(BackendError, match=rf"reached 1 of 2 servers; missed {servers[1].url}"):
            await fleet.update_weights(WeightUpdate("v2"))
        assert servers[0].engine.weight_version == "v2"
        servers[1].restart()  # back, still on v1: it gets v2 before it serves again
        results = [await fleet.generate(request(f"s{i}", prompt)) for i in range(12)]
        assert {r.server for r in results} == {servers[0].url, servers[1].url}
        assert {r.weight_version for r in results} == {"v2"}
        assert servers[1].engine.weight_version == "v2"
    finally:
        await fleet.aclose()


async def test_when_every_server_failed_the_next_call_tries_them_again(servers, prompt):
    fleet = await FleetBackend.connect([s.url for s in servers], connect, retry_after_s=600)
    try:
        for server in servers:
            server.stop()
        with pytest.raises(BackendUnavailable, match="no inference server of the fleet answered"):
            await fleet.generate(request("s", prompt))
        for server in servers:
            server.restart()
        # Both are still within their 600 s: rather than refuse every call that long, the fleet tries them.
        assert (await fleet.generate(request("s", prompt))).server in {s.url for s in servers}
    finally:
        await fleet.aclose()
