"""The CLI's HTTP client against a mock transport: error lines, SSE chunks, metrics."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from hearth.cli.client import APIError, Client, CLIError
from hearth.cli.turn import run_turn


def client(handler: Callable[[httpx.Request], httpx.Response], api_key: str | None = None) -> Client:
    return Client("http://hearth.test", api_key, transport=httpx.MockTransport(handler))


def sse(*events: object) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


def chunk(delta: dict, finish: str | None = None) -> dict:
    return {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "usage": None}


def test_openai_error_envelope_becomes_one_line() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json={"error": {"message": "session demo is busy:\n  wait", "type": "conflict",
                                                   "param": None, "code": "session_busy"}})

    with pytest.raises(APIError) as e:
        client(handler).get("/v1/sessions/demo")
    assert str(e.value) == "session demo is busy: wait (HTTP 409, session_busy)"
    assert e.value.status == 409 and e.value.error_code == "session_busy"


def test_non_json_error_uses_the_reason_phrase() -> None:
    with pytest.raises(APIError, match=r"^Bad Gateway \(HTTP 502\)$"):
        client(lambda r: httpx.Response(502, text="<html>oops</html>")).get("/v1/models")


def test_api_key_is_sent_as_bearer() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"object": "list", "data": []})

    client(handler, api_key="k1").get("/v1/sessions")
    assert seen == ["Bearer k1"]


def test_metrics_are_summed_over_labels() -> None:
    text = ('# HELP hearth_kv_slots_busy x\nhearth_kv_slots_busy{model="a"} 2.0\nhearth_kv_slots_busy{model="b"} 1.0\n'
            'hearth_cancel_registry_runs 0.0\n')
    m = client(lambda r: httpx.Response(200, text=text)).metrics()
    assert m == {"hearth_kv_slots_busy": 3.0, "hearth_cancel_registry_runs": 0.0}


def test_health_never_raises() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    assert client(refuse).health() == "down"
    assert client(lambda r: httpx.Response(503, json={"status": "loading"})).health() == "loading"
    failed = client(lambda r: httpx.Response(503, json={"status": "error", "error": "bad file"})).health()
    assert failed == "error: bad file"


def test_connection_refused_is_a_cli_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(CLIError, match=r"no Hearth server answers at http://hearth\.test"):
        client(refuse).get("/v1/models")


def test_a_turn_streams_reasoning_and_content_and_reads_usage() -> None:
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=sse(
            chunk({"role": "assistant", "content": ""}), chunk({"reasoning_content": "think"}),
            chunk({"reasoning_content": "ing"}), chunk({"content": "Hel"}), chunk({"content": "lo"}),
            chunk({}, "stop"),
            {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4,
                                                          "prompt_tokens_details": {"cached_tokens": 5}}},
            b"[DONE]"))

    out = Console(record=True, width=80, force_terminal=True)
    result = run_turn(client(handler), {"messages": [{"role": "user", "content": "hi"}]}, out)
    assert (result.reasoning, result.content) == ("thinking", "Hello")
    assert result.stats.finish_reason == "stop"
    assert (result.stats.prompt_tokens, result.stats.cached_tokens, result.stats.completion_tokens) == (9, 5, 4)
    assert result.stats.ttft is not None and not result.interrupted
    body = bodies[0]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["cancel_id"].startswith("cli-") and len(body["cancel_id"]) > 20
    rendered = out.export_text(styles=True, clear=False)
    assert "\x1b[2;3mthink" in rendered  # reasoning is dimmed (and italic)
    assert out.export_text() == "thinking\n\nHello\n"


def test_each_turn_gets_a_fresh_cancel_id() -> None:
    ids: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        ids.append(json.loads(request.content)["cancel_id"])
        return httpx.Response(200, content=sse(chunk({"content": "x"}), chunk({}, "length"), b"[DONE]"))

    c, out = client(handler), Console(file=io.StringIO())
    for _ in range(3):
        assert run_turn(c, {"messages": []}, out).stats.finish_reason == "length"
    assert len(set(ids)) == 3


def test_an_error_event_mid_stream_is_reported() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=sse(chunk({"content": "x"}), {"error": {"message": "decode failed"}}))

    with pytest.raises(CLIError, match="generation failed: decode failed"):
        run_turn(client(handler), {"messages": []}, Console(file=io.StringIO()))


def test_download_writes_the_whole_file_or_nothing(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 1000
    dest = tmp_path / "x.tar"
    n = client(lambda r: httpx.Response(200, content=payload)).download("/v1/snapshots/s/archive", dest)
    assert n == len(payload) and dest.read_bytes() == payload

    missing = tmp_path / "y.tar"
    with pytest.raises(APIError):
        client(lambda r: httpx.Response(404, json={"error": {"message": "no such snapshot"}})).download("/a", missing)
    assert not missing.exists() and not (tmp_path / "y.tar.part").exists()
