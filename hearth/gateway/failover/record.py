"""A session turn as the gateway saw it, for its transcript when the node that answered cannot
give its own copy.

A session turn's transcript is copied from the node's `/history` before the answer's final
event goes out (continuity.session_synced). When that copy fails because the node died right
after it wrote its final event, the client has the whole answer and the gateway relayed all of
it: the turn is then recorded from the request and the relayed answer (the migration `Cut`'s
request holding the whole answer), read by the node's own protocol readers and written as the
node writes its history (`message_to_json`). None where that reading fails (an input the
readers refuse outside a node, e.g. an `item_reference`): the caller then fails the turn
honestly.
"""

from __future__ import annotations

import logging
from typing import Any

from hearth.api.anthropic.messages import read_messages
from hearth.api.openai.chat import read_chat
from hearth.chat.types import Message
from hearth.errors import HearthError
from hearth.gateway.protocols import Protocol
from hearth.protocols.responses_input import normalize_input, partial_message, split_partial, to_messages, to_tools
from hearth.sessions.transcript import message_to_json

log = logging.getLogger("hearth.gateway")


def _responses_messages(body: dict[str, Any]) -> list[Message]:
    items = normalize_input(body.get("input"))
    if any(isinstance(i, dict) and i.get("type") == "item_reference" for i in items):
        raise ValueError("an item_reference is resolved only by the node that stores the item")
    toolset = to_tools(body.get("tools"))
    before, tail = split_partial(items)
    return [*to_messages(before, tools=toolset), partial_message(tail, toolset, offset=len(before))]


def turn_messages(protocol: Protocol, whole: dict[str, Any] | None, first: bool) -> list[dict[str, Any]] | None:
    """The turn's new messages and its answer, OpenAI-shaped as a node's history holds them;
    `whole` is the turn's request ending with the whole answer (`Cut.body(..., whole=True)`).
    A system message counts only in the session's `first` turn (later, a node keeps the one it
    has)."""
    if whole is None:
        return None
    try:
        if protocol == "chat":
            messages = read_chat(whole, "record")[1].messages
        elif protocol == "anthropic":
            messages = read_messages(whole, "record")[1].messages
        elif protocol == "responses":
            messages = _responses_messages(whole)
        else:
            return None
    except (HearthError, ValueError, TypeError, KeyError) as e:
        log.warning("could not record the turn from the relayed answer: %s", e)
        return None
    return [message_to_json(m) for m in messages if first or m.role != "system"]
