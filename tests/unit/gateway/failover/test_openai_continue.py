"""Stream migration for openai-kind upstreams, in-process over fake engines: the first chat call
breaks after some text, and the next upstream of the alias that can continue is sent the same
request with that text as the final assistant message, in its engine's way (`continuation`:
vllm, prefill); what the client sees, on chat, Messages and Responses, is one answer with one
finish. Upstreams of continuation `none`, cut tool calls and the migration limit end with the
protocol's terminal error, as before."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from hearth.chat.types import Finish, TextDelta
from hearth.gateway.app import create_gateway_app
from hearth.gateway.failover.openai import Echo, continuation_body
from hearth.gateway.settings import GatewaySettings, Upstream, parse_upstreams
from hearth.gateway.state import gateway_of
from tests.helpers.fake_fleet import parsed

PORTS = (9201, 9202, 9203)
Reply = Callable[[httpx.Request], httpx.Response]


class Body(httpx.AsyncByteStream):
    """These SSE chunks, then a broken connection, a clean close or a stall (`end`)."""

    def __init__(self, chunks: list[bytes], end: str) -> None:
        self.chunks, self.end = chunks, end

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for c in self.chunks:
            yield c
        if self.end == "broken":
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
        if self.end == "stall":
            await asyncio.sleep(60)


def delta(d: dict[str, Any], finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    chunk: dict[str, Any] = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "model": "up-model",
                             "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}
    if usage is not None:
        chunk["usage"] = usage
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def stream(*chunks: bytes, end: str = "done") -> Reply:
    tail = [b"data: [DONE]\n\n"] if end == "done" else []
    return lambda r: httpx.Response(200, headers={"content-type": "text/event-stream"},
                                    stream=Body([*chunks, *tail], end))


CUT = stream(delta({"role": "assistant", "content": ""}), delta({"content": "Hel"}), delta({"content": "lo"}),
             end="broken")
REST = stream(delta({"role": "assistant", "content": ""}), delta({"content": " wor"}), delta({"content": "ld"}),
              delta({}, "stop"), delta({}, usage={"prompt_tokens": 12, "completion_tokens": 3}))


class Engines:
    """Three fake engines; each chat call is answered by the next reply in `script`."""

    def __init__(self, *script: Reply) -> None:
        self.script = list(script)
        self.calls: list[tuple[int, dict[str, Any]]] = []  # (port, body) of each chat call

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "up-model"}]})
        self.calls.append((request.url.port or 0, json.loads(request.content)))
        return self.script.pop(0)(request)


@contextmanager
def gateway(tmp_path: Path, engines: Engines, kinds: tuple[str, ...] = ("vllm", "vllm", "vllm"),
            stall: float | None = None, **settings: Any) -> Iterator[TestClient]:
    ups = [Upstream(name=f"e{i}", url=f"http://127.0.0.1:{port}", kind="openai", models={"q": "up-model"},
                    continuation=kind, stall_timeout=stall)
           for i, (port, kind) in enumerate(zip(PORTS, kinds, strict=True))]
    gs = GatewaySettings(upstreams=ups, data_dir=tmp_path, probe_interval=60, digest_interval=0, **settings)
    with TestClient(create_gateway_app(gs, transport=httpx.MockTransport(engines))) as c:
        yield c


def kind_of(kinds: tuple[str, ...], port: int) -> str:
    return kinds[PORTS.index(port)]


def migrations(c: TestClient, outcome: str) -> float:
    return float(gateway_of(c.app).pool.metrics.stream_migrations.labels(outcome)._value.get())


def sse_events(c: TestClient, path: str, body: dict[str, Any]) -> list[tuple[str | None, Any]]:
    with c.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        return parsed("".join(r.iter_text()))


CHAT = {"model": "q", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50,
        "stream_options": {"include_usage": True}}
MSG = {"model": "q", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
RESP = {"model": "q", "input": "hi"}


def chat_view(events: list[tuple[str | None, Any]]) -> tuple[str, list[str], Any]:
    """(text, finish reasons, usage) of a chat stream; asserts it has no error and one role."""
    chunks = [d for _, d in events if d != "[DONE]"]
    assert events[-1] == (None, "[DONE]") and not any("error" in d for d in chunks), events
    assert len({d["id"] for d in chunks}) == 1
    deltas = [ch["delta"] for d in chunks for ch in d["choices"]]
    assert sum(1 for d in deltas if d.get("role")) == 1
    finishes = [ch["finish_reason"] for d in chunks for ch in d["choices"] if ch.get("finish_reason")]
    return "".join(d.get("content") or "" for d in deltas), finishes, chunks[-1].get("usage")


# ---- the request the continuing engine gets --------------------------------------------------


@pytest.mark.parametrize("kind", ["vllm", "prefill"])
def test_the_next_engine_is_asked_to_continue_in_its_own_way(tmp_path: Path, kind: str) -> None:
    engines = Engines(CUT, REST)
    with gateway(tmp_path, engines, kinds=(kind,) * 3) as c:
        text, finishes, usage = chat_view(sse_events(c, "/v1/chat/completions", CHAT))
    (first_port, first), (second_port, second) = engines.calls
    assert first_port != second_port
    assert second["messages"] == [*first["messages"], {"role": "assistant", "content": "Hello"}]
    if kind == "vllm":  # exclusive in vLLM and SGLang: the template leaves the last message open
        assert (second["continue_final_message"], second["add_generation_prompt"]) == (True, False)
    else:  # llama-server prefills any final assistant message by itself
        assert "continue_final_message" not in second and "add_generation_prompt" not in second
    # the rest of the request as it was, but for max_tokens: the engine counts from its first new token
    assert {k: v for k, v in second.items() if k != "messages"} == {
        **{k: v for k, v in first.items() if k != "messages"}, "max_tokens": 48,
        **({"continue_final_message": True, "add_generation_prompt": False} if kind == "vllm" else {})}
    assert (text, finishes) == ("Hello world", ["stop"])
    # Completion tokens of both parts (the first part's 2 chunks, the rest's 3 reported); the
    # continuation's prompt less the partial answer it was given.
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (10, 5, 15)


@pytest.mark.parametrize("pieces", [["Hello wor"], ["Hel", "lo", " wor"]])
def test_an_engine_that_repeats_the_prefilled_text_is_relayed_only_what_is_new(tmp_path: Path,
                                                                              pieces: list[str]) -> None:
    # Recent llama-server builds start their answer with the prefilled message, then the new tokens.
    echoing = stream(delta({"role": "assistant", "content": None}), *(delta({"content": p}) for p in pieces),
                     delta({"content": "ld"}), delta({}, "stop"))
    with gateway(tmp_path, Engines(CUT, echoing), kinds=("prefill",) * 3) as c:
        text, finishes, _ = chat_view(sse_events(c, "/v1/chat/completions", CHAT))
    assert (text, finishes) == ("Hello world", ["stop"])


def test_text_that_only_begins_like_the_partial_answer_is_let_through() -> None:
    echo = Echo("Hello")
    assert echo.feed(TextDelta(0, "He")) == []
    assert echo.feed(TextDelta(0, "y")) == [TextDelta(0, "Hey")]
    assert echo.feed(TextDelta(0, "Hello")) == [TextDelta(0, "Hello")]  # decided: no more dropping
    held = Echo("Hello")
    assert held.feed(TextDelta(0, "Hel")) == [] and held.feed(Finish(0, "stop")) == [TextDelta(0, "Hel"),
                                                                                       Finish(0, "stop")]


def test_a_clients_own_final_assistant_message_and_the_partial_text_are_one_message() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure: "}]}
    # llama-server continued the client's message in the first answer too, and refuses two
    # assistant messages at the end
    assert continuation_body(body, "one", "prefill", continue_final=False)["messages"][1:] == [
        {"role": "assistant", "content": "Sure: one"}]
    # vLLM answered it as a new turn unless the client asked to continue it
    assert continuation_body(body, "one", "vllm", continue_final=False)["messages"][1:] == [
        {"role": "assistant", "content": "Sure: "}, {"role": "assistant", "content": "one"}]
    assert continuation_body(body, "one", "vllm", continue_final=True)["messages"][1:] == [
        {"role": "assistant", "content": "Sure: one"}]
    assert continuation_body(body, "", "vllm", continue_final=False) is body  # nothing yet: the same request


def test_an_engine_that_cannot_continue_is_never_sent_a_partial_answer(tmp_path: Path) -> None:
    kinds = ("vllm", "none", "vllm")
    engines = Engines(CUT, REST)
    with gateway(tmp_path, engines, kinds=kinds) as c:
        text, _, _ = chat_view(sse_events(c, "/v1/chat/completions", CHAT))
    assert text == "Hello world" and kind_of(kinds, engines.calls[1][0]) == "vllm"


@pytest.mark.parametrize("end", ["closed", "stall"])
def test_a_stream_closed_without_its_finish_or_stalled_goes_on(tmp_path: Path, end: str) -> None:
    cut = stream(delta({"role": "assistant", "content": ""}), delta({"content": "Hello"}), end=end)
    engines = Engines(cut, REST)
    with gateway(tmp_path, engines, stall=0.3) as c:
        text, finishes, _ = chat_view(sse_events(c, "/v1/chat/completions", CHAT))
        assert migrations(c, "continued") == 1
    assert (text, finishes) == ("Hello world", ["stop"])


def test_a_break_before_any_text_sends_the_same_request_again(tmp_path: Path) -> None:
    engines = Engines(stream(delta({"role": "assistant", "content": ""}), end="broken"), REST)
    with gateway(tmp_path, engines, kinds=("none",) * 3) as c:  # a plain resend: any engine takes it
        text, _, usage = chat_view(sse_events(c, "/v1/chat/completions", CHAT))
    assert engines.calls[0][1] == engines.calls[1][1]
    assert text == " world" and usage["prompt_tokens"] == 12


# ---- what the client sees, by protocol --------------------------------------------------------


def test_a_messages_client_sees_one_message(tmp_path: Path) -> None:
    with gateway(tmp_path, Engines(CUT, REST)) as c:
        events = sse_events(c, "/v1/messages", MSG)
    names = [n for n, _ in events]
    assert names.count("message_start") == 1 and names.count("message_stop") == 1 and "error" not in names
    assert names.count("content_block_start") == 1
    text = "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta")
    assert text == "Hello world"
    [stop] = [d for n, d in events if n == "message_delta"]
    assert stop["delta"]["stop_reason"] == "end_turn" and stop["usage"]["output_tokens"] == 5


def test_a_responses_client_sees_one_response(tmp_path: Path) -> None:
    with gateway(tmp_path, Engines(CUT, REST)) as c:
        events = sse_events(c, "/v1/responses", RESP)
        names = [n for n, _ in events]
        assert names.count("response.created") == 1 and names[-1] == "response.completed"
        assert "response.failed" not in names
        assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
        final = events[-1][1]["response"]
        assert final["output_text"] == "Hello world" and final["usage"]["output_tokens"] == 5
        stored = c.get(f"/v1/responses/{final['id']}").json()  # the gateway's copy holds the whole answer
        assert stored["output_text"] == "Hello world"


# ---- where it ends with the terminal error, as before ------------------------------------------


def chat_error(events: list[tuple[str | None, Any]]) -> tuple[str, dict[str, Any]]:
    chunks = [d for _, d in events if d != "[DONE]"]
    errors = [d["error"] for d in chunks if "error" in d]
    assert events[-1] == (None, "[DONE]") and len(errors) == 1, events
    text = "".join(ch["delta"].get("content") or "" for d in chunks for ch in d.get("choices") or [])
    return text, errors[0]


def test_engines_that_cannot_continue_end_with_the_terminal_error(tmp_path: Path) -> None:
    engines = Engines(CUT)
    with gateway(tmp_path, engines, kinds=("none",) * 3) as c:
        text, error = chat_error(sse_events(c, "/v1/chat/completions", CHAT))
        assert migrations(c, "no_node") == 1
    assert text == "Hello" and "failed mid-stream" in error["message"] and len(engines.calls) == 1


def test_the_migration_limit_bounds_the_moves(tmp_path: Path) -> None:
    again = stream(delta({"content": " wor"}), end="broken")
    engines = Engines(CUT, again)
    with gateway(tmp_path, engines, migration_limit=1) as c:
        text, _ = chat_error(sse_events(c, "/v1/chat/completions", CHAT))
        assert migrations(c, "continued") == 1 and migrations(c, "limit") == 1
    assert text == "Hello wor" and len(engines.calls) == 2
    assert engines.calls[1][1]["messages"][-1] == {"role": "assistant", "content": "Hello"}


def test_a_second_break_continues_with_the_whole_text_so_far(tmp_path: Path) -> None:
    engines = Engines(CUT, stream(delta({"content": " wor"}), end="broken"),
                      stream(delta({"content": "ld"}), delta({}, "stop")))
    with gateway(tmp_path, engines) as c:
        text, finishes, _ = chat_view(sse_events(c, "/v1/chat/completions", CHAT))
    assert (text, finishes) == ("Hello world", ["stop"]) and len({p for p, _ in engines.calls}) == 3
    assert engines.calls[2][1]["messages"][-1] == {"role": "assistant", "content": "Hello wor"}


def test_a_tool_call_cut_mid_arguments_is_not_continued(tmp_path: Path) -> None:
    call = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "f", "arguments": '{"ci'}}]}
    engines = Engines(stream(delta({"role": "assistant", "content": ""}), delta(call), end="broken"))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with gateway(tmp_path, engines) as c:
        _, error = chat_error(sse_events(c, "/v1/chat/completions", {**CHAT, "tools": tools}))
        assert migrations(c, "nothing_to_continue") == 1
    assert "failed mid-stream" in error["message"] and len(engines.calls) == 1


def test_a_refusal_ends_with_the_terminal_error(tmp_path: Path) -> None:
    refuse = lambda r: httpx.Response(400, json={"error": {"message": "prefill is incompatible"}})  # noqa: E731
    engines = Engines(CUT, refuse)
    with gateway(tmp_path, engines) as c:
        text, _ = chat_error(sse_events(c, "/v1/chat/completions", CHAT))
        assert migrations(c, "refused") == 1
    assert text == "Hello"
    pool = gateway_of(c.app).pool
    assert all(n.in_flight == 0 for n in pool.nodes.values())  # every lease went back


# ---- configuration ------------------------------------------------------------------------------


def test_continuation_is_read_and_checked() -> None:
    [up] = parse_upstreams({"upstream": [{"name": "v", "url": "http://x:1", "kind": "openai", "models": ["m"],
                                          "continuation": "prefill"}]})
    assert up.continuation == "prefill"
    with pytest.raises(ValueError, match="continuation must be one of"):
        Upstream(name="v", url="http://x:1", kind="openai", models={"m": "m"}, continuation="sglang")
    with pytest.raises(ValueError, match="for openai upstreams"):
        Upstream(name="h", url="http://x:1", models={"m": "m"}, continuation="vllm")
