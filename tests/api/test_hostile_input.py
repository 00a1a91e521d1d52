"""Input built to hurt: nesting past any parser's recursion, lone surrogates, prompts far past the
context. Each gets the protocol's own 400, cheaply, and leaves nothing stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from hearth.api.app import create_app
from hearth.api.context import node_of
from hearth.api.openapi import openapi_path
from hearth.api.operations import OPERATIONS
from hearth.chat.types import Message
from hearth.config import Settings
from hearth.jsonsafe import MAX_DEPTH
from hearth.sessions.store import SessionRow, SessionStore
from tests.api.conftest import Harness

IDS = {"session_id": "s1", "snapshot_id": "snap_" + "0" * 32, "response_id": "resp_" + "0" * 32}
JSON_ROUTES = [op for op in OPERATIONS if op.body is not None and op.body not in ("tar", "multipart")]
USER = [{"role": "user", "content": "hi"}]


def concrete(path: str) -> str:
    return openapi_path(path).format(**IDS)


def assert_envelope(r: Any, status: int, anthropic: bool, ollama: bool = False) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    if ollama:
        assert list(body) == ["error"] and isinstance(body["error"], str), body
    elif anthropic:
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    else:
        assert body["error"]["type"] == "invalid_request_error", body
    return body


@pytest.mark.parametrize("op", JSON_ROUTES, ids=lambda op: f"{op.method} {op.path}")
async def test_json_nested_past_the_limit_is_a_400_on_every_endpoint(h: Harness, op: Any) -> None:
    for depth in (MAX_DEPTH + 1, 5000):  # 5000 raised RecursionError (a 500) in read_json
        body = b'{"x": ' + b"[" * depth + b"]" * depth + b"}"
        r = await h.client.request(op.method, concrete(op.path), content=body,
                                     headers={"content-type": "application/json"})
        err = assert_envelope(r, 400, op.anthropic, op.ollama)
        assert "nested deeper than" in json.dumps(err)


SURROGATE_BODIES = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi \ud800"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "name": "\ud800"}]}),
    ("/v1/chat/completions", {"messages": [*USER, {"role": "assistant", "content": "a", "reasoning_content": "\udfff"},
                                           *USER]}),
    ("/v1/completions", {"prompt": "\ud800"}),
    ("/v1/responses", {"input": "hi \ud800"}),
    ("/v1/responses", {"input": "hi", "metadata": {"k": "\ud800"}}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "\ud800"}]}),
    ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "\ud800"}]}),
    ("/tokenize", {"content": "\ud800"}),
    ("/api/chat", {"model": "fake", "messages": [{"role": "user", "content": "\ud800"}], "stream": False}),
    ("/api/generate", {"model": "fake", "prompt": "\ud800", "stream": False}),
]


@pytest.mark.parametrize(("path", "body"), SURROGATE_BODIES)
async def test_a_lone_surrogate_anywhere_is_the_protocols_400(h: Harness, path: str, body: dict[str, Any]) -> None:
    raw = json.dumps({**body, "max_tokens": 4}).encode()  # ensure_ascii: the surrogate travels as \\udXXX
    r = await h.client.post(path, content=raw, headers={"content-type": "application/json"})
    err = assert_envelope(r, 400, path.startswith("/v1/messages"), path.startswith("/api/"))
    assert "lone UTF-16 surrogate" in json.dumps(err)


async def test_a_poisoned_session_turn_stores_nothing(h: Harness) -> None:
    r = await h.client.post("/v1/chat/completions", json={"session_id": "s1", "messages": USER, "max_tokens": 3})
    assert r.status_code == 200
    poisoned = {"session_id": "s1", "max_tokens": 3,
                "messages": [{"role": "user", "content": "again", "name": "\ud800"}]}
    r = await h.client.post("/v1/chat/completions", content=json.dumps(poisoned).encode(),
                              headers={"content-type": "application/json"})
    assert r.status_code == 400
    history = await h.client.get("/v1/sessions/s1/history")
    assert history.status_code == 200 and len(history.json()["data"]) == 2
    fresh = {**poisoned, "session_id": "s2"}
    r = await h.client.post("/v1/chat/completions", content=json.dumps(fresh).encode(),
                              headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert (await h.client.get("/v1/sessions/s2")).status_code == 404


async def test_poison_an_older_server_stored_is_repaired_on_read(h: Harness, tmp_path: Path) -> None:
    home = tmp_path / "old-home"
    home.mkdir()
    store = SessionStore(home / "sessions.db")  # what a server without edge validation wrote
    row = SessionRow("old", "fake", 0.0, 0.0, 256, [Message("user", "hi", name="\ud800"),
                                                     Message("assistant", "ok", reasoning="x\udfff")])
    store.save(row, replace_messages=True)
    store.close()
    app = create_app(h.backend, Settings(data_dir=home, parallel=2, batch=64))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://h") as client:
        r = await client.get("/v1/sessions/old/history")
        assert r.status_code == 200
        data = r.json()["data"]
        assert data[0]["name"] == "\ufffd" and data[1]["reasoning_content"] == "x\ufffd"
        assert (await client.get("/v1/sessions")).status_code == 200
    node_of(app).sessions.close()


@pytest.mark.parametrize(("path", "body"), [
    ("/tokenize", {"content": "x" * 100_000}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 100_000}], "max_tokens": 4}),
    ("/v1/completions", {"prompt": "x" * 100_000, "max_tokens": 4}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "x" * 100_000}], "max_tokens": 4}),
    ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "x" * 100_000}]}),
])
async def test_text_that_cannot_fit_is_refused_without_tokenizing_it(h: Harness, path: str, body: dict[str, Any],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    runner = h.runner
    assert runner is not None
    n_ctx = h.backend.limits(None).seq_ctx
    seen: list[int] = []
    real = runner.tokenize

    def spy(text: str, **kw: Any) -> list[int]:
        seen.append(len(text))
        return real(text, **kw)

    monkeypatch.setattr(runner, "tokenize", spy)
    r = await h.client.post(path, json=body)
    assert r.status_code == 400, r.text
    # Anthropic's own wording on its routes (Claude Code compacts on it); OpenAI's elsewhere
    assert ("prompt is too long" if path.startswith("/v1/messages") else "maximum context length") in r.text
    # the fake vocabulary's longest token is 4 bytes ("</s>"), so nothing past 4 * n_ctx is tokenized
    assert all(n <= 4 * n_ctx for n in seen), seen
