"""The gateway's ASGI application: the node's middleware (request ids, auth, the error policy
in each protocol's envelope) over the gateway's routes."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from hearth.api import keys, web
from hearth.api.anthropic import messages as anthropic
from hearth.api.app import create_app
from hearth.config import Settings
from hearth.gateway.background import RelayedBackground
from hearth.gateway.batches.metrics import GatewayBatchCollector
from hearth.gateway.batches.runner import GatewayBatches
from hearth.gateway.edge import admin, generate, models, ollama, resources, usage
from hearth.gateway.edge import batches as batch_routes
from hearth.gateway.fleet.leases import Leases
from hearth.gateway.fleet.membership import Membership
from hearth.gateway.fleet.moves import Mover
from hearth.gateway.fleet.pool import Pool
from hearth.gateway.fleet.probes import Prober
from hearth.gateway.foreign.backend import OpenAIUpstreamBackend
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.settings import GatewaySettings
from hearth.gateway.state import Gateway, attach
from hearth.gateway.store import create_store
from hearth.gateway.store.batches import BatchTables
from hearth.gateway.store.usage import GatewayLedger
from hearth.gateway.turn.proxy import Proxy
from hearth.gateway.upstream.http import HttpxSender, UpstreamHttp
from hearth.gateway.upstream.node_client import NodeClient
from hearth.http.access import AccessSettings
from hearth.http.app import assemble
from hearth.http.key_usage import KeyAccounts, KeyUsageCollector
from hearth.http.keyring import KeyReloadCollector, LiveKeys, Ring, off_sighup, on_sighup, reload_logged
from hearth.observability.ledger import LedgerCollector
from hearth.observability.tracing import Tracing, configured_endpoint, otlp_processor

log = logging.getLogger("hearth.gateway")

GENERATION = ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions", "/v1/messages",
              "/v1/responses", "/responses")


def create_gateway_app(settings: GatewaySettings, transport: httpx.AsyncBaseTransport | None = None,
                       tracing: Tracing | None = None) -> Starlette:
    metrics = GatewayMetrics()
    store = create_store(settings)
    ledger = GatewayLedger(store) if settings.usage_ledger else None
    owned: Tracing | None = None  # a test's own tracing is its to shut down
    if tracing is None and configured_endpoint(settings.otlp_endpoint) is not None:
        tracing = owned = Tracing(otlp_processor(settings.otlp_endpoint), service="hearth-gateway")
    # One client for every upstream call; its connection pool is sized past every node's cap
    # (with room for nodes that join later).
    limit = max(sum(u.max_in_flight for u in settings.upstreams) * 2 + 16, 256)
    client = httpx.AsyncClient(transport=transport, limits=httpx.Limits(max_connections=limit,
                                                                        max_keepalive_connections=limit))
    nodes = NodeClient(client)  # every call to a node but generation and pass-through routes
    pool = Pool(settings, store, metrics, nodes)
    # Generation requests go over the fast client (upstream/http.py; httpx for https upstreams),
    # unless a test hands in an httpx transport standing for the fleet.
    http: UpstreamHttp | HttpxSender = UpstreamHttp(HttpxSender(client)) if transport is None \
        else HttpxSender(client)
    proxy = Proxy(settings, pool, store, metrics, nodes, http)
    # Usage and limits per client key: the node's accounts (hearth/http/key_usage.py), fed by the
    # usage the proxy reads from the answers it relays.
    accounts = KeyAccounts(settings.keyring)
    proxy.after.accounts = accounts
    proxy.ledger, proxy.tracing = ledger, tracing
    metrics.registry.register(KeyUsageCollector(accounts))
    if ledger is not None:  # the same families as a node's: written, dropped, queue depth
        metrics.registry.register(LedgerCollector(ledger))
    background = RelayedBackground(proxy, store, settings.heartbeat)
    batches = GatewayBatches(BatchTables(store), settings.batch_concurrency, settings.lease_ttl,
                             key_names=frozenset(k.name for k in settings.keyring))
    batch_metrics = GatewayBatchCollector(batches)
    metrics.registry.register(batch_metrics)
    translator, translated_aliases = _translator(settings, pool, client, http)
    mover = Mover(pool, store, nodes, metrics)
    leases = Leases(mover, min(settings.probe_interval, settings.lease_ttl / 3))
    metrics.watch_nodes(lambda: list(pool.nodes.values()), lambda: pool.waiting)
    prober = Prober(settings, nodes, metrics, lambda: list(pool.nodes.values()), pool.wake)
    membership = Membership(settings, pool, store, mover, prober)
    # The client keys in force, reloaded from --api-key-file on SIGHUP or POST /admin/keys/reload
    # (http/keyring.py): the key check, each key's accounts and the batch runner follow.
    live = LiveKeys(settings.keyring, settings.api_key_file, settings.api_keys)

    def follow(ring: Ring) -> None:
        accounts.rekey(ring.keys)
        batches.key_names = ring.names  # checked before each batch line (key_gone)

    live.on_swap(follow)
    metrics.registry.register(KeyReloadCollector(live))

    async def metrics_endpoint(request: Request) -> Response:
        await batch_metrics.refresh()
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await store.open()
        if ledger is not None:
            ledger.start()
        await membership.start()  # the nodes that joined, from the store, before the pool starts
        await prober.start()  # nodes probed first: a drain continued here needs to know which are up
        await pool.start()
        await leases.beat()  # the drains in force, and what a gateway that is gone left, before serving
        leases.start()
        hup = _on_sighup(membership, translated_aliases, live)
        try:
            async with contextlib.AsyncExitStack() as stack:
                if translator is not None:
                    await stack.enter_async_context(translator.router.lifespan_context(translator))
                await batches.start(app)  # its lines go through this app (the turn path)
                yield
        finally:
            await batches.shutdown()  # before the pool stops: its lines in flight run again later
            await leases.stop()
            if hup:
                off_sighup()
            await background.shutdown()  # its runs end as failed, recorded before the store closes
            await membership.stop()
            await pool.stop()
            await prober.stop()
            await proxy.continuity.idle()
            await http.aclose()
            await client.aclose()
            if ledger is not None:
                await ledger.close()  # what is queued is written before the store closes
            if owned is not None:
                owned.shutdown()  # flushes the spans it holds
            await store.close()

    route_list = _routes(metrics_endpoint, accounts, live)
    app = assemble(route_list, lifespan, metrics.requests, AccessSettings.of(settings, settings.join_key, live),
                   accounts)
    attach(app, Gateway(settings=settings, pool=pool, store=store, proxy=proxy, client=client, nodes=nodes, mover=mover,
                        started=int(time.time()), translator=translator, translated=translated_aliases,
                        background=background, membership=membership, batches=batches))
    return app


def _translator(settings: GatewaySettings, pool: Pool, client: httpx.AsyncClient,
                http: UpstreamHttp | HttpxSender) -> tuple[Starlette | None, frozenset[str]]:
    """Models on openai-kind upstreams are served by the node's own protocol layer over a backend
    that speaks OpenAI chat to them: Anthropic and Responses clients are translated there. Its
    app (None without such upstreams) and the aliases it serves."""
    translated = OpenAIUpstreamBackend(pool, client, http)
    # CORS is the gateway's; so are these turns' usage (per key, and their ledger rows) and
    # spans (foreign/turn.py): a ledger or traces here would count each turn a second time.
    inner = Settings(models=[], data_dir=settings.data_dir / "translated", cors_origins=[], usage_ledger=False)
    aliases = frozenset(translated.aliases())
    return (create_app(translated, inner, traced=False) if aliases else None), aliases


def _routes(metrics_endpoint: Callable[[Request], Awaitable[Response]], accounts: KeyAccounts,
            live: LiveKeys) -> list[Route]:
    """The route table: every endpoint and the edge module that answers it."""
    route_list = [Route(p, generate.generate, methods=["POST"]) for p in GENERATION]
    route_list += [
        Route("/v1/messages/count_tokens", generate.by_model, methods=["POST"]),
        Route("/v1/messages", anthropic.unrouted, methods=anthropic.ALL_METHODS),
        Route("/v1/messages/{rest:path}", anthropic.unrouted, methods=anthropic.ALL_METHODS),
        Route("/tokenize", generate.by_model, methods=["POST"]),
        Route("/detokenize", generate.by_model, methods=["POST"]),
        Route("/v1/responses/{response_id}", resources.response_route, methods=["GET", "DELETE"]),
        Route("/v1/responses/{response_id}/cancel", resources.response_route, methods=["POST"]),
        Route("/v1/sessions", resources.create_session, methods=["POST"]),
        Route("/v1/sessions", resources.list_sessions, methods=["GET"]),
        Route("/v1/sessions/{session_id}", resources.session_route, methods=["GET", "DELETE"]),
        Route("/v1/sessions/{session_id}/{action:path}", resources.session_route, methods=["GET", "POST"]),
        Route("/v1/snapshots", resources.list_snapshots, methods=["GET"]),
        Route("/v1/snapshots/import", resources.import_snapshot, methods=["POST"]),
        Route("/v1/snapshots/{snapshot_id}", resources.snapshot_route, methods=["GET", "PATCH", "DELETE"]),
        Route("/v1/snapshots/{snapshot_id}/{action}", resources.snapshot_route, methods=["GET", "POST"]),
        *ollama.routes(),  # Ollama's /api/* and /v1/embeddings, to nodes that serve the model
        Route("/v1/cancel", resources.cancel, methods=["POST"]),
        *batch_routes.ROUTES,
        Route("/v1/models", models.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", models.get_model, methods=["GET"]),
        Route("/health", models.health, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/admin/status", admin.status, methods=["GET"]),
        Route("/admin/keys/usage", keys.usage_of(accounts), methods=["GET"]),
        Route("/admin/keys/reload", keys.reload_of(live), methods=["POST"]),
        Route("/admin/usage", usage.usage, methods=["GET"]),
        Route("/admin/nodes/{node}/drain", admin.drain, methods=["POST"]),
        Route("/admin/nodes/{node}/undrain", admin.undrain, methods=["POST"]),
        Route("/admin/fleet/join", admin.fleet_join, methods=["POST"]),
        Route("/admin/fleet/reload", admin.fleet_reload, methods=["POST"]),
        Route("/admin/fleet/{node}", admin.fleet_leave, methods=["DELETE"]),
        Route("/admin/sessions/{session_id}", admin.session_status, methods=["GET"]),
        Route("/admin/sessions/{session_id}/move", admin.move_session, methods=["POST"]),
        Route("/", web.index, methods=["GET"]),
        Route("/web/{name:path}", web.static_file, methods=["GET"]),
    ]
    return route_list


def _on_sighup(membership: Membership, translated: frozenset[str], live: LiveKeys) -> bool:
    """SIGHUP reloads the fleet file and the key file, each that the gateway was started with,
    each on its own: a bad one is logged and changes nothing, and does not stop the other. False
    where signals cannot be handled here (not the main thread: a test's in-process server)."""
    actions: list[Callable[[], None]] = []
    if membership.settings.upstreams_file is not None:
        async def reload() -> None:
            try:
                await membership.reload(translated)
            except Exception as e:
                log.error("SIGHUP: %s", e)

        actions.append(lambda: membership.spawn(reload()))
    if live.path is not None:
        actions.append(lambda: reload_logged(live))
    return on_sighup(actions)
