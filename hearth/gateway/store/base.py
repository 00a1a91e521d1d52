"""What the gateway must not lose, in a database: SQLite under its data dir (one gateway, the
default) or PostgreSQL (`--database postgresql://…`, postgres.py: any number of gateways
share it). One interface (`GatewayStore`), one schema (schema.py); every method is a
coroutine. The tables:

- `affinity`: binding keys (a session, a response chain) → the node that holds them;
- `transcripts`: every session's conversation as its node last reported it (OpenAI-shaped
  messages, the node's `/history`), so a session whose node died continues elsewhere,
  re-prefilled from it;
- `responses`: each stored Responses turn on a Hearth node (its input items and output items,
  and the response it continued), so a `previous_response_id` chain whose node died is replayed
  as input items on another node;
- `background`: the response object of each background response a gateway runs
  (`background.py`): `in_progress` while it runs, final once it ended, so a GET answers after
  its events expired or the gateway restarted. Rows still running whose gateway is gone (killed:
  it renews its row in `gateways` no more) are failed (`server_restarted`, as a node's);
- `owners`: which tenant created a session, a response, a background run;
- `members`: nodes that joined the fleet at run time, each with its lease;
- `gateways`: each live gateway's lease (store/postgres.py renews it);
- `moves`: a session move in progress, with the gateway that runs it and how far it got
  (fleet/moves.py): a survivor finishes or rolls back a dead gateway's (leases.py);
- `drains`: nodes out of routing for every gateway, and the gateway moving their sessions off.

The SQL is written once, with `?` placeholders and statements both databases take; a backend
supplies the connection (`_tx`). A write of several statements is one transaction; no
transaction is held across anything but its own statements (never an upstream call).
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any

from hearth.gateway.routing.affinity import KeyKind, key_of
from hearth.gateway.store.schema import MIGRATIONS
from hearth.gateway.store.tx import Tx
from hearth.protocols.responses_log import ORPHAN_ERROR

RUNNING = ("queued", "in_progress")
MAX_CHAIN = 1000
GATEWAY_TTL = 15.0  # seconds a gateway's lease lasts unrenewed (--lease-ttl; leases.py renews it)

_CHAIN = f"""WITH RECURSIVE c(id, previous, items, depth) AS (
    SELECT id, previous, items, 0 FROM responses WHERE id = ?
    UNION ALL
    SELECT r.id, r.previous, r.items, c.depth + 1 FROM responses r JOIN c ON r.id = c.previous
    WHERE c.depth < {MAX_CHAIN - 1})
