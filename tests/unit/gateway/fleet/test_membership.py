"""A fleet that changes while it serves (gateway/fleet/membership.py): nodes that join, lapse, come
back, leave; two gateways on one database; the fleet file reloaded. Fakes: an httpx transport
for the nodes (every /health answers 200, no node holds a session) and a wall clock the test
moves."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from hearth.errors import BadRequest, Conflict, NotFound
from hearth.gateway.fleet.membership import Membership
from hearth.gateway.fleet.moves import Mover
from hearth.gateway.fleet.pool import Pool
from hearth.gateway.fleet.probes import Prober
from hearth.gateway.metrics import GatewayMetrics
from hearth.gateway.routing.affinity import Affinity
from hearth.gateway.settings import GatewaySettings, Upstream, load_upstreams
from hearth.gateway.store.sqlite import SqliteStore
from hearth.gateway.upstream.node_client import NodeClient
from tests.helpers import until

NONE = Affinity("none")
TTL, GRACE = 10.0, 30.0


def fleet_node(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/sessions":
        return httpx.Response(200, json={"object": "list", "data": []})
    return httpx.Response(200, json={"status": "ok"})


class Wall:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def toml(*names: str, cap: int = 2, kind: str = "hearth", model: str = "m") -> str:
    return "".join(f'[[upstream]]\nname = "{n}"\nurl = "http://{n}.test:8000"\nkind = "{kind}"\n'
                   f'models = {{ "{model}" = "model" }}\nmax_in_flight = {cap}\n\n' for n in names)


async def gateway(tmp_path: Path, ups: list[Upstream], wall: Wall, db: str = "g.sqlite3",
            fleet_file: Path | None = None) -> Membership:
    settings = GatewaySettings(upstreams=list(ups), data_dir=tmp_path, member_ttl=TTL, member_grace=GRACE,
                               upstreams_file=fleet_file)
    client = httpx.AsyncClient(transport=httpx.MockTransport(fleet_node))
    store = SqliteStore(tmp_path / db)
    await store.open()
    pool = Pool(settings, store, GatewayMetrics(), NodeClient(client))
    pool.metrics.watch_nodes(lambda: list(pool.nodes.values()), lambda: pool.waiting)
    for n in pool.nodes.values():
        n.live.probed(True)
    # The store writes unix time; the fake wall starts there and moves only when a test moves it.
    wall.now = wall.now or time.time()
    nodes = NodeClient(client)
    prober = Prober(settings, nodes, pool.metrics, lambda: list(pool.nodes.values()), pool.wake)
    return Membership(settings, pool, store, Mover(pool, store, nodes, GatewayMetrics()), prober, wall=wall)


def registration(name: str, **spec: Any) -> dict[str, Any]:
    return {"name": name, "url": f"http://{name}.test:8000", "kind": "hearth", "models": {"m": "model"},
            "max_in_flight": 2, "api_key": f"{name}-key", **spec}


async def joined_and_up(m: Membership, name: str) -> None:
    await until(lambda: name in m.pool.nodes and m.pool.nodes[name].live.up, f"{name} probed up")


async def test_store_members_round_trip_and_shared_by_two_stores_on_one_file(tmp_path: Path) -> None:
    one, two = SqliteStore(tmp_path / "g.sqlite3"), SqliteStore(tmp_path / "g.sqlite3")
    await one.open()
    await two.open()
    await one.renew_member("a", "http://a:1", {"models": {"m": "m"}}, 10)
    rows = await two.members()
    assert [(r["name"], r["url"], r["spec"]) for r in rows] == [("a", "http://a:1", {"models": {"m": "m"}})]
    await two.renew_member("a", "http://a:2", {}, -5)  # an upsert; expires is now + ttl
    assert (await one.members())[0]["url"] == "http://a:2"
    assert await one.remove_member("a") and not await two.remove_member("a")
    assert await two.members() == []


async def test_a_node_that_joins_takes_new_requests(tmp_path: Path) -> None:
    wall = Wall()
    m = await gateway(tmp_path, [Upstream("a", "http://a.test:8000", models={"m": "model"}, max_in_flight=1)], wall)
    answer = await m.join(registration("b"))
    assert answer["renew_every"] == pytest.approx(TTL / 3, abs=0.001)
    await joined_and_up(m, "b")
    node = m.pool.nodes["b"]
    assert node.source == "joined" and node.up.headers() == {"Authorization": "Bearer b-key"}
    assert [u.name for u in m.pool.aliases()["m"]] == ["a", "b"]
    first = await m.pool.acquire("m", NONE, [], 10)  # a is at its cap (1) after this: b takes the next
    second = await m.pool.acquire("m", NONE, [], 10)
    assert {first.node.name, second.node.name} == {"a", "b"}


async def test_a_node_that_stops_renewing_lapses_then_is_removed(tmp_path: Path) -> None:
    wall = Wall()
    m = await gateway(tmp_path, [Upstream("a", "http://a.test:8000", models={"m": "model"})], wall)
    await m.join(registration("b"))
    await joined_and_up(m, "b")
    wall.now += TTL + 1  # no renewal within its ttl
    await m.sync()
    b = m.pool.nodes["b"]
    assert b.lapsed and b.live.up and not b.routable(m.pool.clock())
    assert b'hearth_gateway_node_lapsed{node="b"} 1.0' in m.pool.metrics.render()
    leases = [await m.pool.acquire("m", NONE, [], 10) for _ in range(4)]
    assert {lease.node.name for lease in leases} == {"a"}  # up, but out of routing
    # renewed within the grace (the store stamps its own clock: the renewal as at the fake wall's time)
    reg = registration("b")
    await m.store.renew_member("b", reg.pop("url"), {k: v for k, v in reg.items() if k != "name"},
                                    TTL + wall.now - time.time())
    await m.sync()
    assert not b.lapsed and b.routable(m.pool.clock())
    wall.now += TTL + GRACE + 1
    await m.sync()
    assert "b" not in m.pool.nodes and await m.store.members() == []
    assert [u.name for u in m.pool.upstreams()] == ["a"]


async def test_a_node_registered_through_one_gateway_is_used_by_the_other(tmp_path: Path) -> None:
    wall = Wall()
    one = await gateway(tmp_path, [], wall)
    two = await gateway(tmp_path, [], wall)  # the same database file
    await one.join(registration("b"))
    assert "b" not in two.pool.nodes
    await two.sync()
    await joined_and_up(two, "b")
    assert (await two.pool.acquire("m", NONE, [], 10)).node.name == "b"
    await two.leave("b")  # left through the other gateway
    await one.sync()
    assert "b" not in one.pool.nodes and "b" not in two.pool.nodes


async def test_joining_refuses_bad_registrations_and_names_of_the_fleet_file(tmp_path: Path) -> None:
    wall = Wall()
    m = await gateway(tmp_path, [Upstream("a", "http://a.test:8000", models={"m": "model"}),
                           Upstream("o", "http://o.test:8000", kind="openai", models={"gpt": "model"})], wall)
    for bad in ({**registration("b"), "name": "../etc"}, {**registration("b"), "url": "ftp://b"},
                registration("b", kind="openai"), registration("b", models="m"), registration("b", max_in_flight=0),
                registration("b", api_key=""), registration("b", extra=1), {"url": "http://b.test:1"}):
        with pytest.raises(BadRequest):
            await m.join(bad)
    with pytest.raises(Conflict):
        await m.join(registration("a"))  # an upstream of the fleet file
    with pytest.raises(Conflict):
        await m.join(registration("b", models={"gpt": "model"}))  # served by an openai upstream
    with pytest.raises(Conflict):
        await m.leave("a")
    with pytest.raises(NotFound):
        await m.leave("nobody")
    assert await m.store.members() == [] and set(m.pool.nodes) == {"a", "o"}


async def test_a_node_that_rejoins_from_a_new_address_is_probed_there(tmp_path: Path) -> None:
    wall = Wall()
    m = await gateway(tmp_path, [], wall)
    await m.join(registration("b"))
    await joined_and_up(m, "b")
    await m.join({**registration("b"), "url": "http://b2.test:8000"})
    await joined_and_up(m, "b")
    assert m.pool.nodes["b"].up.url == "http://b2.test:8000"


async def test_reload_adds_changes_and_drains_out_removed_upstreams(tmp_path: Path) -> None:
    wall = Wall()
    path = tmp_path / "fleet.toml"
    path.write_text(toml("a", "b"))
    m = await gateway(tmp_path, load_upstreams(path), wall, fleet_file=path)
    await m.join(registration("j"))
    path.write_text(toml("a", cap=5) + toml("c"))
    result = await m.reload()
    assert (result["added"], result["changed"], result["removed"]) == (["c"], ["a"], ["b"])
    assert m.pool.nodes["a"].up.max_in_flight == 5
    await until(lambda: "b" not in m.pool.nodes, "b drained and removed")
    await until(lambda: m.pool.nodes["c"].live.up, "c probed up")
    assert set(m.pool.nodes) == {"a", "c", "j"} and m.pool.nodes["j"].source == "joined"


@pytest.mark.parametrize("text", ["[[upstream]\nname = ", toml("a") + toml("a"), toml("j"),
                                  toml("x", kind="openai", model="new"), '[[upstream]]\nname = "a"\n'])
async def test_a_bad_fleet_file_is_an_error_and_changes_nothing(tmp_path: Path, text: str) -> None:
    wall = Wall()
    path = tmp_path / "fleet.toml"
    path.write_text(toml("a", "b"))
    m = await gateway(tmp_path, load_upstreams(path), wall, fleet_file=path)
    await m.join(registration("j"))
    before = {n.name: n.up for n in m.pool.nodes.values()}
    path.write_text(text)
    with pytest.raises(BadRequest) as e:
        await m.reload()
    assert "unchanged" in e.value.message
    assert {n.name: n.up for n in m.pool.nodes.values()} == before
    assert not any(n.draining for n in m.pool.nodes.values())


async def test_reload_without_a_fleet_file_is_an_error(tmp_path: Path) -> None:
    m = await gateway(tmp_path, [], Wall())
    with pytest.raises(BadRequest):
        await m.reload()


async def test_a_store_that_fails_leaves_the_fleet_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    wall = Wall()
    m = await gateway(tmp_path, [Upstream("a", "http://a.test:8000", models={"m": "model"})], wall)
    await m.join(registration("b"))

    async def gone() -> list[dict[str, Any]]:
        raise OSError("database unreachable")

    monkeypatch.setattr(m.store, "members", gone)
    await m.start()  # does not raise: the loop tries again every interval
    await m.stop()
    assert set(m.pool.nodes) == {"a", "b"} and "database unreachable" in caplog.text
