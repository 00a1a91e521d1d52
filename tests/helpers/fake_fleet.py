"""A fake fleet of two Hearth nodes for the gateway's in-process tests (`Fleet`: `a` and `b`,
each answering as `behave[name]` says), a gateway over it, and helpers to read its answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from starlette.testclient import TestClient

from hearth.gateway.app import create_gateway_app
from hearth.gateway.fleet.pool import Pool
from hearth.gateway.routing.affinity import key_of
from hearth.gateway.settings import GatewaySettings, Upstream
from hearth.gateway.state import gateway_of

Handler = Callable[[httpx.Request], httpx.Response]


NEVER = math.inf  # `prefill` / `stall`: the node never sends (its stream waits until it is closed)


async def _silent(seconds: float) -> None:
    if math.isinf(seconds):
        await asyncio.Event().wait()  # no clock involved: only the gateway's close ends it
    else:
        await asyncio.sleep(seconds)


class Events(httpx.AsyncByteStream):
    """An upstream SSE body: these chunks, then (optionally) a broken connection."""

    def __init__(self, chunks: list[bytes], broken: bool = False, prefill: float = 0.0, stall: float = 0.0) -> None:
        self.chunks = chunks
        self.broken = broken
        self.prefill = prefill
        self.stall = stall

    async def __aiter__(self) -> AsyncIterator[bytes]:
        await _silent(self.prefill)  # a node still prefilling: no bytes yet
        for c in self.chunks:
            yield c
        await _silent(self.stall)  # a stopped node: the connection stays open, nothing comes
        if self.broken:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")


def sse(status: int = 200, chunks: list[bytes] | None = None, broken: bool = False,
        prefill: float = 0.0, stall: float = 0.0) -> httpx.Response:
    return httpx.Response(status, headers={"content-type": "text/event-stream"},
                          stream=Events(chunks or [], broken, prefill, stall))


def chat_chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "up-model",
                                   "choices": [{"index": 0, "delta": {"content": text}}]}).encode() + b"\n\n"


OK_CHAT = {"id": "chatcmpl-1", "object": "chat.completion", "model": "up-model",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 3}}}


class Fleet:
    """Two fake nodes, `a` and `b`; `behave[name]` answers their generation requests."""

    def __init__(self) -> None:
        self.seen: list[httpx.Request] = []
        self.behave: dict[str, Handler] = {n: lambda r: httpx.Response(200, json=OK_CHAT) for n in ("a", "b")}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        name = {9101: "a", 9102: "b"}[request.url.port or 0]
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        return self.behave[name](request)

    def calls(self, path: str) -> list[httpx.Request]:
        return [r for r in self.seen if r.url.path == path]


@contextlib.contextmanager
def gateway(tmp_path: Path, fleet: Fleet, **settings: Any) -> Iterator[TestClient]:
    ups = [Upstream(name=n, url=f"http://127.0.0.1:{port}", api_key=f"up-{n}", models={"smol": "up-model"},
                    max_in_flight=4) for n, port in (("a", 9101), ("b", 9102))]
    gs = GatewaySettings(upstreams=ups, data_dir=tmp_path, api_keys=["gw-key"], probe_interval=60,
                         **{"heartbeat": 0.05, "digest_interval": 0, **settings})  # digests: test_digest_routing
    app = create_gateway_app(gs, transport=httpx.MockTransport(fleet))
    with TestClient(app, headers={"Authorization": "Bearer gw-key"}) as c:
        yield c


def pool_of(c: TestClient) -> Pool:
    return gateway_of(c.app).pool


def stick(c: TestClient, key: str, node: str) -> dict[str, str]:
    """Make `node` the first choice for requests with this X-Session-Id."""
    pool_of(c)._soft[key_of("header", key)] = node
    return {"X-Session-Id": key}


def stream_text(c: TestClient, path: str, body: dict[str, object], headers: dict[str, str]) -> str:
    with c.stream("POST", path, json={**body, "stream": True}, headers=headers) as r:
        assert r.status_code == 200
        assert r.headers["cache-control"] == "no-cache" and r.headers["x-accel-buffering"] == "no"
        return "".join(r.iter_text())


def parsed(text: str) -> list[tuple[str | None, Any]]:
    out: list[tuple[str | None, Any]] = []
    for block in text.split("\n\n"):
        if not block or block.startswith(":"):
            continue
        name = block.split("\n", 1)[0][7:] if block.startswith("event: ") else None
        raw = block.split("data: ", 1)[1]
        out.append((name, raw if raw == "[DONE]" else json.loads(raw)))
    return out


def response(rid: str, status: str = "in_progress", output: list[Any] | None = None) -> dict[str, Any]:
    return {"id": rid, "object": "response", "status": status, "model": "up-model", "output": output or []}
