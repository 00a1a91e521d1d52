"""The gateway's store, one set of tests run against both backends: SQLite (a file) and a real
PostgreSQL server (tests/helpers/postgres.py), through the one interface (transcripts.py)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from hearth.errors import Unavailable
from hearth.gateway.store.base import MAX_CHAIN, GatewayStore
from hearth.gateway.store.postgres import PostgresStore, redacted
from hearth.gateway.store.schema import VERSION
from hearth.gateway.store.sqlite import SqliteStore
from hearth.protocols.responses_log import ORPHAN_ERROR
from tests.helpers.postgres import PASSWORD, Postgres


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[GatewayStore]:
    s = await _open(request.param, tmp_path, request)
    yield s
    await s.close()


async def _open(kind: str, tmp_path: Path, request: pytest.FixtureRequest, instance: str = "g1") -> GatewayStore:
    if kind == "sqlite":
        s: GatewayStore = SqliteStore(tmp_path / "gateway.sqlite3")
    else:
        pg: Postgres = request.getfixturevalue("postgres")
        url = getattr(request.node, "_database", None) or pg.create_database()
        request.node._database = url  # a second gateway of the same test opens the same database
        s = PostgresStore(url, instance)
    await s.open()
    return s


async def test_bindings_follow_their_last_assignment(store: GatewayStore) -> None:
    assert await store.node_of("session:s1") is None
    await store.assign("session:s1", "a")
    await store.assign("session:s2", "a")
    await store.assign("response:r1", "a")
    await store.assign("session:s1", "b")
    assert await store.node_of("session:s1") == "b"
    assert await store.keys_on("a") == ["session:s2"]
    assert await store.counts() == {"a": 1, "b": 1}
    assert await store.counts("response") == {"a": 1}
    await store.forget("session:s1")
    assert await store.node_of("session:s1") is None


async def test_transcripts_round_trip_and_a_deleted_session_goes_whole(store: GatewayStore) -> None:
    messages = [{"role": "user", "content": "héllo ✓"}, {"role": "assistant", "content": "hi"}]
    await store.save_transcript("s1", "smol", messages)
    assert await store.transcript("s1") == ("smol", messages)
    await store.save_transcript("s1", "smol", messages[:1])  # the node's latest copy replaces the last
    assert await store.transcript("s1") == ("smol", messages[:1])
    await store.assign("session:s1", "a")
    await store.drop_session("s1")
    assert await store.transcript("s1") is None and await store.node_of("session:s1") is None


async def test_a_chain_is_read_whole_or_not_at_all(store: GatewayStore) -> None:
    await store.save_response("r1", None, [{"n": 1}])
    await store.save_response("r2", "r1", [{"n": 2}, {"n": 3}])
    await store.save_response("r3", "r2", [{"n": 4}])
    assert await store.chain("r3") == [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}]
    assert await store.chain("r1") == [{"n": 1}]
    await store.save_response("r5", "r4", [{"n": 5}])  # r4 was never stored: a link is missing
    assert await store.chain("r5") is None
    assert await store.chain("nope") is None


async def test_a_chain_longer_than_the_bound_keeps_its_last_turns(store: GatewayStore) -> None:
    previous = None
    for i in range(MAX_CHAIN + 5):
        await store.save_response(f"r{i}", previous, [i])
        previous = f"r{i}"
    assert await store.chain(previous) == list(range(5, MAX_CHAIN + 5))


async def test_owners_and_members(store: GatewayStore) -> None:
    assert await store.owner_of("session", "s1") is None
    await store.set_owner("session", "s1", "team-a")
    await store.set_owner("response", "s1", "")
    await store.set_owner("session", "s1", "team-b")
    assert await store.owner_of("session", "s1") == "team-b" and await store.owner_of("response", "s1") == ""
    await store.renew_member("n1", "http://10.0.0.1:8000", {"models": {"smol": "m"}}, 30)
    await store.renew_member("n0", "http://10.0.0.2:8000", {}, -1)  # expired: listed all the same
    members = await store.members()
    assert [(m["name"], m["url"], m["spec"]) for m in members] == [
        ("n0", "http://10.0.0.2:8000", {}), ("n1", "http://10.0.0.1:8000", {"models": {"smol": "m"}})]
    assert members[0]["expires"] < members[1]["expires"]
    assert await store.remove_member("n0") and not await store.remove_member("n0")
    assert [m["name"] for m in await store.members()] == ["n1"]


async def test_background_rows_and_their_end(store: GatewayStore) -> None:
    response = {"id": "resp_1", "status": "in_progress", "output": []}
    await store.save_background(response)
    assert await store.background("resp_1") == response
    await store.save_background({**response, "status": "completed"})
    assert (await store.background("resp_1") or {})["status"] == "completed"
    assert await store.drop_background("resp_1") and not await store.drop_background("resp_1")
    assert await store.background("resp_1") is None


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_runs_of_a_gateway_that_is_gone_are_failed_and_a_live_ones_are_not(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    first = await _open(kind, tmp_path, request, "g1")
    await first.save_background({"id": "resp_1", "status": "in_progress", "output": []})
    if kind == "sqlite":  # one gateway per file: the one that opens it next is the only one
        await first.close()
        second = await _open(kind, tmp_path, request, "g2")
        assert second.orphans == 1
    else:  # several gateways share it: g1's run stands while g1 renews its lease
        second = await _open(kind, tmp_path, request, "g2")
        assert second.orphans == 0 and (await second.background("resp_1") or {})["status"] == "in_progress"
        assert await second.live_gateways() == {"g1", "g2"}
        await first.renew_gateway(ttl=-1)  # g1 was killed: its lease ran out
        assert await second.fail_orphans() == 1
        await first.close()
    failed = await second.background("resp_1") or {}
    assert failed["status"] == "failed" and failed["error"] == dict(ORPHAN_ERROR)
    await second.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_migrations_apply_once_even_when_gateways_open_together(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    stores = await asyncio.gather(*(_open(kind, tmp_path, request, f"g{i}") for i in range(3)))
    assert [await s.migrate() for s in stores] == [VERSION] * 3
    for s in stores:
        await s.close()
    if kind == "sqlite":
        db = sqlite3.connect(tmp_path / "gateway.sqlite3")
        versions = [r[0] for r in db.execute("SELECT version FROM schema_version ORDER BY version")]
        db.close()
    else:
        async with await psycopg.AsyncConnection.connect(request.node._database) as conn:
            versions = [r[0] for r in await (await conn.execute(
                "SELECT version FROM schema_version ORDER BY version")).fetchall()]
    assert versions == list(range(1, VERSION + 1))


async def test_a_file_of_before_versions_is_migrated_with_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "gateway.sqlite3"
    db = sqlite3.connect(path)  # the schema the SQLite store had before migrations
    db.executescript("""
        CREATE TABLE affinity (key TEXT PRIMARY KEY, node TEXT NOT NULL, updated REAL NOT NULL);
        CREATE TABLE transcripts (session_id TEXT PRIMARY KEY, model TEXT NOT NULL, messages TEXT NOT NULL,
                                  updated REAL NOT NULL);
        CREATE TABLE responses (id TEXT PRIMARY KEY, previous TEXT, items TEXT NOT NULL, updated REAL NOT NULL);
        CREATE TABLE background (id TEXT PRIMARY KEY, status TEXT NOT NULL, response TEXT NOT NULL,
                                 updated REAL NOT NULL);""")
    db.execute("INSERT INTO affinity VALUES ('session:s1', 'a', 1.0)")
    db.execute("INSERT INTO background VALUES ('resp_1', 'in_progress', ?, 1.0)",
               (json.dumps({"id": "resp_1", "status": "in_progress"}),))
    db.commit()
    db.close()
    store = SqliteStore(path)
    await store.open()
    assert await store.node_of("session:s1") == "a"
    assert store.orphans == 1 and (await store.background("resp_1") or {})["status"] == "failed"
    await store.close()


async def test_a_database_that_is_away_is_a_503_with_retry_after_and_the_store_comes_back(
        request: pytest.FixtureRequest, postgres: Postgres) -> None:
    store = PostgresStore(postgres.create_database(), "g1")
    await store.open()
    await store.assign("session:s1", "a")
    postgres.stop()
    try:
        with pytest.raises(Unavailable) as e:
            await store.node_of("session:s1")
        assert e.value.status == 503 and e.value.retry_after and e.value.code == "database_unavailable"
        assert PASSWORD not in str(e.value)
    finally:
        postgres.start()
    assert await store.node_of("session:s1") == "a"  # the pool reconnected by itself
    await store.close()


def test_a_urls_password_is_never_shown() -> None:
    assert redacted("postgresql://u:s3cret@db:5432/h") == "postgresql://u:***@db:5432/h"
    assert redacted("postgresql://db/h") == "postgresql://db/h"


async def test_a_failed_write_leaves_nothing_half_written(store: GatewayStore) -> None:
    await store.assign("session:s1", "a")
    await store.save_transcript("s1", "smol", [{"role": "user", "content": "x"}])
    with pytest.raises(RuntimeError):
        async with store._tx() as tx:
            await tx.execute("DELETE FROM affinity WHERE key = ?", ("session:s1",))
            raise RuntimeError("the second statement never ran")
    assert await store.node_of("session:s1") == "a"


async def test_a_move_is_recorded_as_it_goes_and_one_gateway_claims_an_orphan(store: GatewayStore) -> None:
    assert await store.begin_move("s1", "a", "b")
    assert not await store.begin_move("s1", "a", "c")  # one move of a session at a time
    await store.move_saved("s1", "snap_1")
    [move] = await store.moves()
    assert (move.session_id, move.src, move.dst, move.snapshot, move.state, move.gateway) == (
        "s1", "a", "b", "snap_1", "copying", store.instance)
    await store.move_assigned("s1", "b")
    assert await store.node_of("session:s1") == "b" and (await store.moves())[0].state == "assigned"
    store.instance = "survivor"  # as another gateway on the same database
    assert await store.claim_move(move)  # a survivor takes it over...
    assert not await store.claim_move(move)  # ...and only one: the row's gateway changed
    assert (await store.moves())[0].gateway == "survivor"
    await store.end_move("s1")
    assert await store.moves() == []


async def test_drains_are_recorded_and_a_running_one_claimed_once(store: GatewayStore) -> None:
    await store.set_drain("a", "running")
    await store.set_drain("b", "drained")
    assert await store.drains() == {"a": ("running", store.instance), "b": ("drained", store.instance)}
    first = store.instance
    store.instance = "survivor"
    assert await store.claim_drain("a", first) and not await store.claim_drain("a", first)
    assert not await store.claim_drain("b", first)  # a finished drain has nothing to continue
    await store.set_drain("a", None)
    assert list(await store.drains()) == ["b"]
