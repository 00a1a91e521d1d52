"""The prompt cache's protocol side in-process: conversation keys reach the backend from every
chat protocol, Anthropic cache_control breakpoints become the tokens the engine keeps, and the
usage and timings report what the cache did. The scripted model's tokens are bytes, so a
prompt's token counts are its rendered text's length."""

from __future__ import annotations

from typing import Any

import pytest

from hearth.backends.base import EventStream
from hearth.chat.types import ChatRequest
from tests.api.conftest import ANSWER, Harness
from tests.helpers import until

EPHEMERAL = {"type": "ephemeral"}
# Longer than two of the cache's 256-token blocks, so the prompt spans full blocks and a partial one.
SYSTEM = "You are a careful assistant. " * 22
SYSTEM_TURN = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"  # what the scripted template renders for it


def system_blocks(marked: bool = True) -> list[dict[str, Any]]:
    return [{"type": "text", "text": SYSTEM, **({"cache_control": EPHEMERAL} if marked else {})}]


MESSAGES = {"model": "fake", "max_tokens": 64, "temperature": 0, "system": system_blocks(),
            "messages": [{"role": "user", "content": "Hi"}]}


def record_requests(h: Harness, monkeypatch: pytest.MonkeyPatch) -> list[ChatRequest]:
    """The ChatRequests the backend gets, as it gets them."""
    seen: list[ChatRequest] = []
    chat = h.backend.chat

    async def recording(req: ChatRequest) -> EventStream:
        seen.append(req)
        return await chat(req)

    monkeypatch.setattr(h.backend, "chat", recording)
    return seen


def answer_text(path: str, body: dict[str, Any]) -> str:
    if path == "/v1/chat/completions":
        return str(body["choices"][0]["message"]["content"])
    if path == "/v1/responses":
        return str(body["output_text"])
    return str(body["content"][0]["text"])


