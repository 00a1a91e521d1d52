"""Driving the chat page from tests: start a turn, wait for it, read the last reply."""

from __future__ import annotations

import json
import re
from typing import Any


def send(page: Any, text: str) -> None:
    """Start a turn and wait until it has started: its reply element exists (a count only grows,
    where the button's "stop" state of a short turn can come and go between two polls)."""
    before = page.locator(".msg.assistant").count()
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    page.wait_for_function(f"() => document.querySelectorAll('.msg.assistant').length > {before}")


def wait_done(page: Any, timeout: float = 90) -> None:
    """The turn `send` started has ended (the page set its button back in the turn's `finally`)."""
    page.wait_for_selector("#send[data-state=send]", timeout=timeout * 1000)


def last_reply(page: Any) -> Any:
    return page.locator(".msg.assistant").last


def stats_numbers(page: Any) -> dict[str, int]:
    text = last_reply(page).locator(".stats").inner_text()
    return {k: int(v) for k, v in re.findall(r"(prompt|cached|completion) (\d+)", text)}


def chat_bodies(page: Any) -> list[dict[str, Any]]:
    """Collects the JSON bodies the page posts to /v1/chat/completions."""
    bodies: list[dict[str, Any]] = []
    page.on("request", lambda r: bodies.append(r.post_data_json)
            if r.method == "POST" and r.url.endswith("/v1/chat/completions") else None)
    return bodies


def sse(pieces: list[str], finish: str = "stop", usage: dict[str, Any] | None = None) -> str:
    """A chat completion stream, as the server sends it, that answers with `pieces` in order."""
    base = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "m", "usage": None}
    chunks: list[dict[str, Any]] = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    chunks += [{**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    chunks.append({**base, "choices": [], "usage": usage or {"prompt_tokens": 5, "completion_tokens": len(pieces),
                                                            "total_tokens": 5 + len(pieces)}})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def answer_with(page: Any, pieces: list[str]) -> None:
    """Every chat turn of `page` from now on is answered by this fixed stream (not the model)."""
    body = sse(pieces)
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"content-type": "text/event-stream"}, body=body))
