"""Response shapes, as pydantic models, for the OpenAPI document (`hearth.api.openapi`).

The handlers build these objects as dicts (the wire format is the protocols' own, field for
field); these models describe them, and tests check real responses against them (the in-process
API tests and the schema fuzzer), so the document cannot drift from what the server sends.
Hearth's own objects forbid unknown fields; the protocol objects (OpenAI, Anthropic) allow
them, as their clients do.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Own(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Protocol(BaseModel):
    model_config = ConfigDict(extra="allow")


# ---- errors --------------------------------------------------------------------------------


class OpenAIErrorBody(_Own):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(_Own):
    error: OpenAIErrorBody


class AnthropicErrorBody(_Own):
    type: str
    message: str


class AnthropicError(_Own):
    type: Literal["error"]
    error: AnthropicErrorBody


# ---- OpenAI Chat Completions and Completions -------------------------------------------------


class CompletionUsageDetails(_Protocol):
    cached_tokens: int


class CompletionUsage(_Protocol):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: CompletionUsageDetails | None = None


class FunctionCall(_Protocol):
    name: str | None
    arguments: str


class ToolCall(_Protocol):
    id: str | None
    type: Literal["function"]
    function: FunctionCall


class TopLogprob(_Protocol):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(_Protocol):
    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class AssistantMessage(_Protocol):
    role: Literal["assistant"]
    content: str | None
    refusal: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class LlamaTimings(_Protocol):
    """llama-server's `timings` (docs/api.md, "Run options")."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    cache_tier: Literal["slot", "ram", "disk"] | None = None  # where cache_n came from (Hearth's)


class HearthStopError(_Protocol):
    type: Literal["malformed_tool_call"]
    message: str


class ChatChoice(_Protocol):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: str
    stop_reason: Literal["repetition", "timeout"] | None = None  # the loop detector or the time cap stopped it
    error: HearthStopError | None = None  # a malformed tool call


class ChatCompletion(_Protocol):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: CompletionUsage
    timings: LlamaTimings | None = None


class LegacyLogprobs(_Protocol):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class TextChoice(_Protocol):
    index: int
    text: str
    logprobs: LegacyLogprobs | None
    finish_reason: str
    stop_reason: Literal["repetition", "timeout"] | None = None


class TextCompletion(_Protocol):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[TextChoice]
    usage: CompletionUsage
    timings: LlamaTimings | None = None


# ---- OpenAI Responses --------------------------------------------------------------------------


class ResponseUsage(_Protocol):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: dict[str, int] | None = None
    output_tokens_details: dict[str, int] | None = None


class ResponseErrorInfo(_Protocol):
    code: str
    message: str


class OutputItem(_Protocol):
    """A message, reasoning or function_call item (OpenAI's shapes; fields by type)."""

    type: str
    id: str | None = None


class Response(_Protocol):
    id: str
    object: Literal["response"]
    created_at: int
    model: str
    status: Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
    output: list[OutputItem]
    output_text: str | None = None
    incomplete_details: dict[str, Any] | None
    error: ResponseErrorInfo | None
    usage: ResponseUsage | None
    instructions: str | None = None
    metadata: dict[str, Any] | None = None
    previous_response_id: str | None = None
    stop_reason: Literal["repetition", "timeout"] | None = None
    timings: LlamaTimings | None = None


class ResponseDeleted(_Protocol):
    id: str
    object: Literal["response"]
    deleted: bool


# ---- Anthropic Messages -----------------------------------------------------------------------


class AnthropicUsage(_Protocol):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class ContentBlock(_Protocol):
    """A text, thinking or tool_use block (Anthropic's shapes; fields by type)."""

    type: str


class AnthropicMessage(_Protocol):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[ContentBlock]
    stop_reason: str | None
    stop_sequence: str | None
    usage: AnthropicUsage
    stop_details: dict[str, str] | None = None  # {"type": "repetition" | "malformed_tool_call", "message"?}
    timings: LlamaTimings | None = None


