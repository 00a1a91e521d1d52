"""Answers of the accounting routes: usage and limits per API key, the usage ledger (rows or
sums), a journaled request. Models for the OpenAPI document and the tests (`hearth.api.wire`
says why)."""

from __future__ import annotations

from typing import Any, Literal

from hearth.api.wire.base import HearthModel


class KeyLimits(HearthModel):
    concurrent: int | None
    rpm: int | None
    tpm: int | None


class KeyUsage(HearthModel):
    name: str
    tenant: str
    requests: int
    limited: int
    in_flight: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    limits: KeyLimits


class KeyUsageList(HearthModel):
    object: Literal["list"]
    data: list[KeyUsage]


class KeysReloaded(HearthModel):
    """POST /admin/keys/reload: what the key file's reload changed, by key name, in counts."""

    object: Literal["keys.reload"]
    added: int
    removed: int
    changed: int
    unchanged: int


class UsageRow(HearthModel):
    """One request in the usage ledger (hearth.observability.ledger.UsageRecord)."""

    at: float
    request_id: str
    tenant: str
    key: str | None
    via: str | None
    model: str
    endpoint: str
    prompt_tokens: int
    cached_tokens: int
    cache_tier: str | None
    generated_tokens: int
    discarded_tokens: int
    finish_reason: str | None
    cancelled: str | None
    error: str | None
    queue_ms: float | None
    ttft_ms: float | None
    total_ms: float


class UsageSum(HearthModel):
    """The ledger's rows summed per value of the `group` fields (those present)."""

    day: str | None = None
    key: str | None = None
    model: str | None = None
    tenant: str | None = None
    requests: int
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    discarded_tokens: int
    cancelled: int


class JournalAnswer(HearthModel):
    text: str
    tool_calls: list[dict[str, str]]
    finish_reason: str | None
    prompt_tokens: int
    generated_tokens: int


class JournalRecord(HearthModel):
    """A journaled request (hearth.observability.journal): its body as received, its answer."""

    id: str
    at: float
    endpoint: str
    path: str
    model: str
    request: dict[str, Any]
    answer: JournalAnswer


class UsageList(HearthModel):
    object: Literal["list"]
    group: list[str] | None = None  # present: `data` holds sums
    data: list[UsageRow] | list[UsageSum]
