"""Real Hearth servers for end-to-end tests: started on a free port with the real model, waited
for until healthy, stopped. The fixtures that hold them live in the conftest.py files."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.helpers.polling import wait_until
from tests.helpers.prometheus import sample

# Request fields for a run that must be bit-exact: recompute the whole prompt instead of reusing a
# cached prefix (one left by an earlier test can move the last bits of the logits).
EXACT: dict[str, object] = {"cache_prompt": False}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def metric(self, name: str, headers: dict[str, str] | None = None) -> float:
        """One sample of the server's /metrics (see `sample`); KeyError while it has none."""
        return sample(httpx.get(f"{self.url}/metrics", timeout=10, headers=headers).text, name)

    def wait_metric(self, name: str, ok: Callable[[float], bool], headers: dict[str, str] | None = None,
                    timeout: float = 120.0) -> None:
        """Wait until the metric satisfies `ok` (the server got there), failing after `timeout`."""
        wait_until(lambda: ok(self.metric(name, headers)), f"{name} to reach the expected value", timeout)


def start_server(tmp: Path, *args: str, ready_timeout: float = 120.0, port: int | None = None,
                 env: dict[str, str] | None = None) -> Server:
    """A server on `port` (default: a free one); `tmp` holds its log and data dir (`tmp/home`), so
    a server started again with the same `tmp` and port is the same node restarted. `env` is
    added to this process's environment."""
    port = port or free_port()
    log = tmp / f"server-{port}.log"  # appended to: a restarted node keeps its earlier log
    env = {**os.environ, **(env or {}), "HEARTH_HOME": str(tmp / "home")}
    cmd = [sys.executable, "-m", "hearth.cli.main", "serve", "--port", str(port), "--threads", "2", *args]
    with log.open("ab") as out:  # the child keeps its own descriptor; ours is closed at once
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_healthy("server", proc, url, log, ready_timeout)
    return Server(url, proc, log)


def wait_healthy(what: str, proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float,
                 path: str = "/health", headers: dict[str, str] | None = None) -> None:
    """Until `url` + `path` answers 200; RuntimeError with the log if the process exits or time
    runs out (then it is killed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + path, headers=headers, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{what} did not become ready:\n{log.read_text()}")


def stop_server(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(15)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(5)
