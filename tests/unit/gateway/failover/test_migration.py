"""Stream migration in-process over fake upstreams: node `a` breaks mid-answer, node `b` is
asked to continue it (the request it gets is checked: the partial answer as the final
assistant message, continue_final_message) and what the client sees is one stream with the
first answer's ids, indexes and sequence numbers, one opening and one finish."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from hearth.errors import Unavailable
from hearth.gateway.state import gateway_of
from tests.helpers.fake_fleet import Fleet, gateway, parsed, response, sse, stick, stream_text


@pytest.fixture
def fleet() -> Fleet:
    return Fleet()


def data(obj: dict[str, Any], event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(obj).encode() + b"\n\n"


def chunk(cid: str, delta: dict[str, Any], finish: str | None = None) -> bytes:
    return data({"id": cid, "object": "chat.completion.chunk", "created": 1 if cid.endswith("1") else 2,
                 "model": "up-model", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})




def continuation_body(fleet: Fleet) -> dict[str, Any]:
    second = [r for r in fleet.seen if r.url.port == 9102 and r.url.path != "/health"][-1]
    body: dict[str, Any] = json.loads(second.content)
    assert body["continue_final_message"] is True
    return body


def migrations(c: Any, outcome: str) -> float:
    value = gateway_of(c.app).proxy.metrics.stream_migrations.labels(outcome)._value.get()
    return float(value)


CHAT = {"model": "smol", "messages": [{"role": "user", "content": "hi"}]}


def test_chat_goes_on_on_another_node_as_one_stream(tmp_path: Path, fleet: Fleet) -> None:
    fleet.behave["a"] = lambda r: sse(chunks=[chunk("chatcmpl-1", {"role": "assistant", "content": ""}),
                                              chunk("chatcmpl-1", {"content": "Hel"}),
                                              chunk("chatcmpl-1", {"content": "lo"})], broken=True)
    fleet.behave["b"] = lambda r: sse(chunks=[
        chunk("chatcmpl-2", {"role": "assistant", "content": ""}), chunk("chatcmpl-2", {"content": " world"}),
        chunk("chatcmpl-2", {}, "stop"),
        data({"id": "chatcmpl-2", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}}),
        b"data: [DONE]\n\n"])
    with gateway(tmp_path, fleet) as c:
        events = parsed(stream_text(c, "/v1/chat/completions", CHAT, stick(c, "k", "a")))
        assert continuation_body(fleet)["messages"] == [*CHAT["messages"], {"role": "assistant", "content": "Hello"}]
        chunks = [d for _, d in events if d != "[DONE]"]
        assert all(d["id"] == "chatcmpl-1" and d.get("created", 1) == 1 for d in chunks)
        deltas = [ch["delta"] for d in chunks for ch in d["choices"]]
        assert sum(1 for d in deltas if "role" in d) == 1
        assert "".join(d.get("content") or "" for d in deltas) == "Hello world"
        assert [ch["finish_reason"] for d in chunks for ch in d["choices"] if ch["finish_reason"]] == ["stop"]
        assert chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 3}
        assert events[-1] == (None, "[DONE]") and not any("error" in d for d in chunks)
        assert migrations(c, "continued") == 1


def test_chat_tool_call_cut_mid_arguments_goes_on(tmp_path: Path, fleet: Fleet) -> None:
    announce = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                "function": {"name": "f", "arguments": '{"ci'}}]}
    fleet.behave["a"] = lambda r: sse(chunks=[chunk("chatcmpl-1", {"role": "assistant", "content": ""}),
                                              chunk("chatcmpl-1", announce)], broken=True)
    fleet.behave["b"] = lambda r: sse(chunks=[
        chunk("chatcmpl-2", {"role": "assistant", "content": ""}),
        chunk("chatcmpl-2", {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "P"}'}}]}),
        chunk("chatcmpl-2", {}, "tool_calls"), b"data: [DONE]\n\n"])
    with gateway(tmp_path, fleet) as c:
        events = parsed(stream_text(c, "/v1/chat/completions", CHAT, stick(c, "k", "a")))
        [partial] = continuation_body(fleet)["messages"][1:]
        assert partial["tool_calls"] == [{"id": "call_1", "type": "function",
                                          "function": {"name": "f", "arguments": '{"ci'}}]
        calls = [t for _, d in events if d != "[DONE]" for ch in d["choices"]
                 for t in ch["delta"].get("tool_calls", [])]
        assert [t.get("id") for t in calls] == ["call_1", None]
        assert "".join(t["function"]["arguments"] for t in calls) == '{"city": "P"}'


MSG = {"model": "smol", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}


def m_start(mid: str) -> bytes:
    return data({"type": "message_start", "message": {"id": mid, "model": "up-model", "content": []}},
                "message_start")


def block(kind: str, payload: dict[str, Any]) -> bytes:
    return data({"type": kind, **payload}, kind)


def test_messages_go_on_with_the_open_block_and_continuous_indexes(tmp_path: Path, fleet: Fleet) -> None:
    fleet.behave["a"] = lambda r: sse(chunks=[
        m_start("msg_1"), block("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        block("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hel"}})], broken=True)
    fleet.behave["b"] = lambda r: sse(chunks=[
        m_start("msg_2"), data({"type": "ping"}, "ping"),
        block("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        block("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "lo"}}),
        block("content_block_stop", {"index": 0}),
        block("content_block_start", {"index": 1, "content_block": {"type": "tool_use", "id": "toolu_9",
                                                                    "name": "f", "input": {}}}),
        block("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta", "partial_json": "{}"}}),
        block("content_block_stop", {"index": 1}),
        block("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
        block("message_stop", {})])
    with gateway(tmp_path, fleet) as c:
        events = parsed(stream_text(c, "/v1/messages", MSG, stick(c, "k", "a")))
        assert continuation_body(fleet)["messages"][-1] == {"role": "assistant",
                                                            "content": [{"type": "text", "text": "Hel"}]}
        names = [n for n, _ in events]
        assert names.count("message_start") == 1 and names.count("message_stop") == 1 and "error" not in names
        assert [d["message"]["id"] for n, d in events if n == "message_start"] == ["msg_1"]
        starts = [(d["index"], d["content_block"]["type"]) for n, d in events if n == "content_block_start"]
        assert starts == [(0, "text"), (1, "tool_use")]
        text = "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta" and d["index"] == 0)
        assert text == "Hello"
        assert [d["index"] for n, d in events if n == "content_block_stop"] == [0, 1]


def test_messages_tool_use_cut_mid_input_goes_on(tmp_path: Path, fleet: Fleet) -> None:
    fleet.behave["a"] = lambda r: sse(chunks=[
        m_start("msg_1"),
        block("content_block_start", {"index": 0, "content_block": {"type": "tool_use", "id": "toolu_1",
                                                                    "name": "f", "input": {}}}),
        block("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"ci'}})],
        broken=True)
    fleet.behave["b"] = lambda r: sse(chunks=[
        m_start("msg_2"),
        block("content_block_start", {"index": 0, "content_block": {"type": "tool_use", "id": "toolu_2",
                                                                    "name": "", "input": {}}}),
        block("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": 'ty": 1}'}}),
        block("content_block_stop", {"index": 0}),
        block("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
        block("message_stop", {})])
    with gateway(tmp_path, fleet) as c:
        events = parsed(stream_text(c, "/v1/messages", MSG, stick(c, "k", "a")))
        partial = continuation_body(fleet)["messages"][-1]["content"]
        assert partial == [{"type": "tool_use", "id": "toolu_1", "name": "f", "partial_json": '{"ci'}]
        assert [d["content_block"]["id"] for n, d in events if n == "content_block_start"] == ["toolu_1"]
        args = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
        assert json.loads(args) == {"city": 1}


RESP = {"model": "smol", "input": "hi"}


def r_event(name: str, seq: int, **payload: Any) -> bytes:
    return data({"type": name, "sequence_number": seq, **payload}, name)




def test_responses_go_on_with_the_same_ids_and_sequence_numbers(tmp_path: Path, fleet: Fleet) -> None:
    item = {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}
    part = {"type": "output_text", "text": ""}
    fleet.behave["a"] = lambda r: sse(chunks=[
        r_event("response.created", 0, response=response("resp_1")),
        r_event("response.in_progress", 1, response=response("resp_1")),
        r_event("response.output_item.added", 2, output_index=0, item=item),
        r_event("response.content_part.added", 3, item_id="msg_1", output_index=0, content_index=0, part=part),
        r_event("response.output_text.delta", 4, item_id="msg_1", output_index=0, content_index=0, delta="Hel")],
        broken=True)
    theirs = {**item, "id": "msg_2"}
    done_item = {**theirs, "status": "completed", "content": [{"type": "output_text", "text": "lo"}]}
    fleet.behave["b"] = lambda r: sse(chunks=[
        r_event("response.created", 0, response=response("resp_2")),
        r_event("response.in_progress", 1, response=response("resp_2")),
        r_event("response.output_item.added", 2, output_index=0, item=theirs),
        r_event("response.content_part.added", 3, item_id="msg_2", output_index=0, content_index=0, part=part),
        r_event("response.output_text.delta", 4, item_id="msg_2", output_index=0, content_index=0, delta="lo"),
        r_event("response.output_text.done", 5, item_id="msg_2", output_index=0, content_index=0, text="lo"),
        r_event("response.content_part.done", 6, item_id="msg_2", output_index=0, content_index=0,
                part={"type": "output_text", "text": "lo"}),
        r_event("response.output_item.done", 7, output_index=0, item=done_item),
        r_event("response.completed", 8, response={**response("resp_2", "completed", [done_item]),
                                                   "usage": {"input_tokens": 3, "output_tokens": 4}})])
    with gateway(tmp_path, fleet) as c:
        events = parsed(stream_text(c, "/v1/responses", RESP, stick(c, "k", "a")))
        body = continuation_body(fleet)
        assert body["input"][-1] == {"type": "message", "role": "assistant",
                                     "content": [{"type": "output_text", "text": "Hel"}]}
        names = [n for n, _ in events]
        assert names.count("response.created") == 1 and names.count("response.output_item.added") == 1
        assert names.count("response.content_part.added") == 1 and names[-1] == "response.completed"
        assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
        assert {d["item_id"] for _, d in events if "item_id" in d} == {"msg_1"}
        assert [d["text"] for n, d in events if n == "response.output_text.done"] == ["Hello"]
        final = events[-1][1]["response"]
        assert final["id"] == "resp_1" and final["status"] == "completed" and final["output_text"] == "Hello"
        assert final["output"][0]["id"] == "msg_1" and final["usage"] == {"input_tokens": 3, "output_tokens": 4}


def test_a_refusal_ends_the_stream_with_the_terminal_error(tmp_path: Path, fleet: Fleet) -> None:
    fleet.behave["a"] = lambda r: sse(chunks=[chunk("chatcmpl-1", {"content": "Hel"})], broken=True)
    fleet.behave["b"] = lambda r: httpx.Response(400, json={"error": {"param": "continue_final_message"}})
    with gateway(tmp_path, fleet) as c:
        events = parsed(stream_text(c, "/v1/chat/completions", CHAT, stick(c, "k", "a")))
        assert events[-2][1]["error"]["code"] == "upstream_failed" and events[-1] == (None, "[DONE]")
        assert migrations(c, "refused") == 1


def test_the_migration_limit_bounds_the_moves(tmp_path: Path, fleet: Fleet) -> None:
    fleet.behave["a"] = lambda r: sse(chunks=[chunk("chatcmpl-1", {"content": "Hel"})], broken=True)
    fleet.behave["b"] = lambda r: sse(chunks=[chunk("chatcmpl-2", {"content": "lo"})], broken=True)
    with gateway(tmp_path, fleet, migration_limit=1) as c:
        events = parsed(stream_text(c, "/v1/chat/completions", CHAT, stick(c, "k", "a")))
        text = "".join(ch["delta"].get("content") or "" for _, d in events if d != "[DONE]" and "choices" in d
                       for ch in d["choices"])
        assert text == "Hello" and events[-2][1]["error"]["code"] == "upstream_failed"
        assert migrations(c, "continued") == 1 and migrations(c, "limit") == 1


# ---- a session turn's transcript is copied before its answer ends ---------------------------

TURN = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}]


def session_node(history_status: int, stream: bool) -> Any:
    def node(r: httpx.Request) -> httpx.Response:
        if r.url.path.endswith("/history"):
            return httpx.Response(history_status, json={"object": "list", "data": TURN})
        if stream:
            return sse(chunks=[chunk("chatcmpl-1", {"content": "Hello"}), chunk("chatcmpl-1", {}, "stop"),
                               b"data: [DONE]\n\n"])
        return httpx.Response(200, json={"id": "chatcmpl-1", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "stop"}]})
    return node


def test_a_streamed_session_turn_ends_once_its_transcript_is_copied(tmp_path: Path, fleet: Fleet) -> None:
    fleet.behave["a"] = fleet.behave["b"] = session_node(200, stream=True)
    with gateway(tmp_path, fleet) as c:
        events = parsed(stream_text(c, "/v1/chat/completions", {**CHAT, "session_id": "s1"}, {}))
        assert events[-1] == (None, "[DONE]")
        # No waiting for background copies: the copy was done before [DONE] went out.
        assert c.portal.call(gateway_of(c.app).store.transcript, "s1") == ("smol", TURN)


def test_a_non_streamed_session_turn_returns_once_its_transcript_is_copied(tmp_path: Path, fleet: Fleet) -> None:
    fleet.behave["a"] = fleet.behave["b"] = session_node(200, stream=False)
    with gateway(tmp_path, fleet) as c:
        r = c.post("/v1/chat/completions", json={**CHAT, "session_id": "s2"})
        assert r.status_code == 200
        assert c.portal.call(gateway_of(c.app).store.transcript, "s2") == ("smol", TURN)


def test_a_streamed_turn_whose_transcript_cannot_be_copied_is_recorded_from_the_relayed_answer(
        tmp_path: Path, fleet: Fleet) -> None:
    # The node answered and died before the gateway could copy the turn: the client has the
    # whole answer, and the gateway records the turn from the request and what it relayed.
    fleet.behave["a"] = fleet.behave["b"] = session_node(503, stream=True)
    with gateway(tmp_path, fleet) as c:
        events = parsed(stream_text(c, "/v1/chat/completions", {**CHAT, "session_id": "s3"}, {}))
        assert events[-2][1]["choices"][0]["finish_reason"] == "stop" and events[-1] == (None, "[DONE]")
        assert c.portal.call(gateway_of(c.app).store.transcript, "s3") == ("smol", TURN)
        assert gateway_of(c.app).proxy.metrics.transcripts_from_relay._value.get() == 1


def test_a_non_streamed_turn_whose_transcript_cannot_be_copied_is_not_reported_done(
        tmp_path: Path, fleet: Fleet) -> None:
    # Nothing reached the client: it is retried on the other node, which fails the copy too.
    fleet.behave["a"] = fleet.behave["b"] = session_node(503, stream=False)
    with gateway(tmp_path, fleet) as c:
        r = c.post("/v1/chat/completions", json={**CHAT, "session_id": "s4"})
        assert r.status_code >= 500
        assert c.portal.call(gateway_of(c.app).store.transcript, "s4") is None


@pytest.mark.parametrize("stream", [True, False])
def test_a_database_lost_after_the_answer_keeps_the_answer_and_frees_the_node(tmp_path: Path, fleet: Fleet,
                                                                              stream: bool) -> None:
    fleet.behave["a"] = fleet.behave["b"] = session_node(200, stream=stream)
    with gateway(tmp_path, fleet) as c:
        pool = gateway_of(c.app).pool

        async def away(*_: object) -> None:
            raise Unavailable("the gateway's database is unavailable", code="database_unavailable", retry_after=5)

        pool.store.assign = away  # type: ignore[method-assign]  # it goes away once the node has answered
        if stream:
            assert parsed(stream_text(c, "/v1/chat/completions", {**CHAT, "session_id": "s5"}, {}))[-1] == (
                None, "[DONE]")
        else:
            assert c.post("/v1/chat/completions", json={**CHAT, "session_id": "s5"}).status_code == 200
        assert [n.in_flight for n in pool.nodes.values()] == [0, 0]
