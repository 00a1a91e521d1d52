"""Background responses run by the gateway, in-process over fake upstreams: the node gets a
plain streamed request; the gateway answers the create, GET (plain and streamed, from any
sequence number), cancel and /v1/cancel from its own event log, continues a run whose node
broke on the other node, and keeps the final object across a restart."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from hearth.gateway.state import gateway_of
from hearth.gateway.store.sqlite import SqliteStore
from tests.helpers import wait_until
from tests.helpers.fake_fleet import Fleet, gateway, parsed, response, sse, stick


@pytest.fixture
def fleet() -> Fleet:
    return Fleet()


@pytest.fixture
def client(tmp_path: Path, fleet: Fleet) -> Iterator[TestClient]:
    with gateway(tmp_path, fleet) as c:
        yield c

BG = {"model": "smol", "input": "hi", "background": True}
ITEM = {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}
PART = {"type": "output_text", "text": ""}


def r_event(name: str, seq: int, **payload: Any) -> bytes:
    """A node's event, compact JSON as a node writes it (the gateway renames the model in it)."""
    data = json.dumps({"type": name, "sequence_number": seq, **payload}, separators=(",", ":"))
    return f"event: {name}\ndata: {data}\n\n".encode()


class Gated(httpx.AsyncByteStream):
    """An upstream SSE body: `before`, then (once `gate` is set) `after`, then optionally a
    broken connection. `closed` is set when the gateway closes the request."""

    def __init__(self, before: list[bytes], after: list[bytes], gate: threading.Event, broken: bool = False) -> None:
        self.before, self.after, self.gate, self.broken = before, after, gate, broken
        self.closed = threading.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for c in self.before:
            yield c
        while not self.gate.is_set():
            await asyncio.sleep(0.005)
        for c in self.after:
            yield c
        if self.broken:
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    async def aclose(self) -> None:
        self.closed.set()


def opening(rid: str, item_id: str = "msg_1") -> list[bytes]:
    item = {**ITEM, "id": item_id}
    return [r_event("response.created", 0, response=response(rid)),
            r_event("response.in_progress", 1, response=response(rid)),
            r_event("response.output_item.added", 2, output_index=0, item=item),
            r_event("response.content_part.added", 3, item_id=item_id, output_index=0, content_index=0, part=PART)]


def delta(seq: int, text: str, item_id: str = "msg_1") -> bytes:
    return r_event("response.output_text.delta", seq, item_id=item_id, output_index=0, content_index=0, delta=text)


def ending(rid: str, seq: int, text: str, item_id: str = "msg_1") -> list[bytes]:
    done = {**ITEM, "id": item_id, "status": "completed", "content": [{"type": "output_text", "text": text}]}
    return [r_event("response.output_text.done", seq, item_id=item_id, output_index=0, content_index=0, text=text),
            r_event("response.content_part.done", seq + 1, item_id=item_id, output_index=0, content_index=0,
                    part={"type": "output_text", "text": text}),
            r_event("response.output_item.done", seq + 2, output_index=0, item=done),
            r_event("response.completed", seq + 3, response={**response(rid, "completed", [done]), "output_text": text,
                                                             "usage": {"input_tokens": 3, "output_tokens": 2}})]


class Node:
    """A fake node's Responses answers: one gated run (`Hel` before the gate, `lo` and the end
    after it); its other routes 404."""

    def __init__(self, gate: threading.Event, broken_at_gate: bool = False) -> None:
        self.gate, self.broken = gate, broken_at_gate
        self.streams: list[Gated] = []
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, r: httpx.Request) -> httpx.Response:
        if r.method != "POST" or r.url.path != "/v1/responses":
            return httpx.Response(404, json={"error": {"message": "no such response", "code": "response_not_found"}})
        self.bodies.append(json.loads(r.content))
        before = [*opening("resp_1"), delta(4, "Hel")]
        after = [] if self.broken else [delta(5, "lo"), *ending("resp_1", 6, "Hello")]
        self.streams.append(Gated(before, after, self.gate, self.broken))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=self.streams[-1])


def names(events: list[tuple[str | None, Any]]) -> list[str | None]:
    return [n for n, _ in events]


def replay(c: TestClient, rid: str, after: int | None = None) -> list[tuple[str | None, Any]]:
    params = {"stream": "true", **({"starting_after": str(after)} if after is not None else {})}
    with c.stream("GET", f"/v1/responses/{rid}", params=params) as r:
        assert r.status_code == 200
        return parsed("".join(r.iter_text()))


