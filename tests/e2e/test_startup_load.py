"""A request sent while the model named at start is still loading waits for that load, as a
request for a model loaded on demand does: a stream gets its status line, opening event and
heartbeats meanwhile, a client that leaves is cancelled, and /health says `loading` until the
model is ready. The load is held at the server's test gate (hearth.test_gate), so the test
knows it is under way while it looks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hearth import test_gate as load_gate
from hearth.models import DEFAULT_MODEL_ID
from tests.helpers import Server, free_port, sample, stop_server, wait_until

pytestmark = pytest.mark.slow

BODY = {"messages": [{"role": "user", "content": "Name one colour of the rainbow."}], "max_tokens": 8,
        "temperature": 0, "cache_prompt": False}


@pytest.fixture
def starting(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    """A server whose start-up load of the default model waits at the gate: its port is open."""
    gate = tmp_path / "gate"
    gate.mkdir()
    load_gate.hold_path(gate, DEFAULT_MODEL_ID).touch()
    port = free_port()
    log = tmp_path / "server.log"
    env = {**os.environ, load_gate.ENV: str(gate), "HEARTH_HOME": str(tmp_path / "home")}
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "hearth.cli.main", "serve", "--port", str(port),
                                 "--threads", "2", "--ctx", "2048", "--parallel", "2", "--sse-heartbeat", "0.2"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    server = Server(f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_until(lambda: load_gate.waiting_path(gate, DEFAULT_MODEL_ID).exists(), "the load to reach the gate", 120)
        wait_until(lambda: answers(server), "the port to open", 60)
        yield server, gate
    finally:
        load_gate.hold_path(gate, DEFAULT_MODEL_ID).unlink(missing_ok=True)
        stop_server(server)


def answers(s: Server) -> bool:
    try:
        httpx.get(f"{s.url}/health", timeout=5)
        return True
    except httpx.HTTPError:
        return False


def health(s: Server) -> tuple[int, dict[str, str]]:
    r = httpx.get(f"{s.url}/health", timeout=10)
    return r.status_code, r.json()


def test_a_stream_during_the_start_up_load_opens_beats_and_answers(starting: tuple[Server, Path]) -> None:
    srv, gate = starting
    assert health(srv) == (503, {"status": "loading"})
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json={**BODY, "stream": True}, timeout=300) as r:
        assert r.status_code == 200  # the status line: during the load
        lines = r.iter_lines()
        seen = []
        for line in lines:  # the opening event, then a heartbeat, all while the load is held
            seen.append(line)
            if line == ": keep-alive" and any('"role":"assistant"' in x for x in seen):
                break
        assert load_gate.waiting_path(gate, DEFAULT_MODEL_ID).exists()
        assert health(srv) == (503, {"status": "loading"})
        load_gate.hold_path(gate, DEFAULT_MODEL_ID).unlink()
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    streamed = "".join(piece for piece in (_content(x) for x in rest) if piece)
    wait_until(lambda: health(srv)[0] == 200, "the server to report ready", 60)
    whole = httpx.post(f"{srv.url}/v1/chat/completions", json=BODY, timeout=300).json()
    assert streamed == whole["choices"][0]["message"]["content"]  # temperature 0: the same answer
    assert sample(httpx.get(f"{srv.url}/metrics", timeout=10).text, "hearth_model_loads_total", 0.0) == 1


def test_a_client_that_leaves_during_the_start_up_load_is_cancelled(starting: tuple[Server, Path]) -> None:
    srv, gate = starting
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json={**BODY, "stream": True}, timeout=300) as r:
        lines = r.iter_lines()
        for line in lines:
            if '"role":"assistant"' in line:
                break
    # the connection is closed while the load is held: the run ends as a disconnect
    wait_until(lambda: cancellations(srv) == 1, "the disconnect to end the run", 60)
    assert health(srv) == (503, {"status": "loading"})
    load_gate.hold_path(gate, DEFAULT_MODEL_ID).unlink()
    wait_until(lambda: health(srv)[0] == 200, "the server to report ready", 60)
    r2 = httpx.post(f"{srv.url}/v1/chat/completions", json=BODY, timeout=300)
    assert r2.status_code == 200 and r2.json()["choices"][0]["finish_reason"] in ("stop", "length")


def cancellations(s: Server) -> float:
    return sample(httpx.get(f"{s.url}/metrics", timeout=10).text, "hearth_cancellations_total", 0.0,
                  cause="disconnect")


def _content(line: str) -> str:
    if not line.startswith("data: {"):
        return ""
    choices = json.loads(line[6:]).get("choices") or []
    return "".join((c.get("delta") or {}).get("content") or "" for c in choices)
