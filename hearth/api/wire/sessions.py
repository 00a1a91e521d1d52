"""Answers of the session and snapshot routes (docs/sessions.md), superlinear's names beside
Hearth's. Models for the OpenAPI document and the tests (`hearth.api.wire` says why)."""

from __future__ import annotations

from typing import Any, Literal

from hearth.api.wire.base import HearthModel


class Session(HearthModel):
    object: Literal["session"]
    session_id: str
    model: str
    created_at: int
    last_used_at: int
    current_pos: int
    max_seq_len: int
    message_count: int
    residency: str
    busy: bool
    cache_position: int  # superlinear's name for current_pos
    status: Literal["idle", "busy"]  # superlinear's


class SessionChange(Session):
    """A rollback, resize or load: the session, with superlinear's `{"session": {...}}` beside it."""

    session: Session
    old_max_seq_len: int | None = None  # resize
    strategy: str | None = None  # resize, as sent
    mode: Literal["reject", "drop_oldest"] | None = None  # resize, as applied


class SessionList(HearthModel):
    object: Literal["list"]
    data: list[Session]
    sessions: list[Session]  # superlinear's name for data


class SessionDeleted(HearthModel):
    session_id: str
    object: Literal["session.deleted"]
    deleted: bool


class TranscriptFunction(HearthModel):
    name: str
    arguments: str


class TranscriptToolCall(HearthModel):
    id: str
    type: Literal["function"]
    function: TranscriptFunction


class TranscriptMessage(HearthModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None
    name: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[TranscriptToolCall] | None = None
    tool_call_id: str | None = None


class SessionHistory(HearthModel):
    object: Literal["list"]
    session_id: str
    data: list[TranscriptMessage]
    messages: list[TranscriptMessage]  # superlinear's name for data


class Snapshot(HearthModel):
    object: Literal["snapshot"]
    snapshot_id: str
    created_at: int | float
    title: str
    description: str
    tags: list[str]
    model: dict[str, Any]
    engine: dict[str, Any]
    session: dict[str, Any]
    format_version: int
    bytes: int


class SnapshotList(HearthModel):
    object: Literal["list"]
    data: list[Snapshot]
    snapshots: list[Snapshot]  # superlinear's name for data


class SnapshotDeleted(HearthModel):
    snapshot_id: str
    object: Literal["snapshot.deleted"]
    deleted: bool
