"""CORS on a node and on the gateway (hearth/http/cors.py): preflights answered without a key, the
real request still keyed and still readable by the page, loopback origins by default, the list
from --cors-origins, and nothing at all for other origins or with CORS off."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from hearth.config import Settings, check_origins, parse_origins
from hearth.gateway.app import create_gateway_app
from hearth.gateway.settings import GatewaySettings, Upstream
from tests.api.conftest import Harness, serve

PAGE = "http://localhost:5173"
PREFLIGHT = {"Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os, x-custom-thing"}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@contextlib.asynccontextmanager
async def node(tmp_path: Path, **settings: Any) -> AsyncIterator[Harness]:
    async with serve(tmp_path, api_keys=["k"], **settings) as h:
        yield h


async def preflight(h: Harness, origin: str, path: str = "/v1/chat/completions") -> httpx.Response:
    return await h.client.options(path, headers={"Origin": origin, **PREFLIGHT})


def assert_allowed_preflight(r: httpx.Response, origin: str) -> None:
    assert r.status_code == 204, r.text
    assert r.headers["access-control-allow-origin"] == origin
    assert "POST" in r.headers["access-control-allow-methods"]
    allowed = {h.strip() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "x-api-key", "content-type", "anthropic-version", "anthropic-beta", "openai-beta",
            "x-stainless-os", "x-custom-thing"} <= allowed
    assert int(r.headers["access-control-max-age"]) > 0
    assert "Origin" in r.headers["vary"]


@pytest.mark.parametrize("origin", [PAGE, "http://127.0.0.1", "https://localhost:8443", "http://[::1]:3000"])
async def test_a_loopback_preflight_is_answered_without_a_key_by_default(tmp_path: Path, origin: str) -> None:
    async with node(tmp_path) as h:
        assert_allowed_preflight(await preflight(h, origin), origin)
        assert_allowed_preflight(await preflight(h, origin, "/v1/messages"), origin)


async def test_the_real_request_still_needs_the_key_and_its_401_is_readable(tmp_path: Path) -> None:
    async with node(tmp_path) as h:
        r = await h.post("/v1/chat/completions", CHAT, headers={"Origin": PAGE})
        assert r.status_code == 401
        assert "key" in r.json()["error"]["message"]
        assert r.headers["access-control-allow-origin"] == PAGE
        assert "x-request-id" in r.headers["access-control-expose-headers"]
        r = await h.post("/v1/chat/completions", CHAT, headers={"Origin": PAGE, "Authorization": "Bearer k"})
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == PAGE and "Origin" in r.headers["vary"]
        exposed = {x.strip() for x in r.headers["access-control-expose-headers"].split(",")}
        assert {"x-request-id", "retry-after", "x-hearth-upstream"} <= exposed
        r = await h.post("/v1/messages", CHAT, headers={"Origin": PAGE, "x-api-key": "k"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == PAGE


@pytest.mark.parametrize("origin", ["https://evil.example", "http://localhost.evil.example", "null",
                                    "http://127.0.0.2"])
async def test_other_origins_get_no_cors_headers(tmp_path: Path, origin: str) -> None:
    async with node(tmp_path) as h:
        r = await preflight(h, origin)
        assert r.status_code == 405  # not answered: it falls through to the API, as without CORS
        assert not [k for k in r.headers if k.startswith("access-control-")]
        r = await h.post("/v1/chat/completions", CHAT, headers={"Origin": origin, "Authorization": "Bearer k"})
        assert r.status_code == 200 and not [k for k in r.headers if k.startswith("access-control-")]


async def test_a_request_without_an_origin_is_untouched(tmp_path: Path) -> None:
    async with node(tmp_path) as h:
        r = await h.post("/v1/chat/completions", CHAT, headers={"Authorization": "Bearer k"})
        assert r.status_code == 200 and not [k for k in r.headers if k.startswith("access-control-")]


async def test_cors_off(tmp_path: Path) -> None:
    async with node(tmp_path, cors_origins=parse_origins("")) as h:
        r = await preflight(h, PAGE)
        assert r.status_code == 405 and "access-control-allow-origin" not in r.headers
        r = await h.post("/v1/chat/completions", CHAT, headers={"Origin": PAGE})
        assert r.status_code == 401 and "access-control-allow-origin" not in r.headers


async def test_a_configured_list_replaces_the_default(tmp_path: Path) -> None:
    async with node(tmp_path, cors_origins=parse_origins("https://app.example.com, https://*.corp.example")) as h:
        assert_allowed_preflight(await preflight(h, "https://app.example.com"), "https://app.example.com")
        assert_allowed_preflight(await preflight(h, "https://ui.corp.example"), "https://ui.corp.example")
        assert (await preflight(h, PAGE)).status_code == 405  # loopback is no longer in the list
        assert (await preflight(h, "http://app.example.com")).status_code == 405  # the scheme is part of it


async def test_any_origin(tmp_path: Path) -> None:
    async with node(tmp_path, cors_origins=["*"]) as h:
        assert_allowed_preflight(await preflight(h, "https://anything.example"), "https://anything.example")


@pytest.mark.parametrize("bad", ["https://app.example.com/", "app.example.com", "https://x.example/path"])
def test_entries_that_could_never_match_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not an origin"):
        check_origins([bad])
    with pytest.raises(ValueError, match="not an origin"):
        Settings(cors_origins=[bad])
    check_origins(["loopback", "*", "http://localhost:3000", "https://*.example.com"])


@contextlib.contextmanager
def gateway(tmp_path: Path, **settings: Any) -> Iterator[TestClient]:
    """A gateway over one fake node that answers every generation request."""

    def fleet(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        assert "origin" not in request.headers  # the browser's Origin stays at the gateway
        return httpx.Response(200, json={"id": "c", "object": "chat.completion", "model": "up", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]})

    up = Upstream(name="a", url="http://127.0.0.1:9101", models={"smol": "up"})
    gs = GatewaySettings(upstreams=[up], data_dir=tmp_path, api_keys=["gw"], probe_interval=60, **settings)
    with TestClient(create_gateway_app(gs, transport=httpx.MockTransport(fleet))) as c:
        yield c


def test_the_gateway_answers_preflights_without_a_key(tmp_path: Path) -> None:
    with gateway(tmp_path) as c:
        r = c.options("/v1/chat/completions", headers={"Origin": PAGE, **PREFLIGHT})
        assert r.status_code == 204 and r.headers["access-control-allow-origin"] == PAGE
        r = c.post("/v1/chat/completions", json={**CHAT, "model": "smol"}, headers={"Origin": PAGE})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == PAGE
        r = c.post("/v1/chat/completions", json={**CHAT, "model": "smol"},
                   headers={"Origin": PAGE, "Authorization": "Bearer gw"})
        assert r.status_code == 200, r.text
        assert r.headers.get_list("access-control-allow-origin") == [PAGE]
        r = c.options("/v1/chat/completions", headers={"Origin": "https://evil.example", **PREFLIGHT})
        assert "access-control-allow-origin" not in r.headers


def test_the_gateway_flag_turns_it_off(tmp_path: Path) -> None:
    with gateway(tmp_path, cors_origins=[]) as c:
        r = c.options("/v1/chat/completions", headers={"Origin": PAGE, **PREFLIGHT})
        assert "access-control-allow-origin" not in r.headers
