"""Issue 14's parity items on the real default model: the fields users of the systems Hearth
replaces send (repetition detection, flush control, stream_thinking, t_max_predict_ms,
timings) and the bugs a careful user found, each reproduced."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from tests.helpers import EXACT, Server

pytestmark = pytest.mark.slow


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=120)


def ask(content: str, **kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "temperature": 0, **kw}


@pytest.mark.parametrize(("field", "value"), [("repetition_penalty", 0), ("repetition_penalty", 11),
                                              ("repeat_penalty", 0)])
@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_an_out_of_range_repetition_penalty_is_a_400(server: Server, path: str, field: str, value: float) -> None:
    # regression: repetition_penalty 0 was read as "not given" (`x or y`) and ran with 1.0
    body = ask("hi", max_tokens=2) if path == "/chat/completions" else {"prompt": "hi", "max_tokens": 2}
    r = post(server, path, {**body, field: value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "repetition_penalty"


def test_a_reasoning_budget_leaves_grammar_constrained_output_alone(server: Server) -> None:
    # regression: the budget forced "</think>" into output whose grammar has its own think block
    grammar = 'root ::= "<think>" [a-z]{2,6} "</think>" [a-z ]{1,12}'
    r = post(server, "/chat/completions", ask("Think, then answer: what is blue?", grammar=grammar,
                                             reasoning_budget=1, max_tokens=40, **EXACT))
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["message"]["content"]
    assert re.fullmatch(r"<think>[a-z]{2,6}</think>[a-z ]{1,12}", content), content


# ---- repetition detection ---------------------------------------------------------------------

LOOPING_CHAT = "Write 123.123.123.123.123.123.123"  # SmolLM2 writes "123." on and on at temperature 0
LOOPING_PROMPT = "1\n1\n1\n1\n1\n1\n"  # and continues this with "1\n" forever


def finish_of(path: str, data: dict[str, Any]) -> tuple[str, Any, int]:
    """(finish reason, Hearth's stop marker, completion tokens) in each protocol's own shape."""
    if path == "/messages":
        return data["stop_reason"], data.get("stop_details"), data["usage"]["output_tokens"]
    if path == "/responses":
        return data["status"], data.get("stop_reason"), data["usage"]["output_tokens"]
    c = data["choices"][0]
    return c["finish_reason"], c.get("stop_reason"), data["usage"]["completion_tokens"]


# cache_prompt false everywhere a test relies on what the model writes at temperature 0: chat,
# responses and messages render the same prompt, and a prefix reused from an earlier request can
# change the last bits of the logits (docs/api.md, Reproducibility). Recomputed, each request
# takes the same path on every run, whatever ran before it.
LOOPS: dict[str, dict[str, Any]] = {
    "/chat/completions": ask(LOOPING_CHAT, max_tokens=120, **EXACT),
    "/completions": {"prompt": LOOPING_PROMPT, "temperature": 0, "max_tokens": 120, **EXACT},
    "/responses": {"input": LOOPING_CHAT, "temperature": 0, "max_output_tokens": 120, "store": False, **EXACT},
    "/messages": {"messages": [{"role": "user", "content": LOOPING_CHAT}], "temperature": 0, "max_tokens": 120,
                  **EXACT},
}
STOPPED = {"/chat/completions": ("stop", "repetition"), "/completions": ("stop", "repetition"),
           "/responses": ("completed", "repetition"), "/messages": ("end_turn", {"type": "repetition"})}


@pytest.mark.parametrize("path", list(LOOPS))
def test_a_looping_generation_stops_with_a_repetition_stop(server: Server, path: str) -> None:
    where = {"extra": {"repetition_detection": True}} if path == "/messages" else {"repetition_detection": True}
    r = post(server, path, {**LOOPS[path], **where})
    assert r.status_code == 200, r.text
    reason, marker, n = finish_of(path, r.json())
    assert (reason, marker) == STOPPED[path]
    assert n < 120
    timings = r.json()["timings"]  # llama-server's names, on every protocol
    assert timings["predicted_n"] == n and timings["predicted_ms"] > 0 and timings["predicted_per_second"] > 0
    assert timings["prompt_n"] + timings["cache_n"] > 0 and timings["prompt_ms"] > 0


def test_without_detection_the_loop_runs_to_max_tokens_and_options_are_checked(server: Server) -> None:
    strict = {"min_repeats": 4, "min_tokens": 8}  # 4 repeats of "1\n" over at least 8 tokens
    base = {**LOOPS["/completions"], "max_tokens": 20}
    assert finish_of("/completions", post(server, "/completions", base).json()) == ("length", None, 20)
    off = post(server, "/completions", {**base, "repetition_detection": {"enabled": False, **strict}})
    assert finish_of("/completions", off.json()) == ("length", None, 20)
    on = post(server, "/completions", {**base, "repetition_detection": strict})
    assert finish_of("/completions", on.json()) == ("stop", "repetition", 8)
    for bad in ("yes", {"min_repeats": 1}, {"window": 3}):
        r = post(server, "/chat/completions", ask("hi", max_tokens=2, repetition_detection=bad))
        assert r.status_code == 400 and r.json()["error"]["param"].startswith("repetition_detection"), r.text
    r = post(server, "/chat/completions", ask("hi", max_tokens=2, extra={"repetition_detection": 5}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "extra.repetition_detection", r.text


def test_a_streamed_loop_flushed_every_8_tokens_equals_the_non_streamed_one(server: Server) -> None:
    body = {**LOOPS["/chat/completions"], "repetition_detection": True}
    whole = post(server, "/chat/completions", body).json()
    chunks = sse(server, "/chat/completions", {**body, "stream_options": {"flush_every_n_tokens": 8}})
    contents = [c["choices"][0]["delta"]["content"] for c in chunks
                if c.get("choices") and c["choices"][0]["delta"].get("content")]
    assert "".join(contents) == whole["choices"][0]["message"]["content"]
    n = whole["usage"]["completion_tokens"]
    assert len(contents) <= 1 + -(-(n - 1) // 8)  # the first alone, then groups of 8 tokens
    final = [c for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"]]
    assert len(final) == 1 and final[0]["choices"][0]["stop_reason"] == "repetition"
    assert final[0]["timings"]["predicted_n"] == n  # the final chunk carries the timings


def test_flush_every_ms_and_stream_thinking_keep_the_stream_equal(server: Server) -> None:
    body = {"input": "Name three fruits.", "temperature": 0, "max_output_tokens": 24, "store": False, **EXACT}
    whole = post(server, "/responses", body).json()["output_text"]
    chunks = sse(server, "/responses", {**body, "stream_options": {"flush_every_ms": 200}, "stream_thinking": False})
    assert "".join(c["delta"] for c in chunks if c.get("type") == "response.output_text.delta") == whole
    for bad in ({"stream_thinking": "no"}, {"stream_options": {"flush_every_n_tokens": 0}},
                {"stream_options": {"flush_every_ms": -5}}):
        r = post(server, "/chat/completions", ask("hi", max_tokens=2, **bad))
        assert r.status_code == 400, r.text


def test_t_max_predict_ms_is_the_generation_cap(server: Server) -> None:
    """Counted from the first token, as llama-server's: the prompt's processing is not cut, so
    there is always a first token; the cap ends the answer as `length`, named `timeout`."""
    r = post(server, "/chat/completions", ask("Tell me a long story.", max_tokens=1500, t_max_predict_ms=1))
    choice = r.json()["choices"][0]
    assert r.status_code == 200 and (choice["finish_reason"], choice["stop_reason"]) == ("length", "timeout"), r.text
    assert 1 <= r.json()["usage"]["completion_tokens"] < 1500
    both = post(server, "/chat/completions", ask("hi", max_tokens=2, timeout=5, t_max_predict_ms=5000))
    assert both.status_code == 400 and both.json()["error"]["param"] == "t_max_predict_ms"
    big = post(server, "/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                     "t_max_predict_ms": 10**9})
    assert big.status_code == 400 and "t_max_predict_ms" in big.json()["error"]["message"]


def sse(server: Server, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    with httpx.stream("POST", server.base_url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
    return out


# ---- a malformed tool call ----------------------------------------------------------------------

WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_a_tool_call_cut_by_max_tokens_ends_clearly_and_never_as_text(server: Server) -> None:
    # the grammar of tool_choice "required" makes a call; max_tokens cuts it mid-JSON
    body = {"messages": ASK_WEATHER, "temperature": 0, "max_tokens": 18, "tool_choice": "required",
            "tools": [{"type": "function", "function": WEATHER}], **EXACT}
    c = post(server, "/chat/completions", body).json()["choices"][0]
    assert c["finish_reason"] == "length"
    assert c["error"]["type"] == "malformed_tool_call" and "malformed tool call 0" in c["error"]["message"]
    assert "get_weather" in c["error"]["message"]
    assert "<tool_call>" not in (c["message"]["content"] or "")
    chunks = sse(server, "/chat/completions", body)
    assert not any("<tool_call>" in (ch["choices"][0]["delta"].get("content") or "") for ch in chunks if ch["choices"])
    final = [ch["choices"][0] for ch in chunks if ch["choices"] and ch["choices"][0]["finish_reason"]]
    assert final[0]["finish_reason"] == "length" and final[0]["error"]["type"] == "malformed_tool_call"

    m = post(server, "/messages", {"messages": ASK_WEATHER, "max_tokens": 18, "temperature": 0, **EXACT,
                                   "tool_choice": {"type": "any"}, "tools": [
                                       {"name": "get_weather", "input_schema": WEATHER["parameters"]}]}).json()
    assert m["stop_reason"] == "max_tokens" and m["stop_details"]["type"] == "malformed_tool_call"
    assert not any("<tool_call>" in b.get("text", "") for b in m["content"])
    r = post(server, "/responses", {"input": "What is the weather in Paris?", "max_output_tokens": 18,
                                    "temperature": 0, "store": False, "tool_choice": "required", **EXACT,
                                    "tools": [{"type": "function", **WEATHER}]}).json()
    assert r["status"] == "incomplete" and r["error"]["code"] == "malformed_tool_call"
    assert "<tool_call>" not in r["output_text"]


def test_a_max_tokens_past_the_context_is_served_to_the_windows_end(server: Server) -> None:
    """llama-server's and Ollama's default: the budget is lowered to what the 2048-token window
    leaves, the window's end then ends the answer with each protocol's `length`."""
    long = "word " * 1990  # most of the window, so few tokens are left to generate
    r = httpx.post(server.base_url + "/chat/completions", json=ask(long, max_tokens=100_000, ignore_eos=True),
                   timeout=600)  # a deadline, not speed: a 2,000-token prefill on a loaded machine
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 2048
    m = httpx.post(server.base_url + "/messages", json={**ask(long, ignore_eos=True), "max_tokens": 32_000},
                   timeout=600)
    assert m.status_code == 200, m.text
    assert m.json()["stop_reason"] == "max_tokens"
