"""Every call the gateway makes to a node besides generation (which goes over `http.py`, the fast
client) and the routes that pass a client's request through as it is (`edge/forward.py`,
`edge/ollama.py`): one place for the URL, the node's credentials and the caller's tenant
(`headers.py`), the timeouts, and the typed shapes of `hearth.fleet_protocol` in and out.

Transport errors (`httpx.HTTPError`) propagate: each caller decides what a node that cannot be
reached means for it (a failed probe, a stale digest, a turn retried elsewhere)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from hearth.fleet_protocol import (
    BLOCKS_PATH,
    DIGEST_PATH,
    SESSIONS_PATH,
    BlocksQuery,
    SessionCreate,
    history_path,
    session_path,
)
from hearth.gateway.settings import Upstream
from hearth.gateway.upstream.client import node_url
from hearth.gateway.upstream.headers import upstream_headers
from hearth.tenants import OPEN, Caller

SESSION_TIMEOUT = 30.0  # a session's creation, lookup, deletion or history
MOVE_TIMEOUT = 600.0  # a snapshot saved, sent or loaded while a session moves


@dataclass(frozen=True, slots=True)
class Reply:
    """A node's answer: its status and, when it was JSON, the document (else None)."""

    status: int
    doc: Any
    text: str

    @classmethod
    def of(cls, r: httpx.Response) -> Reply:
        try:
            doc = r.json()
        except ValueError:
            doc = None
        return cls(r.status_code, doc, r.text)

    @property
    def obj(self) -> dict[str, Any]:
        """The document when it is a JSON object, else {}."""
        return self.doc if isinstance(self.doc, dict) else {}


class NodeClient:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    # ---- liveness and what a node serves ---------------------------------------------------------

    async def probe(self, up: Upstream, timeout: float) -> tuple[str, int]:
        """The liveness path for `up`'s kind and what it answered (/health on a Hearth node,
        /v1/models on other engines)."""
        path = "/health" if up.kind == "hearth" else "/v1/models"
        r = await self.client.get(node_url(up, path), headers=up.headers(), timeout=timeout)
        return path, r.status_code

    async def models(self, up: Upstream, timeout: float) -> Reply:
        return Reply.of(await self.client.get(node_url(up, "/v1/models"), headers=up.headers(), timeout=timeout))

    # ---- the prompt cache: what a node holds -------------------------------------------------------

    async def digest(self, up: Upstream, timeout: float) -> Reply:
        """The node's prompt-cache digest (its own key's namespace); 404: no prompt cache there."""
        return Reply.of(await self.client.get(node_url(up, DIGEST_PATH), headers=up.headers(), timeout=timeout))

    async def blocks(self, up: Upstream, query: BlocksQuery, timeout: float) -> Reply:
        """A request's prompt blocks as `up` keys them."""
        return Reply.of(await self.client.post(node_url(up, BLOCKS_PATH), json=query, headers=up.headers(),
                                               timeout=timeout))

    # ---- sessions ----------------------------------------------------------------------------------

    async def session_status(self, up: Upstream, sid: str, who: Caller) -> int:
        """GET the session as `who`: 200 if `up` has it, 404 if not."""
        r = await self.client.get(node_url(up, session_path(sid)), headers=upstream_headers(up, who),
                                  timeout=SESSION_TIMEOUT)
        return r.status_code

    async def create_session(self, up: Upstream, body: SessionCreate, who: Caller) -> Reply:
        """A session with its history, created on `up` as `who` (its owner)."""
        return Reply.of(await self.client.post(node_url(up, SESSIONS_PATH), json=body,
                                               headers=upstream_headers(up, who), timeout=SESSION_TIMEOUT))

    async def delete_session(self, up: Upstream, sid: str, who: Caller) -> int:
        r = await self.client.delete(node_url(up, session_path(sid)), headers=upstream_headers(up, who, admin=True),
                                     timeout=SESSION_TIMEOUT)
        return r.status_code

    async def history(self, up: Upstream, sid: str, who: Caller) -> Reply:
        """The session's transcript as the node keeps it (`data`: a list of HistoryMessage)."""
        return Reply.of(await self.client.get(node_url(up, history_path(sid)), headers=upstream_headers(up, who),
                                              timeout=SESSION_TIMEOUT))

    # ---- the usage ledger ----------------------------------------------------------------------------

    async def usage_row(self, up: Upstream, answer_id: str, who: Caller, timeout: float) -> Reply:
        """The node's usage-ledger rows for one answer (`data`: [] until the node wrote it), as
        `who` (GET /admin/usage is the one admin path a tenant reads: its own rows)."""
        return Reply.of(await self.client.get(node_url(up, "/admin/usage"), params={"request_id": answer_id,
                                                                                    "limit": "1"},
                                              headers=upstream_headers(up, who), timeout=timeout))

    # ---- a session's move (snapshots) --------------------------------------------------------------

    async def call(self, up: Upstream, method: str, path: str, *, who: Caller = OPEN, admin: bool = False,
                   **kw: Any) -> Reply:
        """One step of a move (save, load, delete a snapshot or a session), as `who`."""
        return Reply.of(await self.client.request(method, node_url(up, path), headers=upstream_headers(up, who, admin),
                                                  timeout=MOVE_TIMEOUT, **kw))

    @asynccontextmanager
    async def archive(self, up: Upstream, snapshot: str, who: Caller) -> AsyncIterator[httpx.Response]:
        """A snapshot's archive, streamed from `up`."""
        async with self.client.stream("GET", node_url(up, f"/v1/snapshots/{snapshot}/archive"),
                                      headers=upstream_headers(up, who), timeout=MOVE_TIMEOUT) as r:
            yield r
