"""The Batch API through a real gateway in front of two real nodes, with the official `openai`
SDK (docs/gateway.md, "Batches"): `files.create`, `batches.create`, `retrieve`, `files.content`;
a node killed (-9) in the middle of the batch costs only its unfinished lines: every line is in
the output exactly once, and the surviving node ran exactly the lines that were left.

Deterministic: the gateway runs one line at a time (`--batch-concurrency 1`) and its test gate
holds the batch before line 3 (hearth.test_gate), so exactly lines 0-2 are finished when the node
dies; each node's requests are read from its own /metrics, never guessed from timing."""

from __future__ import annotations

import io
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from hearth import test_gate
from tests.e2e.gateway.conftest import GW_KEY, node_get, start_gateway, start_node, stop, upstreams_toml
from tests.helpers import Server, stop_server, wait_until
from tests.helpers.prometheus import sample

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
LINES = 6
HELD = 3  # the line the batch waits before while node a is killed


def rows(n: int) -> bytes:
    return b"".join(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": CHAT, "body": {
        "model": "smol", "temperature": 0, "max_tokens": 4,
        "messages": [{"role": "user", "content": f"Count to {i + 1}."}]}}).encode() + b"\n" for i in range(n))


def served(node: Server, name: str) -> float:
    text = node_get(node, name, "/metrics").text
    return sample(text, f'hearth_http_requests_total{{endpoint="{CHAT}"}}', default=0.0)


@pytest.fixture
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[dict[str, Server], Any, Path]]:
    nodes = {"a": start_node(tmp_path, "a"), "b": start_node(tmp_path, "b")}
    gates = tmp_path / "gates"
    gates.mkdir()
    monkeypatch.setenv(test_gate.ENV, str(gates))  # the gateway process inherits it
    gw = start_gateway(tmp_path, upstreams_toml(nodes), "--batch-concurrency", "1")
    try:
        yield nodes, gw, gates
    finally:
        stop(gw.proc)
        for s in nodes.values():
            stop_server(s)


def test_a_batch_through_the_gateway_survives_a_node_killed_mid_way(
        pair: tuple[dict[str, Server], Any, Path]) -> None:
    nodes, gw, gates = pair
    hold = test_gate.hold_path(gates, f"gateway-batch-line-{HELD}")
    hold.touch()
    with openai.OpenAI(base_url=gw.base_url, api_key=GW_KEY, timeout=600, max_retries=0) as c:
        f = c.files.create(file=("in.jsonl", io.BytesIO(rows(LINES))), purpose="batch")
        assert f.purpose == "batch" and f.bytes == len(rows(LINES))
        batch = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        assert batch.status in ("validating", "in_progress") and batch.request_counts is not None
        wait_until(test_gate.waiting_path(gates, f"gateway-batch-line-{HELD}").exists, "the batch held", 300)
        mid = c.batches.retrieve(batch.id)
        assert mid.status == "in_progress" and mid.request_counts is not None
        assert mid.request_counts.completed == HELD
        before = {n: served(s, n) for n, s in nodes.items()}
        assert sum(before.values()) == HELD
        victim = max(before, key=lambda n: (before[n], n))  # the node that ran lines (a, on an idle fleet)
        other = next(n for n in nodes if n != victim)
        os.kill(nodes[victim].proc.pid, signal.SIGKILL)
        nodes[victim].proc.wait(30)
        hold.unlink()
        wait_until(lambda: c.batches.retrieve(batch.id).status in ("completed", "failed", "cancelled", "expired"),
                   "the batch's end", 300)
        done = c.batches.retrieve(batch.id)
        assert done.status == "completed" and done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
        assert done.output_file_id is not None and done.error_file_id is None
        out = [json.loads(x) for x in c.files.content(done.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in out] == [f"q{i}" for i in range(LINES)]  # each line once, in order
    assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in out)
    assert all(o["response"]["body"]["service_tier"] == "flex" for o in out)
    # the survivor ran exactly the lines left when the other died: none twice, none lost
    assert served(nodes[other], other) - before[other] == LINES - HELD
