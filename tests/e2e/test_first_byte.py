"""First byte before the prefill ends, on every streaming protocol, through the real server:
the opening event goes out when the request is admitted, heartbeats fill the prefill's
silence, and the id the opening event carries is enough to cancel the run mid-prefill."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers import Server, start_server, stop_server

pytestmark = pytest.mark.slow

# ~3,000 tokens for SmolLM2: 24 prefill steps of 128 tokens (a cancel lands at the next one),
# seconds of silence at 0.1 s beats.
LONG = " ".join(f"Note {i}: the lantern on the north pier was lit at dusk and put out at dawn." for i in range(150))


@pytest.fixture(scope="module")
def beating_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("first-byte"), "--ctx", "4096", "--parallel", "2", "--batch", "128",
                     "--sse-heartbeat", "0.1")
    yield s
    stop_server(s)


# protocol → (path, body, the opening event's test, a heartbeat's test, a model output's test)
def _chat_open(kind: str | None, data: dict[str, Any]) -> bool:
    return data.get("object") == "chat.completion.chunk" and data["choices"][0]["delta"].get("role") == "assistant"


def _text_open(kind: str | None, data: dict[str, Any]) -> bool:
    return data.get("object") == "text_completion" and data["choices"][0]["text"] == ""


def _chat_out(kind: str | None, data: dict[str, Any]) -> bool:
    return any(c["delta"].get("content") for c in data.get("choices", []))


def _text_out(kind: str | None, data: dict[str, Any]) -> bool:
    return any(c.get("text") for c in data.get("choices", []))


PROTOCOLS: dict[str, tuple[str, dict[str, Any], Any, Any]] = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}], "max_tokens": 50},
             _chat_open, _chat_out),
    "completions": ("/v1/completions", {"prompt": LONG, "max_tokens": 50}, _text_open, _text_out),
    "responses": ("/v1/responses", {"input": LONG, "max_output_tokens": 50, "store": False},
                  lambda k, d: k == "response.created", lambda k, d: k == "response.output_text.delta"),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": LONG}], "max_tokens": 50},
                 lambda k, d: k == "message_start", lambda k, d: k == "content_block_delta"),
}


def events(lines: Iterator[str]) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
    """("comment", None, {}) for an SSE comment, else ("event", name, data)."""
    name = None
    for line in lines:
        if line.startswith(":"):
            yield "comment", None, {}
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and line != "data: [DONE]":
            data = json.loads(line[6:])
            yield "event", data.get("type", name) if isinstance(data, dict) else name, data
            name = None


@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_opening_event_and_heartbeats_come_before_the_prefill_ends(beating_server: Server, protocol: str) -> None:
    path, body, is_open, is_output = PROTOCOLS[protocol]
    cancel_id = f"first-byte-{protocol}"
    seen: list[str] = []
    finish: list[Any] = []
    # cache_prompt false: chat, responses and messages render the same prompt, and a cancelled
    # prefill leaves its chunks in the slot; reused, they would shorten the next protocol's
    # prefill by however far the earlier one got (timing), eating the margin below.
    with httpx.Client(timeout=300) as client, client.stream(
            "POST", beating_server.url + path,
            json={**body, "stream": True, "temperature": 0, "cancel_id": cancel_id, "cache_prompt": False},
    ) as r:
        assert r.status_code == 200, r.read()
        for what, kind, data in events(r.iter_lines()):
            if what == "comment" or kind == "ping":
                seen.append("beat")
            elif is_open(kind, data):
                seen.append("open")
            elif is_output(kind, data):
                seen.append("output")
            finish += [c["finish_reason"] for c in data.get("choices") or [] if c.get("finish_reason")]
            if kind in ("response.incomplete", "response.completed"):
                finish.append(data["response"]["incomplete_details"])
            elif kind == "message_delta":
                finish.append(data["delta"]["stop_reason"])
            if seen.count("beat") == 3 and "cancel" not in seen:  # once: later events must not cancel again
                # the prefill is still running: the opening event's id is enough to stop it
                seen.append("cancel")
                cancel = client.post(beating_server.url + "/v1/cancel", json={"cancel_id": cancel_id})
                assert cancel.json()["cancelled"] == 1, cancel.text
    assert seen[0] == "open" and "cancel" in seen, seen
    assert "output" not in seen, seen  # stopped before the first token
    assert finish == [{"reason": "cancelled"} if protocol == "responses" else "cancelled"], finish