class TokenCount(_Protocol):
    input_tokens: int


# ---- models, health, tokenizer, cancel ----------------------------------------------------------


class ModelStatus(_Protocol):
    value: Literal["loaded", "loading", "unloaded", "unloading"]
    pinned: bool  # named with --model: loaded at start and kept
    users: int  # requests holding it now
    loads: int
    load_seconds: float
    expires_in: float | None = None  # seconds until an idle loaded model is unloaded (absent: never, or busy)
    loaded_bytes: int | None = None  # memory its load took (process RSS after minus before)
    error: str | None = None  # why its last load failed


class ModelObject(_Protocol):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    meta: dict[str, Any] = Field(default_factory=dict)
    status: ModelStatus | None = None  # on a server that loads models on demand (llama-server's router)


class ModelLoaded(_Own):
    success: bool
    model: str
    status: ModelStatus | None = None


class ModelUnloaded(_Own):
    success: bool
    model: str
    unloaded: bool  # false: it was not loaded


class ModelList(_Own):
    object: Literal["list"]
    data: list[ModelObject]


class Health(_Own):
    status: Literal["ok", "loading", "error"]
    error: str | None = None


class TokenPiece(_Own):
    id: int
    piece: str


class Tokenized(_Own):
    tokens: list[int] | list[TokenPiece]
    count: int


class Detokenized(_Own):
    content: str


class Cancelled(_Own):
    cancelled: int


# ---- sessions and snapshots ------------------------------------------------------------------


class Session(_Own):
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


class SessionList(_Own):
    object: Literal["list"]
    data: list[Session]
    sessions: list[Session]  # superlinear's name for data


class SessionDeleted(_Own):
    session_id: str
    object: Literal["session.deleted"]
    deleted: bool


class TranscriptFunction(_Own):
    name: str
    arguments: str


class TranscriptToolCall(_Own):
    id: str
    type: Literal["function"]
    function: TranscriptFunction


class TranscriptMessage(_Own):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None
    name: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[TranscriptToolCall] | None = None
    tool_call_id: str | None = None


class SessionHistory(_Own):
    object: Literal["list"]
    session_id: str
    data: list[TranscriptMessage]
    messages: list[TranscriptMessage]  # superlinear's name for data


class Snapshot(_Own):
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


class SnapshotList(_Own):
    object: Literal["list"]
    data: list[Snapshot]
    snapshots: list[Snapshot]  # superlinear's name for data


class SnapshotDeleted(_Own):
    snapshot_id: str
    object: Literal["snapshot.deleted"]
    deleted: bool


# ---- the prompt cache ------------------------------------------------------------------------


class PromptCacheTier(_Own):
    hits: int  # placements whose reused prefix came from this tier
    tokens: int  # prompt tokens served from it
    blocks: int  # held now (ram, disk; 0 for slot: slots hold sequences)
    bytes: int
    budget: int  # bytes allowed (0: the tier is off)
    evictions: int


class PromptCacheModelStats(_Own):
    block_tokens: int
    tiers: dict[Literal["slot", "ram", "disk"], PromptCacheTier]
    misses: int
    written_blocks: int
    write_errors: int
    dropped_offers: int
    disk_full: bool
    loaded_bytes: int
    load_seconds: float
    rejected_files: int


class PromptCacheStats(_Own):
    object: Literal["prompt_cache.stats"]
    models: dict[str, PromptCacheModelStats]


class KeyLimits(_Own):
    concurrent: int | None
    rpm: int | None
    tpm: int | None


class KeyUsage(_Own):
    name: str
    tenant: str
    requests: int
    limited: int
    in_flight: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    limits: KeyLimits


class KeyUsageList(_Own):
    object: Literal["list"]
    data: list[KeyUsage]


class UsageRow(_Own):
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


class UsageSum(_Own):
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


