"""The Batch API's shapes, for the OpenAPI document (`hearth.api.openapi`) and the tests that
check real answers against them: OpenAI's objects field for field (unknown fields allowed, as
OpenAI's clients allow them)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Protocol(BaseModel):
    model_config = ConfigDict(extra="allow")


class FileObject(_Protocol):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    expires_at: int | None
    filename: str
    purpose: Literal["batch", "batch_output"]
    status: str
    status_details: str | None


class FileList(_Protocol):
    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(_Protocol):
    id: str
    object: Literal["file"]
    deleted: bool


class BatchIn(BaseModel):
    """POST /v1/batches (checked by the handler field by field, with OpenAI's messages)."""

    model_config = ConfigDict(extra="forbid")
    input_file_id: str
    endpoint: Literal["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"]
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None


class RequestCounts(_Protocol):
    total: int
    completed: int
    failed: int


class BatchError(_Protocol):
    code: str
    message: str
    param: str | None
    line: int | None


class BatchErrors(_Protocol):
    object: Literal["list"]
    data: list[BatchError]


class BatchObject(_Protocol):
    id: str
    object: Literal["batch"]
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                    "cancelled"]
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None


class BatchList(_Protocol):
    object: Literal["list"]
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool
