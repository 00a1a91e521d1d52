"""Answers of the control routes: models (listed, loaded, unloaded), health, the tokenizer and
cancel. Models for the OpenAPI document and the tests (`hearth.api.wire` says why)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from hearth.api.wire.base import HearthModel, ProtocolModel


class ModelStatus(ProtocolModel):
    value: Literal["loaded", "loading", "unloaded", "unloading"]
    pinned: bool  # named with --model: loaded at start and kept
    users: int  # requests holding it now
    loads: int
    load_seconds: float
    expires_in: float | None = None  # seconds until an idle loaded model is unloaded (absent: never, or busy)
    loaded_bytes: int | None = None  # memory its load took (process RSS after minus before)
    error: str | None = None  # why its last load failed


class ModelObject(ProtocolModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    meta: dict[str, Any] = Field(default_factory=dict)
    status: ModelStatus | None = None  # on a server that loads models on demand (llama-server's router)


class ModelLoaded(HearthModel):
    success: bool
    model: str
    status: ModelStatus | None = None


class ModelUnloaded(HearthModel):
    success: bool
    model: str
    unloaded: bool  # false: it was not loaded


class ModelList(HearthModel):
    object: Literal["list"]
    data: list[ModelObject]


class Health(HearthModel):
    status: Literal["ok", "loading", "error"]
    error: str | None = None


class TokenPiece(HearthModel):
    id: int
    piece: str


class Tokenized(HearthModel):
    tokens: list[int] | list[TokenPiece]
    count: int


class Detokenized(HearthModel):
    content: str


class Cancelled(HearthModel):
    cancelled: int
