"""OpenAI chat / completions as the gateway speaks it to `openai`-kind upstreams: a request as
the upstream's JSON, each chunk of its stream as events, its usage, and its error answers as the
gateway's own errors. Pure translation; `foreign/backend.py` makes the calls."""

from __future__ import annotations

import json
from typing import Any

from hearth.chat.types import (
    ChatEvent,
    ChatRequest,
    CompletionRequest,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from hearth.errors import BadRequest, HearthError, NotFound, TooManyRequests, Unavailable
from hearth.sessions.transcript import message_to_json

FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls"}


def sampling_json(req: ChatRequest | CompletionRequest) -> dict[str, Any]:
    s = req.sampling
    out: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p, "n": req.n}
    if s.max_tokens is not None:
        out["max_tokens"] = s.max_tokens
    if s.stop:
        out["stop"] = s.stop
    if s.seed is not None:
        out["seed"] = s.seed
    if s.presence_penalty:
        out["presence_penalty"] = s.presence_penalty
    if s.frequency_penalty:
        out["frequency_penalty"] = s.frequency_penalty
    if s.logit_bias:
        out["logit_bias"] = {str(k): v for k, v in s.logit_bias.items()}
    return out


def chat_json(req: ChatRequest, model: str) -> dict[str, Any]:
    messages = []
    for m in req.messages:
        d = message_to_json(m)
        d.pop("reasoning_content", None)  # most engines reject it on input
        messages.append(d)
    body: dict[str, Any] = {"model": model, "messages": messages, "stream": True,
                            "stream_options": {"include_usage": True}, **sampling_json(req)}
    if req.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                           "parameters": t.parameters}} for t in req.tools]
        if req.tool_choice in ("none", "auto", "required"):
            body["tool_choice"] = req.tool_choice
        elif req.tool_choice:
            body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice}}
    rf = req.response_format
    if rf is not None and rf.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif rf is not None and rf.type == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": rf.name or "schema",
                                                                          "schema": rf.schema or {},
                                                                          "strict": rf.strict}}
    return body


def chunk_events(data: dict[str, Any], completion: bool) -> list[ChatEvent]:
    """One upstream stream chunk → events (usage arrives as its own Done later)."""
    events: list[ChatEvent] = []
    for ch in data.get("choices") or []:
        i = int(ch.get("index", 0))
        if completion:
            if ch.get("text"):
                events.append(TextDelta(i, ch["text"]))
        else:
            delta = ch.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                events.append(ReasoningDelta(i, reasoning))
            if delta.get("content"):
                events.append(TextDelta(i, delta["content"]))
            for tc in delta.get("tool_calls") or []:
                fn = tc.get("function") or {}
                events.append(ToolCallDelta(i, int(tc.get("index", 0)), tc.get("id"), fn.get("name"),
                                            fn.get("arguments") or ""))
        if ch.get("finish_reason"):
            events.append(Finish(i, FINISH.get(ch["finish_reason"], "stop")))
    return events


def usage_of(data: dict[str, Any]) -> Usage | None:
    u = data.get("usage")
    if not isinstance(u, dict):
        return None
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Usage(int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0), int(cached))


def refusal(status: int, text: str) -> HearthError:
    """An upstream's error answer as the gateway's own (its message kept, never its headers)."""
    try:
        err = json.loads(text).get("error")
        message = err.get("message") if isinstance(err, dict) else str(err)
    except (ValueError, AttributeError):
        message = text[:500]
    message = f"upstream: {message}"
    if status == 404:
        return NotFound(message)
    if status == 429:
        return TooManyRequests(message)
    if status >= 500:
        return Unavailable(message, retry_after=2)
    return BadRequest(message)
