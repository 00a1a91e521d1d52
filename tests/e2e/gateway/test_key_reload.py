"""The gateway's client keys reloaded without a restart, on a real `hearth gateway` over a real
node (docs/gateway.md, "Reloading the keys"): one SIGHUP reloads the fleet file and the key file,
each on its own, so a broken one of them does not stop the other. Every wait polls with a
deadline that only catches a hang; the verdicts are what the gateway then answers. This module
has its own gateway and node (not the package's fleet)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.e2e.gateway.conftest import GW_KEY, NODE_ARGS, Gateway, node_key, start_gateway, stop, upstreams_toml
from tests.helpers import Server, free_port, start_server, stop_server

pytestmark = pytest.mark.slow

ALICE, BOB, CAROL = "sk-gw-alice", "sk-gw-bob", "sk-gw-carol"


@dataclass
class World:
    gw: Gateway
    node: Server
    keys: Path
    toml: Path

    def status(self, key: str) -> int:
        return httpx.get(f"{self.gw.url}/v1/models", headers={"Authorization": f"Bearer {key}"},
                         timeout=60).status_code

    def upstreams(self) -> set[str]:
        return set(self.gw.status())


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    # the gateway carries tenants (it has a key file): the node trusts its key as a gateway's
    (tmp_path / "a").mkdir()
    node_keys = tmp_path / "node-keys.txt"
    node_keys.write_text(f"{node_key('a')} name=gateway role=gateway\n")
    node = start_server(tmp_path / "a", *NODE_ARGS, "--api-key-file", str(node_keys), "--admin-key", "node-a-admin")
    keys = tmp_path / "gw-keys.txt"
    keys.write_text(f"{ALICE} name=alice tenant=team-a\n{BOB} name=bob tenant=team-b\n")
    try:
        gw = start_gateway(tmp_path, upstreams_toml({"a": node}), "--api-key-file", str(keys))
    except BaseException:
        stop_server(node)
        raise
    toml = next(tmp_path.glob("fleet-*.toml"))
    try:
        yield World(gw, node, keys, toml)
    finally:
        stop(gw.proc)
        stop_server(node)


def test_one_sighup_reloads_keys_and_fleet_each_on_its_own(world: World) -> None:
    w = world
    good_fleet = w.toml.read_text()
    assert w.status(BOB) == 200 and w.status(CAROL) == 401

    # the key file changed, the fleet file broken: the keys are reloaded all the same
    w.keys.write_text(f"{ALICE} name=alice tenant=team-a\n{CAROL} name=carol tenant=team-c\n")
    w.toml.write_text(good_fleet + "[[upstream]\n")
    w.gw.proc.send_signal(signal.SIGHUP)
    w.gw.wait(lambda: w.status(CAROL) == 200, "the new key accepted after SIGHUP")
    assert w.status(BOB) == 401 and w.status(ALICE) == 200 and w.status(GW_KEY) == 200  # a flag's key: kept
    w.gw.wait(lambda: "fleet file not reloaded, the fleet is unchanged" in w.gw.log.read_text(),
              "the broken fleet file refused")
    assert w.upstreams() == {"a"}
    r = httpx.post(f"{w.gw.url}/v1/chat/completions", headers={"Authorization": f"Bearer {CAROL}"}, timeout=120,
                   json={"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                         "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text
    log = w.gw.log.read_text()
    # unchanged: alice and the --api-key flag's key
    assert "API keys reloaded: 1 added, 1 removed, 0 changed, 2 unchanged" in log and CAROL not in log

    # the fleet file changed (an upstream nothing listens at), the key file broken: the fleet is
    # reloaded, the keys in force stay
    w.toml.write_text(good_fleet + f'[[upstream]]\nname = "a2"\nurl = "http://127.0.0.1:{free_port()}"\n'
                      'models = { "smol" = "smollm2-135m-instruct" }\n')
    w.keys.write_text(f"{ALICE} name=alice\n{BOB} name=bob colour=blue\n")
    w.gw.proc.send_signal(signal.SIGHUP)
    w.gw.wait(lambda: "a2" in w.upstreams(), "the added upstream after SIGHUP")
    w.gw.wait(lambda: "API keys not reloaded" in w.gw.log.read_text(), "the broken key file refused")
    assert f"{w.keys}:2: unknown, empty or repeated key attribute 'colour'" in w.gw.log.read_text()
    assert w.status(CAROL) == 200 and w.status(BOB) == 401 and w.gw.proc.poll() is None
