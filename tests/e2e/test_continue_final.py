"""continue_final_message on the real model: the model's own answer A at temperature 0, cut at
a word boundary, continued, gives the rest of A (compared as text; the cut may re-tokenize,
so a run that parts from A is reported by the assertion, not forgiven). Streamed equals
non-streamed."""

from __future__ import annotations

import json

import httpx

from tests.helpers import Server

MESSAGES = [{"role": "user", "content": "List five fruits, one per line."}]


def chat(server: Server, body: dict[str, object]) -> dict[str, object]:
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=120,
                   json={"temperature": 0, "max_tokens": 48, "cache_prompt": False, **body})
    assert r.status_code == 200, r.text
    out: dict[str, object] = r.json()
    return out


def test_a_cut_answer_continues_with_its_own_rest(server: Server) -> None:
    whole = chat(server, {"messages": MESSAGES})
    answer = whole["choices"][0]["message"]["content"]  # type: ignore[index]
    assert isinstance(answer, str) and " " in answer.strip()
    cut = answer.rfind(" ", 0, len(answer) // 2)  # a word boundary in the first half
    head = answer[:cut]
    # as the gateway continues a cut stream: the head is the answer's own output (partial_is_output),
    # so the budget and the counts are the whole answer's
    rest = chat(server, {"messages": [*MESSAGES, {"role": "assistant", "content": head}],
                         "continue_final_message": True, "partial_is_output": True})
    text = rest["choices"][0]["message"]["content"]  # type: ignore[index]
    assert isinstance(text, str) and text
    assert head + text == answer
    assert rest["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]  # type: ignore[index]
    # as a client's prefill: input, with max_tokens bounding only the new tokens
    prefilled = chat(server, {"messages": [*MESSAGES, {"role": "assistant", "content": head}],
                              "continue_final_message": True})
    more = prefilled["choices"][0]["message"]["content"]  # type: ignore[index]
    assert isinstance(more, str) and more.startswith(text)  # the same answer, at most further on
    usage = prefilled["usage"]
    assert usage["prompt_tokens"] > whole["usage"]["prompt_tokens"]  # type: ignore[index]
    assert usage["completion_tokens"] < whole["usage"]["completion_tokens"] or \
        usage["completion_tokens"] == 48  # type: ignore[index]

    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
        "temperature": 0, "max_tokens": 48, "cache_prompt": False, "stream": True, "continue_final_message": True,
        "partial_is_output": True, "messages": [*MESSAGES, {"role": "assistant", "content": head}]})
    chunks = [json.loads(ev[6:]) for ev in r.text.split("\n\n") if ev.startswith("data: {")]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    assert streamed == text
