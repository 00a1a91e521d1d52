"""One fleet for the gateway's end-to-end tests, as issue 12 lays it out: three Hearth nodes
(the default model, small context, two slots) and llama-cpp-python's own server
(`python -m llama_cpp.server`, the same wheel) as a foreign `openai`-kind node, behind one real
`hearth gateway` process. The Hearth nodes serve the alias `smol`, the foreign engine its own
alias `foreign` (an alias is served by one kind of upstream, docs/gateway.md).

The fleet lives for the whole package. Tests that kill a node leave it dead; the `fleet`
fixture brings back what the next test needs (`Fleet.heal`: the same node restarted on its
port and data dir, then waited for until the gateway routes to it again), so no test depends on
which ran before it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from hearth.models import resolve_model
from tests.helpers import Server, free_port, start_server, stop_server, wait_healthy, wait_until

NODE_ARGS = ("--parallel", "2", "--ctx", "1024", "--threads", "1",  # several nodes share the cores
             "--sse-heartbeat", "0.5")  # a silent stream beats often: the gateway's stall timeout can be short
STALL_TIMEOUT = 5.0  # the fleet gateway's --stall-timeout (10 heartbeats of a Hearth node)
GW_KEY = "gw-key"
GW_ADMIN = "gw-admin"
FOREIGN_KEY = "foreign-key"
HEARTH = ("a", "b", "c")
# A Hearth node's run that outlasts, by seconds on any machine, what a test does while it runs
# (read a few pieces, then cancel, leave, kill or stop the node; a burst of requests): most of
# the node's context (--ctx 1024), with `ignore_eos` where it is sent, one token per step (no
# drafts: a repetitive story would otherwise be drafted several tokens a step).
LONG_TOKENS = 900
LONG_RUN: dict[str, Any] = {"max_tokens": LONG_TOKENS, "speculative": False}


def node_key(name: str) -> str:
    return f"node-{name}-key"


def start_node(tmp: Path, name: str, port: int | None = None) -> Server:
    """A node with its own API and admin keys (never the gateway's); data and log in `tmp/name`."""
    (tmp / name).mkdir(exist_ok=True)
    return start_server(tmp / name, *NODE_ARGS, "--api-key", node_key(name), "--admin-key", f"node-{name}-admin",
                        port=port)


def start_foreign(tmp: Path, port: int | None = None) -> Server:
    port = port or free_port()
    log = tmp / "llama_cpp_server.log"
    with log.open("ab") as out:  # the child keeps its own descriptor; ours is closed at once
        proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model",
                                 str(resolve_model("default").path), "--model_alias", "smollm2", "--port", str(port),
                                 "--n_ctx", "1024", "--n_threads", "1", "--api_key", FOREIGN_KEY,
                                 # by default it abandons a running request whenever another arrives (a
                                 # liveness probe included): it then ends the stream early without a finish
                                 # reason, which the gateway rightly reports as a broken stream
                                 "--interrupt_requests", "False"], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {FOREIGN_KEY}"},
                         timeout=2).status_code == 200:
                return Server(url, proc, log)
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)


def upstreams_toml(nodes: dict[str, Server], max_in_flight: int = 2) -> str:
    return "".join(f'[[upstream]]\nname = "{n}"\nurl = "{s.url}"\napi_key = "{node_key(n)}"\n'
                   f'admin_key = "node-{n}-admin"\nmodels = {{ "smol" = "smollm2-135m-instruct" }}\n'
                   f"max_in_flight = {max_in_flight}\n\n" for n, s in nodes.items())


