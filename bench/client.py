"""One streamed chat completion over raw httpx, timed token by token."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class RequestSpec:
    """What every server is asked; `logit_bias` replaces `ignore_eos` where a server lacks it."""

    prompt: str
    max_tokens: int
    model: str = "bench"
    ignore_eos: bool = True
    logit_bias: dict[str, float] | None = None
    include_usage: bool = True

    def body(self) -> dict[str, object]:
        body: dict[str, object] = {
            "model": self.model,
            "messages": [{"role": "user", "content": self.prompt}],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.logit_bias:
            body["logit_bias"] = self.logit_bias
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        return body


@dataclass
class StreamResult:
    """Timings are seconds from perf_counter; `token_times` holds arrival of each content chunk."""

    t_start: float
    t_end: float = 0.0
    token_times: list[float] = field(default_factory=list)
    usage_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    text_chars: int = 0
    done: bool = False

    @property
    def n_tokens(self) -> int:
        """Completion tokens: the server's usage count when it sends one, else content chunks."""
        return self.usage_tokens if self.usage_tokens is not None else len(self.token_times)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.t_start if self.token_times else None

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first: (last - first) / (n - 1)."""
        if len(self.token_times) < 2 or self.n_tokens < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (self.n_tokens - 1)

    @property
    def tokens_per_s(self) -> float | None:
        """End-to-end rate of one stream, request sent to last token."""
        if not self.token_times:
            return None
        return self.n_tokens / (self.token_times[-1] - self.t_start)


def _handle_event(data: str, result: StreamResult, now: float) -> None:
    event = json.loads(data)
    usage = event.get("usage")
    if usage and usage.get("completion_tokens") is not None:
        result.usage_tokens = int(usage["completion_tokens"])
    for choice in event.get("choices") or []:
        content = (choice.get("delta") or {}).get("content")
        if content:
            result.token_times.append(now)
            result.text_chars += len(content)
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]


async def stream_chat(client: httpx.AsyncClient, base_url: str, spec: RequestSpec) -> StreamResult:
    """Send one streaming chat completion; never raises for HTTP or protocol errors."""
    result = StreamResult(t_start=time.perf_counter())
    try:
        async with client.stream("POST", f"{base_url}/v1/chat/completions", json=spec.body()) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                result.error = f"HTTP {resp.status_code}: {body[:300]}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    result.done = True
                    break
                _handle_event(data, result, time.perf_counter())
            if not result.done and result.finish_reason is None:
                result.error = f"stream closed early after {len(result.token_times)} content chunks"
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.t_end = time.perf_counter()
    return result


async def first_model_id(client: httpx.AsyncClient, base_url: str) -> str | None:
    """The first id listed by GET /v1/models (servers that check the `model` field need it)."""
    try:
        resp = await client.get(f"{base_url}/v1/models")
        data = resp.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return str(data[0]["id"]) if data and "id" in data[0] else None
