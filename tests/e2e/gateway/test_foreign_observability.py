"""A foreign engine's turns in the gateway's usage ledger and traces, end to end: llama.cpp's own
`llama-server` (built by scripts/build_llama_server.sh from the llama.cpp Hearth runs, the
default model) as the `openai`-kind upstream of a real `hearth gateway` process exporting over
OTLP/HTTP to a receiver the test starts. Each turn is one row in `GET /admin/usage` with the
engine's own counts (OpenAI chat and an Anthropic client translated alike), a stream its
client left is counted and marked, and the turn's spans continue the client's trace."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from hearth.models import resolve_model
from tests.e2e.gateway.conftest import GW_ADMIN, GW_KEY, Gateway, start_gateway, stop
from tests.helpers import Server, free_port, wait_until
from tests.helpers.otlp import Receiver
from tests.helpers.servers import wait_healthy

pytestmark = pytest.mark.slow

LLAMA_CPP_VERSION = "0.3.36"  # scripts/build_llama_server.sh's default, the wheel's llama.cpp
CLIENT = {"Authorization": f"Bearer {GW_KEY}"}
ADMIN = {"Authorization": f"Bearer {GW_ADMIN}"}
# Greedy decoding of this prompt on the default model runs to any max_tokens up to 300 (digits,
# never an end of turn): checked against the engine itself before it is relied on.
LONG = [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}]


def llama_server_binary() -> Path | None:
    env = os.environ.get("LLAMA_SERVER_BIN")
    if env:
        return Path(env)
    cached = Path.home() / ".cache" / "hearth" / "llama-server" / LLAMA_CPP_VERSION / "llama-server"
    return cached if cached.exists() else None


@dataclass
class World:
    gw: Gateway
    engine: Server
    receiver: Receiver


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    exe = llama_server_binary()
    if exe is None:
        pytest.skip("llama-server is not built: scripts/build_llama_server.sh (or set LLAMA_SERVER_BIN)")
    tmp = tmp_path_factory.mktemp("gw-foreign-obs")
    receiver = Receiver().start()
    port = free_port()
    log = tmp / "llama-server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(exe), "-m", str(resolve_model("default").path), "--host", "127.0.0.1",
                                 "--port", str(port), "-c", "1024", "-np", "1", "-t", "1"],
                                stdout=out, stderr=subprocess.STDOUT)
    engine = Server(f"http://127.0.0.1:{port}", proc, log)
    gw: Gateway | None = None
    before = os.environ.get("OTEL_BSP_SCHEDULE_DELAY")
    try:
        wait_healthy("llama-server", proc, engine.url, log, 120)
        toml = (f'[[upstream]]\nname = "llama"\nurl = "{engine.url}"\nkind = "openai"\ncontinuation = "prefill"\n'
                'models = { "foreign" = "smollm2" }\nmax_in_flight = 1\n')
        os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "50"  # the gateway process inherits it: spans exported at once
        gw = start_gateway(tmp, toml, "--otlp-endpoint", receiver.url)
        yield World(gw, engine, receiver)
    finally:
        if before is None:
            os.environ.pop("OTEL_BSP_SCHEDULE_DELAY", None)
        else:
            os.environ["OTEL_BSP_SCHEDULE_DELAY"] = before
        if gw is not None:
            stop(gw.proc)
        stop(proc)
        receiver.stop()


def rows(w: World) -> list[dict[str, Any]]:
    r = httpx.get(f"{w.gw.url}/admin/usage", headers=ADMIN, timeout=30)
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def row_of(w: World, answer_id: str) -> dict[str, Any]:
    wait_until(lambda: any(r["request_id"] == answer_id for r in rows(w)), f"the gateway's row of {answer_id}", 60)
    [row] = [r for r in rows(w) if r["request_id"] == answer_id]
    return row


def test_a_turn_on_llama_server_is_one_ledger_row_and_one_trace(world: World) -> None:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    body = {"model": "foreign", "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 8,
            "temperature": 0}
    r = httpx.post(f"{world.gw.url}/v1/chat/completions", json=body, timeout=300,
                   headers={**CLIENT, "traceparent": f"00-{trace_id}-{parent}-01"})
    assert r.status_code == 200, r.text
    answer = r.json()
    row = row_of(world, answer["id"])
    assert (row["prompt_tokens"], row["generated_tokens"]) == (answer["usage"]["prompt_tokens"],
                                                               answer["usage"]["completion_tokens"])
    assert row["generated_tokens"] == 8 and row["prompt_tokens"] > 0
    assert (row["finish_reason"], row["cancelled"], row["status"], row["error"]) == ("length", None, 200, None)
    assert (row["model"], row["endpoint"], row["node"], row["nodes"], row["failovers"]) == (
        "foreign", "chat", "llama", "llama", 0)

    def spans() -> dict[str, Any]:
        return {s.name: s for s in world.receiver.of_trace(trace_id)}

    wait_until(lambda: {"chat foreign", "hearth.gateway.route", "hearth.gateway.relay"} <= spans().keys(),
               "the gateway's spans to reach the receiver", 60)
    got = spans()
    root, route, relay = got["chat foreign"], got["hearth.gateway.route"], got["hearth.gateway.relay"]
    assert root.service == "hearth-gateway" and root.parent_span_id == parent
    assert route.parent_span_id == root.span_id and relay.parent_span_id == root.span_id
    assert route.attributes["hearth.route.node"] == "llama" and relay.attributes["hearth.node"] == "llama"
    assert root.attributes["gen_ai.usage.output_tokens"] == 8
    assert root.attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert set(got) == {"chat foreign", "hearth.gateway.route", "hearth.gateway.relay"}  # none from the translator

    # an Anthropic client, translated: its own row, the engine's counts as the client got them
    m = httpx.post(f"{world.gw.url}/v1/messages", json={**body, "messages": body["messages"]}, timeout=300,
                   headers={**CLIENT, "anthropic-version": "2023-06-01"})
    assert m.status_code == 200, m.text
    msg = m.json()
    row = row_of(world, msg["id"])
    u = msg["usage"]  # Anthropic's input_tokens leave out the prompt read from the engine's cache
    whole = u["input_tokens"] + (u.get("cache_read_input_tokens") or 0) + (u.get("cache_creation_input_tokens") or 0)
    assert (row["endpoint"], row["prompt_tokens"], row["cached_tokens"], row["generated_tokens"]) == (
        "messages", whole, u.get("cache_read_input_tokens") or 0, u["output_tokens"])
    assert row["finish_reason"] == "length" and msg["stop_reason"] == "max_tokens"


def test_a_stream_counts_the_engines_usage_and_one_its_client_left_is_marked(world: World) -> None:
    body = {"model": "foreign", "messages": LONG, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    answer_id, usage = "", None
    with httpx.stream("POST", f"{world.gw.url}/v1/chat/completions", headers=CLIENT, timeout=300,
                      json={**body, "max_tokens": 6}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                answer_id = answer_id or line.split('"id":"', 1)[1].split('"', 1)[0]
                if '"usage":{' in line:
                    usage = httpx.Response(200, content=line[6:]).json()["usage"]
    assert usage is not None
    row = row_of(world, answer_id)
    assert (row["prompt_tokens"], row["generated_tokens"], row["finish_reason"]) == (
        usage["prompt_tokens"], usage["completion_tokens"], "length")

    # The engine itself runs this prompt to 300 tokens: the stream below is still going when its
    # client leaves after 3 pieces, whatever the machine's speed.
    alone = httpx.post(f"{world.engine.url}/v1/chat/completions", timeout=300,
                       json={"messages": LONG, "temperature": 0, "max_tokens": 300})
    assert alone.json()["choices"][0]["finish_reason"] == "length", alone.text
    answer_id, pieces = "", 0
    with httpx.stream("POST", f"{world.gw.url}/v1/chat/completions", headers=CLIENT, timeout=300,
                      json={**body, "max_tokens": 300}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                answer_id = answer_id or line.split('"id":"', 1)[1].split('"', 1)[0]
                pieces += 1
                if pieces >= 3:
                    break  # the client leaves mid-answer
    row = row_of(world, answer_id)
    # no usage comes from an engine whose stream was closed: the pieces it had streamed, at least
    # those the client got, never the whole answer
    assert (row["cancelled"], row["finish_reason"], row["status"]) == ("disconnect", "cancelled", 200)
    assert 3 <= row["generated_tokens"] < 300
