"""The gateway's fast upstream client against scripted servers on real loopback sockets: bodies
(chunked, sized, large), keep-alive reuse, a node's keep-alive close racing a request, failures
as httpx's transport errors, and an abandoned stream closing its connection (how a node learns
its client left)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from hearth.gateway.upstream import http as upstream_http
from hearth.gateway.upstream.http import HttpxSender, UpstreamHttp

NO_FALLBACK = HttpxSender(httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(599))))
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    return head, await reader.readexactly(length)


@contextlib.asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A server calling `handler(reader, writer, connection_number)`; yields its URL and the
    connection numbers it saw."""
    seen: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(len(seen))
        try:
            await handler(reader, writer, seen[-1])
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}", seen


def frozen_clock(http: UpstreamHttp) -> UpstreamHttp:
    """An idle connection is reused for at most IDLE_REUSE seconds of the client's clock: frozen,
    a reuse the test counts on cannot be lost to a slow machine between two requests."""
    http._clock = lambda: 1000.0
    return http


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def test_a_chunked_stream_arrives_in_order_and_the_connection_is_reused() -> None:
    requests: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            requests.append(await read_request(reader))
            writer.write(SSE_HEAD + chunked(b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"))
            await writer.drain()

    http = frozen_clock(UpstreamHttp(NO_FALLBACK))
    async with serve(handler) as (url, seen):
        for _ in range(3):
            resp = await http.send("POST", url + "/v1/chat/completions?x=1", {"x-api-key": "k"}, b'{"a":1}', 5)
            assert resp.status_code == 200
            assert resp.headers["content-type"] == "text/event-stream"
            assert await resp.aread() == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
            await resp.aclose()
        assert seen == [0]  # one connection, kept alive
        await http.aclose()
    head, body = requests[0]
    assert head.startswith(b"POST /v1/chat/completions?x=1 HTTP/1.1\r\n")
    assert b"\r\nx-api-key: k\r\n" in head and b"\r\ncontent-length: 7\r\n" in head
    assert body == b'{"a":1}'


async def test_a_sized_body_and_a_closing_answer() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 5\r\nconnection: close\r\n\r\nnope!")
        await writer.drain()

    http = UpstreamHttp(NO_FALLBACK)
    async with serve(handler) as (url, seen):
        for _ in range(2):
            resp = await http.send("GET", url + "/x", {}, b"", 5)
            assert (resp.status_code, await resp.aread()) == (404, b"nope!")
            await resp.aclose()
        assert seen == [0, 1]  # `connection: close` is honoured: a new connection per request


async def test_a_large_body_passes_flow_control_intact() -> None:
    payload = bytes(range(256)) * (3 * upstream_http.HIGH_WATER // 256)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(payload) + payload)
        await writer.drain()

    http = UpstreamHttp(NO_FALLBACK)
    async with serve(handler) as (url, _):
        resp = await http.send("POST", url + "/", {}, b"{}", 5)
        got = bytearray()
        async for chunk in resp.aiter_raw():
            got += chunk
            await asyncio.sleep(0)  # a slow reader: the connection pauses and resumes
        assert bytes(got) == payload
        await resp.aclose()
        await http.aclose()


async def test_refused_and_cut_connections_are_httpx_transport_errors() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(SSE_HEAD + b"9\r\ndata: 1\n\n\r\n")  # one event, then the node dies
        await writer.drain()

    http = UpstreamHttp(NO_FALLBACK)
    async with serve(cut) as (url, _):
        resp = await http.send("POST", url + "/", {}, b"{}", 5)
        chunks = []
        with pytest.raises(httpx.ReadError):
            async for chunk in resp.aiter_raw():
                chunks.append(chunk)
        assert chunks == [b"data: 1\n\n"]  # what arrived before the cut is delivered first
        await resp.aclose()
    # Nothing listens on a port this socket holds (bound, never listening): the connection is
    # refused. (The closed server's port could be taken by another process meanwhile.)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        with pytest.raises(httpx.ConnectError):
            await http.send("POST", f"http://127.0.0.1:{port}/", {}, b"{}", 5)


async def test_garbage_is_a_protocol_error() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()

    async with serve(garbage) as (url, _):
        with pytest.raises(httpx.RemoteProtocolError):
            await UpstreamHttp(NO_FALLBACK).send("POST", url + "/", {}, b"{}", 5)


async def test_a_keep_alive_close_racing_the_next_request_is_sent_again_on_a_new_connection() -> None:
    async def once_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        # Then the node closes the kept-alive connection without answering the next request
        # (it never read it), as a server's keep-alive timeout does.
        await reader.read(1)

    http = frozen_clock(UpstreamHttp(NO_FALLBACK))  # so the kept-alive connection is always tried
    async with serve(once_per_connection) as (url, seen):
        for _ in range(3):
            resp = await http.send("POST", url + "/", {}, b"{}", 5)
            assert await resp.aread() == b"ok"
            await resp.aclose()
        assert len(seen) == 3


async def test_an_old_idle_connection_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()

    now = [1000.0]
    http = UpstreamHttp(NO_FALLBACK)
    monkeypatch.setattr(http, "_clock", lambda: now[0])
    async with serve(handler) as (url, seen):
        for step in (0.0, upstream_http.IDLE_REUSE / 2, upstream_http.IDLE_REUSE + 0.1):
            now[0] += step
            resp = await http.send("POST", url + "/", {}, b"{}", 5)
            await resp.aread()
            await resp.aclose()
        assert seen == [0, 1]  # reused after a short idle, not after IDLE_REUSE
        await http.aclose()


async def test_an_abandoned_stream_closes_its_connection() -> None:
    closed = asyncio.Event()

    async def endless_loop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        await read_request(reader)
        writer.write(SSE_HEAD)
        while True:
            writer.write(b"9\r\ndata: x\n\n\r\n")
            try:
                await writer.drain()
                got = await asyncio.wait_for(reader.read(1), 0.01)
            except TimeoutError:
                continue
            except ConnectionError:
                got = b""
            if got == b"":
                closed.set()
                return

    http = UpstreamHttp(NO_FALLBACK)
    async with serve(endless_loop) as (url, seen):
        resp = await http.send("POST", url + "/", {}, b"{}", 5)
        async for _ in resp.aiter_raw():
            break
        await resp.aclose()
        await asyncio.wait_for(closed.wait(), 60)
        resp = await http.send("POST", url + "/", {}, b"{}", 5)  # not the abandoned connection
        await resp.aclose()
        assert len(seen) == 2


async def test_https_upstreams_go_to_the_fallback() -> None:
    seen: list[httpx.Request] = []

    def engine(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    http = UpstreamHttp(HttpxSender(httpx.AsyncClient(transport=httpx.MockTransport(engine))))
    resp = await http.send("POST", "https://node.example:8443/v1/chat/completions", {"x-api-key": "k"}, b"{}", 5)
    assert (resp.status_code, await resp.aread()) == (200, b'{"ok":true}')
    await resp.aclose()
    assert str(seen[0].url) == "https://node.example:8443/v1/chat/completions"
    assert seen[0].headers["x-api-key"] == "k"


async def test_a_header_with_a_line_break_is_dropped_not_sent_as_two() -> None:
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
        heads.append((await read_request(reader))[0])
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()

    async with serve(handler) as (url, _):
        resp = await UpstreamHttp(NO_FALLBACK).send(
            "POST", url + "/", {"x-request-id": "a\r\nx-admin: 1", "x-ok": "fine"}, b"{}", 5)
        assert await resp.aread() == b"ok"
        await resp.aclose()
    assert b"x-admin" not in heads[0] and b"x-request-id" not in heads[0] and b"\r\nx-ok: fine\r\n" in heads[0]
