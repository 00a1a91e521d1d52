"""What the gateway learns from an answer as it passes (usage: cached, prompt and completion
tokens; a Responses id and output), read with byte patterns so the relay's per-event cost stays a
few `in` tests for events that carry no usage."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_CACHED = re.compile(rb'"(?:cached_tokens|cache_read_input_tokens)":(\d+)')
_PROMPT = re.compile(rb'"(?:prompt_tokens|input_tokens)":(\d+)')
_CREATED = re.compile(rb'"cache_creation_input_tokens":(\d+)')
_COMPLETION = re.compile(rb'"(?:completion_tokens|output_tokens)":(\d+)')
_RESPONSE_ID = re.compile(rb'"id":"(resp_[A-Za-z0-9_-]+)"')
_ANSWER_ID = re.compile(rb'"id": ?"((?:chatcmpl|cmpl|msg|resp)[-_][A-Za-z0-9_-]+)"')
# A Hearth node's llama.cpp-style `timings` (the last chunk of every chat or completions stream,
# whether or not the client asked for usage): tokens reused, prefilled and generated.
_TIMINGS = re.compile(rb'"cache_n":(\d+),"prompt_n":(\d+),.*?"predicted_n":(\d+)')
# Ollama's counts (/api/chat and /api/generate's final object, /api/embed's answer): the whole
# prompt (cached tokens included) and the tokens generated.
_OLLAMA_PROMPT = re.compile(rb'"prompt_eval_count": ?(\d+)')
_OLLAMA_EVAL = re.compile(rb'"eval_count": ?(\d+)')


@dataclass(slots=True)
class Scan:
    """What the gateway learns from an answer as it passes: usage and a Responses id."""

    responses: bool = False  # a Responses answer: look for its id and output
    cached: int | None = None
    prompt: int | None = None
    completion: int | None = None  # tokens generated (usage per key, hearth/http/key_usage.py)
    response_id: str | None = None
    output: list[Any] | None = None  # a Responses answer's output items (kept for chain failover)
    migrated: bool = False  # the answer was finished by another node than the one that began it
    anthropic_usage: bool = False  # `prompt` is Anthropic's input_tokens: the part not read from cache
    created: int = 0  # Anthropic's cache_creation_input_tokens
    answer_id: str | None = None  # the first answer id seen: the node's ledger row (turn/settle.py)
    looks: int = 0  # events searched for it
    # Each continuation of a failed-over stream: [its node, its own answer id (None until seen)],
    # in order: a cancelled turn's parts are each counted from their node's row (turn/settle.py).
    parts: list[list[str | None]] = field(default_factory=list)
    part_looks: int = 0

    def named(self, answer_id: str | None) -> None:
        """The answer's id as its node named it in a header (Ollama's objects carry none:
        `ANSWER_ID_HEADER`), before any event is read."""
        if self.answer_id is None and answer_id:
            self.answer_id = answer_id

    def moved(self, node: str, answer_id: str | None = None) -> None:
        """The stream goes on on `node`: a new part, named by its node's header (`answer_id`) or
        else by its own events, which `feed_part` reads first."""
        self.parts.append([node, answer_id or None])
        self.part_looks = 0

    def feed_part(self, raw: bytes) -> None:
        """A continuation's own event, before it is rewritten to the first answer's ids."""
        if self.parts and self.parts[-1][1] is None and self.part_looks < 3:
            self.part_looks += 1
            if a := _ANSWER_ID.search(raw):
                self.parts[-1][1] = a.group(1).decode()

    @property
    def whole_prompt(self) -> int | None:
        """Every prompt token, cached or not (Anthropic's input_tokens leaves the cache out)."""
        if self.prompt is None or not self.anthropic_usage:
            return self.prompt
        return self.prompt + (self.cached or 0) + self.created

    def feed_response(self, data: bytes) -> None:
        """A Responses answer: the whole JSON (non-streamed) or its terminal event."""
        if data.startswith(b"event: "):
            if not data.startswith((b"event: response.completed", b"event: response.incomplete")):
                return
            data = data.split(b"data: ", 1)[-1]
        try:
            doc = json.loads(data)
        except ValueError:
            return
        r = doc.get("response", doc) if isinstance(doc, dict) else None
        if isinstance(r, dict) and r.get("status") in ("queued", "in_progress"):
            return  # a background response as it starts: its output is not known yet
        if isinstance(r, dict) and isinstance(r.get("output"), list):
            self.output = r["output"]

    def feed(self, data: bytes) -> None:
        if self.looks < 3:  # the id is in the first event or two: not looked for past them
            self.looks += 1
            if self.answer_id is None and (a := _ANSWER_ID.search(data)):
                self.answer_id = a.group(1).decode()
        if self.responses and self.response_id is None and (r := _RESPONSE_ID.search(data)):
            self.response_id = r.group(1).decode()
        if b'"usage"' not in data:  # most events: text deltas
            if b'"timings"' in data and (t := _TIMINGS.search(data)):  # a stream without usage: its counts
                self.cached, self.prompt, self.completion = int(t[1]), int(t[1]) + int(t[2]), int(t[3])
            elif b'eval_count"' in data:  # Ollama's final object (or embeddings answer)
                if p := _OLLAMA_PROMPT.search(data):
                    self.prompt = int(p[1])
                if e := _OLLAMA_EVAL.search(data):
                    self.completion = int(e[1])
            return
        if m := _CACHED.findall(data):
            self.cached = int(m[-1])
        if m := _PROMPT.findall(data):
            self.prompt = int(m[-1])
        if b'"cache_read_input_tokens"' in data:
            self.anthropic_usage = True
        if m := _CREATED.findall(data):
            self.created = int(m[-1])
        if m := _COMPLETION.findall(data):
            self.completion = int(m[-1])