CHAT = ("/v1/chat/completions", {"model": "fake", "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]})
RESPONSES = ("/v1/responses", {"model": "fake", "temperature": 0, "input": "Hi"})
ANTHROPIC = ("/v1/messages", {"model": "fake", "temperature": 0, "max_tokens": 64,
                              "messages": [{"role": "user", "content": "Hi"}]})
CLAUDE_USER_ID = '{"device_id":"d","account_uuid":"","session_id":"cc-session"}'


@pytest.mark.parametrize(("route", "extra", "headers", "expected"), [
    (CHAT, {}, {}, None),
    (CHAT, {"prompt_cache_key": "pck"}, {}, "pck"),
    (CHAT, {}, {"session_id": "sid"}, "sid"),
    (CHAT, {"prompt_cache_key": "pck"}, {"session-id": "sid"}, "pck"),
    (RESPONSES, {"prompt_cache_key": "codex"}, {"session-id": "sid", "thread-id": "tid"}, "codex"),
    (RESPONSES, {}, {"thread-id": "tid"}, "tid"),
    (ANTHROPIC, {"metadata": {"user_id": CLAUDE_USER_ID}}, {"X-Claude-Code-Session-Id": "hdr"}, "cc-session"),
    (ANTHROPIC, {"metadata": {"user_id": "plain-user"}}, {}, "plain-user"),
    (ANTHROPIC, {}, {"X-Claude-Code-Session-Id": "hdr"}, "hdr"),
    (ANTHROPIC, {"prompt_cache_key": "pck", "metadata": {"user_id": CLAUDE_USER_ID}}, {}, "pck"),
])
async def test_the_conversation_key_reaches_the_backend_and_changes_no_answer(
        h: Harness, monkeypatch: pytest.MonkeyPatch, route: tuple[str, dict[str, Any]], extra: dict[str, Any],
        headers: dict[str, str], expected: str | None) -> None:
    seen = record_requests(h, monkeypatch)
    path, body = route
    r = await h.post(path, {**body, **extra}, headers=headers)
    assert r.status_code == 200, r.text
    assert answer_text(path, r.json()) == ANSWER
    [req] = seen
    assert req.cache_key == expected


async def test_a_key_that_is_not_a_string_is_a_400_in_the_protocols_envelope(h: Harness) -> None:
    r = await h.post(CHAT[0], {**CHAT[1], "prompt_cache_key": 7})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_cache_key"
    r = await h.post(ANTHROPIC[0], {**ANTHROPIC[1], "prompt_cache_key": ["k"]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


async def test_cache_control_on_openai_shapes_is_accepted_and_ignored(h: Harness,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    seen = record_requests(h, monkeypatch)
    part = {"type": "text", "text": "Hi", "cache_control": EPHEMERAL}
    r = await h.post(CHAT[0], {**CHAT[1], "messages": [{"role": "user", "content": [part]}]})
    assert r.status_code == 200, r.text
    r = await h.post(RESPONSES[0], {**RESPONSES[1], "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Hi", "cache_control": EPHEMERAL}]}]})
    assert r.status_code == 200, r.text
    assert [req.cache_through for req in seen] == [None, None]


# ---- cache_control and usage on Messages --------------------------------------------------------


async def prompt_size(h: Harness, body: dict[str, Any]) -> int:
    counted = await h.post("/v1/messages/count_tokens", {k: v for k, v in body.items() if k != "max_tokens"})
    return int(counted.json()["input_tokens"])


def split(usage: dict[str, Any]) -> tuple[int, int, int]:
    return usage["input_tokens"], usage["cache_creation_input_tokens"], usage["cache_read_input_tokens"]


async def test_a_system_breakpoint_writes_the_system_prompt(h: Harness) -> None:
    """The first request writes exactly the tokens up to the end of the marked system prompt."""
    total = await prompt_size(h, MESSAGES)
    r = await h.post("/v1/messages", MESSAGES)
    assert r.status_code == 200, r.text
    assert split(r.json()["usage"]) == (total - len(SYSTEM_TURN), len(SYSTEM_TURN), 0)


async def test_claude_codes_breakpoints_on_the_system_and_the_last_user_message(h: Harness) -> None:
    """A breakpoint on the last user message keeps the whole prompt but the assistant header
    the template adds after it; the system blocks' breakpoints are earlier, so they do not count."""
    body = {**MESSAGES, "messages": [
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer"},
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ok</system-reminder>"},
                                     {"type": "text", "text": "Second question", "cache_control": EPHEMERAL}]}]}
    total = await prompt_size(h, body)
    r = await h.post("/v1/messages", body)
    assert r.status_code == 200, r.text
    header = len("<|im_start|>assistant\n")
    assert split(r.json()["usage"]) == (header, total - header, 0)


async def test_no_breakpoint_writes_nothing_the_client_asked_for(h: Harness) -> None:
    body = {**MESSAGES, "system": system_blocks(marked=False)}
    total = await prompt_size(h, body)
    r = await h.post("/v1/messages", body)
    assert split(r.json()["usage"]) == (total, 0, 0)


async def test_streamed_usage(h: Harness) -> None:
    """message_start knows the prompt and what was read; what the request wrote is known when it
    ends, so message_delta carries the final split (the SDKs take its counts over message_start's)."""
    total = await prompt_size(h, MESSAGES)
    events = await h.sse("/v1/messages", MESSAGES)
    start = next(d for e, d in events if e == "message_start")["message"]["usage"]
    delta = next(d for e, d in events if e == "message_delta")
    assert split(start) == (total, 0, 0) and start["output_tokens"] == 0
    assert split(delta["usage"]) == (total - len(SYSTEM_TURN), len(SYSTEM_TURN), 0)
    assert delta["usage"]["output_tokens"] == len(ANSWER) + 1
    assert delta["timings"]["cache_tier"] is None and delta["timings"]["cache_n"] == 0


async def cached_blocks(h: Harness) -> None:
    """Until the cache's writer has put the first request's blocks in RAM (it stores one offer's
    blocks under one lock: some means all)."""
    cache = h.backend.prompt_cache
    assert cache is not None
    await until(lambda: cache.cache_stats()["fake"].tiers["ram"].blocks > 0, "the prompt's blocks in the cache")


