"""A session turn recorded from what the gateway relayed (turn_record.py), per protocol: the
turn's new messages and the whole answer, OpenAI-shaped as a node's /history holds them."""

from __future__ import annotations

import json
from typing import Any

from hearth.gateway.failover.cuts import ChatCut, Cut, MessagesCut
from hearth.gateway.failover.cuts.responses import ResponsesCut
from hearth.gateway.failover.record import turn_messages


def event(obj: dict[str, Any], name: str | None = None) -> bytes:
    return (f"event: {name}\n".encode() if name else b"") + b"data: " + json.dumps(obj).encode()


def fed(cut: Cut, events: list[bytes]) -> Cut:
    for e in events:
        cut.feed(e)
    return cut


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return event({"id": "chatcmpl-1", "created": 1, "choices": [{"index": 0, "delta": delta,
                                                                   "finish_reason": finish}]})


def test_a_chat_turn_with_a_tool_call() -> None:
    cut = fed(ChatCut(), [chunk({"role": "assistant", "content": "Let me look."}),
                          chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                 "function": {"name": "ls", "arguments": '{"path": '}}]}),
                          chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"."}'}}]}),
                          chunk({}, "tool_calls")])
    body = {"model": "smol", "session_id": "s", "messages": [{"role": "user", "content": "List it."}],
            "tools": [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]}
    assert turn_messages("chat", cut.body(body, whole=True), first=False) == [
        {"role": "user", "content": "List it."},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}]}]
    assert cut.body(body) is None  # the answer ended: nothing to continue


def test_a_messages_turn_keeps_its_system_prompt_only_in_the_first_turn() -> None:
    cut = fed(MessagesCut(), [
        event({"type": "message_start", "message": {"id": "msg_1"}}, "message_start"),
        event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
              "content_block_start"),
        event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi "}},
              "content_block_delta"),
        event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "there."}},
              "content_block_delta"),
        event({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        event({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}, "message_delta"),
        event({"type": "message_stop"}, "message_stop")])
    body = {"model": "smol", "session_id": "s", "max_tokens": 8, "system": "Be brief.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]}
    turn = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there."}]
    assert turn_messages("anthropic", cut.body(body, whole=True), first=True) == [
        {"role": "system", "content": "Be brief."}, *turn]
    assert turn_messages("anthropic", cut.body(body, whole=True), first=False) == turn


def test_a_responses_turn() -> None:
    item = {"type": "message", "id": "msg_1", "role": "assistant", "content": []}
    cut = fed(ResponsesCut(), [
        event({"type": "response.created", "sequence_number": 0, "response": {"id": "resp_1", "output": []}},
              "response.created"),
        event({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": item},
              "response.output_item.added"),
        event({"type": "response.output_text.delta", "sequence_number": 2, "output_index": 0, "content_index": 0,
               "delta": "Fine."}, "response.output_text.delta"),
        event({"type": "response.output_item.done", "sequence_number": 3, "output_index": 0,
               "item": {**item, "content": [{"type": "output_text", "text": "Fine."}]}},
              "response.output_item.done"),
        event({"type": "response.completed", "sequence_number": 4, "response": {"id": "resp_1"}},
              "response.completed")])
    body = {"model": "smol", "session_id": "s", "input": "How are you?"}
    assert turn_messages("responses", cut.body(body, whole=True), first=False) == [
        {"role": "user", "content": "How are you?"}, {"role": "assistant", "content": "Fine."}]


def test_an_input_only_a_node_can_read_is_not_recorded() -> None:
    body = {"model": "smol", "session_id": "s", "input": [{"type": "item_reference", "id": "msg_x"},
                                                          {"type": "message", "role": "assistant",
                                                           "content": [{"type": "output_text", "text": "."}]}]}
    assert turn_messages("responses", body, first=False) is None
    assert turn_messages("chat", None, first=False) is None
