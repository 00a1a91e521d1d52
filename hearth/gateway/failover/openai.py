"""Stream migration for `openai`-kind upstreams (vLLM, SGLang, llama-server): a chat answer
whose engine broke after it produced output goes on on another engine of the same alias.

The translating backend (foreign/backend.py) knows the answer so far as events, not as a
protocol's wire: what the client has is the text of choice 0. It is sent to another upstream
as the final assistant message of the same chat request, in the way that upstream's TOML entry
says it continues one (`continuation`):

- `vllm` (vLLM, SGLang): `continue_final_message: true, add_generation_prompt: false` (the two
  are exclusive in both engines; the template then leaves the last message open);
- `prefill` (llama-server): nothing else: llama-server continues any final assistant message
  unless started with `--no-prefill-assistant`, and refuses two assistant messages at the end
  (so the client's own final assistant message and the partial text are joined into one);
- `none`: the engine would answer it as a new turn, so it is never sent a partial answer.

An answer with nothing in it yet (the engine broke before its first token) is the same request
again, which any upstream can take. Only text is continued: a cut after a reasoning or tool-call
delta stays today's terminal error, since no engine continues a half-built tool call through the
OpenAI API, and reasoning would have to be sent back in a field engines drop or reject.

Recent llama-server builds repeat the prefilled message at the start of their answer (its first
content delta is the final assistant message's text plus the first new token; tried with a
llama-server built from llama.cpp in 2025-26), older ones and vLLM do not: `Echo` drops such a
repetition, so the client gets only what is new either way.

The engine that continues counts the partial text as prompt tokens: usage is fixed up in
foreign/backend.py (`joined_usage`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from hearth.chat.types import ChatEvent, TextDelta, Usage
from hearth.errors import HearthError
from hearth.gateway.failover.retry import RETRY_STATUSES
from hearth.gateway.fleet.health import counts_as_failure
from hearth.gateway.fleet.pool import Lease, Node, Pool
from hearth.gateway.routing.affinity import Affinity
from hearth.gateway.upstream.client import node_url
from hearth.gateway.upstream.http import Answer, Sender
from hearth.http.sse import json_bytes

log = logging.getLogger("hearth.gateway")


def continuation_body(body: dict[str, Any], text: str, kind: str, continue_final: bool,
                      produced: int = 0) -> dict[str, Any]:
    """`body` (a chat request as sent to an upstream) with `text`, the answer so far, as its
    final assistant message in the way of an upstream of continuation `kind`. `continue_final`:
    the client asked to continue its own final assistant message, which `text` then extends.
    `produced`: the tokens of `text` (estimated), taken off `max_tokens`, which these engines
    count from the continuation's first new token."""
    if not text:
        return body  # nothing reached the client: the same request again
    messages = list(body.get("messages") or [])
    last = messages[-1] if messages else None
    partial: dict[str, Any] = {"role": "assistant", "content": text}
    if (isinstance(last, dict) and last.get("role") == "assistant" and isinstance(last.get("content"), str)
            and not last.get("tool_calls") and (continue_final or kind == "prefill")):
        # llama-server prefills any final assistant message, so its first answer went on from it too
        messages.pop()
        partial["content"] = last["content"] + text
    out = {**body, "messages": [*messages, partial]}
    if isinstance(body.get("max_tokens"), int):
        out["max_tokens"] = max(1, body["max_tokens"] - produced)
    if kind == "vllm":
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    return out


def final_text(body: dict[str, Any]) -> str:
    """The text of the final assistant message of a continuation request ("" if none)."""
    messages = body.get("messages") or []
    last = messages[-1] if messages else None
    ok = isinstance(last, dict) and last.get("role") == "assistant" and isinstance(last.get("content"), str)
    return str(last["content"]) if ok and isinstance(last, dict) else ""


class Echo:
    """Drops a continuation's repetition of the message it continues (`prefix`) from the start of
    its text: text that could still be that repetition is held back until it is whole (dropped)
    or turns out to be something else (let through, whole)."""

    def __init__(self, prefix: str) -> None:
        self.prefix: str | None = prefix or None  # None: decided
        self.held = ""

    def feed(self, ev: ChatEvent) -> list[ChatEvent]:
        if self.prefix is None:
            return [ev]
        if isinstance(ev, TextDelta) and ev.index == 0:
            seen = self.held + ev.text
            if self.prefix.startswith(seen) and seen != self.prefix:
                self.held = seen
                return []
            rest = seen[len(self.prefix):] if seen.startswith(self.prefix) else seen
            self.prefix, self.held = None, ""
            return [TextDelta(0, rest)] if rest else []
        out: list[ChatEvent] = [TextDelta(0, self.held)] if self.held else []
        self.prefix, self.held = None, ""
        return [*out, ev]


