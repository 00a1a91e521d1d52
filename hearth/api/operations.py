"""The OpenAPI document's table (`hearth.api.openapi` builds the document from it): per route,
what it takes and what it answers (status → shape), in the protocol's error envelope. A test
checks that every route of the app is here, and the schema fuzzer checks real answers against
the document built from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from hearth.api.anthropic import messages
from hearth.api.anthropic import wire as anthropic_wire
from hearth.api.anthropic.messages import CountTokensIn, MessagesIn
from hearth.api.batches import wire as batch_wire
from hearth.api.control import CancelIn, DetokenizeIn, TokenizeIn
from hearth.api.embeddings import EmbeddingsIn
from hearth.api.model_control import LoadIn as LoadModelIn
from hearth.api.model_control import UnloadIn as UnloadModelIn
from hearth.api.ollama import wire as ollama_wire
from hearth.api.ollama.bodies import ChatIn, GenerateIn
from hearth.api.ollama.embed import EmbeddingsIn as OllamaEmbeddingsIn
from hearth.api.ollama.embed import EmbedIn as OllamaEmbedIn
from hearth.api.ollama.models import ShowIn
from hearth.api.ollama.pull import DeleteIn, PullIn
from hearth.api.openai import wire as openai_wire
from hearth.api.openai.chat import ChatCompletionIn
from hearth.api.openai.completions import CompletionIn
from hearth.api.openai.responses import ResponsesIn
from hearth.api.prompt_blocks import BlocksIn
from hearth.api.sessions import CreateIn, ResizeIn, RollbackIn
from hearth.api.snapshots import LoadIn, SnapshotMetaIn
from hearth.api.wire import control
from hearth.api.wire import prompt_cache as cache_wire
from hearth.api.wire import sessions as session_wire
from hearth.api.wire import usage as usage_wire

Body = type[BaseModel] | Literal["tar", "multipart"] | None
GENERATE = (400, 401, 404, 409, 413, 429, 500, 503)


@dataclass(frozen=True, slots=True)
class Operation:
    method: str
    path: str  # as routed, e.g. /v1/models/{model:path}
    summary: str
    tag: str
    ok: type[BaseModel] | Literal["sse", "tar", "text", "html", "static", "empty", "jsonl"] | None
    body: Body = None
    body_required: bool = True
    status: int = 200
    streams: bool = False  # also answers text/event-stream when the body asks for stream: true
    errors: tuple[int, ...] = (400, 401, 413)
    anthropic: bool = False
    ollama: bool = False  # Ollama's envelope ({"error": ...}), and NDJSON when streaming
    # errors in the envelope of the generation path named in the body (/v1/prompt-cache/blocks
    # answers what that path would: Anthropic's for /v1/messages, OpenAI's otherwise)
    either_envelope: bool = False
    params: dict[str, str] = field(default_factory=dict)  # path parameter → description
    query: dict[str, str] = field(default_factory=dict)  # query parameter (optional) → description


def _generation() -> list[Operation]:
    """OpenAI's and Anthropic's generation routes, and stored responses."""
    rid = {"response_id": "A stored response id: resp_ and 32 hex digits"}
    return [
        Operation("POST", "/v1/chat/completions", "Create a chat completion (OpenAI)", "openai",
                  openai_wire.ChatCompletion, ChatCompletionIn, streams=True, errors=GENERATE),
        Operation("POST", "/chat/completions", "Create a chat completion (OpenAI, unversioned path)", "openai",
                  openai_wire.ChatCompletion, ChatCompletionIn, streams=True, errors=GENERATE),
        Operation("POST", "/v1/completions", "Create a completion from a raw prompt (OpenAI legacy)", "openai",
                  openai_wire.TextCompletion, CompletionIn, streams=True, errors=GENERATE),
        Operation("POST", "/completions", "Create a completion (OpenAI legacy, unversioned path)", "openai",
                  openai_wire.TextCompletion, CompletionIn, streams=True, errors=GENERATE),
        Operation("POST", "/v1/messages", "Create a message (Anthropic)", "anthropic", anthropic_wire.AnthropicMessage,
                  MessagesIn, streams=True, errors=GENERATE, anthropic=True),
        Operation("POST", "/v1/messages/count_tokens", "Count a message's input tokens (Anthropic)", "anthropic",
                  anthropic_wire.TokenCount, CountTokensIn, errors=(400, 401, 404, 413, 503), anthropic=True),
        Operation("POST", "/v1/responses", "Create a response (OpenAI Responses)", "openai", openai_wire.Response,
                  ResponsesIn, streams=True, errors=GENERATE),
        Operation("POST", "/responses", "Create a response (OpenAI Responses, unversioned path)", "openai",
                  openai_wire.Response, ResponsesIn, streams=True, errors=GENERATE),
        Operation("GET", "/v1/responses/{response_id}", "Get a stored response, or stream a background one's events",
                  "openai", openai_wire.Response, errors=(400, 401, 404, 410), params=rid, streams=True,
                  query={"stream": "true: the events of a background response (text/event-stream), replayed then "
                                   "followed live until its terminal event",
                         "starting_after": "With stream: only the events after this sequence number (an integer "
                                           ">= 0; default: all)"}),
        Operation("DELETE", "/v1/responses/{response_id}", "Delete a stored response", "openai",
                  openai_wire.ResponseDeleted, errors=(401, 403, 404), params=rid),
        Operation("POST", "/v1/responses/{response_id}/cancel", "Cancel a response's run", "openai",
                  openai_wire.Response, errors=(401, 404), params=rid),
    ]

def _sessions() -> list[Operation]:
    """Sessions (a save makes a snapshot)."""
    sid = {"session_id": "A session id: 1-128 characters of A-Z a-z 0-9 . _ -"}
    return [
        Operation("POST", "/v1/sessions", "Create a session", "sessions", session_wire.Session, CreateIn,
                  body_required=False, status=201, errors=(400, 401, 404, 409, 413, 503)),
        Operation("GET", "/v1/sessions", "List sessions", "sessions", session_wire.SessionList, errors=(401,)),
        Operation("GET", "/v1/sessions/{session_id}", "Get a session", "sessions", session_wire.Session,
                  errors=(400, 401, 404), params=sid),
        Operation("DELETE", "/v1/sessions/{session_id}", "Delete a session and its KV", "sessions",
                  session_wire.SessionDeleted, errors=(400, 401, 403, 404, 409), params=sid),
        Operation("GET", "/v1/sessions/{session_id}/history", "A session's transcript", "sessions",
                  session_wire.SessionHistory, errors=(400, 401, 404), params=sid),
        Operation("POST", "/v1/sessions/{session_id}/rollback", "Keep only a session's first messages", "sessions",
                  session_wire.SessionChange, RollbackIn, errors=(400, 401, 404, 409, 413), params=sid),
        Operation("POST", "/v1/sessions/{session_id}/resize", "Change a session's max_seq_len", "sessions",
                  session_wire.SessionChange, ResizeIn, errors=(400, 401, 404, 409, 413, 503), params=sid),
        Operation("POST", "/v1/sessions/{session_id}/resize/next_pow2", "Grow max_seq_len to the next power of 2",
                  "sessions", session_wire.SessionChange, errors=(400, 401, 404, 409, 503), params=sid),
        Operation("POST", "/v1/sessions/{session_id}/save", "Snapshot a session", "snapshots", session_wire.Snapshot,
                  SnapshotMetaIn, body_required=False, status=201, errors=(400, 401, 404, 409, 413, 503),
                  params=sid),
    ]

def _batches() -> list[Operation]:
    """The Batch API: files and batches."""
    file_id = {"file_id": "A file id: file- and 32 hex digits"}
    batch_id = {"batch_id": "A batch id: batch_ and 32 hex digits"}
    return [
        Operation("POST", "/v1/files", "Upload a batch's input file (JSONL, purpose batch)", "batches",
                  batch_wire.FileObject, "multipart", errors=(400, 401, 413)),
        Operation("GET", "/v1/files", "List files", "batches", batch_wire.FileList, errors=(400, 401),
                  query={"purpose": "Only files of this purpose", "limit": "Files per page (1-10000)",
                         "after": "The last file id of the previous page", "order": "desc (default) or asc"}),
        Operation("GET", "/v1/files/{file_id}", "Get a file's object", "batches", batch_wire.FileObject,
                  errors=(401, 404), params=file_id),
        Operation("DELETE", "/v1/files/{file_id}", "Delete a file", "batches", batch_wire.FileDeleted,
                  errors=(401, 403, 404), params=file_id),
        Operation("GET", "/v1/files/{file_id}/content", "Download a file's content", "batches", "jsonl",
                  errors=(401, 404), params=file_id),
        Operation("POST", "/v1/batches", "Create a batch", "batches", batch_wire.BatchObject, batch_wire.BatchIn,
                  errors=(400, 401, 404, 413)),
        Operation("GET", "/v1/batches", "List batches, newest first", "batches", batch_wire.BatchList,
                  errors=(400, 401), query={"limit": "Batches per page (1-100, default 20)",
                                            "after": "The last batch id of the previous page"}),
        Operation("GET", "/v1/batches/{batch_id}", "Get a batch", "batches", batch_wire.BatchObject,
                  errors=(401, 404), params=batch_id),
        Operation("POST", "/v1/batches/{batch_id}/cancel", "Cancel a batch", "batches", batch_wire.BatchObject,
                  errors=(401, 404, 409), params=batch_id),
    ]

def _snapshots() -> list[Operation]:
    """Snapshots."""
    snap = {"snapshot_id": "A snapshot id: snap_ and 32 hex digits"}
    return [
        Operation("GET", "/v1/snapshots", "List snapshots", "snapshots", session_wire.SnapshotList, errors=(401,)),
        Operation("POST", "/v1/snapshots/import", "Import a snapshot archive", "snapshots",
                  session_wire.Snapshot, "tar", status=201, errors=(400, 401, 409, 413, 422, 503)),
        Operation("GET", "/v1/snapshots/{snapshot_id}", "Get a snapshot's manifest", "snapshots", session_wire.Snapshot,
                  errors=(400, 401, 404, 422), params=snap),
        Operation("PATCH", "/v1/snapshots/{snapshot_id}", "Edit a snapshot's title, description, tags",
                  "snapshots", session_wire.Snapshot, SnapshotMetaIn, errors=(400, 401, 404, 413, 422), params=snap),
        Operation("DELETE", "/v1/snapshots/{snapshot_id}", "Delete a snapshot", "snapshots",
                  session_wire.SnapshotDeleted, errors=(400, 401, 403, 404), params=snap),
        Operation("POST", "/v1/snapshots/{snapshot_id}/load", "Load a snapshot into a session", "snapshots",
                  session_wire.SessionChange, LoadIn, body_required=False, status=201,
                  errors=(400, 401, 403, 404, 409, 413, 422, 503), params=snap),
        Operation("GET", "/v1/snapshots/{snapshot_id}/archive", "Download a snapshot as a tar archive", "snapshots",
                  "tar", errors=(400, 401, 404, 422), params=snap),
    ]

def _prompt_cache_and_accounting() -> list[Operation]:
    """The prompt cache (a router's reads, the admin's), usage, the journal, cancel."""
    model_q = {"model": "A model id or alias (default: the default model)"}
    return [
        Operation("GET", "/v1/prompt-cache/digest", "What this node's prompt cache and sessions hold, for a router",
                  "prompt-cache", cache_wire.PromptCacheDigest, errors=(401, 404)),
        Operation("POST", "/v1/prompt-cache/blocks", "A generation request's prompt-cache blocks, for a router",
                  "prompt-cache", cache_wire.PromptCacheBlocks, BlocksIn, errors=(400, 401, 404, 413, 503),
                  either_envelope=True),
        Operation("GET", "/admin/prompt-cache", "Prompt-cache counters and sizes per model and tier", "prompt-cache",
                  cache_wire.PromptCacheStats, errors=(401, 403, 404)),
        Operation("DELETE", "/admin/prompt-cache", "Drop a model's prompt-cache blocks (every model's without model)",
                  "prompt-cache", cache_wire.PromptCacheCleared, errors=(401, 403, 404, 503), query=model_q),
        Operation("GET", "/admin/prompt-cache/entries", "A model's prompt-cache blocks", "prompt-cache",
                  cache_wire.PromptCacheEntries, errors=(400, 401, 403, 404, 503),
                  query={**model_q, "limit": "At most this many blocks (1 to 100000; default 1000)"}),
        Operation("GET", "/admin/keys/usage", "Usage and limits per API key", "control", usage_wire.KeyUsageList,
                  errors=(401, 403)),
        Operation("POST", "/admin/keys/reload", "Read the key file again and put it in force (counts of what "
                  "changed)", "control", usage_wire.KeysReloaded, errors=(400, 401, 403)),
        Operation("GET", "/admin/usage", "The usage ledger: rows or sums (a tenant key: its own)", "control",
                  usage_wire.UsageList, errors=(400, 401, 404),
                  query={"tenant": "Only this tenant (the admin's choice)", "key": "Only this key (its name)",
                         "model": "Only this model", "since": "From (unix seconds or ISO 8601)",
                         "until": "Before (unix seconds or ISO 8601)",
                         "group": "Sum by day, key, model, tenant (comma-separated; empty: one total)",
                         "limit": "Rows at most (1 to 100000; default 1000)"}),
        Operation("GET", "/admin/journal/{request_id}", "A journaled request and its answer (--journal)", "control",
                  usage_wire.JournalRecord, errors=(401, 404), params={"request_id": "The answer's id"}),
        Operation("POST", "/v1/cancel", "Cancel runs by cancel_id, session or id", "control", control.Cancelled,
                  CancelIn),
    ]

def _control() -> list[Operation]:
    """Models, embeddings, health, the tokenizer, metrics, this document."""
    return [
        Operation("GET", "/v1/models", "List models", "control", control.ModelList, errors=(401, 503)),
        Operation("GET", "/v1/models/{model:path}", "Get a model", "control", control.ModelObject,
                  errors=(401, 404, 503), params={"model": "A model id or alias"}),
        Operation("POST", "/models/load", "Load a model now (llama-server's router shape)", "control",
                  control.ModelLoaded, LoadModelIn, errors=(400, 401, 403, 404, 409, 503)),
        Operation("POST", "/v1/models/load", "Load a model now", "control", control.ModelLoaded, LoadModelIn,
                  errors=(400, 401, 403, 404, 409, 503)),
        Operation("POST", "/models/unload", "Unload a model now (llama-server's router shape)", "control",
                  control.ModelUnloaded, UnloadModelIn, errors=(400, 401, 403, 404, 409, 503)),
        Operation("POST", "/v1/models/unload", "Unload a model now", "control", control.ModelUnloaded, UnloadModelIn,
                  errors=(400, 401, 403, 404, 409, 503)),
        Operation("POST", "/v1/embeddings", "Create embeddings (OpenAI)", "openai",
                  openai_wire.EmbeddingList, EmbeddingsIn, errors=(400, 401, 404, 413, 503)),
        Operation("POST", "/embeddings", "Create embeddings (OpenAI, unversioned path)", "openai",
                  openai_wire.EmbeddingList, EmbeddingsIn, errors=(400, 401, 404, 413, 503)),
        Operation("POST", "/api/embed", "Embeddings (Ollama)", "ollama", ollama_wire.OllamaEmbed, OllamaEmbedIn,
                  errors=(400, 401, 404, 413, 503), ollama=True),
        Operation("POST", "/api/embeddings", "One embedding (Ollama, older endpoint)", "ollama",
                  ollama_wire.OllamaEmbedding, OllamaEmbeddingsIn, errors=(400, 401, 404, 413, 503), ollama=True),
        Operation("GET", "/health", "Health: 200 once the model is loaded", "control", control.Health, errors=()),
        Operation("POST", "/tokenize", "Tokenize text or messages", "control", control.Tokenized, TokenizeIn,
                  errors=(400, 401, 404, 413, 503)),
        Operation("POST", "/detokenize", "Turn token ids into text", "control", control.Detokenized, DetokenizeIn,
                  errors=(400, 401, 404, 413, 503)),
        Operation("GET", "/metrics", "Prometheus metrics", "control", "text", errors=(401,)),
        Operation("GET", "/openapi.json", "This document", "control", None, errors=()),
    ]

def _ollama_and_web() -> list[Operation]:
    """Ollama's /api/* and the chat page."""
    return [
        Operation("POST", "/api/chat", "Chat (Ollama); NDJSON unless stream is false", "ollama", ollama_wire.OllamaChat,
                  ChatIn, streams=True, errors=GENERATE, ollama=True),
        Operation("POST", "/api/generate", "Generate from a prompt (Ollama); NDJSON unless stream is false", "ollama",
                  ollama_wire.OllamaGenerate, GenerateIn, streams=True, errors=GENERATE, ollama=True),
        Operation("GET", "/api/tags", "List models (Ollama)", "ollama", ollama_wire.OllamaModels, errors=(401, 503),
                  ollama=True),
        Operation("POST", "/api/show", "A model's details (Ollama)", "ollama", ollama_wire.OllamaShow, ShowIn,
                  errors=(400, 401, 404, 413, 503), ollama=True),
        Operation("GET", "/api/ps", "Loaded models (Ollama)", "ollama", ollama_wire.OllamaModels, errors=(401, 503),
                  ollama=True),
        Operation("GET", "/api/version", "The Ollama API version followed", "ollama", ollama_wire.OllamaVersion,
                  errors=(401,), ollama=True),
        Operation("POST", "/api/pull", "Install a catalog model (Ollama); NDJSON progress unless stream is false",
                  "ollama", ollama_wire.OllamaProgress, PullIn, streams=True, errors=(400, 401, 403, 404, 413, 503),
                  ollama=True),
        Operation("DELETE", "/api/delete", "Delete a catalog-installed model (Ollama)", "ollama", "empty", DeleteIn,
                  errors=(400, 401, 403, 404, 409, 413, 503), ollama=True),
        Operation("GET", "/", "The built-in chat page", "web", "html", errors=()),
        Operation("GET", "/web/{name}", "The chat page's static files", "web", "static", errors=(404,),
                  params={"name": "index.html, app.js or style.css"}),
    ]


OPERATIONS = [*_generation(), *_sessions(), *_batches(), *_snapshots(), *_prompt_cache_and_accounting(),
              *_control(), *_ollama_and_web()]
# Endpoints that only ever answer an error (Anthropic's 404/405 for wrong methods and unknown
# /v1/messages/... paths): not operations of the API.
UNDOCUMENTED = {messages.unrouted}
