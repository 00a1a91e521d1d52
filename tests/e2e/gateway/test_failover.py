"""Three Hearth nodes behind a gateway: a node killed mid-stream (the client gets its
protocol's terminal error, the session continues elsewhere from the gateway's transcript)
and a SIGSTOPped node (routed around, back without flapping)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.conftest import Server, stop_server
from tests.e2e.gateway.conftest import GW_KEY, Gateway, node_get, start_gateway, start_nodes, stop, upstreams_toml

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    ns = start_nodes(tmp_path_factory.mktemp("fleet"), ["a", "b", "c"])
    yield ns
    for s in ns.values():
        if s.proc.poll() is None:
            os.kill(s.proc.pid, signal.SIGCONT)
            stop_server(s)


@pytest.fixture(scope="module")
def gw(nodes: dict[str, Server], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    g = start_gateway(tmp_path_factory.mktemp("gw"), upstreams_toml(nodes), "--probe-interval", "0.3",
                      "--probe-timeout", "1")
    yield g
    stop(g.proc)


@pytest.fixture(scope="module")
def oai(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=GW_KEY, max_retries=0)


def test_kill_mid_stream_ends_with_an_error_and_the_session_continues_elsewhere(
        gw: Gateway, oai: openai.OpenAI, nodes: dict[str, Server]) -> None:
    first = oai.chat.completions.create(model="smol", max_tokens=8, temperature=0, extra_body={"session_id": "fo"},
                                        messages=[{"role": "user", "content": "My name is Ada. Say hi."}])
    reply = first.choices[0].message.content
    gw.wait(lambda: gw.admin("GET", "/admin/sessions/fo").json()["transcript_messages"] == 2, "the transcript copy")
    owner = gw.session_node("fo")
    stream = oai.chat.completions.create(model="smol", max_tokens=400, stream=True,
                                         extra_body={"session_id": "fo", "ignore_eos": True},
                                         messages=[{"role": "user", "content": "Write a long story."}])
    received = []
    with pytest.raises(openai.APIError) as e:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                received.append(chunk.choices[0].delta.content)
                if len(received) == 3:
                    nodes[owner].proc.kill()  # kill -9, mid-stream
    assert len(received) >= 3 and "failed mid-stream" in str(e.value)
    nodes[owner].proc.wait(10)

    after = oai.chat.completions.create(model="smol", max_tokens=8, temperature=0, extra_body={"session_id": "fo"},
                                        messages=[{"role": "user", "content": "What is my name?"}])
    assert after.choices[0].message.content is not None
    now = gw.session_node("fo")
    assert now != owner
    history = node_get(nodes[now], now, "/v1/sessions/fo/history").json()["data"]
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    assert history[0]["content"] == "My name is Ada. Say hi." and history[1]["content"] == reply
    assert history[2]["content"] == "What is my name?"
    gw.wait(lambda: not gw.status()[owner]["up"], "the killed node to be marked down")


def test_sigstopped_node_is_routed_around_and_comes_back_without_flapping(
        gw: Gateway, oai: openai.OpenAI, nodes: dict[str, Server]) -> None:
    alive = [n for n, s in nodes.items() if s.proc.poll() is None]
    assert len(alive) == 2
    frozen, other = alive
    before = gw.status()
    os.kill(nodes[frozen].proc.pid, signal.SIGSTOP)
    try:
        gw.wait(lambda: not gw.status()[frozen]["up"], "the stopped node to be marked down")
        for i in range(4):  # none may wait on the stopped node: the client timeout would fire
            r = httpx.post(gw.base_url + "/chat/completions", headers={"Authorization": f"Bearer {GW_KEY}"},
                           timeout=60, json={"model": "smol", "max_tokens": 4,
                                             "messages": [{"role": "user", "content": f"Ping {i}"}]})
            assert r.status_code == 200
    finally:
        os.kill(nodes[frozen].proc.pid, signal.SIGCONT)
    gw.wait(lambda: gw.status()[frozen]["up"], "the node to come back")
    after = gw.status()
    assert after[frozen]["transitions"] == before[frozen]["transitions"] + 2  # down once, up once
    assert after[other]["transitions"] == before[other]["transitions"]
    assert after[frozen]["breaker"] == "closed"


def test_a_response_chain_continues_after_its_node_dies(gw: Gateway, nodes: dict[str, Server]) -> None:
    headers = {"Authorization": f"Bearer {GW_KEY}"}
    first = httpx.post(gw.base_url + "/responses", headers=headers, timeout=60, json={
        "model": "smol", "input": "My name is Ada.", "max_output_tokens": 8, "temperature": 0})
    assert first.status_code == 200
    owner = first.headers["x-hearth-upstream"]
    nodes[owner].proc.kill()
    nodes[owner].proc.wait(10)
    second = httpx.post(gw.base_url + "/responses", headers=headers, timeout=60, json={
        "model": "smol", "input": "What is my name?", "previous_response_id": first.json()["id"],
        "max_output_tokens": 8, "temperature": 0})
    assert second.status_code == 200, second.text
    assert second.headers["x-hearth-upstream"] != owner
    # the new node prefilled the whole chain, replayed by the gateway: more than this turn's input
    assert second.json()["usage"]["input_tokens"] > first.json()["usage"]["input_tokens"]
    assert second.json()["output_text"]