@dataclass
class Gateway(Server):
    """A gateway process: a server (url, process, log, /v1) with admin routes."""

    def admin(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return httpx.request(method, self.url + path, headers={"Authorization": f"Bearer {GW_ADMIN}"}, timeout=120,
                             **kw)

    def status(self) -> dict[str, Any]:
        return {n["name"]: n for n in self.admin("GET", "/admin/status").json()["nodes"]}

    def session_node(self, sid: str) -> str:
        return str(self.admin("GET", f"/admin/sessions/{sid}").json()["node"])

    def wait(self, ok: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        wait_until(ok, what, timeout, interval=0.05)


def start_gateway(tmp: Path, toml: str, *args: str, home: Path | None = None, ready: str = "/health") -> Gateway:
    """A gateway on a free port, once `ready` answers 200 (to a client's key: /health is 503
    while no node is up); its store under `home` (default a new folder per start: give the same
    one to restart the same gateway)."""
    port = free_port()
    (tmp / f"fleet-{port}.toml").write_text(toml)
    log = tmp / f"gateway-{port}.log"
    env = {**os.environ, "HEARTH_GATEWAY_HOME": str(home or tmp / f"gw-{port}")}
    cmd = [sys.executable, "-m", "hearth.cli.main", "gateway", "--upstreams", str(tmp / f"fleet-{port}.toml"),
           "--port", str(port), "--api-key", GW_KEY, "--admin-key", GW_ADMIN, *args]
    with log.open("wb") as out:  # the child keeps its own descriptor; ours is closed at once
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_healthy("gateway", proc, url, log, 60, ready, {"Authorization": f"Bearer {GW_KEY}"})
    return Gateway(url, proc, log)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def node_get(node: Server, name: str, path: str) -> httpx.Response:
    return httpx.get(node.url + path, headers={"Authorization": f"Bearer {node_key(name)}"}, timeout=30)


def fleet_toml(nodes: dict[str, Server], foreign: Server) -> str:
    return upstreams_toml(nodes) + (
        f'[[upstream]]\nname = "foreign"\nurl = "{foreign.url}"\nkind = "openai"\napi_key = "{FOREIGN_KEY}"\n'
        'models = { "foreign" = "smollm2" }\nmax_in_flight = 2\n')


@dataclass
class Fleet:
    gw: Gateway
    nodes: dict[str, Server]  # the Hearth nodes, by upstream name
    foreign: Server
    tmp: Path

    def alive(self) -> list[str]:
        """Hearth nodes whose process runs (a SIGSTOPped one included)."""
        return [n for n, s in self.nodes.items() if s.proc.poll() is None]

    def kill(self, name: str) -> None:
        """kill -9."""
        proc = self.foreign.proc if name == "foreign" else self.nodes[name].proc
        proc.kill()
        proc.wait(10)

    def _restart(self, name: str) -> None:
        if name == "foreign":
            self.foreign = start_foreign(self.tmp, port=int(self.foreign.url.rsplit(":", 1)[1]))
        else:
            self.nodes[name] = start_node(self.tmp, name, port=int(self.nodes[name].url.rsplit(":", 1)[1]))

    def heal(self, hearth: int = len(HEARTH), foreign: bool = True) -> None:
        """At least `hearth` Hearth nodes (and the foreign one) running and routed to again:
        killed ones restarted on their port with their data dir (sessions come back from it), as
        a crashed node restarted by its supervisor would be; drained ones undrained."""
        dead = [n for n in self.nodes if self.nodes[n].proc.poll() is not None][:max(0, hearth - len(self.alive()))]
        if foreign and self.foreign.proc.poll() is not None:
            dead.append("foreign")
        if dead:
            with ThreadPoolExecutor(len(dead)) as ex:
                list(ex.map(self._restart, dead))
        wanted = self.alive() + (["foreign"] if foreign else [])
        for n, st in self.gw.status().items():
            if n in wanted and st["draining"]:  # a drain test that failed before its undrain
                self.gw.admin("POST", f"/admin/nodes/{n}/undrain")

        def routed() -> bool:
            status = self.gw.status()
            return all(status[n]["up"] and status[n]["breaker"] != "open" and not status[n]["draining"]
                       for n in wanted)

        self.gw.wait(routed, f"the gateway to route to {wanted} again")


@pytest.fixture(scope="package")
def whole_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    with ThreadPoolExecutor(len(HEARTH) + 1) as ex:
        futures = {n: ex.submit(start_node, tmp, n) for n in HEARTH}
        foreign_f = ex.submit(start_foreign, tmp)
        nodes = {n: f.result() for n, f in futures.items()}
        foreign = foreign_f.result()
    # Probes often (a killed node is seen down at once: its port refuses), but give a probe 3 s:
    # a healthy node on a loaded 2-core machine can be slow to answer one, and FALL (3) slow
    # answers in a row would mark it down and back up, failing the tests that count transitions.
    gw = start_gateway(tmp, fleet_toml(nodes, foreign), "--probe-interval", "0.3", "--probe-timeout", "3",
                       "--stall-timeout", str(STALL_TIMEOUT))
    fleet = Fleet(gw, nodes, foreign, tmp)
    yield fleet
    stop(gw.proc)
    for s in [*fleet.nodes.values(), fleet.foreign]:
        if s.proc.poll() is None:
            os.kill(s.proc.pid, signal.SIGCONT)  # a test that failed while a node was stopped
            stop_server(s)


@pytest.fixture
def fleet(whole_fleet: Fleet) -> Fleet:
    """The shared fleet, every node up and routed to."""
    whole_fleet.heal()
    return whole_fleet


# These three do not heal the fleet: a module whose tests need all of it uses `fleet`.
@pytest.fixture
def gw(whole_fleet: Fleet) -> Gateway:
    return whole_fleet.gw


@pytest.fixture
def nodes(whole_fleet: Fleet) -> dict[str, Server]:
    return whole_fleet.nodes


@pytest.fixture
def oai(gw: Gateway) -> Iterator[openai.OpenAI]:
    """The SDK client of a gateway test. Every client a test makes is closed by a fixture or a
    `with`: one left to the garbage collector leaks its pooled sockets, and the ResourceWarning
    (an error here) would land in whichever test collects it."""
    with openai.OpenAI(base_url=gw.base_url, api_key=GW_KEY, max_retries=0) as client:
        yield client  # and its connections closed after the test


@pytest.fixture
def ac(gw: Gateway) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=gw.url, api_key=GW_KEY, max_retries=0) as client:
        yield client


def cancel_at_first_piece(gw: Gateway, model: str, cancel_id: str, max_tokens: int,
                          **extra: Any) -> tuple[str | None, int, httpx.Response]:
    """Stream a long story through the gateway (the official SDK) and cancel it by id when its
    first text arrives: (its finish reason, the text pieces received, the cancel's answer)."""
    finish, pieces, cancelled = None, 0, None
    with openai.OpenAI(base_url=gw.base_url, api_key=GW_KEY, max_retries=0) as oai:
        stream = oai.chat.completions.create(model=model, max_tokens=max_tokens, stream=True,
                                             messages=[{"role": "user", "content": "Write a long story."}],
                                             extra_body={"cancel_id": cancel_id, **extra})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                pieces += 1
                if pieces == 1:
                    cancelled = httpx.post(gw.base_url + "/cancel", json={"cancel_id": cancel_id},
                                           headers={"Authorization": f"Bearer {GW_KEY}"})
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
    assert cancelled is not None, "no text arrived to cancel"
    return finish, pieces, cancelled
