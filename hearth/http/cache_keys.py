"""The conversation key of a stateless chat request (`ChatRequest.cache_key`): what a client
sends to say "this request continues that conversation", read from every protocol the same way.

First found wins (docs/api.md, "Prompt cache and conversation keys"):
1. the body's `prompt_cache_key` (OpenAI Chat Completions and Responses; read on Messages too);
2. Anthropic's `metadata.user_id`: Claude Code sends a JSON string
   `{"device_id", "account_uuid", "session_id"}`, whose `session_id` is the key; any other
   string is the key as it is;
3. the headers `X-Claude-Code-Session-Id`, `session-id` / `session_id` (Codex), `thread-id`.

An empty string counts as not sent. The key is a priority hint for the prompt cache (the
conversation's KV is kept before strangers'), never an access boundary, and it changes no
answer. A key longer than `MAX_KEY_CHARS` is replaced by a hash of it rather than refused: a
client cannot know this server's limit, and a hint is not worth a failed request.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

MAX_KEY_CHARS = 256
# Case-insensitive, as HTTP header names are (Starlette's Headers look them up so).
KEY_HEADERS = ("x-claude-code-session-id", "session-id", "session_id", "thread-id")


def body_key(prompt_cache_key: str | None = None, metadata: Mapping[str, Any] | None = None) -> str | None:
    """The key the body carries (sources 1 and 2), as sent (not yet bounded)."""
    if prompt_cache_key:
        return prompt_cache_key
    user_id = metadata.get("user_id") if metadata is not None else None
    if isinstance(user_id, str) and user_id:
        return _session_of(user_id) or user_id
    return None


def conversation_key(from_body: str | None, headers: Mapping[str, str]) -> str | None:
    """The request's key: the body's (`body_key`), else the first key header sent; bounded."""
    key = from_body or next((v for v in (headers.get(h) for h in KEY_HEADERS) if v), None)
    return bounded(key) if key else None


def bounded(key: str) -> str:
    if len(key) <= MAX_KEY_CHARS:
        return key
    return "blake2b:" + hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def _session_of(user_id: str) -> str | None:
    """Claude Code's `session_id` inside a JSON `user_id`; None if it is not that."""
    if not user_id.startswith("{"):
        return None
    try:
        value = json.loads(user_id)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    session = value.get("session_id") if isinstance(value, dict) else None
    return session if isinstance(session, str) and session else None
