"""The backend contract: everything above `backends/` (api, sessions, observability, cli)
talks to a backend through these types and nothing else, as vLLM's serving layer talks to
one `EngineClient`. A backend may run the model here (`LocalBackend`) or elsewhere (a pool of
remote engines reached over HTTP); nothing above this module can tell.

Generation: `chat()` and `complete()` validate eagerly and raise a `HearthError` before
returning the stream, so the HTTP layer can still answer with a 4xx; once the stream is
returned, problems arrive as a `Finish(reason="error")` and `Done(error=...)`.
Closing the stream (`aclose()`, or cancelling the task that iterates it) cancels the work.

Token work (`tokenize`, `tokenize_prompt`, ...) is async: a backend must not run it on the event
loop (a long prompt takes seconds to template and tokenize), and a remote one makes a call.

Capabilities: a backend that cannot do something optional says so by returning None from the
capability's property (today: `session_kv`, `prompt_cache`, `model_loading`, `embeddings`); the
`require_...` functions turn that into the one error the API answers with, a 404
`sessions_unsupported` or `prompt_cache_unsupported` (what a client sees from a server without
them), never an AttributeError.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from hearth.chat.cancel import CancelToken
from hearth.chat.types import ChatEvent, ChatRequest, CompletionRequest, Message
from hearth.engine.fair_share import TenantTally as TenantTally
from hearth.engine.prefix_cache.stats import CacheEntry as CacheEntry
from hearth.engine.prefix_cache.stats import PrefixCacheStats as PrefixCacheStats
from hearth.engine.prefix_cache.stats import TierStats as TierStats
from hearth.errors import NotFound
from hearth.models import ModelSpec

T = TypeVar("T")


@dataclass(slots=True)
class ModelCard:
    id: str
    created: int
    owned_by: str = "hearth"
    meta: dict[str, Any] = field(default_factory=dict)
    # Where the model stands on a server that loads models on demand (llama-server's router
    # shape): {"value": "loaded" | "loading" | "unloaded" | "unloading", ...}; None: always loaded.
    status: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """What a model accepts: `seq_ctx` tokens per sequence (prompt + output, the most a
    session may hold) and `parallel` sequences decoded at once (candidates of one request
    included)."""

    seq_ctx: int
    parallel: int


@dataclass(slots=True)
class ModelStats:
    """One model's load and lifetime counters, read at scrape time (metrics, `hearth server
    status`). Gauges first, then counters that only grow."""

    running: int = 0  # sequences decoding or prefilling
    waiting: int = 0  # requests queued for a slot
    kv_tokens: int = 0  # tokens held in the KV cache, all slots
    slots_busy: int = 0  # KV sequence slots in use
    swapped_ram_bytes: int = 0  # swapped-out session KV held in host RAM
    prompt_tokens: int = 0  # prefilled (reused prefixes not counted)
    cached_tokens: int = 0  # prompt tokens reused from the KV cache
    generated_tokens: int = 0
    steps: int = 0  # engine steps (one decode call each)
    finished: int = 0  # requests finished, any reason
    cancelled: int = 0  # requests cancelled in the engine
    swap_outs: int = 0  # session KV moved out of a slot
    swap_ins: int = 0  # session KV moved back into a slot
    drafted_tokens: int = 0  # speculative draft tokens verified
    accepted_tokens: int = 0  # of those, the ones accepted (emitted without a step of their own)
    interrupted_decodes: int = 0  # decodes stopped midway by an abort (their work re-run)
    kv_reprefills: int = 0  # session KV that could not be restored or failed a decode: prefilled again
    grammar_cache_hits: int = 0  # constrained requests whose grammar this model had compiled already
    grammar_cache_misses: int = 0  # grammars compiled against this model's vocabulary
    paused: int = 0  # requests paused for a higher class (hearth/engine/preempt.py)
    preemptions: int = 0  # pauses so far
    # Fair shares (hearth/engine/fair_share.py): each tenant's counters, and the requests
    # queued and paused now per class name (flex, default, priority).
    tenants: dict[str, TenantTally] = field(default_factory=dict)
    queued_by_class: dict[str, int] = field(default_factory=dict)
    paused_by_class: dict[str, int] = field(default_factory=dict)


# ---- session KV ----------------------------------------------------------------------------

Residency = Literal["resident", "host", "disk", "none"]


@dataclass(frozen=True, slots=True)
class KVInfo:
    """Where a session's KV lives and how many tokens it holds: `resident` in a slot, `host`
    RAM or `disk` after a swap-out, `none` (never ran, dropped, or on a backend that lost it)."""

    residency: Residency
    n_tokens: int


@dataclass(frozen=True, slots=True)
class KVState:
    """A session's KV as it moves between backends and snapshots: the exact token ids it holds
    and the engine's opaque bytes for them (llama.cpp seq-state here). Raw bytes only: never
    pickled, never parsed above the backend."""

    tokens: list[int]
    data: bytes


@dataclass(frozen=True, slots=True)
class KVIdentity:
    """What KV bytes depend on. A snapshot saved under one identity loads only where
    `model["sha256"]` and the whole `engine` dict are equal (409 otherwise).

    model:  {id, sha256 (of the weights file, 64 lowercase hex digits), arch, n_ctx_train}
    engine: the runner's fingerprint: engine build, KV layout and KV type (`kv_type`)."""

    model: dict[str, Any]
    engine: dict[str, Any]


class SessionKV(Protocol):
    """The session-KV capability, keyed by (model id, session id). Session ids are already
    validated (`hearth.ids.is_session_id`). A session's KV must not be in use by a running turn
    when it is exported, imported or dropped: those raise `Conflict(code="session_busy")`
    then. A remote backend implements each method with one HTTP call to the node holding
    the session."""

    async def kv_info(self, model: str, session_id: str) -> KVInfo: ...

    async def export_kv(self, model: str, session_id: str) -> KVState | None:
        """A copy of the session's tokens and KV bytes, wherever they live; None if it has none."""
        ...

    async def import_kv(self, model: str, session_id: str, state: KVState) -> None:
        """Make `state` the session's KV (replacing any), used from its next turn on.
        ValueError if the bytes do not fit this engine."""
        ...

    async def drop_kv(self, model: str, session_id: str) -> None:
        """Forget the session's KV, wherever it lives (a no-op if there is none)."""
        ...

    async def trim_kv(self, model: str, session_id: str, tokens: list[int]) -> int:
        """Cut the session's KV to its common prefix with `tokens` (its transcript after a
        rollback or resize); returns how many tokens it keeps (0 if it has none)."""
        ...

    async def kv_identity(self, model: str) -> KVIdentity: ...

    async def max_kv_bytes(self, model: str) -> int:
        """At most how many bytes `export_kv` gives for a session as long as the model's
        longest sequence: imported KV past this is refused before it is read."""
        ...


# ---- the prompt-cache capability ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """A prompt's full blocks as this node's prompt cache keys them: what a router matches
    against digests (docs/api.md, "POST /v1/prompt-cache/blocks"). `root` is "" and `blocks`
    empty where the model has no prompt cache."""

    model: str
    root: str  # the hash chain's root, hex
    block_tokens: int
    n_tokens: int  # the whole prompt's tokens, the last partial block's included
    blocks: list[str]  # hex, in prompt order: full blocks only
    tails: list[list[str]]  # hex, per block (the last partial one's included): its tail keys


class PromptCache(Protocol):
    """What a backend with a durable prompt cache shows and lets an admin do
    (hearth.engine.prefix_cache: stateless prompts' KV in blocks, in RAM and on disk)."""

    def cache_stats(self) -> dict[str, PrefixCacheStats]:
        """Per model id. Cheap and non-blocking: called at every /metrics scrape."""
        ...

    async def cache_entries(self, model: str | None) -> list[CacheEntry]:
        """The blocks one model's cache holds (None: the default model)."""
        ...

    async def clear_cache(self, model: str | None) -> int:
        """Drop every block of one model's cache (None: every model's); how many were dropped."""
        ...

    async def cache_digest(self, ns: str = "") -> dict[str, Any]:
        """Per model id: what the node holds in prompt-cache namespace `ns`, for a router to
        read cheaply: {block_tokens, root (the namespace's hash chain root, hex), blocks:
        {slot|ram|disk: [hash...]}, keys: {slot: [conversation key...]}, sessions:
        {resident|host|disk: [id...]}}. How the hashes chain: docs/api.md. Hashing work runs off
        the event loop and the engine thread."""
        ...

    async def cache_blocks(self, model: str | None, tokens: list[int], ns: str = "") -> PromptBlocks:
        """The full blocks of a prompt's `tokens` (as `tokenize_prompt` or `tokenize` gave them)
        keyed as this node's cache keys them in namespace `ns`; off the event loop and the
        engine thread."""
        ...


# ---- the model-loading capability ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadStats:
    """One servable model's loads, for /metrics."""

    loaded: bool
    loads: int  # loads that succeeded
    load_failures: int
    load_seconds: float  # all loads together
    loaded_bytes: int  # memory its load took, measured (process RSS after minus before); 0 unloaded


class ModelLoading(Protocol):
    """A backend that loads models when requests name them and unloads idle ones
    (hearth.backends.local.loader): counters, and loading or unloading one on request."""

    def load_stats(self) -> dict[str, LoadStats]:
        """Per model id. Cheap and non-blocking: called at every /metrics scrape."""
        ...

    def is_loaded(self, model: str | None) -> bool:
        """Whether a request for `model` finds it loaded now; True for a name that is not a
        model (the request's own error says so) and while the server starts."""
        ...

    async def load_model(self, model: str, keep_alive: float | None = None) -> ModelCard:
        """Load `model` now (if it is not loaded) and keep it for `keep_alive` seconds from now
        (Ollama's meaning: 0 now, negative forever; None: the server's default); its card."""
        ...

    async def unload_model(self, model: str) -> bool:
        """Unload `model` now; False if it was not loaded. Conflict while requests use it."""
        ...

    def add_model(self, spec: ModelSpec) -> None:
        """Serve `spec` on demand from now on (a model installed while the server runs)."""
        ...

    async def remove_model(self, model: str) -> None:
        """Stop serving `model` (its file is about to be deleted): unloaded first; Conflict while
        requests use it, or for a pinned or default model."""
        ...


# ---- the embeddings capability --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """Vectors for `inputs` (texts, or token-id lists used as they are) from an embedding model.
    An input past the model's context is refused (ContextLimit, 400) unless `truncate` (Ollama's
    default) cuts it to the context. `dimensions`: the length the client wants (None: the
    model's own; another length is a 400 unless the model is declared Matryoshka)."""

    model: str | None
    inputs: list[str | list[int]]
    truncate: bool = False
    dimensions: int | None = None
    keep_alive: float | None = None  # Ollama's meaning (seconds; 0 now; negative forever)
    timeout: float | None = None  # bounds the wait for the model's load
    cancel: CancelToken | None = None  # set (the client left): the work is dropped
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class EmbedResult:
    model: str  # the model's id
    vectors: list[list[float]]  # one per input, in order, L2-normalised
    prompt_tokens: int  # every input's tokens, special tokens included
    load_seconds: float  # time waiting for the model's load (Ollama's load_duration)
    total_seconds: float


class Embeddings(Protocol):
    """A backend that serves embedding models (hearth.backends.local.embedding)."""

    async def embed(self, req: EmbedRequest) -> EmbedResult:
        """The vectors, or: NotFound (unknown model), BadRequest (a chat model, a bad input
        or `dimensions`), ContextLimit (an input too long, `truncate` off), Unavailable."""
        ...


# ---- the backend ---------------------------------------------------------------------------


class Backend(Protocol):
    # lifecycle
    @property
    def ready(self) -> bool: ...

    @property
    def load_error(self) -> str | None:
        """Why the backend could not start (health answers 503 with it), or None."""
        ...

    async def start(self) -> None:
        """Load or connect. Runs in the background while the server already answers (/health
        says 503 until `ready`); a failure is recorded in `load_error`, not raised."""
        ...

    async def stop(self) -> None: ...

    def cancel_all(self) -> None:
        """Shutting down: end every run now with its final event (finish_reason "cancelled");
        requests still waiting for a slot get 503. Callable from a signal handler."""
        ...

    # models
    def models(self) -> list[ModelCard]: ...

    def resolve(self, model: str | None) -> str:
        """The canonical id for a requested model name (None or "": the default model);
        NotFound if there is none, Unavailable while loading."""
        ...

    def limits(self, model: str | None) -> ModelLimits: ...

    # generation
    async def chat(self, req: ChatRequest) -> EventStream:
        """A chat turn. With `req.session` set (only the session manager sets it) `messages` is
        the whole transcript and the session owns the KV the request builds."""
        ...

    async def complete(self, req: CompletionRequest) -> EventStream: ...

    # tokens (off the event loop)
    async def tokenize(self, model: str | None, text: str, *, add_special: bool = True) -> list[int]: ...

    async def tokenize_chat(self, model: str | None, messages: list[Message]) -> list[int]:
        """The chat template's tokens for `messages` (no generation prompt, no tools)."""
        ...

    async def tokenize_prompt(self, req: ChatRequest) -> list[int]:
        """The prompt tokens `chat(req)` would start from, template and tools and all (/tokenize
        with messages; Anthropic's count_tokens is their number)."""
        ...

    async def token_pieces(self, model: str | None, tokens: list[int]) -> list[str]: ...

    async def detokenize(self, model: str | None, tokens: list[int]) -> str: ...

    # observability
    def stats(self) -> dict[str, ModelStats]:
        """Per model id. Cheap and non-blocking: called at every /metrics scrape."""
        ...

    # capabilities
    @property
    def session_kv(self) -> SessionKV | None:
        """The session-KV capability, or None if this backend has none."""
        ...

    @property
    def prompt_cache(self) -> PromptCache | None:
        """The prompt-cache capability, or None if this backend has none."""
        ...

    @property
    def model_loading(self) -> ModelLoading | None:
        """The model-loading capability, or None if this backend keeps its models loaded."""
        ...

    @property
    def embeddings(self) -> Embeddings | None:
        """The embeddings capability, or None if this backend serves no embedding models."""
        ...


def _required(part: T | None, message: str, code: str) -> T:
    """A backend's optional part, or the 404 that says the routes needing it are not available."""
    if part is None:
        raise NotFound(message, code=code)
    return part


def require_session_kv(backend: Backend) -> SessionKV:
    return _required(backend.session_kv, "this server keeps no sessions: its backend cannot hold a session's KV, "
                     "so the sessions and snapshots APIs (and session_id on requests) are not available",
                     "sessions_unsupported")


def require_prompt_cache(backend: Backend) -> PromptCache:
    return _required(backend.prompt_cache, "this server keeps no prompt cache: its backend has none, so the "
                     "prompt-cache routes are not available", "prompt_cache_unsupported")


def require_model_loading(backend: Backend) -> ModelLoading:
    return _required(backend.model_loading, "this server does not load or unload models on request: its backend "
                     "keeps its models loaded", "model_loading_unsupported")


def require_embeddings(backend: Backend) -> Embeddings:
    return _required(backend.embeddings, "this server does not compute embeddings: its backend has no "
                     "embedding models", "embeddings_unsupported")


# ---- event streams -------------------------------------------------------------------------


class EventStream:
    """A stream of ChatEvents whose cleanups always run exactly once: when it is exhausted,
    or on `aclose()`, even if it was never iterated (an async generator that never started
    would skip its `finally`, leaking whatever the backend reserved for it)."""

    def __init__(self, events: AsyncIterator[ChatEvent], on_close: list[Callable[[], None]] | None = None) -> None:
        self._events = events
        self._on_close = on_close or []
        self._observers: list[Callable[[ChatEvent], None]] = []
        self._closed = False

    def observe(self, fn: Callable[[ChatEvent], None]) -> None:
        """Call `fn` with every event as it passes (metrics, logging)."""
        self._observers.append(fn)

    def on_close(self, fn: Callable[[], None]) -> None:
        if self._closed:
            fn()
        else:
            self._on_close.append(fn)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> ChatEvent:
        try:
            ev = await self._events.__anext__()
        except StopAsyncIteration:
            self._cleanup()
            raise
        for fn in self._observers:
            fn(ev)
        return ev

    async def aclose(self) -> None:
        try:
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        if self._closed:
            return
        self._closed = True
        for cb in self._on_close:
            cb()