def check_one_run(events: list[tuple[str | None, Any]]) -> None:
    """Numbered from 0 without a gap, one opening and one terminal event (the last), every
    response in it background."""
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert names(events).count("response.created") == 1
    terminals = [n for n in names(events) if n in ("response.completed", "response.incomplete", "response.failed")]
    assert len(terminals) == 1 and names(events)[-1] == terminals[0]
    assert all(d["response"]["background"] is True for _, d in events if "response" in d)


def test_a_background_create_runs_on_the_gateway_and_is_polled_and_replayed(tmp_path: Path, fleet: Fleet) -> None:
    gate = threading.Event()
    node = Node(gate)
    fleet.behave["a"] = fleet.behave["b"] = node
    with gateway(tmp_path, fleet) as c:
        r = c.post("/v1/responses", json={**BG, "store": True})
        assert r.status_code == 200, r.text
        started = r.json()
        assert started["id"] == "resp_1" and started["background"] is True and started["status"] == "in_progress"
        assert started["model"] == "smol"  # the alias, as relayed answers name it
        [sent] = node.bodies
        assert sent["stream"] is True and "background" not in sent and sent["store"] is True
        wait_until(lambda: c.get("/v1/responses/resp_1").json()["output_text"] == "Hel", "the output so far")
        assert c.get("/v1/responses/resp_1").json()["status"] == "in_progress"
        gate.set()
        wait_until(lambda: c.get("/v1/responses/resp_1").json()["status"] == "completed", "the run to end")
        done = c.get("/v1/responses/resp_1").json()
        assert done["output_text"] == "Hello" and done["background"] is True and done["usage"]["output_tokens"] == 2
        whole = replay(c, "resp_1")
        check_one_run(whole)
        assert whole[-1][1]["response"] == done
        for n in range(len(whole)):  # from any point: every later event, once
            assert replay(c, "resp_1", n) == whole[n + 1:]


def test_a_streamed_background_create_follows_the_log(tmp_path: Path, fleet: Fleet) -> None:
    gate = threading.Event()
    gate.set()
    fleet.behave["a"] = fleet.behave["b"] = Node(gate)
    with gateway(tmp_path, fleet) as c:
        with c.stream("POST", "/v1/responses", json={**BG, "stream": True}) as r:
            assert r.status_code == 200
            streamed = parsed("".join(r.iter_text()))
        check_one_run(streamed)
        assert streamed == replay(c, "resp_1")
        assert streamed[-1][1]["response"]["output_text"] == "Hello"


def test_cancel_ends_the_run_as_a_node_ends_a_cancelled_one(tmp_path: Path, fleet: Fleet) -> None:
    gate = threading.Event()
    node = Node(gate)
    fleet.behave["a"] = fleet.behave["b"] = node
    with gateway(tmp_path, fleet) as c:
        assert c.post("/v1/responses", json=BG).status_code == 200
        wait_until(lambda: c.get("/v1/responses/resp_1").json()["output_text"] == "Hel", "the output so far")
        r = c.post("/v1/responses/resp_1/cancel")
        assert r.status_code == 200
        cancelled = r.json()
        assert cancelled["status"] == "cancelled" and cancelled["incomplete_details"] == {"reason": "cancelled"}
        assert cancelled["output_text"] == "Hel" and cancelled["output"][0]["status"] == "incomplete"
        assert node.streams[0].closed.is_set()  # the node's request closed: the node stops its run
        events = replay(c, "resp_1")
        check_one_run(events)
        assert events[-1] == ("response.incomplete", {**events[-1][1], "response": cancelled})
        assert [d["item"]["status"] for n, d in events if n == "response.output_item.done"] == ["incomplete"]
        assert c.get("/v1/responses/resp_1").json() == cancelled
        assert c.post("/v1/responses/resp_1/cancel").json() == cancelled  # once ended, as it is
        # No node was asked to cancel it: the gateway's run is the gateway's.
        assert not [q for q in fleet.seen if "cancel" in q.url.path]


def test_v1_cancel_with_the_response_id_cancels_it(tmp_path: Path, fleet: Fleet) -> None:
    fleet.behave["a"] = fleet.behave["b"] = Node(threading.Event())
    with gateway(tmp_path, fleet) as c:
        assert c.post("/v1/responses", json=BG).status_code == 200
        assert c.post("/v1/cancel", json={"response_id": "resp_1"}).json() == {"cancelled": 1}
        assert c.get("/v1/responses/resp_1").json()["status"] == "cancelled"