@pytest.mark.parametrize("stream", [False, True])
async def test_the_second_request_reads_what_the_first_wrote(h: Harness, stream: bool) -> None:
    total = await prompt_size(h, MESSAGES)

    async def usage() -> dict[str, Any]:
        if not stream:
            r = await h.post("/v1/messages", MESSAGES)
            assert r.status_code == 200, r.text
            return dict(r.json()["usage"]) | {"timings": r.json()["timings"]}
        delta = next(d for e, d in await h.sse("/v1/messages", MESSAGES) if e == "message_delta")
        return dict(delta["usage"]) | {"timings": delta["timings"]}

    first = await usage()
    assert split(first) == (total - len(SYSTEM_TURN), len(SYSTEM_TURN), 0)
    await cached_blocks(h)
    second = await usage()
    fresh, written, read = split(second)
    assert written == 0 and read >= first["cache_creation_input_tokens"]
    assert fresh + written + read == total
    assert second["timings"]["cache_n"] == read and second["timings"]["cache_tier"] in ("slot", "ram")


async def test_a_session_turn_with_breakpoints_writes_nothing(h: Harness) -> None:
    """A session's KV is its own, never offered to the prompt cache: its breakpoints keep nothing."""
    body = {**MESSAGES, "session_id": "s1"}
    r = await h.post("/v1/messages", body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["cache_creation_input_tokens"] == 0


# ---- OpenAI usage -----------------------------------------------------------------------------


async def test_openai_usage_and_timings_report_the_cache(h: Harness) -> None:
    path, body = RESPONSES
    body = {**body, "instructions": SYSTEM}
    first = (await h.post(path, body)).json()
    details = first["usage"]["input_tokens_details"]
    assert details == {"cached_tokens": 0, "cache_write_tokens": 0}  # no breakpoints on OpenAI's protocols
    assert first["timings"]["cache_tier"] is None
    await cached_blocks(h)
    events = await h.sse(path, body)
    done = events[-1][1]["response"]
    assert done["usage"]["input_tokens_details"]["cached_tokens"] > len(SYSTEM)
    assert done["usage"]["input_tokens_details"]["cache_write_tokens"] == 0
    assert done["timings"]["cache_tier"] in ("slot", "ram")
    r = (await h.post(CHAT[0], {**CHAT[1], "messages": [{"role": "system", "content": SYSTEM},
                                                        {"role": "user", "content": "Hi"}]})).json()
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] > len(SYSTEM)
    assert r["timings"]["cache_tier"] in ("slot", "ram") and r["timings"]["cache_n"] > len(SYSTEM)


# ---- conversation keys keep their slot ------------------------------------------------------------


async def test_an_unrelated_burst_does_not_take_a_keyed_conversations_slot(h: Harness) -> None:
    """Two slots: a keyed conversation in one, a stranger's prompt in the other. A burst of
    unrelated requests takes the stranger's slot each time, though the keyed one is older (plain
    LRU would take it first), so the conversation's next turn finds its prefix in its slot."""
    def chat(content: str, key: str | None = None) -> dict[str, Any]:
        return {**CHAT[1], "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}],
                **({"prompt_cache_key": key} if key else {})}

    first = await h.post(CHAT[0], chat("Plan my week.", "conv-7"))
    assert first.status_code == 200, first.text
    assert (await h.post(CHAT[0], chat("A stranger asks."))).status_code == 200
    for i in range(3):
        unrelated = [{"role": "user", "content": f"Unrelated {i}: " + "x" * 300}]
        r = await h.post(CHAT[0], {**CHAT[1], "messages": unrelated})
        assert r.status_code == 200, r.text
    turn = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Plan my week."},
            {"role": "assistant", "content": ANSWER}, {"role": "user", "content": "And the next?"}]
    again = (await h.post(CHAT[0], {**CHAT[1], "messages": turn, "prompt_cache_key": "conv-7"})).json()
    assert again["timings"]["cache_tier"] == "slot"
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= first.json()["usage"]["prompt_tokens"] - 1
