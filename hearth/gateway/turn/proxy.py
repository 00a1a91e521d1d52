"""One generation request through the gateway, a turn: choose a node (`Pool.acquire`), call
it, relay its answer (`relay.py`), record where the conversation now lives.

A node that fails before the client's first byte is left for another (`retry.py`: which
failures, and the error once every node failed). A session the gateway holds is made present on
the chosen node first (`continuity.py`), and re-created there if the node lost it.
The client's headers go to the node as `headers.forwarded_headers` says.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response

from hearth.api.http import auth
from hearth.api.http.key_usage import KeyAccounts
from hearth.api.http.sse import json_bytes
from hearth.errors import Conflict, HearthError, NotFound, TooManyRequests
from hearth.gateway.failover.cuts import Cut, cut_for
from hearth.gateway.failover.cuts.base import PARTIAL_IS_OUTPUT
from hearth.gateway.failover.record import turn_messages
from hearth.gateway.failover.restore import Continuity
from hearth.gateway.failover.retry import RETRY_STATUSES, Retry, exhausted, refused
from hearth.gateway.fleet.health import counts_as_failure
from hearth.gateway.fleet.pool import Lease, Node, Pool
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.protocols import Protocol, protocol_of
from hearth.gateway.routing.affinity import Affinity, affinity_of
from hearth.gateway.routing.prefixes import conversation, prefix_hashes
from hearth.gateway.settings import GatewaySettings
from hearth.gateway.store.base import GatewayStore
from hearth.gateway.tenancy import caller, hidden, owns, session_hidden, upstream_headers
from hearth.gateway.turn.relay import Moved, Relay, Release, Scan
from hearth.gateway.upstream.headers import forwarded_headers, passed_headers
from hearth.gateway.upstream.http import Answer, Buffered, Sender
from hearth.sessions.ids import stored_session_id
from hearth.tenants import OPEN, Caller

log = logging.getLogger("hearth.gateway")

MIGRATED = "(migrated)"  # the owner of a response finished by another node than the one that began it

@dataclass(slots=True)
class Turn:
    """A generation request as the proxy routes it."""

    path: str
    protocol: Protocol
    body: dict[str, Any]
    alias: str
    affinity: Affinity
    hashes: list[tuple[str, int]]
    prompt_tokens: int
    session_id: str | None
    history: list[Any]  # the gateway's transcript of the session before this turn ([]: none)
    stream: bool
    headers: dict[str, str]
    who: Caller = OPEN  # the client's tenant (tenancy.py): what the node is told, whose records these are
    key: Caller = OPEN  # the client's key, as the key check found it: whose usage this is
    started: float = field(default_factory=time.monotonic)


class Proxy:
    def __init__(self, settings: GatewaySettings, pool: Pool, store: GatewayStore, metrics: GatewayMetrics,
                 client: httpx.AsyncClient, http: Sender) -> None:
        self.settings = settings
        self.pool = pool
        self.store = store
        self.metrics = metrics
        self.client = client
        self.http = http  # generation requests; `client` for the rest
        self.accounts: KeyAccounts | None = None  # usage per client key, when the app counts it
        self.continuity = Continuity(store, client, metrics, keyed=settings.tenants)
        self.relay = Relay(settings, metrics, pool.clock)

    # ---- the request ---------------------------------------------------------------------------

    async def turn(self, request: Request, body: dict[str, Any]) -> Turn:
        alias = self.pool.resolve(body.get("model"))
        headers = forwarded_headers(request)
        who = caller(request)
        # Checked here too: the id goes into upstream URLs (history, create, delete). As the node
        # stores it: a tenant's ids are its own namespace (hearth.tenants); nodes take either form.
        sid = stored_session_id(who, body["session_id"]) if body.get("session_id") is not None else None
        if sid is not None:
            body = {**body, "session_id": sid}
        affinity = affinity_of(body, headers)
        if sid is not None and await session_hidden(self.store, who, sid):  # a node's own answers
            if body.get("session_create") is False:
                raise NotFound(f"session {sid} not found (session_create is false)", param="session_id",
                               code="session_not_found")
            raise Conflict(f"session {sid} already exists", param="session_id", code="session_exists")
        rid = body.get("previous_response_id")
        if isinstance(rid, str) and await hidden(self.store, who, "response", rid):
            raise NotFound(f"no stored response with id {rid!r}", param="previous_response_id")
        items = conversation(body)
        saved = await self.store.transcript(sid) if sid is not None and await owns(self.store, who, "session", sid) \
            else None
        history = saved[1] if saved is not None else []
        hashes = prefix_hashes(alias, history + items)
        return Turn(request.url.path, protocol_of(request.url.path), body, alias, affinity, hashes,
                    hashes[-1][1] if hashes else 1, sid, history, body.get("stream") is True, headers, who,
                    auth.caller(request))

    async def generate(self, request: Request, body: dict[str, Any]) -> Response:
        return await self.serve(await self.turn(request, body))

    async def serve(self, turn: Turn) -> Response:
        """The turn sent, retried and relayed; needs nothing of the client's request (a
        background run's turn is served by a task of the gateway's, `background.py`)."""
        tried: set[str] = set()
        failures: list[Retry] = []
        # What the nodes hold of this prompt (routing.py): asked once, kept across retries.
        blocks = {} if turn.session_id is not None else await self.pool.request_blocks(
            turn.alias, turn.affinity, turn.path, turn.body)
        for _ in range(len(self.pool.nodes)):
            lease = await self.pool.acquire(turn.alias, turn.affinity, turn.hashes, turn.prompt_tokens, tried,
                                            blocks)
            tried.add(lease.node.name)
            try:
                answer = await self._attempt(lease, turn)
            except Retry as e:
                failures.append(e)
                self.metrics.retries.labels(e.label).inc()
                log.warning("upstream %s failed before the first byte (%s); trying another", lease.node.name, e.reason)
                continue
            return answer
        error = exhausted(failures, self.settings.probe_interval)
        if isinstance(error, TooManyRequests):  # the fleet is full, not broken
            self.metrics.rejected("upstreams_full")
        raise error

    async def _send(self, node: Node, turn: Turn, body: dict[str, Any]) -> Answer:
        """POST `body` (the turn's, or its continuation's) to `node`, the session made present
        there first. Raises httpx.TransportError when the node cannot be reached."""
        held = turn.session_id is not None and await self.continuity.ensure_session(
            node, turn.alias, turn.session_id, turn.history)
        payload = {**await self.continuity.rechained(node, body, turn.who), "model": node.up.models[turn.alias]}
        if held:  # the node must not start it afresh if it lost it (a node replaced with an empty disk)
            payload["session_create"] = False
        headers = {**turn.headers, "content-type": "application/json", **upstream_headers(node.up, turn.who)}
        resp = await self.http.send("POST", node.up.url + turn.path, headers, json_bytes(payload),
                                    self.settings.connect_timeout)
        if held and resp.status_code == 404 and turn.session_id is not None:
            passed_on = await self._session_lost(node, turn, resp)
            resp = passed_on if passed_on is not None else await self.http.send(
                "POST", node.up.url + turn.path, headers, json_bytes(payload), self.settings.connect_timeout)
        node.last_bytes = self.pool.clock()
        return resp

    def _releaser(self, lease: Lease) -> Release:
        """`Pool.release` for `lease`, once whatever calls it how often."""
        released = False

        def release(ok: bool | None) -> None:
            nonlocal released
            if not released:
                released = True
                self.pool.release(lease, ok)

        return release

    async def _attempt(self, lease: Lease, turn: Turn) -> Response:
        node = lease.node
        release = self._releaser(lease)
        try:
            resp = await self._send(node, turn, turn.body)
        except httpx.TransportError as e:
            release(False)
            raise Retry("connect", f"{node.name}: {type(e).__name__}: {e}") from e
        except BaseException:
            release(None)
            raise
        if resp.status_code in RETRY_STATUSES:
            await resp.aclose()
            retry = refused(node.name, resp)
            if resp.status_code == 429:
                node.cooling_until = self.pool.clock() + retry.retry_after
            release(False if counts_as_failure(resp.status_code) else None)
            raise retry
        streaming = resp.status_code == 200 and resp.headers.get("content-type", "").startswith("text/event-stream")
        if not streaming:
            try:
                content = await resp.aread()
            except httpx.TransportError as e:
                release(False)
                raise Retry("read", f"{node.name}: {type(e).__name__}") from e
            finally:
                await resp.aclose()
            ok = None if resp.status_code < 500 else False
            if resp.status_code < 300:
                content, scan = self.relay.whole(content, node, turn.alias, turn.protocol)
                if not await self._finished(lease, turn, scan):
                    # The node answered and died before its transcript was copied: nothing reached
                    # the client, so the turn runs again elsewhere (the node's copy is stale now).
                    release(False)
                    raise Retry("read", f"{node.name} failed before its session transcript was copied")
                ok = True
            release(ok)
            self.metrics.ttft.observe(time.monotonic() - turn.started)
            return Response(content, status_code=resp.status_code,
                            media_type=resp.headers.get("content-type", "application/json"),
                            headers=passed_headers(resp, node.name))
        cut = cut_for(turn.protocol, turn.body) if self.settings.migration_limit else None
        tried = {node.name}
        return await self.relay.stream(resp, lease, turn.alias, turn.protocol, turn.started,
                                       lambda scan, at: self._finished(at, turn, scan, cut), release, cut,
                                       lambda c, failed: self._continue(turn, c, tried))

    async def _continue(self, turn: Turn, cut: Cut, tried: set[str]) -> Moved | None:
        """The turn's answer so far (`cut`) sent to another node to continue (migration.py);
        None when there is nothing to continue with or no node takes it. `tried`: the nodes
        this stream has been on (each at most once)."""
        body = cut.body(turn.body)
        if body is None:
            self.metrics.stream_migrations.labels("nothing_to_continue").inc()
            return None
        body[PARTIAL_IS_OUTPUT] = True  # the partial answer keeps its place in max_tokens and usage
        for _ in range(len(self.pool.nodes)):
            try:
                lease = await self.pool.acquire(turn.alias, turn.affinity, turn.hashes, turn.prompt_tokens, tried,
                                                urgent=True)
            except HearthError:
                break
            tried.add(lease.node.name)
            release = self._releaser(lease)
            try:
                resp = await self._send(lease.node, turn, body)
            except httpx.TransportError as e:
                release(False)
                log.warning("continuing on %s: %s", lease.node.name, e)
                continue
            except HearthError as e:
                release(None)
                log.warning("continuing on %s: %s", lease.node.name, e)
                self.metrics.stream_migrations.labels("refused").inc()
                return None
            except BaseException:
                release(None)
                raise
            if resp.status_code == 200 and resp.headers.get("content-type", "").startswith("text/event-stream"):
                return Moved(resp, lease, release)
            try:
                text = (await resp.aread())[:300]
            except httpx.TransportError:
                text = b""
            finally:
                await resp.aclose()
            if resp.status_code in RETRY_STATUSES:
                release(False if counts_as_failure(resp.status_code) else None)
                continue
            release(None)
            log.warning("%s would not continue the answer (%d): %s", lease.node.name, resp.status_code,
                        text.decode(errors="replace"))
            self.metrics.stream_migrations.labels("refused").inc()
            return None
        self.metrics.stream_migrations.labels("no_node").inc()
        return None

    async def _session_lost(self, node: Node, turn: Turn, resp: Answer) -> Answer | None:
        """A 404 to a turn of a session the gateway holds on `node`: if the node lost the session,
        restore it from the gateway's transcript and return None (send the turn again); any other
        404 is the answer."""
        assert turn.session_id is not None
        content = await resp.aread()
        await resp.aclose()
        r = await self.client.get(f"{node.up.url}/v1/sessions/{turn.session_id}",
                                  headers=upstream_headers(node.up, await self.continuity.as_owner(turn.session_id)),
                                  timeout=30)
        if r.status_code != 404:
            return Buffered(resp.status_code, resp.headers, content)
        log.warning("upstream %s lost session %s; restoring it from the gateway's transcript", node.name,
                    turn.session_id)
        await self.continuity.ensure_session(node, turn.alias, turn.session_id, turn.history, lost=True)
        return None

    # ---- after the answer ----------------------------------------------------------------------

    def spend(self, who: Caller, scan: Scan) -> None:
        """The answer's usage, as relayed, to the caller's key (api/http/key_usage.py)."""
        if self.accounts is not None and not who.admin:
            self.accounts.spend(who.key_name, scan.whole_prompt or 0, scan.completion or 0, scan.cached or 0,
                                who.on_behalf)

    async def _finished(self, lease: Lease, turn: Turn, scan: Scan, cut: Cut | None = None) -> bool:
        """A successful answer from `lease`'s node: remember where the conversation now lives.
        A session turn's transcript is copied from that node before the answer's last event
        goes out (so the gateway's copy holds every turn a client saw answered). When the copy
        fails (the node died right after answering), a streamed turn is recorded from what the
        gateway relayed (`cut`, turn_record.py). False: the turn is in no copy."""
        node = lease.node
        # A session's prompt holds its transcript, which `hashes` (history + items) stand for too.
        node.prefixes.add(turn.hashes, scan.whole_prompt)
        try:
            await self.pool.remember(turn.affinity, node.name)
            if scan.response_id is not None:
                # A migrated response is stored on no node under the id the client has: the next
                # turn of its chain is replayed from the gateway's copy (continuity.rechained).
                owner = MIGRATED if scan.migrated else node.name
                await self.pool.remember(Affinity("response", scan.response_id), owner)
                if self.settings.tenants:
                    await self.store.set_owner("response", scan.response_id, turn.who.tenant)
                if scan.output is not None:
                    await self.continuity.response_done(turn.body, scan.response_id, scan.output)
            # Owners only where the gateway carries tenants: without them every caller is the
            # admin, and a record without an owner is the admin's (tenancy.owns), so the rows would
            # add database round trips to every turn and say nothing.
            if self.settings.tenants and turn.session_id is not None \
                    and await self.store.owner_of("session", turn.session_id) is None:
                await self.store.set_owner("session", turn.session_id, turn.who.tenant)
        except HearthError as e:  # the database went away during the turn: the answer stands
            log.warning("%s answered but where the conversation lives is not recorded: %s", node.name, e)
        self.spend(turn.key, scan)
        if scan.cached is not None:
            self.metrics.reported_cached.inc(scan.cached)
            self.metrics.predicted_cached.inc(lease.decision.predicted_cached)
        if (whole := scan.whole_prompt) is not None:
            self.metrics.reported_prompt.inc(whole)
        if turn.session_id is None or await self.continuity.session_synced(node, turn.session_id, turn.alias):
            return True
        record = turn_messages(turn.protocol, cut.body(turn.body, whole=True), first=not turn.history) \
            if cut is not None else None
        if record is None:
            return False
        try:
            await self.store.save_transcript(turn.session_id, turn.alias, [*turn.history, *record])
        except HearthError as e:
            log.warning("session %s: the turn is in no copy: %s", turn.session_id, e)
            return False
        self.metrics.transcripts_from_relay.inc()
        log.warning("session %s: %s answered but its transcript could not be copied; the turn is recorded from "
                    "what the gateway relayed", turn.session_id, node.name)
        return True
