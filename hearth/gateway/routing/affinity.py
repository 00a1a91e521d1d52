"""Which conversation a request belongs to, and the store key that names it.

Affinity key, first found: `session_id` (body), `previous_response_id`, an `X-Session-Id`
header, the conversation key a node reads (`prompt_cache_key`, Claude Code's session id,
Codex's `session-id` header: hearth.http.cache_keys). A session or a response chain lives
on one node (its transcript and KV are there): that key is *binding* while the node is
healthy (a busy node makes the request wait). The others are *soft*: they pin the
conversation to its node while that node is healthy and not saturated; a saturated one loses
to the cost model (a conversation key is a cache hint, not state: prefilling it elsewhere
beats waiting), and the conversation then stays where it went.

`key_of` is the only place a store key ("session:…", "response:…") is spelled: routes, moves,
restores, tenancy and the store itself build keys with it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from hearth.http.cache_keys import body_key, conversation_key

KeyKind = Literal["session", "response", "header", "cache_key", "none"]


def key_of(kind: KeyKind, value: str) -> str:
    """The store's affinity key for one conversation (`value_of` reads it back)."""
    return f"{kind}:{value}"


def value_of(key: str) -> str:
    """The session id, response id, ... that `key_of` put in a key."""
    return key.partition(":")[2]


@dataclass(frozen=True, slots=True)
class Affinity:
    kind: KeyKind
    value: str | None = None

    @property
    def binding(self) -> bool:
        """A session or response chain lives on its node: only failure moves it."""
        return self.kind in ("session", "response")

    @property
    def key(self) -> str | None:
        return key_of(self.kind, self.value) if self.value is not None else None


def affinity_of(body: Mapping[str, Any], headers: Mapping[str, str]) -> Affinity:
    """The first key found; a conversation key is read as a node reads it (hearth.api.http.
    cache_keys: prompt_cache_key, Claude Code's session id, Codex's headers), so the gateway
    routes a conversation to the node that keeps its KV warm for it."""
    for kind, value in (("session", body.get("session_id")), ("response", body.get("previous_response_id")),
                        ("header", headers.get("x-session-id"))):
        if isinstance(value, str) and value:
            return Affinity(kind, value)  # type: ignore[arg-type]
    pck, meta = body.get("prompt_cache_key"), body.get("metadata")
    key = conversation_key(body_key(pck if isinstance(pck, str) else None,
                                    meta if isinstance(meta, Mapping) else None), headers)
    return Affinity("cache_key", key) if key else Affinity("none")
