"""Streamed chat completions over raw httpx, with what the A/B sections need from each stream."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Stream:
    """Times are perf_counter seconds; `token_times` holds the arrival of each content chunk."""

    t_send: float
    token_times: list[float] = field(default_factory=list)
    text: str = ""
    usage_tokens: int | None = None
    finish_reason: str | None = None
    timings: dict[str, Any] = field(default_factory=dict)  # llama-server's per-request timings
    error: str | None = None
    t_end: float = 0.0

    @property
    def n_tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else len(self.token_times)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.t_send if self.token_times else None

    @property
    def decode_tps(self) -> float | None:
        """Tokens after the first over the time from first to last token."""
        if len(self.token_times) < 2 or self.n_tokens < 2 or self.token_times[-1] <= self.token_times[0]:
            return None
        return (self.n_tokens - 1) / (self.token_times[-1] - self.token_times[0])

    @property
    def e2e_tps(self) -> float | None:
        if not self.token_times:
            return None
        return self.n_tokens / (self.token_times[-1] - self.t_send)


def chat_body(messages: list[dict[str, str]], max_tokens: int, *, ignore_eos: bool, **extra: Any) -> dict[str, Any]:
    # No "model": each server serves one, and Hearth names it after the file it was given.
    body: dict[str, Any] = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def _feed(data: str, s: Stream, now: float) -> None:
    event = json.loads(data)
    usage = event.get("usage")
    if usage and usage.get("completion_tokens") is not None:
        s.usage_tokens = int(usage["completion_tokens"])
    if isinstance(event.get("timings"), dict):
        s.timings = event["timings"]
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        content = delta.get("content")
        if content:
            s.token_times.append(now)
            s.text += content
        # A tool call's arguments stream as chunks too (the structured section's forced call).
        args = "".join(((c.get("function") or {}).get("arguments") or "") for c in delta.get("tool_calls") or [])
        if args:
            s.token_times.append(now)
            s.text += args
        if choice.get("finish_reason"):
            s.finish_reason = choice["finish_reason"]


async def stream_chat(client: httpx.AsyncClient, base_url: str, body: dict[str, Any], on_token: Any = None) -> Stream:
    """Send one streamed chat completion; never raises for HTTP or protocol errors.
    `on_token(stream)` is called after each content chunk (the cancel section triggers from it)."""
    s = Stream(t_send=time.perf_counter())
    try:
        async with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                s.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:300]}"
                return s
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                n = len(s.token_times)
                _feed(data, s, time.perf_counter())
                if on_token is not None and len(s.token_times) > n:
                    on_token(s)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        s.error = f"{type(exc).__name__}: {exc}"
    finally:
        s.t_end = time.perf_counter()
    return s


def parse_prometheus(text: str) -> dict[str, float]:
    """Metric name -> value summed over its label sets (enough for single-model servers)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0].strip()
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


async def metrics(client: httpx.AsyncClient, base_url: str) -> dict[str, float]:
    resp = await client.get(f"{base_url}/metrics")
    resp.raise_for_status()
    return parse_prometheus(resp.text)
