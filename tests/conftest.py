"""Shared fixtures: a real Hearth server (real model, real port) for end-to-end tests."""

from __future__ import annotations

import gc
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    """What exists once the tests are collected (modules, their objects) lives for the whole run:
    moved out of the collector's sight, so the collection after each test (below) scans only
    what tests made, in milliseconds."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _collect_garbage_after_each_test() -> Iterator[None]:
    """Warnings are errors, and an object that leaks a file or socket warns when the garbage
    collector finalizes it: whenever that happens to run, so in whichever test is running then.
    Collecting after every test makes the warning, and the failure, land in the test that leaked,
    every time."""
    yield
    gc.collect()


# Request fields for a run that must be bit-exact: recompute the whole prompt instead of reusing a
# cached prefix (one left by an earlier test can move the last bits of the logits).
EXACT: dict[str, object] = {"cache_prompt": False}


def wait_until(condition: Callable[[], bool], what: str = "the condition", timeout: float = 120.0) -> None:
    """Poll `condition` until it holds; the deadline only catches a hang, it never decides a verdict."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


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
        text = httpx.get(f"{self.url}/metrics", timeout=10, headers=headers).text
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def wait_metric(self, name: str, ok: Callable[[float], bool], headers: dict[str, str] | None = None,
                    timeout: float = 120.0) -> None:
        """Wait until the metric satisfies `ok` (the server got there), failing after `timeout`."""
        wait_until(lambda: ok(self.metric(name, headers)), f"{name} to reach the expected value", timeout)


def start_server(tmp: Path, *args: str, ready_timeout: float = 120.0, port: int | None = None) -> Server:
    """A server on `port` (default: a free one); `tmp` holds its log and data dir (`tmp/home`), so
    a server started again with the same `tmp` and port is the same node restarted."""
    port = port or free_port()
    log = tmp / f"server-{port}.log"  # appended to: a restarted node keeps its earlier log
    env = {**os.environ, "HEARTH_HOME": str(tmp / "home")}
    cmd = [sys.executable, "-m", "hearth.cli.main", "serve", "--port", str(port), "--threads", "2", *args]
    with log.open("ab") as out:  # the child keeps its own descriptor; ours is closed at once
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_healthy("server", proc, url, log, ready_timeout)
    return Server(url, proc, log)


def wait_healthy(what: str, proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float) -> None:
    """Until `url`/health answers 200; RuntimeError with the log if the process exits or time
    runs out (then it is killed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
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


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the e2e suite: the embedded default model, 8 slots. A queued request may
    wait 10 minutes for a slot: on a machine shared with other llama.cpp processes a step can
    take seconds, and the default 60 s would turn a test's deliberately queued request into a 429."""
    s = start_server(tmp_path_factory.mktemp("hearth"), "--parallel", "8", "--ctx", "2048", "--max-wait", "600")
    yield s
    stop_server(s)
