"""Usage ledger, traces and replay through a real server and the real model: spans reach a real
OTLP/HTTP receiver (tests/helpers/otlp.py decodes the protobuf) with the client's trace
continued; the ledger's rows match the answers and a disconnected stream's row counts what it
generated; `hearth replay` finds a temperature-0 answer identical."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.helpers import Server, start_server, stop_server, wait_until
from tests.helpers.otlp import Receiver

pytestmark = pytest.mark.slow

ADMIN = "adm-obs"
ALICE = {"Authorization": "Bearer k-alice"}


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("obs")
    keys = tmp / "keys"
    keys.write_text("k-alice name=alice tenant=team-a\nk-bob name=bob tenant=team-b\n")
    s = start_server(tmp, "--api-key-file", str(keys), "--admin-key", ADMIN, "--parallel", "2", "--ctx", "2048",
                     "--otlp-endpoint", receiver.url, "--journal", env={"OTEL_BSP_SCHEDULE_DELAY": "50"})
    yield s
    stop_server(s)


def chat(max_tokens: int = 8, **kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "Count from one to twenty."}], "max_tokens": max_tokens,
            "temperature": 0, **kw}


def usage_rows(srv: Server, **params: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{srv.url}/admin/usage", params=params, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def test_spans_reach_a_real_otlp_receiver(srv: Server, receiver: Receiver) -> None:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    r = httpx.post(f"{srv.base_url}/chat/completions", json=chat(), timeout=120,
                   headers={**ALICE, "traceparent": f"00-{trace_id}-{parent}-01"})
    assert r.status_code == 200, r.text
    body = r.json()
    wait_until(lambda: len(receiver.of_trace(trace_id)) >= 5, "the spans to reach the receiver", 60)
    spans = {s.name: s for s in receiver.of_trace(trace_id)}
    root = spans[f"chat {body['model']}"]
    assert root.parent_span_id == parent and root.service == "hearth"
    assert {"hearth.queue", "hearth.prompt_cache", "hearth.prefill", "hearth.decode"} <= spans.keys()
    assert all(s.parent_span_id == root.span_id for n, s in spans.items() if n != root.name)
    a = root.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == body["model"]
    assert a["gen_ai.usage.input_tokens"] == body["usage"]["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == body["usage"]["completion_tokens"]
    assert a["gen_ai.response.finish_reasons"] == (body["choices"][0]["finish_reason"],)
    assert a["hearth.tenant"] == "team-a" and "gen_ai.input.messages" not in a


def test_the_ledger_matches_the_answers_and_a_disconnected_stream(srv: Server) -> None:
    r = httpx.post(f"{srv.base_url}/chat/completions", json=chat(), headers=ALICE, timeout=120)
    body = r.json()
    wait_until(lambda: any(x["request_id"] == body["id"] for x in usage_rows(srv)), "the ledger row", 30)
    [row] = [x for x in usage_rows(srv) if x["request_id"] == body["id"]]
    assert (row["tenant"], row["key"], row["model"]) == ("team-a", "alice", body["model"])
    assert row["prompt_tokens"] == body["usage"]["prompt_tokens"]
    assert row["generated_tokens"] == body["usage"]["completion_tokens"] and row["cancelled"] is None
    # a stream the client leaves after 3 chunks: counted, as disconnected, with every token it read
    received = 0
    with httpx.stream("POST", f"{srv.base_url}/chat/completions", headers=ALICE, timeout=120,
                      json=chat(max_tokens=400, stream=True, ignore_eos=True)) as s:
        for line in s.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                received += 1
                if received == 3:
                    break
    wait_until(lambda: any(x["cancelled"] == "disconnect" for x in usage_rows(srv)), "the disconnected row", 60)
    [gone] = [x for x in usage_rows(srv) if x["cancelled"] == "disconnect"]
    assert 3 <= gone["generated_tokens"] < 400 and gone["discarded_tokens"] <= gone["generated_tokens"] - 3
    # the tenant's own view
    mine = httpx.get(f"{srv.url}/admin/usage", headers=ALICE, timeout=10).json()["data"]
    assert {x["tenant"] for x in mine} == {"team-a"}


def test_replay_is_identical_at_temperature_0(srv: Server) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    ids = []
    for body in (chat(max_tokens=24), chat(max_tokens=24, stream=True), {**chat(max_tokens=64), "tools": tools}):
        r = httpx.post(f"{srv.base_url}/chat/completions", json=body, headers=ALICE, timeout=120)
        assert r.status_code == 200, r.text
        ids.append(r.text.split('"id":"', 1)[1].split('"', 1)[0])
    env = {**os.environ, "HEARTH_API_KEY": "k-alice"}  # the tenant's own key reads its own records
    for rid in ids:
        out = subprocess.run([sys.executable, "-m", "hearth.cli.main", "replay", rid, "--url", srv.url],
                             capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0 and out.stdout.startswith(f"identical: {rid}"), out.stdout + out.stderr
    other = subprocess.run([sys.executable, "-m", "hearth.cli.main", "replay", ids[0], "--url", srv.url],
                           capture_output=True, text=True, env={**os.environ, "HEARTH_API_KEY": "k-bob"}, timeout=60)
    assert other.returncode != 0 and "404" in other.stderr + other.stdout  # another tenant's record
