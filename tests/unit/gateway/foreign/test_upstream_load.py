"""openai-kind upstreams under concurrent load, over real loopback sockets (issue 39 item 8):
more concurrent requests than the upstream's max_in_flight all complete, and the gateway keeps
its connections to the engine alive (a stream closed before the end of its body closed its
connection, so every request opened a new one); and the fast client's line reader."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from hearth.gateway.app import create_gateway_app
from hearth.gateway.settings import GatewaySettings, Upstream
from hearth.gateway.state import gateway_of
from hearth.gateway.upstream.http import UpstreamHttp, lines_of

CAP = 4  # the engine's max_in_flight
REQUESTS = 24  # from 12 client threads: three times the cap waits in the gateway's queue


class Engine:
    """An OpenAI-compatible engine on a loopback socket, in a thread of its own: keep-alive
    HTTP/1.1, chat answers as a chunked SSE stream whose last chunk (the body's end) is written
    after [DONE], as engines do. Counts the connections that carried a chat request."""

    def __init__(self) -> None:
        self.chat_connections: set[int] = set()
        self.chats = 0
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Engine:
        self._thread.start()
        assert self._ready.wait(10), "the fake engine did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self._ready.set()
        self._loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                if head.startswith(b"GET /v1/models"):
                    body = json.dumps({"data": [{"id": "m"}]}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(body), body))
                    continue
                self.chat_connections.add(id(writer))
                self.chats += 1
                events = [{"choices": [{"index": 0, "delta": {"content": "hi"}}]},
                          {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 3, "completion_tokens": 1}}]
                sse = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(sse), sse))
                await writer.drain()
                await asyncio.sleep(0.001)  # the body's end comes in a packet of its own
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
def engine() -> Iterator[Engine]:
    with Engine() as e:
        yield e


@pytest.mark.parametrize("stream", [False, True])
def test_more_concurrent_requests_than_the_cap_all_complete_on_kept_alive_connections(
        tmp_path: Path, engine: Engine, stream: bool) -> None:
    up = Upstream(name="fast", url=engine.url, kind="openai", models={"smol": "m"}, max_in_flight=CAP)
    app = create_gateway_app(GatewaySettings(upstreams=[up], data_dir=tmp_path, probe_interval=60, max_wait=60))
    with TestClient(app) as client:
        http = gateway_of(app).proxy.sender.http
        assert isinstance(http, UpstreamHttp)  # generation to a plain-http engine goes over the fast client
        http._clock = lambda: 1000.0  # idle connections never age out during the test

        def one(_: int) -> str:
            r = client.post("/v1/chat/completions", json={
                "model": "smol", "messages": [{"role": "user", "content": "x"}], "stream": stream})
            assert r.status_code == 200, r.text
            return r.text

        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(one, range(REQUESTS)))
    for text in answers:
        if stream:
            assert '"hi"' in text and text.rstrip().endswith("data: [DONE]")
        else:
            assert json.loads(text)["choices"][0]["message"]["content"] == "hi"
    assert engine.chats == REQUESTS
    # Never more connections than requests in flight at once: each went back to the pool.
    assert len(engine.chat_connections) <= CAP, len(engine.chat_connections)


class Chunks:
    def __init__(self, *parts: bytes) -> None:
        self.parts = parts

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        for p in self.parts:
            yield p


async def lines(*parts: bytes) -> list[str]:
    return [line async for line in lines_of(Chunks(*parts))]  # type: ignore[arg-type]


async def test_lines_split_at_every_sse_line_end_across_reads() -> None:
    assert await lines(b"data: a\r", b"\ndata: b\n\n", b"data: c\rdata: d") == [
        "data: a", "data: b", "", "data: c", "data: d"]


async def test_a_character_split_across_reads_is_whole() -> None:
    snow = "data: ☃\n".encode()
    assert await lines(snow[:7], snow[7:]) == ["data: ☃"]


async def test_separators_other_than_sse_line_ends_stay_inside_a_line() -> None:
    assert await lines("data: a\u2028b\x0cc\n".encode()) == ["data: a\u2028b\x0cc"]
