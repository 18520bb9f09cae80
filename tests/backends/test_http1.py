"""The generation client (``polar.backends.http1``) against a real TCP server on loopback that answers each request
as the test scripts it: connections kept alive and reused, and not reused once idle past ``KEEPALIVE_S`` or when
the server says it closes them; chunked and content-length bodies; a stream's lines however its bytes are split;
and every way a backend can fail (a cut body, bytes that are not HTTP, silence) as a transport error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from polar.backends import http1
from polar.backends.http1 import TRANSPORT_ERRORS, BackendConnectionError

Part = bytes | float | None  # bytes to send, a pause (seconds), or None: close the connection now
Answer = Callable[[bytes], list[Part]]  # the request's bytes -> what the server does


def ok(body: bytes, *, close: bool = False) -> list[Part]:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % len(body)
    return [head + (b"connection: close\r\n" if close else b"") + b"\r\n" + body, *([None] if close else [])]


@asynccontextmanager
async def server(answer: Answer) -> AsyncIterator[tuple[str, list[int]]]:
    """The server's URL, and the requests each connection it accepted has served so far (one entry a connection)."""
    served: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(0)
        me = len(served) - 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
                )
                request = head + await reader.readexactly(length)
                served[me] += 1
                for part in answer(request):
                    if part is None:
                        return
                    if isinstance(part, float):
                        await asyncio.sleep(part)
                    else:
                        writer.write(part)
                        await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/generate", served
    finally:
        listener.close()


async def post(client: http1.Client, url: str, body: bytes = b'{"a": 1}') -> tuple[int, bytes]:
    async with client.post(url, body) as reply:
        return reply.status_code, await reply.aread()


async def test_connections_are_kept_alive_and_reused_until_idle_too_long(monkeypatch):
    async with server(lambda request: ok(request.rsplit(b"\r\n\r\n", 1)[1])) as (url, served):
        client = http1.Client(5)
        assert await post(client, url, b'{"n": 1}') == (200, b'{"n": 1}')
        assert await post(client, url, b'{"n": 2}') == (200, b'{"n": 2}')
        assert served == [2]  # one connection, two calls
        monkeypatch.setattr(http1, "KEEPALIVE_S", 0.05)
        await asyncio.sleep(0.1)
        assert await post(client, url) == (200, b'{"a": 1}')
        assert served == [2, 1]  # the idle one was closed, not reused
        await client.aclose()


async def test_a_connection_the_server_closes_is_not_reused():
    async with server(lambda request: ok(b"{}", close=True)) as (url, served):
        client = http1.Client(5)
        for _ in range(3):
            assert await post(client, url) == (200, b"{}")
        assert served == [1, 1, 1]
        await client.aclose()


async def test_a_chunked_body_and_a_stream_split_anywhere_read_whole():
    events = b"data: " + b"x" * 5000 + b"\n\ndata: [DONE]\n\n"
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(events[i : i + 7]), events[i : i + 7]) for i in range(0, len(events), 7))
    answer = [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
        chunked[:100],
        0.01,
        chunked[100:],
        b"0\r\n\r\n",
    ]
    async with server(lambda request: answer) as (url, _):
        client = http1.Client(5)
        async with client.post(url, b"{}") as reply:
            lines = [line async for batch in reply.aiter_line_batches() for line in batch]
        assert lines == ["data: " + "x" * 5000, "", "data: [DONE]", ""]
        assert await post(client, url) == (200, events)  # the same connection, its body read whole
        await client.aclose()


@pytest.mark.parametrize(
    "answer",
    [
        [b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{}", None],  # a body cut short
        [b"SSH-2.0-OpenSSH_9.6\r\n\r\n"],  # bytes that are not HTTP
        [None],  # no answer at all
    ],
    ids=["cut", "not-http", "closed"],
)
async def test_a_broken_answer_is_a_connection_error(answer):
    async with server(lambda request: answer) as (url, _):
        client = http1.Client(5)
        with pytest.raises(BackendConnectionError):
            await post(client, url)
        await client.aclose()


async def test_a_silent_backend_times_out_before_its_headers_and_within_its_body():
    for answer in ([1.0], [b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n{", 1.0]):
        async with server(lambda request, answer=answer: answer) as (url, _):
            client = http1.Client(0.2)
            with pytest.raises(TRANSPORT_ERRORS) as caught:
                await post(client, url)
            assert isinstance(caught.value, TimeoutError), caught.value
            await client.aclose()


async def test_a_refused_connection_is_a_connection_error_naming_the_server():
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    client = http1.Client(5)
    with pytest.raises(BackendConnectionError, match=f"127.0.0.1:{port}"):
        await post(client, f"http://127.0.0.1:{port}/generate")
    await client.aclose()
