"""A fleet that changes while it serves, with real processes: a gateway started over one node
from its fleet file ("a"), and a second real node that joins it at run time (`hearth serve
--join`, "b"). Two nodes are all it takes: b receives new conversations once it joined; b
stopped (SIGSTOP: it stops renewing) is taken out of routing (a conversation bound to it
continues on a), then removed, and comes back when it runs again; b drained with the join key
(its session moves to a with its KV) and shut down cleanly leaves at once; a second gateway on
the same database routes to b without b ever having talked to it; the fleet file is reloaded by
SIGHUP and the CLI, a bad one changing nothing. This module has its own gateway and nodes (not the package's fleet)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.e2e.gateway.conftest import GW_ADMIN, GW_KEY, NODE_ARGS, Gateway, node_key, start_node, stop
from tests.helpers import Server, free_port, start_server, stop_server, wait_until

JOIN_KEY = "gw-join-key"
TTL, GRACE = 2.0, 3.0  # the gateway's --member-ttl and --member-grace: short, so the test is too
MODEL = "smollm2-135m-instruct"  # a node that joins offers its models under their ids: the file does the same


def upstream(name: str, url: str) -> str:
    return (f'[[upstream]]\nname = "{name}"\nurl = "{url}"\napi_key = "{node_key(name)}"\n'
            f'admin_key = "node-{name}-admin"\nmodels = {{ "{MODEL}" = "{MODEL}" }}\nmax_in_flight = 2\n\n')


@dataclass
class Joined:
    gw: Gateway
    home: Path  # the gateway's data dir: its SQLite database
    toml: Path
    a: Server
    b: Server | None
    b_port: int
    tmp: Path

    def start_b(self) -> Server:
        (self.tmp / "b").mkdir(exist_ok=True)
        self.b = start_server(self.tmp / "b", *NODE_ARGS, "--api-key", "node-b-key", "--admin-key", "node-b-admin",
                              "--join", self.gw.url, "--join-key", JOIN_KEY, "--node-name", "b",
                              "--advertise-url", f"http://127.0.0.1:{self.b_port}", port=self.b_port)
        return self.b

    def nodes(self, gw: Gateway | None = None) -> dict[str, dict[str, object]]:
        return (gw or self.gw).status()

    def routed(self, name: str, gw: Gateway | None = None) -> bool:
        n = self.nodes(gw).get(name)
        return n is not None and bool(n["up"]) and not n["lapsed"] and not n["draining"]


def start_gateway(tmp: Path, home: Path, *args: str) -> Gateway:
    port = free_port()
    log = tmp / f"gateway-{port}.log"
    env = {**os.environ, "HEARTH_GATEWAY_HOME": str(home)}
    cmd = [sys.executable, "-m", "hearth.cli.main", "gateway", "--port", str(port), "--api-key", GW_KEY,
           "--admin-key", GW_ADMIN, "--join-key", JOIN_KEY, "--member-ttl", str(TTL), "--member-grace", str(GRACE),
           "--probe-interval", "0.3", "--probe-timeout", "3", *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    gw = Gateway(url, proc, log)
    wait_until(lambda: _answers(gw), "the gateway to answer", 60)
    return gw


def _answers(gw: Gateway) -> bool:
    assert gw.proc.poll() is None, gw.log.read_text()
    try:
        return gw.admin("GET", "/admin/status").status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def joined(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Joined]:
    tmp = tmp_path_factory.mktemp("joined")
    a = start_node(tmp, "a")
    toml = tmp / "fleet.toml"
    toml.write_text(upstream("a", a.url))
    home = tmp / "gw-home"
    gw = start_gateway(tmp, home, "--upstreams", str(toml))
    j = Joined(gw, home, toml, a, None, free_port(), tmp)
    j.start_b()
    yield j
    stop(gw.proc)
    for s in (a, j.b):
        if s is not None and s.proc.poll() is None:
            os.kill(s.proc.pid, signal.SIGCONT)
            stop_server(s)


@pytest.fixture
def fleet(joined: Joined) -> Joined:
    """Both nodes running and routed to (a test that failed may have left b stopped or gone)."""
    if joined.b is not None and joined.b.proc.poll() is None:
        os.kill(joined.b.proc.pid, signal.SIGCONT)
    else:
        joined.start_b()
    for name in ("a", "b"):
        if joined.nodes().get(name, {}).get("draining"):
            joined.gw.admin("POST", f"/admin/nodes/{name}/undrain")
    joined.gw.wait(lambda: joined.routed("a") and joined.routed("b"), "a and b routed to", 90)
    return joined


def new_conversation(gw: Gateway, i: int) -> str:
    """One new conversation (a fresh prompt, no key): the node that served it."""
    r = httpx.post(gw.base_url + "/chat/completions", headers={"Authorization": f"Bearer {GW_KEY}"}, timeout=120,
                   json={"model": MODEL, "max_tokens": 1,
                         "messages": [{"role": "user", "content": f"Conversation {i}: say one word."}]})
    assert r.status_code == 200, r.text
    return r.headers["x-hearth-upstream"]


def test_a_node_that_joins_receives_new_conversations(fleet: Joined) -> None:
    b = fleet.nodes()["b"]
    assert b["source"] == "joined" and b["url"] == f"http://127.0.0.1:{fleet.b_port}"
    # With a out of routing, the only node a new conversation can go to is the one that joined.
    fleet.gw.admin("POST", "/admin/nodes/a/drain")
    try:
        assert {new_conversation(fleet.gw, i) for i in range(3)} == {"b"}
    finally:
        fleet.gw.admin("POST", "/admin/nodes/a/undrain")


def test_a_node_that_stops_renewing_stops_receiving_new_conversations(fleet: Joined) -> None:
    assert fleet.b is not None
    sid = f"bound-{fleet.b_port}"  # a conversation bound to b: it fails over as a dead node's does
    turn(fleet.gw, sid, "Hello")
    if fleet.gw.session_node(sid) != "b":
        assert fleet.gw.admin("POST", f"/admin/sessions/{sid}/move", json={"to": "b"}).status_code == 200
    os.kill(fleet.b.proc.pid, signal.SIGSTOP)  # its renewals stop with it
    try:
        fleet.gw.wait(lambda: "b" not in fleet.nodes() or bool(fleet.nodes()["b"]["lapsed"]),
                      "b's registration to lapse", 60)
        assert {new_conversation(fleet.gw, 10 + i) for i in range(3)} == {"a"}
        turn(fleet.gw, sid, "Still there?")  # continued on a, from the gateway's transcript
        assert fleet.gw.session_node(sid) == "a"
        assert fleet.gw.admin("GET", f"/admin/sessions/{sid}").json()["transcript_messages"] >= 4
        fleet.gw.wait(lambda: "b" not in fleet.nodes(), "b removed after the grace", 60)
        assert "node b removed: it has not renewed" in fleet.gw.log.read_text()
    finally:
        os.kill(fleet.b.proc.pid, signal.SIGCONT)
    # running again, it renews: back in the fleet (the same registration, as if it had just joined)
    fleet.gw.wait(lambda: fleet.routed("b"), "b back in routing once it renews", 60)


def turn(gw: Gateway, sid: str, text: str) -> httpx.Response:
    r = httpx.post(gw.base_url + "/chat/completions", headers={"Authorization": f"Bearer {GW_KEY}"}, timeout=120,
                   json={"model": MODEL, "max_tokens": 2, "session_id": sid,
                         "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return r


def test_a_node_drained_with_the_join_key_then_shut_down_leaves_at_once(fleet: Joined) -> None:
    # What a Kubernetes node pod does when it stops (deploy/kubernetes/nodes.yaml): its preStop
    # drains it through the gateway with the join key (its sessions move, with their KV), then
    # SIGTERM: it leaves the fleet on its way out.
    assert fleet.b is not None
    sid = f"leaving-{fleet.b_port}"
    turn(fleet.gw, sid, "Hello")
    if fleet.gw.session_node(sid) != "b":
        assert fleet.gw.admin("POST", f"/admin/sessions/{sid}/move", json={"to": "b"}).status_code == 200
    out = subprocess.run([sys.executable, "-m", "hearth.cli.main", "gateway", "drain", "b", "--url", fleet.gw.url,
                          "--api-key", JOIN_KEY, "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [m["session_id"] for m in report["moved"]] == [sid] and report["failed"] == [], report
    assert fleet.gw.session_node(sid) == "a" and fleet.nodes()["b"]["draining"]
    usage = turn(fleet.gw, sid, "Again").json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"]  # continued on a from the moved KV
    left, lapsed = (fleet.gw.log.read_text().count(s) for s in ("node b left the fleet", "node b removed"))
    stop_server(fleet.b)  # SIGTERM: DELETE /admin/fleet/b
    fleet.b = None
    fleet.gw.wait(lambda: "b" not in fleet.nodes(), "b gone from the fleet", 30)
    log = fleet.gw.log.read_text()
    assert log.count("node b left the fleet") == left + 1 and log.count("node b removed") == lapsed


def test_a_second_gateway_on_the_same_database_routes_to_joined_nodes(fleet: Joined) -> None:
    # No fleet file, no node ever registered with it: b reaches it through the shared database.
    other = start_gateway(fleet.tmp, fleet.home)
    try:
        other.wait(lambda: fleet.routed("b", other), "the second gateway to route to b", 60)
        assert set(other.status()) == {"b"}
        assert new_conversation(other, 20) == "b"
    finally:
        stop(other.proc)


def test_the_fleet_file_reloads_on_sighup_and_from_the_cli(fleet: Joined) -> None:
    good = fleet.toml.read_text()
    try:
        fleet.toml.write_text(good + "[[upstream]\n")  # broken TOML
        fleet.gw.proc.send_signal(signal.SIGHUP)
        fleet.gw.wait(lambda: "fleet file not reloaded, the fleet is unchanged" in fleet.gw.log.read_text(),
                      "the bad file refused", 30)
        assert set(fleet.nodes()) == {"a", "b"}
        # an upstream added by SIGHUP (nothing listens at its address), removed again by the CLI
        fleet.toml.write_text(good + upstream("a2", f"http://127.0.0.1:{free_port()}"))
        fleet.gw.proc.send_signal(signal.SIGHUP)
        fleet.gw.wait(lambda: "a2" in fleet.nodes(), "a2 added", 30)
        assert fleet.nodes()["a2"]["source"] == "file" and fleet.routed("a")
    finally:
        fleet.toml.write_text(good)
    out = subprocess.run([sys.executable, "-m", "hearth.cli.main", "gateway", "reload", "--url", fleet.gw.url,
                          "--api-key", GW_ADMIN], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "removed: a2" in out.stdout
    fleet.gw.wait(lambda: "a2" not in fleet.nodes(), "a2 drained and removed", 30)
    assert fleet.gw.proc.poll() is None and fleet.routed("a") and fleet.routed("b")
