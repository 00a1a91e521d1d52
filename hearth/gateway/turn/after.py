"""After a successful answer, before its last event goes out: where the conversation now lives
(affinity, a response's owner and chain), the session's transcript copied from its node (or,
when the node died right after answering, recorded from what the gateway relayed:
failover/record.py), the caller's usage spent, and the routing metrics."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from hearth.errors import HearthError
from hearth.gateway.failover.cuts import Cut
from hearth.gateway.failover.record import turn_messages
from hearth.gateway.failover.restore import Continuity
from hearth.gateway.fleet.pool import Lease, Pool
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.routing.affinity import Affinity
from hearth.gateway.settings import GatewaySettings
from hearth.gateway.store.base import GatewayStore
from hearth.gateway.turn.request import Turn
from hearth.gateway.turn.scan import Scan
from hearth.http.key_usage import KeyAccounts
from hearth.tenants import Caller

log = logging.getLogger("hearth.gateway")

MIGRATED = "(migrated)"  # the owner of a response finished by another node than the one that began it


class AfterTurn:
    def __init__(self, settings: GatewaySettings, pool: Pool, store: GatewayStore, metrics: GatewayMetrics,
                 continuity: Continuity) -> None:
        self.settings = settings
        self.pool = pool
        self.store = store
        self.metrics = metrics
        self.continuity = continuity
        self.accounts: KeyAccounts | None = None  # usage per client key, when the app counts it

    def spend(self, who: Caller, scan: Scan) -> None:
        """The answer's usage, as relayed, to the caller's key (hearth/http/key_usage.py)."""
        if self.accounts is not None and not who.admin:
            self.accounts.spend(who.key_name, scan.whole_prompt or 0, scan.completion or 0, scan.cached or 0,
                                who.on_behalf)

    async def record(self, lease: Lease, turn: Turn, scan: Scan, cut: Cut | None = None) -> bool:
        """A successful answer from `lease`'s node: remember where the conversation now lives.
        A session turn's transcript is copied from that node before the answer's last event
        goes out (so the gateway's copy holds every turn a client saw answered). When the copy
        fails (the node died right after answering), a streamed turn is recorded from what the
        gateway relayed (`cut`, failover/record.py). False: the turn is in no copy."""
        node = lease.node
        # A session's prompt holds its transcript, which `hashes` (history + items) stand for too.
        node.prefixes.add(turn.hashes, scan.whole_prompt)
        await self._bindings(lease, turn, scan)
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

    async def _bindings(self, lease: Lease, turn: Turn, scan: Scan) -> None:
        node = lease.node
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


@dataclass(slots=True)
class TurnEnd:
    """`AfterTurn.record` for one streamed turn, as the relay calls it when the terminal event
    arrives (from whichever node ended the answer)."""

    after: AfterTurn
    turn: Turn
    cut: Cut | None

    async def record(self, scan: Scan, lease: Lease) -> bool:
        return await self.after.record(lease, self.turn, scan, self.cut)
