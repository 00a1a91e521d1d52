"""POST /v1/responses in-process: the response object, its event order, stored responses,
failures, cancel and the time cap."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from hearth.api.context import node_of
from tests.api.conftest import ANSWER, Harness, past_the_time_cap, serve

BODY = {"model": "fake", "input": "Hi", "temperature": 0}


async def test_response_object(h: Harness) -> None:
    r = await h.post("/v1/responses", BODY)
    assert r.status_code == 200, r.text
    resp = r.json()
    assert resp["object"] == "response" and resp["status"] == "completed" and resp["output_text"] == ANSWER
    [item] = resp["output"]
    assert item["type"] == "message" and item["content"][0]["text"] == ANSWER
    assert resp["usage"]["output_tokens"] == len(ANSWER) + 1
    assert (await h.client.get(f"/v1/responses/{resp['id']}")).json() == resp


async def test_event_order(h: Harness) -> None:
    events = await h.sse("/v1/responses", BODY)
    kinds = [e for e, _ in events]
    assert kinds[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert "".join(d["delta"] for e, d in events if e == "response.output_text.delta") == ANSWER


async def test_errors(h: Harness) -> None:
    r = await h.post("/v1/responses", {**BODY, "previous_response_id": "resp_nope"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"
    r = await h.post("/v1/responses", {**BODY, "background": True, "store": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "background"


async def test_engine_failure_is_a_500_and_is_stored_as_failed(h: Harness) -> None:
    assert h.runner is not None
    h.runner.fail_decodes = 1
    r = await h.post("/v1/responses", BODY)
    assert r.status_code == 500 and r.json()["error"]["code"] == "generation_failed"
    listed = node_of(h.app).responses._db.execute("SELECT id FROM responses").fetchall()
    [(rid,)] = listed
    stored = (await h.client.get(f"/v1/responses/{rid}")).json()
    assert stored["status"] == "failed" and stored["error"]["code"] == "server_error"
    h.runner.fail_decodes = 1
    events = await h.sse("/v1/responses", BODY)
    assert events[-1][0] == "response.failed"


async def test_the_time_cap_is_max_output_tokens_named_timeout(tmp_path: Path) -> None:
    async with serve(tmp_path, answer="x" * 2000, request_timeout=0.2) as h:
        resp = (await past_the_time_cap(h, "/v1/responses", {**BODY, "max_output_tokens": 1500}, 0.2)).json()
        assert resp["status"] == "incomplete"
        assert resp["incomplete_details"] == {"reason": "max_output_tokens"} and resp["stop_reason"] == "timeout"


async def test_cancel_a_running_response(h: Harness) -> None:
    """The cancel endpoint stops the run and returns the response as it ended."""
    assert h.runner is not None
    h.runner.gate = gate = threading.Event()
    task = asyncio.create_task(h.post("/v1/responses", BODY))
    assert await asyncio.to_thread(h.runner.entered.wait, 10)  # the run holds the engine
    [run] = node_of(h.app).cancels._runs
    run.token.on_cancel(gate.set)  # the engine moves on once the cancel has landed
    [rid] = run.ids
    ended = (await h.post(f"/v1/responses/{rid}/cancel")).json()
    assert ended["status"] == "incomplete" and ended["incomplete_details"] == {"reason": "cancelled"}
    assert (await task).json() == ended
