"""Ollama's answers as Hearth sends them (/api/*): chat, generate, models, pull, embeddings, and
the error envelope. Models for the OpenAPI document and the tests only: the handlers build these
as dicts (`hearth.api.wire` says why)."""

from __future__ import annotations

from typing import Any

from hearth.api.wire.base import HearthModel, ProtocolModel


class OllamaError(HearthModel):
    error: str


class OllamaMessage(ProtocolModel):
    role: str
    content: str


class OllamaChat(ProtocolModel):
    """/api/chat's answer (and each NDJSON line of a stream; the last with done true and the totals)."""

    model: str
    created_at: str
    message: OllamaMessage
    done: bool


class OllamaGenerate(ProtocolModel):
    model: str
    created_at: str
    response: str
    done: bool


class OllamaDetails(ProtocolModel):
    format: str


class OllamaModel(ProtocolModel):
    name: str
    model: str
    size: int
    digest: str
    details: OllamaDetails


class OllamaModels(ProtocolModel):
    """/api/tags and /api/ps."""

    models: list[OllamaModel]


class OllamaShow(ProtocolModel):
    template: str
    details: OllamaDetails
    model_info: dict[str, Any]
    capabilities: list[str]


class OllamaVersion(ProtocolModel):
    version: str


class OllamaProgress(ProtocolModel):
    """/api/pull's answer (and each NDJSON line of its progress)."""

    status: str


class OllamaEmbed(ProtocolModel):
    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class OllamaEmbedding(ProtocolModel):
    embedding: list[float]
