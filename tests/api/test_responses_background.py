"""Background responses in-process: a run no client holds, polled, replayed from a sequence
number and followed live, cancelled, refused at admission, ended by a shutdown."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

from starlette.types import Message

from hearth.api.context import node_of
from hearth.api.openai.responses_store import ResponseStore
from tests.api.conftest import ANSWER, Harness, parse_sse, serve
from tests.api.test_admission_http import one_slot_backend
from tests.helpers import until

BODY = {"model": "fake", "input": "Hi", "temperature": 0}
BG = {**BODY, "background": True}


def gate(h: Harness) -> threading.Event:
    """Hold every decode until the returned event is set."""
    assert h.runner is not None
    h.runner.gate = opened = threading.Event()
    h.runner.entered.clear()
    return opened


async def entered(h: Harness) -> None:
    assert h.runner is not None
    assert await asyncio.to_thread(h.runner.entered.wait, 10), "the run never reached the engine"


async def status_of(h: Harness, rid: str) -> str:
    status: str = (await h.client.get(f"/v1/responses/{rid}")).json()["status"]
    return status


async def until_status(h: Harness, rid: str, *statuses: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def check() -> bool:
        seen.update((await h.client.get(f"/v1/responses/{rid}")).json())
        return seen["status"] in statuses

    for _ in range(5000):
        if await check():
            return seen
        await asyncio.sleep(0.005)
    raise AssertionError(f"{rid} never reached {statuses}: {seen.get('status')}")


async def replay(h: Harness, rid: str, query: str = "") -> str:
    r = await h.client.get(f"/v1/responses/{rid}?stream=true{query}")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    return r.text


async def test_a_background_response_runs_to_its_end_and_is_polled(h: Harness) -> None:
    plain = (await h.post("/v1/responses", BODY)).json()
    r = await h.post("/v1/responses", BG)
    assert r.status_code == 200, r.text
    created = r.json()
    assert created["background"] is True and created["status"] in ("queued", "in_progress")
    done = await until_status(h, created["id"], "completed")
    assert done["output_text"] == plain["output_text"] == ANSWER and done["background"] is True
    assert done["usage"]["output_tokens"] == plain["usage"]["output_tokens"]
    await until(lambda: len(node_of(h.app).cancels) == 0 and len(node_of(h.app).background) == 0)


async def test_a_streamed_background_response_is_replayed_from_any_sequence_number(h: Harness) -> None:
    first = await h.post("/v1/responses", {**BG, "stream": True})
    assert first.status_code == 200
    events = parse_sse(first.text)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert events[0][1]["response"]["background"] is True and events[-1][0] == "response.completed"
    rid = events[0][1]["response"]["id"]
    assert await replay(h, rid) == first.text  # the same bytes, every time
    for k in (0, 3, len(events) - 2, len(events) - 1, len(events) + 5):
        suffix = await replay(h, rid, f"&starting_after={k}")
        assert [d["sequence_number"] for _, d in parse_sse(suffix)] == list(range(k + 1, len(events)))
    final = (await h.client.get(f"/v1/responses/{rid}")).json()
    assert final == events[-1][1]["response"]


async def test_a_reader_follows_the_live_run_and_the_creator_leaving_does_not_stop_it(h: Harness) -> None:
    """The creating client disconnects mid-stream (raw ASGI); the run goes on, and a reader that
    joins from the middle gets every later event exactly once, then the end."""
    opened = gate(h)
    gone = asyncio.Event()
    sent: list[Message] = []
    body = json.dumps({**BG, "stream": True}).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> Message:
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/responses", "raw_path": b"/v1/responses",
             "query_string": b"", "headers": [(b"content-type", b"application/json")], "http_version": "1.1",
             "scheme": "http", "server": ("test", 80), "client": ("test", 1), "root_path": "", "app": h.app}
    task = asyncio.create_task(h.app(scope, receive, send))
    await entered(h)
    await until(lambda: any(m.get("body") for m in sent), "the first events")
    seen = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    got = parse_sse(seen.decode())
    rid, last = got[0][1]["response"]["id"], got[-1][1]["sequence_number"]
    gone.set()
    await asyncio.wait_for(task, 10)
    [run] = node_of(h.app).cancels._runs
    assert run.token.reason is None  # the disconnect did not cancel it
    assert await status_of(h, rid) == "in_progress"
    reader = asyncio.create_task(replay(h, rid, f"&starting_after={last}"))
    opened.set()
    rest = parse_sse(await asyncio.wait_for(reader, 20))
    whole = parse_sse(await replay(h, rid))
    assert got + rest == whole
    assert whole[-1][0] == "response.completed" and whole[-1][1]["response"]["output_text"] == ANSWER


async def test_concurrent_readers_each_get_every_event_once(h: Harness) -> None:
    opened = gate(h)
    created = (await h.post("/v1/responses", BG)).json()
    rid = created["id"]
    await entered(h)
    readers = [asyncio.create_task(replay(h, rid, q)) for q in ("", "&starting_after=0", "&starting_after=1")]
    await asyncio.sleep(0)
    opened.set()
    texts = await asyncio.gather(*readers)
    whole = parse_sse(texts[0])
    assert whole[-1][0] == "response.completed"
    assert parse_sse(texts[1]) == whole[1:] and parse_sse(texts[2]) == whole[2:]


async def test_cancel_a_background_response(h: Harness) -> None:
    opened = gate(h)
    created = (await h.post("/v1/responses", BG)).json()
    rid = created["id"]
    await entered(h)
    [run] = node_of(h.app).cancels._runs
    run.token.on_cancel(opened.set)
    ended = (await h.post(f"/v1/responses/{rid}/cancel")).json()
    assert ended["status"] == "cancelled" and ended["background"] is True
    again = await h.post(f"/v1/responses/{rid}/cancel")  # idempotent: the final object again
    assert again.status_code == 200 and again.json() == ended
    events = parse_sse(await replay(h, rid))
    assert events[-1][0] == "response.incomplete" and events[-1][1]["response"] == ended
    await until(lambda: h.backend.stats()["fake"].slots_busy == 0)


async def test_v1_cancel_by_response_id_cancels_a_background_run(h: Harness) -> None:
    opened = gate(h)
    rid = (await h.post("/v1/responses", BG)).json()["id"]
    await entered(h)
    [run] = node_of(h.app).cancels._runs
    run.token.on_cancel(opened.set)
    assert (await h.post("/v1/cancel", {"response_id": rid})).json() == {"cancelled": 1}
    assert (await until_status(h, rid, "cancelled"))["background"] is True


async def test_the_query_is_checked(h: Harness) -> None:
    plain = (await h.post("/v1/responses", BODY)).json()["id"]
    bg = (await h.post("/v1/responses", BG)).json()["id"]
    await until_status(h, bg, "completed")
    for query, param in (("?stream=maybe", "stream"), ("?stream=true&starting_after=-1", "starting_after"),
                         ("?stream=true&starting_after=abc", "starting_after"),
                         ("?stream=true&starting_after=1.5", "starting_after")):
        r = await h.client.get(f"/v1/responses/{bg}{query}")
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (query, r.text)
    r = await h.client.get(f"/v1/responses/{plain}?stream=true")
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    assert (await h.client.get(f"/v1/responses/{plain}?stream=false")).json()["id"] == plain
    assert (await h.client.get(f"/v1/responses/resp_{'0' * 32}?stream=true")).status_code == 404
    r = await h.post("/v1/responses", {**BG, "store": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "background"


async def test_events_past_the_caps_are_refused_not_skipped(tmp_path: Path) -> None:
    async with serve(tmp_path, answer="x" * 200) as h:
        logs = node_of(h.app).background.logs
        logs.max_bytes = 3000  # a few events' worth: the oldest are dropped
        rid = (await h.post("/v1/responses", BG)).json()["id"]
        await until_status(h, rid, "completed")
        log = logs.get(rid)
        assert log is not None and log.first_kept > 0
        r = await h.client.get(f"/v1/responses/{rid}?stream=true&starting_after=0")
        assert r.status_code == 410 and r.json()["error"]["code"] == "events_expired"
        tail = parse_sse(await replay(h, rid, f"&starting_after={log.first_kept - 1}"))
        assert tail[0][1]["sequence_number"] == log.first_kept and tail[-1][0] == "response.completed"
        logs.keep_seconds = 0  # ended logs expire at once
        r = await h.client.get(f"/v1/responses/{rid}?stream=true")
        assert r.status_code == 410 and r.json()["error"]["param"] == "stream"
        assert (await h.client.get(f"/v1/responses/{rid}")).json()["status"] == "completed"


async def test_a_full_queue_is_the_creating_requests_429_and_nothing_is_kept(tmp_path: Path) -> None:
    weights = tmp_path / "fake.gguf"
    weights.write_bytes(b"fake weights")
    backend, runner = one_slot_backend(weights, max_waiting=0, max_wait=5)
    async with serve(tmp_path, backend=backend, runner=runner) as h:
        opened = gate(h)
        first = (await h.post("/v1/responses", BG)).json()["id"]
        await entered(h)
        r = await h.post("/v1/responses", BG)
        assert r.status_code == 429, r.text
        rows = node_of(h.app).responses._db.execute("SELECT id FROM responses").fetchall()
        assert rows == [(first,)]
        opened.set()
        await until_status(h, first, "completed")


async def test_a_shutdown_ends_background_runs_as_failed_and_frees_their_slots(h: Harness) -> None:
    opened = gate(h)
    rid = (await h.post("/v1/responses", BG)).json()["id"]
    await entered(h)
    [run] = node_of(h.app).cancels._runs
    run.token.on_cancel(opened.set)
    await node_of(h.app).background.shutdown()
    ended = (await h.client.get(f"/v1/responses/{rid}")).json()
    assert ended["status"] == "failed" and ended["error"]["code"] == "server_shutdown"
    assert parse_sse(await replay(h, rid))[-1][0] == "response.failed"
    await until(lambda: h.backend.stats()["fake"].slots_busy == 0)
    assert len(node_of(h.app).cancels) == 0


async def test_the_time_cap_ends_a_background_run(tmp_path: Path) -> None:
    """As `past_the_time_cap`: the run is held in its first decode after its first token until its
    cap has passed."""
    async with serve(tmp_path, answer="x" * 2000) as h:
        opened = gate(h)
        assert h.runner is not None
        h.runner.gate_generating = True
        rid = (await h.post("/v1/responses", {**BG, "timeout": 0.2, "max_output_tokens": 1900})).json()["id"]
        await entered(h)
        passed = time.monotonic() + 0.2
        await until(lambda: time.monotonic() > passed, "the time cap to pass")
        opened.set()
        ended = await until_status(h, rid, "incomplete", "completed", "cancelled")
        assert ended["status"] == "incomplete" and ended["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_run_left_by_a_dead_process_is_failed_when_the_store_opens(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "hearth.db")
    rid, plain = "resp_" + "a" * 32, "resp_" + "b" * 32
    store.put({"id": rid, "background": True, "status": "in_progress", "output": []}, [])
    store.put({"id": plain, "background": False, "status": "in_progress", "output": []}, [])
    store.close()
    reopened = ResponseStore(tmp_path / "hearth.db")
    bg = reopened.get(rid)
    assert bg is not None and bg.response["status"] == "failed"
    assert bg.response["error"]["code"] == "server_restarted"
    other = reopened.get(plain)  # a plain stored answer cut by the process's death: failed too
    assert other is not None and other.response["status"] == "failed"
    assert other.response["error"]["code"] == "server_restarted"
