"""Sessions and snapshots in-process, through every chat protocol: turns build on the stored
transcript, the KV stays with the session, snapshots round-trip, busy sessions are refused."""

from __future__ import annotations

import asyncio
import threading

from tests.api.conftest import ANSWER, Harness


async def test_a_session_across_the_three_chat_protocols(h: Harness) -> None:
    created = await h.post("/v1/sessions", {"session_id": "s1", "model": "fake"})
    assert created.status_code == 201 and created.json()["residency"] == "none"
    r = await h.post("/v1/chat/completions", {"model": "fake", "session_id": "s1", "temperature": 0,
                                              "messages": [{"role": "user", "content": "one"}]})
    assert r.json()["choices"][0]["message"]["content"] == ANSWER
    r = await h.post("/v1/messages", {"model": "fake", "session_id": "s1", "max_tokens": 64, "temperature": 0,
                                      "messages": [{"role": "user", "content": "two"}]})
    assert r.json()["usage"]["cache_read_input_tokens"] > 0  # the first turn's KV was reused
    r = await h.post("/v1/responses", {"model": "fake", "session_id": "s1", "input": "three", "temperature": 0})
    assert r.json()["status"] == "completed"
    history = (await h.client.get("/v1/sessions/s1/history")).json()["data"]
    assert [m["role"] for m in history] == ["user", "assistant"] * 3
    assert [m["content"] for m in history[::2]] == ["one", "two", "three"]
    info = (await h.client.get("/v1/sessions/s1")).json()
    assert info["residency"] == "resident" and info["current_pos"] > 0 and info["message_count"] == 6
    listed = (await h.client.get("/v1/sessions")).json()["data"]
    assert [s["session_id"] for s in listed] == ["s1"]


async def test_snapshot_save_and_load_keep_the_kv(h: Harness) -> None:
    await h.post("/v1/chat/completions", {"model": "fake", "session_id": "a", "temperature": 0,
                                          "messages": [{"role": "user", "content": "remember"}]})
    before = (await h.client.get("/v1/sessions/a")).json()
    snap = await h.post("/v1/sessions/a/save", {"title": "t"})
    assert snap.status_code == 201, snap.text
    snap_id = snap.json()["snapshot_id"]
    assert snap.json()["engine"]["kv_type"] == "fake"
    assert snap.json()["session"]["n_tokens"] == before["current_pos"]
    loaded = await h.post(f"/v1/snapshots/{snap_id}/load", {"session_id": "b"})
    assert loaded.status_code == 201, loaded.text
    assert loaded.json()["current_pos"] == before["current_pos"] and loaded.json()["residency"] == "host"
    r = await h.post("/v1/chat/completions", {"model": "fake", "session_id": "b", "temperature": 0,
                                              "messages": [{"role": "user", "content": "again"}]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert (await h.client.delete("/v1/sessions/a")).json()["deleted"] is True
    assert (await h.client.get("/v1/sessions/a")).status_code == 404
    assert [s["snapshot_id"] for s in (await h.client.get("/v1/snapshots")).json()["data"]] == [snap_id]


async def test_errors(h: Harness) -> None:
    r = await h.client.get("/v1/sessions/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
    r = await h.client.get("/v1/sessions/..")
    assert r.status_code in (400, 404)
    r = await h.post("/v1/sessions", {"session_id": "x", "max_seq_len": 10})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_seq_len"
    r = await h.post("/v1/chat/completions", {"model": "fake", "session_id": "bad id!",
                                              "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_session_id"
    r = await h.post("/v1/messages", {"model": "fake", "session_id": "s", "max_tokens": 10,
                                      "messages": [{"role": "user", "content": "x" * 3000}]})
    assert r.status_code == 400 and r.json()["type"] == "error"


async def test_a_busy_session_is_refused_and_its_turn_still_lands(h: Harness) -> None:
    assert h.runner is not None
    h.runner.gate = gate = threading.Event()
    turn = {"model": "fake", "session_id": "busy", "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
    task = asyncio.create_task(h.post("/v1/chat/completions", turn))
    assert await asyncio.to_thread(h.runner.entered.wait, 10)
    r = await h.post("/v1/chat/completions", {**turn, "session_wait": False})
    assert r.status_code == 409 and r.json()["error"]["code"] == "session_busy"
    assert (await h.client.delete("/v1/sessions/busy")).status_code == 409
    assert (await h.client.get("/v1/sessions/busy")).json()["busy"] is True
    gate.set()
    assert (await task).status_code == 200
    assert (await h.client.get("/v1/sessions/busy")).json()["message_count"] == 2


async def test_a_session_starts_from_a_given_transcript(h: Harness) -> None:
    """What the gateway uses to continue a session whose node died: the transcript, no KV."""
    given = [{"role": "user", "content": "my name is Ada"}, {"role": "assistant", "content": "Hi Ada"}]
    created = await h.post("/v1/sessions", {"session_id": "seeded", "model": "fake", "messages": given})
    assert created.status_code == 201, created.text
    assert created.json()["message_count"] == 2 and created.json()["residency"] == "none"
    r = await h.post("/v1/chat/completions", {"model": "fake", "session_id": "seeded", "temperature": 0,
                                              "messages": [{"role": "user", "content": "my name?"}]})
    assert r.status_code == 200
    history = (await h.client.get("/v1/sessions/seeded/history")).json()["data"]
    assert [m["content"] for m in history[:3]] == ["my name is Ada", "Hi Ada", "my name?"]
    bad = await h.post("/v1/sessions", {"session_id": "bad", "messages": [{"content": "no role"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"


async def test_session_create_false_refuses_an_unknown_session_on_every_protocol(h: Harness) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    bodies = {"/v1/chat/completions": {"model": "fake", "max_tokens": 4, "messages": msgs},
              "/v1/messages": {"model": "fake", "max_tokens": 8, "messages": msgs},
              "/v1/responses": {"model": "fake", "input": "hi"}}
    for path, body in bodies.items():
        r = await h.post(path, {**body, "session_id": "nowhere", "session_create": False})
        assert r.status_code == 404, (path, r.text)
        code = r.json()["error"]["type"] if path == "/v1/messages" else r.json()["error"]["code"]
        assert code == ("not_found_error" if path == "/v1/messages" else "session_not_found"), (path, r.text)
    assert (await h.client.get("/v1/sessions/nowhere")).status_code == 404  # nothing was created
    assert (await h.post("/v1/chat/completions", {**bodies["/v1/chat/completions"], "session_id": "here"})
            ).status_code == 200
    r = await h.post("/v1/chat/completions", {**bodies["/v1/chat/completions"], "session_id": "here",
                                              "session_create": False})
    assert r.status_code == 200, r.text  # an existing session: the turn runs
    assert (await h.client.get("/v1/sessions/here")).json()["message_count"] == 4
