"""The node <-> gateway protocol: what a gateway asks of a Hearth node beside generation, and the
shapes of those calls, defined once. The node (hearth.api) answers with them and the gateway
(hearth.gateway) reads them: a field renamed on one side fails in mypy on the other, not at run
time in the gateway. docs/api.md has the endpoints; docs/gateway.md what the gateway does with them.

- the prompt-cache digest (`GET DIGEST_PATH`): which block hashes a node holds per model and tier;
- a request's blocks (`POST BLOCKS_PATH`, a `BlocksQuery`): its prompt as that node keys it;
- a session's history (`GET history_path(sid)`): its conversation, OpenAI-shaped messages;
- a session created with a history (`POST SESSIONS_PATH`, a `SessionCreate`): how a gateway
  continues a session on another node.
"""

from __future__ import annotations

from typing import Any, TypedDict

# Bump when the digest's shape or the hash chain changes. 2: the slot tier (`blocks.slot`,
# `keys.slot`). 3: `tails` (partial blocks' tail keys, per tier).
DIGEST_VERSION = 3
READABLE_DIGEST_VERSIONS = (1, 2, 3)  # what a gateway reads: 1 has no slot tier, 1 and 2 no tails

DIGEST_PATH = "/v1/prompt-cache/digest"
BLOCKS_PATH = "/v1/prompt-cache/blocks"
SESSIONS_PATH = "/v1/sessions"


def session_path(session_id: str) -> str:
    return f"{SESSIONS_PATH}/{session_id}"


def history_path(session_id: str) -> str:
    return f"{SESSIONS_PATH}/{session_id}/history"


class Tiers(TypedDict, total=False):
    """Hex hashes (or conversation keys) per tier, best first."""

    slot: list[str]
    ram: list[str]
    disk: list[str]


class DigestModel(TypedDict, total=False):
    root: str  # the hash chain's root, hex ("" where the model has no prompt cache)
    block_tokens: int
    blocks: Tiers
    keys: Tiers  # conversation keys held in slots
    tails: Tiers  # partial blocks' tail keys (version 3)
    sessions: dict[str, list[str]]  # where -> session ids (those the caller sees)


class DigestAnswer(TypedDict):
    object: str  # "prompt_cache.digest"
    version: int  # DIGEST_VERSION
    models: dict[str, DigestModel]  # the node's model id -> its cache


class BlocksQuery(TypedDict):
    path: str  # a generation path: /v1/chat/completions, /v1/messages, /v1/responses, ...
    body: dict[str, Any]  # that request's body, its model the node's id


class BlocksAnswer(TypedDict):
    object: str  # "prompt_cache.blocks"
    model: str
    root: str
    block_tokens: int
    n_tokens: int  # the whole prompt's tokens, the last partial block's included
    blocks: list[str]  # hex, in prompt order: full blocks only
    tails: list[list[str]]  # hex, per block (the last partial one's included): its tail keys


class HistoryAnswer(TypedDict):
    object: str  # "list"
    session_id: str
    data: list[dict[str, Any]]  # OpenAI-shaped messages, in order
    messages: list[dict[str, Any]]  # the same (an older name)


class SessionCreate(TypedDict):
    session_id: str
    model: str  # the node's model id
    messages: list[Any]  # the history to start from (OpenAI-shaped)