SELECT previous, items FROM c ORDER BY depth"""


@dataclass(frozen=True, slots=True)
class Move:
    """A move in progress. `state`: saving (the source saves a snapshot), copying (`snapshot`
    goes to the destination), assigned (the session is the destination's: what is left is
    deleting the copies)."""

    session_id: str
    src: str
    dst: str
    snapshot: str | None
    state: str
    gateway: str


class GatewayStore:
    """The interface, and its logic over a backend's `_tx`."""

    instance: str  # this gateway's id in `gateways`, `background.gateway` and `moves.gateway`
    orphans: int = 0  # background runs failed because their gateway was gone, when this one opened
    lease_ttl: float = GATEWAY_TTL
    day_sql = "date(at, 'unixepoch')"  # a unix time's UTC day, YYYY-MM-DD (the usage ledger's grouping)

    def _tx(self, migrate: bool = False) -> contextlib.AbstractAsyncContextManager[Tx]:
        """A transaction: committed when the block ends, rolled back if it raises. `migrate`:
        the one that applies migrations, serialized across every gateway on the database."""
        raise NotImplementedError

    async def open(self) -> None:
        """Apply migrations, register this gateway, fail the runs of gateways that are gone."""
        await self.migrate()
        await self.renew_gateway()
        await self.fail_orphans()

    async def close(self) -> None:
        raise NotImplementedError

    async def migrate(self) -> int:
        """Apply every migration the database lacks; the schema version after."""
        async with self._tx(migrate=True) as tx:
            await tx.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = await tx.fetchone("SELECT MAX(version) FROM schema_version")
            version = int(row[0]) if row and row[0] is not None else 0
            for number, statements in MIGRATIONS:
                if number > version:
                    for statement in statements:
                        if isinstance(statement, str):
                            await tx.execute(statement)
                        else:
                            await statement(tx)  # a data step (schema.py)
                    await tx.execute("INSERT INTO schema_version VALUES (?)", (number,))
                    version = number
        return version

    # ---- binding keys --------------------------------------------------------------------------

    async def node_of(self, key: str) -> str | None:
        async with self._tx() as tx:
            row = await tx.fetchone("SELECT node FROM affinity WHERE key = ?", (key,))
        return row[0] if row else None

    async def assign(self, key: str, node: str) -> None:
        async with self._tx() as tx:
            await tx.execute("INSERT INTO affinity VALUES (?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
                             "node = excluded.node, updated = excluded.updated", (key, node, time.time()))

    async def forget(self, key: str) -> None:
        async with self._tx() as tx:
            await tx.execute("DELETE FROM affinity WHERE key = ?", (key,))

    async def keys_on(self, node: str, kind: KeyKind = "session") -> list[str]:
        async with self._tx() as tx:
            rows = await tx.fetchall("SELECT key FROM affinity WHERE node = ? AND key LIKE ? ORDER BY updated",
                                     (node, key_of(kind, "%")))
        return [r[0] for r in rows]

    async def counts(self, kind: KeyKind = "session") -> dict[str, int]:
        async with self._tx() as tx:
            rows = await tx.fetchall("SELECT node, COUNT(*) FROM affinity WHERE key LIKE ? GROUP BY node",
                                     (key_of(kind, "%"),))
        return {r[0]: int(r[1]) for r in rows}

    # ---- transcripts ---------------------------------------------------------------------------

    async def transcript(self, session_id: str) -> tuple[str, list[dict[str, Any]]] | None:
        """(model alias, messages) or None."""
        async with self._tx() as tx:
            row = await tx.fetchone("SELECT model, messages FROM transcripts WHERE session_id = ?", (session_id,))
        if row is None:
            return None
        messages = json.loads(row[1])
        return row[0], messages if isinstance(messages, list) else []

    async def save_transcript(self, session_id: str, model: str, messages: list[dict[str, Any]]) -> None:
        async with self._tx() as tx:
            await tx.execute("INSERT INTO transcripts VALUES (?, ?, ?, ?) ON CONFLICT(session_id) DO UPDATE SET "
                             "model = excluded.model, messages = excluded.messages, updated = excluded.updated",
                             (session_id, model, json.dumps(messages, ensure_ascii=False), time.time()))

    async def drop_transcript(self, session_id: str) -> None:
        async with self._tx() as tx:
            await tx.execute("DELETE FROM transcripts WHERE session_id = ?", (session_id,))

    async def drop_session(self, session_id: str) -> None:
        """A deleted session: its binding, its transcript and its owner, together."""
        async with self._tx() as tx:
            await tx.execute("DELETE FROM affinity WHERE key = ?", (key_of("session", session_id),))
            await tx.execute("DELETE FROM transcripts WHERE session_id = ?", (session_id,))
            await tx.execute("DELETE FROM owners WHERE kind = 'session' AND id = ?", (session_id,))

    # ---- response chains -----------------------------------------------------------------------

    async def save_response(self, response_id: str, previous: str | None, items: list[Any]) -> None:
        async with self._tx() as tx:
            await tx.execute("INSERT INTO responses VALUES (?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
                             "previous = excluded.previous, items = excluded.items, updated = excluded.updated",
                             (response_id, previous, json.dumps(items, ensure_ascii=False), time.time()))

    async def chain(self, response_id: str) -> list[Any] | None:
        """Every item of the chain ending at `response_id`, oldest first (its last MAX_CHAIN
        turns); None if a link is missing. One query (a recursive one), not one per link."""
        async with self._tx() as tx:
            rows = await tx.fetchall(_CHAIN, (response_id,))
        if not rows or (rows[-1][0] is not None and len(rows) < MAX_CHAIN):
            return None
        return [item for _, items in reversed(rows) for item in json.loads(items)]

    # ---- background responses ------------------------------------------------------------------

    async def save_background(self, response: dict[str, Any]) -> None:
        async with self._tx() as tx:
            await tx.execute("INSERT INTO background (id, status, response, updated, gateway) VALUES (?, ?, ?, ?, ?) "
                             "ON CONFLICT(id) DO UPDATE SET status = excluded.status, response = excluded.response, "
                             "updated = excluded.updated, gateway = excluded.gateway",
                             (response["id"], str(response.get("status")), json.dumps(response, ensure_ascii=False),
                              time.time(), self.instance))

    async def background(self, response_id: str) -> dict[str, Any] | None:
        async with self._tx() as tx:
            row = await tx.fetchone("SELECT response FROM background WHERE id = ?", (response_id,))
        response = json.loads(row[0]) if row else None
        return response if isinstance(response, dict) else None

    async def drop_background(self, response_id: str) -> bool:
        async with self._tx() as tx:
            return await tx.execute("DELETE FROM background WHERE id = ?", (response_id,)) > 0

    # ---- gateways ------------------------------------------------------------------------------

    async def renew_gateway(self, ttl: float | None = None) -> None:
        ttl = self.lease_ttl if ttl is None else ttl
        async with self._tx() as tx:
            await tx.execute("INSERT INTO gateways VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET "
                             "expires = excluded.expires", (self.instance, time.time() + ttl))

    async def live_gateways(self) -> set[str]:
        async with self._tx() as tx:
            rows = await tx.fetchall("SELECT id FROM gateways WHERE expires > ?", (time.time(),))
        return {r[0] for r in rows}

    async def fail_orphans(self) -> int:
        """Runs left `queued` / `in_progress` by a gateway that is gone (killed, its lease
        expired): failed, as a node fails its own (`hearth.protocols.responses_log.ORPHAN_ERROR`). One
        transaction: each row is read and rewritten under it."""
        n = 0
        async with self._tx() as tx:
            now = time.time()
            await tx.execute("DELETE FROM gateways WHERE expires <= ?", (now,))
            rows = await tx.fetchall(f"SELECT response FROM background WHERE status IN {RUNNING} "
                                     "AND gateway NOT IN (SELECT id FROM gateways)")
            for (raw,) in rows:
                response = json.loads(raw)
                response.update(status="failed", error=dict(ORPHAN_ERROR))
                n += await tx.execute(f"UPDATE background SET status = 'failed', response = ?, updated = ? "
                                      f"WHERE id = ? AND status IN {RUNNING}",
                                      (json.dumps(response, ensure_ascii=False), now, response["id"]))
        self.orphans += n
        return n

    # ---- moves and drains ----------------------------------------------------------------------

    async def begin_move(self, session_id: str, src: str, dst: str) -> bool:
        """Record a move this gateway starts; False when one of the session is in progress."""
        async with self._tx() as tx:
            return await tx.execute("INSERT INTO moves VALUES (?, ?, ?, NULL, 'saving', ?, ?) "
                                    "ON CONFLICT(session_id) DO NOTHING",
                                    (session_id, src, dst, self.instance, time.time())) > 0

    async def move_saved(self, session_id: str, snapshot: str) -> None:
        async with self._tx() as tx:
            await tx.execute("UPDATE moves SET snapshot = ?, state = 'copying', updated = ? WHERE session_id = ?",
                             (snapshot, time.time(), session_id))

    async def move_assigned(self, session_id: str, dst: str) -> None:
        """The session is the destination's: its binding and the move's state, together."""
        async with self._tx() as tx:
            await tx.execute("INSERT INTO affinity VALUES (?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
                             "node = excluded.node, updated = excluded.updated",
                             (key_of("session", session_id), dst, time.time()))
            await tx.execute("UPDATE moves SET state = 'assigned', updated = ? WHERE session_id = ?",
                             (time.time(), session_id))

    async def end_move(self, session_id: str) -> None:
        async with self._tx() as tx:
            await tx.execute("DELETE FROM moves WHERE session_id = ?", (session_id,))

    async def moves(self) -> list[Move]:
        async with self._tx() as tx:
            rows = await tx.fetchall("SELECT session_id, src, dst, snapshot, state, gateway FROM moves "
                                     "ORDER BY updated")
        return [Move(*r) for r in rows]

    async def claim_move(self, move: Move) -> bool:
        """Take over a move of a gateway that is gone; False when another gateway took it first."""
        async with self._tx() as tx:
            return await tx.execute("UPDATE moves SET gateway = ?, updated = ? WHERE session_id = ? AND gateway = ?",
                                    (self.instance, time.time(), move.session_id, move.gateway)) > 0

    async def set_drain(self, node: str, state: str | None) -> None:
        """`running` (this gateway moves its sessions off), `drained`, or None (undrained)."""
        async with self._tx() as tx:
            if state is None:
                await tx.execute("DELETE FROM drains WHERE node = ?", (node,))
            else:
                await tx.execute("INSERT INTO drains VALUES (?, ?, ?, ?) ON CONFLICT(node) DO UPDATE SET "
                                 "state = excluded.state, gateway = excluded.gateway, updated = excluded.updated",
                                 (node, state, self.instance, time.time()))

    async def drains(self) -> dict[str, tuple[str, str]]:
        """node → (state, gateway)."""
        async with self._tx() as tx:
            rows = await tx.fetchall("SELECT node, state, gateway FROM drains")
        return {r[0]: (r[1], r[2]) for r in rows}

    async def claim_drain(self, node: str, gateway: str) -> bool:
        async with self._tx() as tx:
            return await tx.execute("UPDATE drains SET gateway = ?, updated = ? WHERE node = ? AND gateway = ? "
                                    "AND state = 'running'", (self.instance, time.time(), node, gateway)) > 0

    # ---- ownership (tenants) -------------------------------------------------------------------

    async def set_owner(self, kind: str, object_id: str, owner: str) -> None:
        async with self._tx() as tx:
            await tx.execute("INSERT INTO owners VALUES (?, ?, ?) ON CONFLICT(kind, id) DO UPDATE SET "
                             "owner = excluded.owner", (kind, object_id, owner))

    async def owner_of(self, kind: str, object_id: str) -> str | None:
        async with self._tx() as tx:
            row = await tx.fetchone("SELECT owner FROM owners WHERE kind = ? AND id = ?", (kind, object_id))
        return row[0] if row else None

    # ---- fleet membership ----------------------------------------------------------------------

    async def renew_member(self, name: str, url: str, spec: dict[str, Any], ttl: float) -> None:
        async with self._tx() as tx:
            await tx.execute("INSERT INTO members VALUES (?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
                             "url = excluded.url, spec = excluded.spec, expires = excluded.expires",
                             (name, url, json.dumps(spec, ensure_ascii=False), time.time() + ttl))

    async def members(self) -> list[dict[str, Any]]:
        async with self._tx() as tx:
            rows = await tx.fetchall("SELECT name, url, spec, expires FROM members ORDER BY name")
        return [{"name": r[0], "url": r[1], "spec": json.loads(r[2]), "expires": float(r[3])} for r in rows]

    async def remove_member(self, name: str) -> bool:
        async with self._tx() as tx:
            return await tx.execute("DELETE FROM members WHERE name = ?", (name,)) > 0
