"""The ASGI application: routes, middleware, error handlers and the backend's lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.routing import Route

from hearth.api import (
    control,
    embeddings,
    keys,
    model_control,
    openapi,
    prompt_blocks,
    prompt_cache,
    sessions,
    snapshots,
    usage,
    web,
)
from hearth.api.anthropic import messages
from hearth.api.batches import routes as batch_routes
from hearth.api.batches.metrics import BatchCollector
from hearth.api.batches.runner import Batches
from hearth.api.context import NodeContext
from hearth.api.http.cancels import CancelRegistry
from hearth.api.ollama import embed as ollama_embed
from hearth.api.ollama.routes import routes as ollama_routes
from hearth.api.openai import chat, completions, responses
from hearth.api.openai.background_runs import BackgroundRuns
from hearth.api.openai.responses_store import ResponseStore
from hearth.backends.base import Backend
from hearth.config import Settings
from hearth.http.access import AccessSettings
from hearth.http.app import assemble
from hearth.http.key_usage import WINDOW, KeyAccounts, KeyUsageCollector
from hearth.http.keyring import KeyReloadCollector, LiveKeys, Ring, off_sighup, on_sighup, reload_logged
from hearth.observability.journal import Journal
from hearth.observability.ledger import Ledger, LedgerCollector
from hearth.observability.metrics import Metrics
from hearth.observability.tracing import Tracing, configured_endpoint, otlp_processor
from hearth.sessions.backend import SessionBackend
from hearth.sessions.manager import SessionManager


def create_app(backend: Backend, settings: Settings | None = None, tracing: Tracing | None = None, *,
               traced: bool = True) -> Starlette:
    """The HTTP server over any backend: it sees only the contract in `hearth.backends.base`.
    Every route reads what it needs from the one `NodeContext` built here (`hearth.api.context`).
    Traces go to `tracing` (tests), else over OTLP when the settings or OTEL_EXPORTER_OTLP_* say so;
    `traced=False`: none at all, whatever they say (the gateway's translator: the gateway traces
    those turns itself)."""
    settings = settings or Settings()
    if tracing is None and traced and configured_endpoint(settings.otlp_endpoint) is not None:
        tracing = Tracing(otlp_processor(settings.otlp_endpoint), settings.trace_content)
    metrics = Metrics(backend)
    manager = SessionManager(backend, settings.data_dir)
    cancels = CancelRegistry()
    metrics.runs_registered.set_function(lambda: len(cancels))
    metrics.cancels_pending.set_function(lambda: cancels.pending)
    accounts = KeyAccounts(settings.keyring)
    metrics.registry.register(KeyUsageCollector(accounts))
    ledger = Ledger(settings.data_dir / "usage.db") if settings.usage_ledger else None
    if ledger is not None:
        metrics.registry.register(LedgerCollector(ledger))
        if settings.keyring:  # the keys' usage survives a restart
            wall = time.time()
            accounts.restore(ledger.per_key(wall - WINDOW), wall)
    journal = Journal(settings.data_dir, settings.journal_max_age, settings.journal_max_mb << 20) \
        if settings.journal else None
    context = NodeContext(backend=SessionBackend(backend, manager), sessions=manager, settings=settings,
                          cancels=cancels, metrics=metrics,
                          responses=ResponseStore(settings.data_dir / "hearth.db"), responses_settled={},
                          background=BackgroundRuns(), keys=accounts, ledger=ledger,
                          tracing=tracing, journal=journal,
                          batches=Batches(settings.data_dir, settings.batch_concurrency,
                                          key_names=frozenset(k.name for k in settings.keyring)))
    metrics.registry.register(BatchCollector(context.batches.store))
    # The keys in force, reloaded from --api-key-file on SIGHUP or POST /admin/keys/reload: the
    # key check, each key's accounts and the batch runner follow each reload (http/keyring.py).
    live = LiveKeys(settings.keyring, settings.api_key_file, settings.api_keys)

    def follow(ring: Ring) -> None:
        accounts.rekey(ring.keys)
        context.batches.key_names = ring.names  # checked before each batch line

    live.on_swap(follow)
    metrics.registry.register(KeyReloadCollector(live))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Load in the background: the port opens at once and /health says 503 until ready.
        loading = asyncio.create_task(backend.start())
        hup = on_sighup([lambda: reload_logged(live)] if live.path is not None else [])
        context.batches.start(app)  # resumes unfinished batches; their lines retry while the model loads
        try:
            yield
        finally:
            if hup:
                off_sighup()
            await context.batches.shutdown()  # first: a line stopped now runs again on the next start
            with contextlib.suppress(asyncio.CancelledError):
                await loading
            await context.background.shutdown()  # before the backend stops: each run records its end
            await backend.stop()
            manager.close()
            if ledger is not None:
                ledger.close()  # after the backend: every run's row is queued
            if tracing is not None:
                tracing.shutdown()  # exports what is still batched
            if journal is not None:
                journal.close()

    routes = [
        Route("/v1/chat/completions", chat.chat_completions, methods=["POST"]),
        # Starlette tries routes in order (a regex each): the small, frequent requests go first
        Route("/v1/embeddings", embeddings.embeddings, methods=["POST"]),
        Route("/chat/completions", chat.chat_completions, methods=["POST"]),
        Route("/embeddings", embeddings.embeddings, methods=["POST"]),
        Route("/v1/completions", completions.completions, methods=["POST"]),
        Route("/completions", completions.completions, methods=["POST"]),
        Route("/v1/messages", messages.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"]),
        # Anthropic's envelope for the other methods (405) and unknown /v1/messages/… paths (404).
        Route("/v1/messages", messages.unrouted, methods=messages.ALL_METHODS),
        Route("/v1/messages/{rest:path}", messages.unrouted, methods=messages.ALL_METHODS),
        Route("/v1/responses", responses.create_response, methods=["POST"]),
        Route("/responses", responses.create_response, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses.get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses.delete_response, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/cancel", responses.cancel_response, methods=["POST"]),
        Route("/v1/files", batch_routes.upload_file, methods=["POST"]),
        Route("/v1/files", batch_routes.list_files, methods=["GET"]),
        Route("/v1/files/{file_id}", batch_routes.get_file, methods=["GET"]),
        Route("/v1/files/{file_id}", batch_routes.delete_file, methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", batch_routes.file_content, methods=["GET"]),
        Route("/v1/batches", batch_routes.create_batch, methods=["POST"]),
        Route("/v1/batches", batch_routes.list_batches, methods=["GET"]),
        Route("/v1/batches/{batch_id}", batch_routes.get_batch, methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", batch_routes.cancel_batch, methods=["POST"]),
        Route("/v1/sessions", sessions.create_session, methods=["POST"]),
        Route("/v1/sessions", sessions.list_sessions, methods=["GET"]),
        Route("/v1/sessions/{session_id}", sessions.get_session, methods=["GET"]),
        Route("/v1/sessions/{session_id}", sessions.delete_session, methods=["DELETE"]),
        Route("/v1/sessions/{session_id}/history", sessions.history, methods=["GET"]),
        Route("/v1/sessions/{session_id}/rollback", sessions.rollback, methods=["POST"]),
        Route("/v1/sessions/{session_id}/resize", sessions.resize, methods=["POST"]),
        Route("/v1/sessions/{session_id}/resize/next_pow2", sessions.resize_next_pow2, methods=["POST"]),
        Route("/v1/sessions/{session_id}/save", sessions.save, methods=["POST"]),
        Route("/v1/snapshots", snapshots.list_snapshots, methods=["GET"]),
        Route("/v1/snapshots/import", snapshots.import_snapshot, methods=["POST"]),
        Route("/v1/snapshots/{snapshot_id}", snapshots.get_snapshot, methods=["GET"]),
        Route("/v1/snapshots/{snapshot_id}", snapshots.patch_snapshot, methods=["PATCH"]),
        Route("/v1/snapshots/{snapshot_id}", snapshots.delete_snapshot, methods=["DELETE"]),
        Route("/v1/snapshots/{snapshot_id}/load", snapshots.load_snapshot, methods=["POST"]),
        Route("/v1/snapshots/{snapshot_id}/archive", snapshots.archive, methods=["GET"]),
        Route("/v1/prompt-cache/digest", prompt_cache.digest, methods=["GET"]),
        Route("/v1/prompt-cache/blocks", prompt_blocks.blocks, methods=["POST"]),
        Route("/admin/prompt-cache", prompt_cache.stats, methods=["GET"]),
        Route("/admin/prompt-cache", prompt_cache.clear, methods=["DELETE"]),
        Route("/admin/prompt-cache/entries", prompt_cache.entries, methods=["GET"]),
        Route("/admin/keys/usage", keys.usage, methods=["GET"]),
        Route("/admin/keys/reload", keys.reload_of(live), methods=["POST"]),
        Route("/admin/usage", usage.usage, methods=["GET"]),
        Route("/admin/journal/{request_id}", usage.journal_record, methods=["GET"]),
        Route("/v1/cancel", control.cancel, methods=["POST"]),
        Route("/api/embed", ollama_embed.embed, methods=["POST"]),  # Ollama's
        Route("/api/embeddings", ollama_embed.embeddings, methods=["POST"]),
        Route("/v1/models", control.list_models, methods=["GET"]),
        Route("/models/load", model_control.load, methods=["POST"]),
        Route("/v1/models/load", model_control.load, methods=["POST"]),
        Route("/models/unload", model_control.unload, methods=["POST"]),
        Route("/v1/models/unload", model_control.unload, methods=["POST"]),
        Route("/v1/models/{model:path}", control.get_model, methods=["GET"]),
        Route("/health", control.health, methods=["GET"]),
        Route("/tokenize", control.tokenize, methods=["POST"]),
        Route("/detokenize", control.detokenize, methods=["POST"]),
        Route("/metrics", control.metrics, methods=["GET"]),
        Route("/openapi.json", openapi.openapi_json, methods=["GET"]),
        *ollama_routes(),  # Ollama's /api/* (docs/api.md)
        Route("/", web.index, methods=["GET"]),
        Route("/web/{name:path}", web.static_file, methods=["GET"]),
    ]
    app = assemble(routes, lifespan, metrics.requests, AccessSettings.of(settings, live=live), accounts)
    app.state.node = context
    return app
