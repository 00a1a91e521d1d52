"""The Ollama stream cut (failover/cuts/ollama.py) and what a node makes of its continuation
request (hearth/api/ollama/bodies.py): the partial answer as the last assistant message on chat
(joined to a client's own), in `partial_response` / `partial_thinking` on generate, never for a
raw prompt; the final object's durations made the whole answer's; the node's ChatRequest
continuing it, counted as output."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hearth.api.ollama.bodies import chat_request, generate_request, read_chat, read_generate
from hearth.chat.types import ChatRequest
from hearth.errors import BadRequest
from hearth.gateway.failover.cuts import OllamaCut, cut_for
from hearth.gateway.protocols import is_terminal, terminal_error


def line(d: dict[str, Any]) -> bytes:
    return json.dumps(d).encode()


def test_chat_cut_joins_a_clients_own_partial_answer_and_stops_after_the_final_object() -> None:
    cut = cut_for("ollama_chat", {}, 0.0)
    assert isinstance(cut, OllamaCut)
    call = {"function": {"name": "f", "arguments": {"x": 1}}}
    for d in ({"message": {"role": "assistant", "content": "", "thinking": "t"}},
              {"message": {"role": "assistant", "content": "a"}},
              {"message": {"role": "assistant", "content": "", "tool_calls": [call]}}):
        cut.feed(line({**d, "done": False}))
    request = {"model": "m", "continue_final_message": True,
               "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "My "}]}
    body = cut.body(request)
    assert body is not None and body["continue_final_message"] is True
    assert body["messages"] == [{"role": "user", "content": "q"},
                                {"role": "assistant", "content": "My a", "thinking": "t", "tool_calls": [call]}]
    cut.feed(line({"message": {"role": "assistant", "content": ""}, "done": True}))
    assert cut.body(request) is None and cut.body(request, whole=True) is not None


def test_generate_cut_and_raw() -> None:
    assert cut_for("ollama_generate", {"raw": True}) is None
    cut = OllamaCut("generate")
    cut.feed(line({"response": "", "thinking": "hm", "done": False}))
    cut.feed(line({"response": "1, 2", "done": False}))
    assert cut.body({"prompt": "p", "partial_response": "0, "}) == {
        "prompt": "p", "partial_response": "0, 1, 2", "partial_thinking": "hm"}


def test_the_final_objects_durations_are_the_whole_answers() -> None:
    cut = OllamaCut("chat", started=0.0)
    cut.feed(line({"message": {"content": "a"}, "done": False}))
    assert cut.rewrite(b'{"message":{"content":"b"},"done":false}') == [b'{"message":{"content":"b"},"done":false}']
    [out] = cut.rewrite(line({"done": True, "eval_count": 9, "total_duration": 5, "load_duration": 4,
                              "prompt_eval_duration": 3, "eval_duration": 2}))
    d = json.loads(out)
    assert d["eval_count"] == 9 and d["load_duration"] == 0 and d["total_duration"] > 5
    assert d["prompt_eval_duration"] + d["eval_duration"] == d["total_duration"]
    assert is_terminal("ollama_chat", out) and not is_terminal("ollama_chat", b'{"done":false}')
    assert is_terminal("ollama_generate", b'{"error":"x"}')
    assert terminal_error("ollama_chat", "gone") == b'{"error":"gone"}\n'


def test_a_node_continues_a_partial_answer_as_output() -> None:
    chat = chat_request(read_chat({"model": "m", "continue_final_message": True, "partial_is_output": True,
                                   "messages": [{"role": "user", "content": "q"},
                                                {"role": "assistant", "content": "a", "thinking": "t"}]}), "m", "id")
    assert chat.continue_final and chat.partial_is_output and chat.messages[-1].reasoning == "t"
    gen = generate_request(read_generate({"model": "m", "prompt": "p", "system": "s", "partial_response": "1, ",
                                          "partial_thinking": "hm", "partial_is_output": True}), "m", "id")
    assert isinstance(gen, ChatRequest) and gen.continue_final and gen.partial_is_output
    assert [(m.role, m.content, m.reasoning) for m in gen.messages] == [
        ("system", "s", None), ("user", "p", None), ("assistant", "1, ", "hm")]
    plain = generate_request(read_generate({"model": "m", "prompt": "p"}), "m", "id")
    assert isinstance(plain, ChatRequest) and not plain.continue_final and len(plain.messages) == 1
    with pytest.raises(BadRequest) as e:
        generate_request(read_generate({"model": "m", "prompt": "p", "raw": True, "partial_response": "x"}), "m", "id")
    assert e.value.param == "partial_response"
