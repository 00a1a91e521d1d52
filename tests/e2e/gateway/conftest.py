"""Real Hearth nodes (the default model, small context, two slots) on loopback ports behind a
real `hearth gateway` process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import Server, free_port, start_server

NODE_ARGS = ("--parallel", "2", "--ctx", "1024", "--threads", "1")  # several nodes share the cores
GW_KEY = "gw-key"
GW_ADMIN = "gw-admin"


def node_key(name: str) -> str:
    return f"node-{name}-key"


def start_nodes(tmp: Path, names: list[str]) -> dict[str, Server]:
    """Nodes in parallel, each with its own API and admin keys (never the gateway's)."""
    def one(name: str) -> Server:
        d = tmp / name
        d.mkdir()
        return start_server(d, *NODE_ARGS, "--api-key", node_key(name), "--admin-key", f"node-{name}-admin")

    with ThreadPoolExecutor(len(names)) as ex:
        return dict(zip(names, ex.map(one, names), strict=True))


def upstreams_toml(nodes: dict[str, Server], max_in_flight: int = 2) -> str:
    return "".join(f'[[upstream]]\nname = "{n}"\nurl = "{s.url}"\napi_key = "{node_key(n)}"\n'
                   f'admin_key = "node-{n}-admin"\nmodels = {{ "smol" = "smollm2-135m-instruct" }}\n'
                   f"max_in_flight = {max_in_flight}\n\n" for n, s in nodes.items())


@dataclass
class Gateway:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def admin(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return httpx.request(method, self.url + path, headers={"Authorization": f"Bearer {GW_ADMIN}"}, timeout=120,
                             **kw)

    def status(self) -> dict[str, Any]:
        return {n["name"]: n for n in self.admin("GET", "/admin/status").json()["nodes"]}

    def session_node(self, sid: str) -> str:
        return str(self.admin("GET", f"/admin/sessions/{sid}").json()["node"])

    def wait(self, ok: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)


def start_gateway(tmp: Path, toml: str, *args: str) -> Gateway:
    port = free_port()
    (tmp / f"fleet-{port}.toml").write_text(toml)
    log = tmp / f"gateway-{port}.log"
    env = {**os.environ, "HEARTH_GATEWAY_HOME": str(tmp / f"gw-{port}")}
    cmd = [sys.executable, "-m", "hearth.cli.main", "gateway", "--upstreams", str(tmp / f"fleet-{port}.toml"),
           "--port", str(port), "--api-key", GW_KEY, "--admin-key", GW_ADMIN, *args]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return Gateway(url, proc, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"gateway did not become ready:\n{log.read_text()}")


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