def joined_usage(last: Usage, before: int, chunks: int) -> Usage:
    """The usage of an answer continued from `before` content chunks of earlier parts: the last
    part's report, less the partial text it counted as prompt (its tokens are not known to the
    gateway: the earlier parts' chunks stand for them, one token per chunk as these engines
    stream), plus those chunks as completion tokens. Without a report: the chunks."""
    completion = last.completion_tokens or chunks
    prompt = max(0, last.prompt_tokens - before) if last.prompt_tokens else 0
    return Usage(prompt, before + completion, min(last.cached_tokens, prompt))


class Attempts(Protocol):
    """What is told of each attempt on an upstream (turn/watch.py `TurnWatch`: the turn's ledger
    row and spans); `sending` answers the headers that carry the turn's trace to the engine."""

    def routed(self, lease: Lease, since: float, urgent: bool = False) -> None: ...

    def sending(self, node: str) -> dict[str, str]: ...

    def retried(self, node: str, reason: str) -> None: ...


async def post_stream(http: Sender, pool: Pool, node: Node, path: str, body: dict[str, Any],
                      trace: Mapping[str, str] | None = None) -> Answer:
    """POST `body` to an openai-kind upstream, its answer streamed (only the connect is timed:
    the stream's silences are `within`'s); the node showed life when its headers came. Over the
    fast client (upstream/http.py) for plain-http upstreams: httpx's pool scans every connection
    on each request, which at 64 concurrent streams took a third of the gateway's CPU."""
    headers = {**(trace or {}), **node.up.headers(), "content-type": "application/json"}
    resp = await http.send("POST", node_url(node.up, path), headers, json_bytes(body), pool.settings.connect_timeout)
    node.last_bytes = pool.clock()
    return resp


class Held:
    """The lease a stream holds now (a continuation replaces it); each released exactly once.
    `ok` is the outcome the stream's close releases it with (None: not the node's fault)."""

    def __init__(self, pool: Pool, lease: Lease) -> None:
        self.pool = pool
        self.lease: Lease | None = lease
        self.ok: bool | None = None

    @property
    def node(self) -> Node:
        assert self.lease is not None, "the lease was released"
        return self.lease.node

    def release(self, ok: bool | None) -> None:
        if self.lease is not None:
            lease, self.lease = self.lease, None
            self.pool.release(lease, ok)

    def close(self) -> None:
        self.release(self.ok)


@dataclass(slots=True)
class Continuer:
    """Opens a continuation of one chat answer on another upstream of its alias."""

    pool: Pool
    http: Sender
    alias: str
    body: Callable[[str], dict[str, Any]]  # the chat request for an upstream's model id
    hashes: list[tuple[str, int]]
    continue_final: bool
    tried: set[str] = field(default_factory=set)  # each upstream at most once per stream
    watch: Attempts | None = None  # the turn's ledger row and spans (foreign/turn.py)

    async def open(self, text: str, produced: int) -> tuple[Lease, Answer, Echo] | None:
        """A continuation of `text` (`produced` content chunks so far) on another upstream: its
        lease, its streaming 200 and the Echo its events go through, or None (counted in
        `hearth_gateway_stream_migrations_total`: `no_node` or `refused`)."""
        metrics = self.pool.metrics.stream_migrations
        unable = {n.name for n in self.pool.nodes.values() if n.up.continuation == "none"} if text else set()
        watch = self.watch
        for _ in range(len(self.pool.nodes)):
            since = time.monotonic()
            try:
                lease = await self.pool.acquire(self.alias, Affinity("none"), self.hashes,
                                                self.hashes[-1][1] if self.hashes else 1, self.tried | unable,
                                                urgent=True)  # its client is mid-stream: no queueing
            except HearthError:
                break
            node = lease.node
            self.tried.add(node.name)
            if watch is not None:
                watch.routed(lease, since, urgent=True)
            body = continuation_body(self.body(node.up.models[self.alias]), text, node.up.continuation,
                                     self.continue_final, produced)
            try:
                resp = await post_stream(self.http, self.pool, node, "/v1/chat/completions", body,
                                         watch.sending(node.name) if watch is not None else None)
            except httpx.TransportError as e:
                self.pool.release(lease, False)
                log.warning("continuing on %s: %s", node.name, e)
                if watch is not None:
                    watch.retried(node.name, f"{type(e).__name__}")
                continue
            except BaseException:
                self.pool.release(lease, None)
                raise
            if resp.status_code == 200:
                metrics.labels("continued").inc()
                return lease, resp, Echo(final_text(body) if text else "")
            try:
                said = (await resp.aread())[:300].decode(errors="replace")
            except httpx.TransportError:
                said = ""
            finally:
                await resp.aclose()
            self.pool.release(lease, False if counts_as_failure(resp.status_code) else None)
            if watch is not None:
                watch.retried(node.name, f"answered {resp.status_code}")
            if resp.status_code in RETRY_STATUSES:
                continue
            log.warning("%s would not continue the answer (%d): %s", node.name, resp.status_code, said)
            metrics.labels("refused").inc()
            return None
        metrics.labels("no_node").inc()
        return None
