"""Output pieces Chat Completions and legacy Completions share: usage, llama-server's
timings, the stream's chunk envelope and its in-band error event."""

from __future__ import annotations

from typing import Any

from hearth.chat.types import Timings, Usage
from hearth.http.sse import json_bytes, sse_data


def usage_dict(u: Usage) -> dict[str, Any]:
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens, "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}


def timings_field(timings: Timings | None) -> dict[str, Any]:
    """llama-server's `timings`, on a response or its final chunk."""
    return {"timings": timings.as_llama_server()} if timings is not None else {}


class Chunks:
    """The streamed chunks of one response: each is the response's envelope (`object` names
    the kind) around `choices`, with `usage` on every chunk once the client asked for it
    (`stream_options.include_usage`: null until the last)."""

    __slots__ = ("_head", "_tail", "created", "id", "include_usage", "model", "object")

    def __init__(self, id_: str, object_: str, created: int, model: str, include_usage: bool) -> None:
        self.id, self.object, self.created, self.model = id_, object_, created, model
        self.include_usage = include_usage
        # The bytes around one text delta's JSON, built once per stream: a streamed token then
        # costs one string's encoding, not an envelope of dicts (`content` equals `__call__`
        # byte for byte; tests/unit/test_chunk_template.py holds it so).
        envelope = json_bytes({"id": id_, "object": object_, "created": created, "model": model,
                               "system_fingerprint": "hearth"})
        self._head = b"data: " + envelope[:-1] + b',"choices":[{"index":'
        self._tail = b'},"logprobs":null,"finish_reason":null}]' + (b',"usage":null' if include_usage else b"") \
            + b"}\n\n"

    def content(self, index: int, text: str) -> bytes:
        """A Chat chunk of one choice's text: `self([{"index": index, "delta": {"content": text},
        "logprobs": None, "finish_reason": None}])`, without the dicts."""
        return b"".join((self._head, str(index).encode(), b',"delta":{"content":', json_bytes(text), self._tail))

    def __call__(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                 extra: dict[str, Any] | None = None) -> bytes:
        obj: dict[str, Any] = {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                               "system_fingerprint": "hearth", "choices": choices}
        if self.include_usage:
            obj["usage"] = usage
        return sse_data(obj | (extra or {}))


def generation_failed(message: str) -> bytes:
    """The event a stream sends when its run failed after the headers went out."""
    return sse_data({"error": {"message": message, "type": "server_error", "param": None,
                               "code": "generation_failed"}})