class JournalAnswer(_Own):
    text: str
    tool_calls: list[dict[str, str]]
    finish_reason: str | None
    prompt_tokens: int
    generated_tokens: int


class JournalRecord(_Own):
    """A journaled request (hearth.observability.journal): its body as received, its answer."""

    id: str
    at: float
    endpoint: str
    path: str
    model: str
    request: dict[str, Any]
    answer: JournalAnswer


class UsageList(_Own):
    object: Literal["list"]
    group: list[str] | None = None  # present: `data` holds sums
    data: list[UsageRow] | list[UsageSum]


class PromptCacheEntry(_Own):
    hash: str  # 32 hex digits
    parent: str  # the previous block's hash, or the chain's root
    start: int
    n_tokens: int
    ram: bool
    disk: bool
    kept: bool
    last_used: float


class PromptCacheEntries(_Own):
    object: Literal["list"]
    model: str
    data: list[PromptCacheEntry]
    total: int
    has_more: bool


class PromptCacheCleared(_Own):
    object: Literal["prompt_cache.cleared"]
    model: str | None
    dropped: int


class DigestBlocks(_Own):
    slot: list[str]  # full blocks idle KV slots hold (what a request arriving now reuses in place)
    ram: list[str]
    disk: list[str]


class DigestTails(_Own):  # tail keys (files.tail_keys) of the partial blocks each tier holds
    slot: list[str]
    ram: list[str]
    disk: list[str]


class DigestKeys(_Own):
    slot: list[str]  # conversation keys of the stateless requests that last filled an idle slot


class DigestSessions(_Own):
    resident: list[str]
    host: list[str]
    disk: list[str]


class ModelDigest(_Own):
    block_tokens: int
    root: str
    blocks: DigestBlocks
    tails: DigestTails
    keys: DigestKeys
    sessions: DigestSessions


class PromptCacheDigest(_Own):
    object: Literal["prompt_cache.digest"]
    version: int
    models: dict[str, ModelDigest]


class PromptCacheBlocks(_Own):
    object: Literal["prompt_cache.blocks"]
    model: str
    root: str  # the hash chain's root ("" when the model has no prompt cache)
    block_tokens: int
    n_tokens: int  # the whole prompt
    blocks: list[str]  # full blocks only, in prompt order
    tails: list[list[str]]  # per block, the last partial one's included: its tail keys


# ---- Ollama's API (/api/*) -------------------------------------------------------------------


class OllamaError(_Own):
    error: str


class OllamaMessage(_Protocol):
    role: str
    content: str


class OllamaChat(_Protocol):
    """/api/chat's answer (and each NDJSON line of a stream; the last with done true and the totals)."""

    model: str
    created_at: str
    message: OllamaMessage
    done: bool


class OllamaGenerate(_Protocol):
    model: str
    created_at: str
    response: str
    done: bool


class OllamaDetails(_Protocol):
    format: str


class OllamaModel(_Protocol):
    name: str
    model: str
    size: int
    digest: str
    details: OllamaDetails


class OllamaModels(_Protocol):
    """/api/tags and /api/ps."""

    models: list[OllamaModel]


class OllamaShow(_Protocol):
    template: str
    details: OllamaDetails
    model_info: dict[str, Any]
    capabilities: list[str]


class OllamaVersion(_Protocol):
    version: str


class OllamaProgress(_Protocol):
    """/api/pull's answer (and each NDJSON line of its progress)."""

    status: str


# ---- embeddings (hearth.api.embeddings, hearth.api.ollama.embed) ------------------------------


class EmbeddingItem(_Protocol):
    object: str
    index: int
    embedding: list[float] | str  # a string when encoding_format is base64


class EmbeddingUsage(_Protocol):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(_Protocol):
    object: str
    data: list[EmbeddingItem]
    model: str
    usage: EmbeddingUsage


class OllamaEmbed(_Protocol):
    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class OllamaEmbedding(_Protocol):
    embedding: list[float]