def test_a_node_that_breaks_mid_run_is_continued_on_the_other(tmp_path: Path, fleet: Fleet) -> None:
    gate = threading.Event()
    fleet.behave["a"] = Node(gate, broken_at_gate=True)
    theirs = {**ITEM, "id": "msg_2"}
    fleet.behave["b"] = lambda r: sse(chunks=[
        r_event("response.created", 0, response=response("resp_2")),
        r_event("response.in_progress", 1, response=response("resp_2")),
        r_event("response.output_item.added", 2, output_index=0, item=theirs),
        r_event("response.content_part.added", 3, item_id="msg_2", output_index=0, content_index=0, part=PART),
        delta(4, "lo", "msg_2"), *ending("resp_2", 5, "lo", "msg_2")])
    with gateway(tmp_path, fleet) as c:
        started = c.post("/v1/responses", json=BG, headers=stick(c, "k", "a")).json()
        assert started["id"] == "resp_1"
        gate.set()  # node a breaks
        wait_until(lambda: c.get("/v1/responses/resp_1").json()["status"] == "completed", "the run to end")
        done = c.get("/v1/responses/resp_1").json()
        assert done["output_text"] == "Hello" and done["output"][0]["id"] == "msg_1"
        continued = json.loads([q for q in fleet.seen if q.url.port == 9102 and q.method == "POST"][-1].content)
        assert continued["continue_final_message"] is True and "background" not in continued
        events = replay(c, "resp_1")
        check_one_run(events)
        assert {d["item_id"] for _, d in events if "item_id" in d} == {"msg_1"}
        assert "".join(d["delta"] for n, d in events if n == "response.output_text.delta") == "Hello"


def test_the_final_object_outlives_a_restart_and_runs_cut_by_one_fail(tmp_path: Path, fleet: Fleet) -> None:
    gate = threading.Event()
    gate.set()
    fleet.behave["a"] = fleet.behave["b"] = Node(gate)
    with gateway(tmp_path, fleet) as c:
        c.post("/v1/responses", json=BG)
        wait_until(lambda: c.get("/v1/responses/resp_1").json()["status"] == "completed", "the run to end")
        done = c.get("/v1/responses/resp_1").json()
    slow = threading.Event()
    fleet.behave["a"] = fleet.behave["b"] = Node(slow)
    with gateway(tmp_path, fleet) as c:  # the nodes know no resp_1 (they answer 404): the gateway's copy
        assert c.get("/v1/responses/resp_1").json() == done
        r = c.get("/v1/responses/resp_1", params={"stream": "true"})
        assert r.status_code == 410 and r.json()["error"]["code"] == "events_expired"
        c.post("/v1/responses", json=BG)  # resp_1 again, left running when this gateway stops
    with gateway(tmp_path, fleet) as c:
        stopped = c.get("/v1/responses/resp_1").json()
        assert stopped["status"] == "failed" and stopped["error"]["code"] == "server_shutdown"
        assert stopped["output_text"] == "Hel"
    # A gateway killed mid-run leaves its row running: failed when the store next opens.
    asyncio.run(_left_running(tmp_path / "gateway.sqlite3", {**response("resp_9"), "background": True}))
    with gateway(tmp_path, fleet) as c:
        orphan = c.get("/v1/responses/resp_9").json()
        assert orphan["status"] == "failed" and orphan["error"]["code"] == "server_restarted"


async def _left_running(path: Path, run: dict[str, Any]) -> None:
    store = SqliteStore(path)
    await store.open()
    await store.save_background(run)
    await store.close()


def test_store_false_is_refused_before_anything_is_sent(client: TestClient, fleet: Fleet) -> None:
    r = client.post("/v1/responses", json={**BG, "store": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "background"
    assert not fleet.calls("/v1/responses")


def test_a_nodes_refusal_is_the_creators_answer_and_nothing_is_kept(client: TestClient, fleet: Fleet) -> None:
    fleet.behave["a"] = fleet.behave["b"] = lambda r: httpx.Response(
        400, json={"error": {"message": "bad tools", "param": "tools", "code": None}})
    r = client.post("/v1/responses", json=BG)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    runs = gateway_of(client.app).background
    wait_until(lambda: not runs._tasks, "the gateway's task to end")
    assert len(runs.logs) == 0
