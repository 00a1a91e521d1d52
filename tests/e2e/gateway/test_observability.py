"""The gateway's traces and usage ledger end to end: a real `hearth gateway` process over a real
node (the default model), both exporting over OTLP/HTTP to one receiver started by the test.
One trace holds the gateway's spans and the node's, parent and child across the two
processes; the gateway's ledger rows carry the node's counts, a stream its client left
included (settled from the node's own row)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.e2e.gateway.conftest import (
    GW_ADMIN,
    GW_KEY,
    NODE_ARGS,
    Gateway,
    node_key,
    start_gateway,
    stop,
    upstreams_toml,
)
from tests.helpers import Server, start_server, stop_server, wait_until
from tests.helpers.otlp import Receiver

pytestmark = pytest.mark.slow

CLIENT = {"Authorization": f"Bearer {GW_KEY}"}
ADMIN = {"Authorization": f"Bearer {GW_ADMIN}"}


@dataclass
class World:
    gw: Gateway
    node: Server
    receiver: Receiver


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("gw-obs")
    receiver = Receiver().start()
    (tmp / "a").mkdir()
    node = start_server(tmp / "a", *NODE_ARGS, "--api-key", node_key("a"), "--admin-key", "node-a-admin",
                        "--otlp-endpoint", receiver.url, env={"OTEL_BSP_SCHEDULE_DELAY": "50"})
    before = os.environ.get("OTEL_BSP_SCHEDULE_DELAY")
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "50"  # the gateway process inherits it: spans exported at once
    try:
        gw = start_gateway(tmp, upstreams_toml({"a": node}), "--otlp-endpoint", receiver.url)
    finally:
        if before is None:
            os.environ.pop("OTEL_BSP_SCHEDULE_DELAY", None)
        else:
            os.environ["OTEL_BSP_SCHEDULE_DELAY"] = before
    yield World(gw, node, receiver)
    stop(gw.proc)
    stop_server(node)
    receiver.stop()


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "smol", "messages": [{"role": "user", "content": "Count from one to twenty."}],
            "max_tokens": 8, "temperature": 0, **kw}


def node_row(w: World, answer_id: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{w.node.url}/admin/usage", params={"request_id": answer_id},
                  headers={"Authorization": "Bearer node-a-admin"}, timeout=30)
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def gateway_rows(w: World) -> list[dict[str, Any]]:
    r = httpx.get(f"{w.gw.url}/admin/usage", headers=ADMIN, timeout=30)
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def test_one_trace_across_the_gateway_and_the_node(world: World) -> None:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    r = httpx.post(f"{world.gw.url}/v1/chat/completions", json=chat(), timeout=300,
                   headers={**CLIENT, "traceparent": f"00-{trace_id}-{parent}-01"})
    assert r.status_code == 200, r.text
    body = r.json()

    def spans() -> dict[str, Any]:
        return {s.name: s for s in world.receiver.of_trace(trace_id)}

    wait_until(lambda: {"chat smol", "hearth.gateway.relay", "hearth.decode"} <= spans().keys(),
               "the gateway's and the node's spans to reach the receiver", 60)
    got = spans()
    root, relay, route = got["chat smol"], got["hearth.gateway.relay"], got["hearth.gateway.route"]
    node_root = next(s for n, s in got.items() if n.startswith("chat ") and n != "chat smol")
    assert root.service == "hearth-gateway" and node_root.service == "hearth"
    assert root.parent_span_id == parent
    assert relay.parent_span_id == root.span_id and route.parent_span_id == root.span_id
    assert node_root.parent_span_id == relay.span_id  # across the two processes
    assert got["hearth.decode"].parent_span_id == node_root.span_id
    assert route.attributes["hearth.route.candidates"] == ("a",) and relay.attributes["hearth.node"] == "a"
    assert root.attributes["gen_ai.usage.output_tokens"] == body["usage"]["completion_tokens"]
    # the gateway's ledger row is the node's, under the answer's id
    wait_until(lambda: any(r["request_id"] == body["id"] for r in gateway_rows(world)), "the gateway's row", 30)
    [row] = [r for r in gateway_rows(world) if r["request_id"] == body["id"]]
    [theirs] = node_row(world, body["id"])
    assert (row["prompt_tokens"], row["generated_tokens"]) == (theirs["prompt_tokens"], theirs["generated_tokens"])
    assert row["node"] == "a" and row["cancelled"] is None


def test_a_stream_its_client_left_has_the_nodes_exact_count(world: World) -> None:
    answer_id = ""
    with httpx.stream("POST", f"{world.gw.url}/v1/chat/completions", headers=CLIENT, timeout=300,
                      json=chat(stream=True, max_tokens=400, ignore_eos=True)) as r:
        assert r.status_code == 200
        chunks = 0
        for line in r.iter_lines():
            if line.startswith("data: {") and '"id":"' in line:
                answer_id = answer_id or line.split('"id":"', 1)[1].split('"', 1)[0]
                chunks += 1
                if chunks >= 3:
                    break  # the client leaves mid-answer
    assert answer_id.startswith("chatcmpl-")
    wait_until(lambda: any(r["request_id"] == answer_id for r in gateway_rows(world)),
               "the gateway's row, settled from the node's", 60)
    [row] = [r for r in gateway_rows(world) if r["request_id"] == answer_id]
    [theirs] = node_row(world, answer_id)
    assert row["cancelled"] == "disconnect" and theirs["cancelled"] == "disconnect"
    assert row["generated_tokens"] == theirs["generated_tokens"] > 0
    assert row["discarded_tokens"] == theirs["discarded_tokens"]
    assert row["generated_tokens"] < 400  # stopped, not run to the end
