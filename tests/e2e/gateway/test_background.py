"""Background responses through a gateway over two Hearth nodes, with the official openai SDK:
created through the gateway, polled and resumed from the middle through it (the gateway runs
them: its own event log, the node sent a plain streamed request), and one whose node is killed
mid-run goes on on the other node (stream migration) as one run.

Its own small fleet (two nodes, one gateway), not the package's: nothing here needs the
foreign engine, and the nodes must be idle for the answers to compare."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.gateway.conftest import GW_KEY, Gateway, start_gateway, start_node, stop, upstreams_toml
from tests.helpers import EXACT, Server, sample, stop_server, wait_until

pytestmark = pytest.mark.slow

PROMPT = "Tell me a long story about a lighthouse keeper."
RUNNING = {"queued", "in_progress"}


@pytest.fixture(scope="module")
def small_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, dict[str, Server]]]:
    tmp: Path = tmp_path_factory.mktemp("bg-fleet")
    nodes = {name: start_node(tmp, name) for name in ("a", "b")}
    gw = start_gateway(tmp, upstreams_toml(nodes))
    try:
        yield gw, nodes
    finally:
        stop(gw.proc)
        for s in nodes.values():
            stop_server(s)


@pytest.fixture
def oai(small_fleet: tuple[Gateway, dict[str, Server]]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=small_fleet[0].base_url, api_key=GW_KEY, max_retries=0, timeout=600) as client:
        yield client


def test_background_through_the_gateway_is_polled_and_resumed(oai: openai.OpenAI) -> None:
    long = {**EXACT, "ignore_eos": True}
    started = oai.responses.create(model="smol", input=PROMPT, temperature=0, max_output_tokens=30,
                                   background=True, extra_body=EXACT)
    assert started.background is True and started.status in RUNNING
    seen: list[Any] = []
    wait_until(lambda: seen.append(oai.responses.retrieve(started.id)) or seen[-1].status not in RUNNING,
               "the background response to end", timeout=300, interval=0.1)
    assert seen[-1].status in ("completed", "incomplete") and seen[-1].output_text
    assert seen[-1].model == "smol"  # named by its alias, as relayed answers are

    stream = oai.responses.create(model="smol", input=PROMPT, temperature=0, max_output_tokens=120,
                                  background=True, stream=True, extra_body=long)
    first: list[Any] = []
    for event in stream:
        first.append(event)
        if len(first) == 6:
            break
    stream.close()  # the client leaves; the run goes on on its node
    rid = first[0].response.id
    resumed = list(oai.responses.retrieve(rid, stream=True, starting_after=first[-1].sequence_number))
    final = resumed[-1].response
    assert resumed[-1].type == "response.incomplete" and final.usage is not None
    assert final.usage.output_tokens == 120  # it ran to its end despite the disconnect
    whole = list(oai.responses.retrieve(rid, stream=True))
    assert [e.model_dump() for e in first + resumed] == [e.model_dump() for e in whole]
    assert [e.sequence_number for e in whole] == list(range(len(whole)))
    done = oai.responses.retrieve(rid)
    assert done.output_text == final.output_text and done.model == "smol"


def test_cancel_through_the_gateway(oai: openai.OpenAI, small_fleet: tuple[Gateway, dict[str, Server]]) -> None:
    started = oai.responses.create(model="smol", input=PROMPT, temperature=0, max_output_tokens=800,
                                   background=True, extra_body={**EXACT, "ignore_eos": True})
    cancelled = oai.responses.cancel(started.id)
    assert cancelled.status == "cancelled" and cancelled.id == started.id
    assert oai.responses.retrieve(started.id).status == "cancelled"
    r = httpx.get(f"{small_fleet[0].base_url}/responses/{started.id}", params={"stream": "maybe"},
                  headers={"Authorization": f"Bearer {GW_KEY}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"  # the node's own check, relayed


def continued(gw: Gateway) -> float:
    text = httpx.get(gw.url + "/metrics", headers={"Authorization": f"Bearer {GW_KEY}"}).text
    return sample(text, "hearth_gateway_stream_migrations_total", default=0.0, outcome="continued")


def test_a_background_response_survives_the_death_of_its_node(
        oai: openai.OpenAI, small_fleet: tuple[Gateway, dict[str, Server]]) -> None:
    # Last in the module: it leaves one node dead.
    gw, nodes = small_fleet
    before = continued(gw)
    stream = oai.responses.create(model="smol", input=PROMPT, temperature=0, max_output_tokens=128, background=True,
                                  stream=True, extra_body={**EXACT, "ignore_eos": True})
    first: list[Any] = []
    for event in stream:
        first.append(event)
        if event.type == "response.output_text.delta" and len(first) >= 6:
            break
    stream.close()  # the client leaves too
    rid = first[0].response.id
    [running] = [name for name, n in gw.status().items() if n["in_flight"]]
    nodes[running].proc.kill()  # kill -9 of the node running it, mid-run
    nodes[running].proc.wait(10)
    seen: list[Any] = []
    wait_until(lambda: seen.append(oai.responses.retrieve(rid)) or seen[-1].status not in RUNNING,
               "the background response to end", timeout=300, interval=0.1)
    done = seen[-1]
    assert continued(gw) == before + 1  # it went on on the other node: the kill came mid-run
    assert done.status == "incomplete" and done.incomplete_details is not None
    assert done.incomplete_details.reason == "max_output_tokens" and done.output_text and done.background is True
    resumed = list(oai.responses.retrieve(rid, stream=True, starting_after=first[-1].sequence_number))
    whole = list(oai.responses.retrieve(rid, stream=True))
    assert [e.model_dump() for e in first + resumed] == [e.model_dump() for e in whole]
    assert [e.sequence_number for e in whole] == list(range(len(whole)))
    terminals = [e for e in whole if e.type in ("response.completed", "response.incomplete", "response.failed")]
    assert terminals == [whole[-1]] and [e.type for e in whole].count("response.created") == 1
    assert "".join(e.delta for e in whole if e.type == "response.output_text.delta") == done.output_text
    assert whole[-1].response.output_text == done.output_text and whole[-1].response.id == rid
