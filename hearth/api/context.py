"""What every node route works with, in one typed object: `create_app` builds a `NodeContext`
once, and every handler reads it through `node(request)` (nothing in hearth/api reads
`app.state` otherwise).

`backend` is the one object the protocols call, completions included: the real backend
wrapped by `SessionBackend`, so a request that names a session becomes a turn of it and any
other goes straight through. `sessions` is the same manager, for the /v1/sessions and
/v1/snapshots routes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request

from hearth.api.batches.runner import Batches
from hearth.api.http.cancels import CancelRegistry
from hearth.api.openai.background_runs import BackgroundRuns
from hearth.api.openai.responses_store import ResponseStore
from hearth.backends.base import Backend
from hearth.config import Settings
from hearth.http.key_usage import KeyAccounts
from hearth.observability.journal import Journal
from hearth.observability.ledger import Ledger
from hearth.observability.metrics import Metrics
from hearth.observability.tracing import Tracing
from hearth.sessions.manager import SessionManager


@dataclass(frozen=True, slots=True)
class NodeContext:
    backend: Backend  # what the protocols call: `SessionBackend` over the real backend
    sessions: SessionManager  # the session and snapshot routes
    settings: Settings
    cancels: CancelRegistry  # in-flight runs, for /v1/cancel
    metrics: Metrics
    responses: ResponseStore  # stored Responses (the database opens on first use)
    # Per in-flight stored response id: set once its outcome is stored (what .../cancel waits for).
    responses_settled: dict[str, asyncio.Event]
    background: BackgroundRuns  # background responses: their runs and their recorded events
    keys: KeyAccounts  # usage and limits per API key
    batches: Batches  # the Batch API: files, batches and their durable runs (api/batches)
    ledger: Ledger | None = None  # one row per request (None: off, `--no-usage-ledger`)
    tracing: Tracing | None = None  # OpenTelemetry spans per request (None: off, the default)
    journal: Journal | None = None  # request bodies and answers, for replay (None: off, the default)


def node_of(app: Starlette) -> NodeContext:
    """The context of a node app made by `create_app` (the gateway's translator is one)."""
    ctx = app.state.node
    if not isinstance(ctx, NodeContext):
        raise TypeError("not a node app: create_app sets app.state.node")
    return ctx


def node(request: Request) -> NodeContext:
    """The context of the node serving `request`."""
    return node_of(request.app)
