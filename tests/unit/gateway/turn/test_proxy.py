"""The gateway in-process over fake upstreams (httpx.MockTransport): credentials, retries
before the first byte, protocol terminal errors after it, models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from hearth.gateway.state import gateway_of
from tests.helpers.fake_fleet import NEVER, OK_CHAT, Fleet, chat_chunk, gateway, pool_of, sse, stick, stream_text


@pytest.fixture
def fleet() -> Fleet:
    return Fleet()




@pytest.fixture
def client(tmp_path: Path, fleet: Fleet) -> Iterator[TestClient]:
    with gateway(tmp_path, fleet) as c:
        yield c






def test_upstream_gets_its_own_key_never_the_clients(client: TestClient, fleet: Fleet) -> None:
    r = client.post("/v1/chat/completions", json={"model": "smol", "messages": [{"role": "user", "content": "x"}]},
                    headers={"x-api-key": "gw-key", "X-Session-Id": "k"})
    assert r.status_code == 200
    assert r.json()["model"] == "smol"  # the alias the client asked for, not the upstream's id
    assert r.headers["x-hearth-upstream"] in ("a", "b")
    sent = fleet.calls("/v1/chat/completions")[0]
    assert sent.headers["authorization"] in ("Bearer up-a", "Bearer up-b")
    assert "x-api-key" not in sent.headers
    assert "x-hearth-tenant" not in sent.headers  # --api-key alone: one tenant, as before tenants (tenancy.py)
    assert sent.headers["x-request-id"] == r.headers["x-request-id"]  # one id in both logs
    assert json.loads(sent.content)["model"] == "up-model"
    probes = fleet.calls("/health")
    assert probes and all(p.headers["authorization"].startswith("Bearer up-") for p in probes)


def test_gateway_keys_hold_in_each_protocols_envelope(client: TestClient, fleet: Fleet) -> None:
    for path, body in (("/v1/chat/completions", {"model": "smol", "messages": []}), ("/v1/models", None),
                       ("/admin/status", None)):
        r = client.request("POST" if body else "GET", path, json=body, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", path
    r = client.post("/v1/messages", json={"model": "smol"}, headers={"Authorization": ""})
    assert r.status_code == 401 and r.json()["type"] == "error"
    assert not fleet.calls("/v1/chat/completions") and not fleet.calls("/v1/messages")


def test_models_list_aliases_and_unknown_model_is_404_in_the_protocols_envelope(client: TestClient) -> None:
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["smol"]
    r = client.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": []})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = client.post("/v1/messages", json={"model": "claude", "max_tokens": 5, "messages": []})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_connect_error_is_retried_on_another_node(client: TestClient, fleet: Fleet) -> None:
    def refuse(r: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    fleet.behave["a"] = refuse
    r = client.post("/v1/chat/completions", json={"model": "smol", "messages": []}, headers=stick(client, "k", "a"))
    assert r.status_code == 200
    assert [c.url.port for c in fleet.calls("/v1/chat/completions")] == [9101, 9102]  # a refused, b answered
    assert pool_of(client).nodes["a"].breaker.failures == 1


def test_upstream_429_is_retried_elsewhere_and_the_node_rests_for_retry_after(client: TestClient,
                                                                              fleet: Fleet) -> None:
    fleet.behave["a"] = lambda r: httpx.Response(429, headers={"Retry-After": "30"}, json={"error": {}})
    r = client.post("/v1/chat/completions", json={"model": "smol", "messages": []}, headers=stick(client, "k", "a"))
    assert r.status_code == 200
    a = pool_of(client).nodes["a"]
    assert a.breaker.failures == 0 and not a.routable(pool_of(client).clock())


def test_client_errors_pass_through_and_do_not_trip_the_breaker(client: TestClient, fleet: Fleet) -> None:
    err = {"error": {"message": "bad", "type": "invalid_request_error", "param": "x", "code": None}}
    fleet.behave["a"] = fleet.behave["b"] = lambda r: httpx.Response(400, json=err)
    for _ in range(5):
        r = client.post("/v1/chat/completions", json={"model": "smol", "messages": []})
        assert r.status_code == 400 and r.json() == err
    assert all(n.breaker.state == "closed" and n.breaker.failures == 0 for n in pool_of(client).nodes.values())


def test_every_node_failing_is_503_with_retry_after(client: TestClient, fleet: Fleet) -> None:
    fleet.behave["a"] = fleet.behave["b"] = lambda r: httpx.Response(503, json={"error": {}})
    r = client.post("/v1/messages", json={"model": "smol", "max_tokens": 5, "messages": []})
    assert r.status_code == 503 and "retry-after" in r.headers
    assert r.json()["error"]["type"] == "overloaded_error"




def test_chat_stream_broken_mid_way_ends_with_an_error_chunk_and_done(client: TestClient, fleet: Fleet) -> None:
    fleet.behave["a"] = lambda r: sse(chunks=[chat_chunk("Hel"), chat_chunk("lo")], broken=True)
    text = stream_text(client, "/v1/chat/completions", {"model": "smol", "messages": []}, stick(client, "k", "a"))
    events = [e for e in text.split("\n\n") if e]
    assert text.count('"Hel"') == 1 and text.count('"lo"') == 1  # relayed once, never retried after the first byte
    assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == "upstream_failed"
    assert events[-1] == "data: [DONE]"
    # b was asked to continue the answer (migration.py) and answered something else: the error stands.
    _, second = fleet.calls("/v1/chat/completions")
    assert json.loads(second.content)["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert pool_of(client).nodes["a"].breaker.failures == 1  # recorded when the stream ended


def test_anthropic_stream_broken_mid_way_ends_with_event_error(client: TestClient, fleet: Fleet) -> None:
    start = b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","model":"up-model"}}\n\n'
    fleet.behave["a"] = lambda r: sse(chunks=[start[:30], start[30:]], broken=True)  # split inside an event
    text = stream_text(client, "/v1/messages", {"model": "smol", "max_tokens": 5, "messages": []},
                       stick(client, "k", "a"))
    events = [e for e in text.split("\n\n") if e]
    assert events[0].startswith("event: message_start") and '"model":"smol"' in events[0]
    assert events[-1].startswith("event: error\n")
    assert json.loads(events[-1].split("data: ", 1)[1])["error"]["type"] == "api_error"


def test_responses_stream_broken_mid_way_ends_with_response_failed(client: TestClient, fleet: Fleet) -> None:
    created = {"type": "response.created", "sequence_number": 0,
               "response": {"id": "resp_abc", "object": "response", "status": "in_progress", "model": "up-model"}}
    fleet.behave["a"] = lambda r: sse(chunks=[b"event: response.created\ndata: " + json.dumps(created).encode()
                                              + b"\n\n"], broken=True)
    text = stream_text(client, "/v1/responses", {"model": "smol", "input": "x"}, stick(client, "k", "a"))
    last = [e for e in text.split("\n\n") if e][-1]
    assert last.startswith("event: response.failed\n")
    failed = json.loads(last.split("data: ", 1)[1])
    assert failed["response"]["id"] == "resp_abc" and failed["response"]["status"] == "failed"
    assert failed["sequence_number"] == 1


def test_stream_closed_without_its_final_event_counts_as_broken(client: TestClient, fleet: Fleet) -> None:
    fleet.behave["a"] = lambda r: sse(chunks=[chat_chunk("x")])  # clean close, but no [DONE]
    text = stream_text(client, "/v1/chat/completions", {"model": "smol", "messages": []}, stick(client, "k", "a"))
    assert text.rstrip().endswith("data: [DONE]") and "upstream_failed" in text


def test_stream_broken_before_its_first_event_is_retried(client: TestClient, fleet: Fleet) -> None:
    fleet.behave["a"] = lambda r: sse(chunks=[], broken=True)
    fleet.behave["b"] = lambda r: sse(chunks=[chat_chunk("ok"), b"data: [DONE]\n\n"])
    text = stream_text(client, "/v1/chat/completions", {"model": "smol", "messages": []}, stick(client, "k", "a"))
    assert '"ok"' in text and "error" not in text
    assert [c.url.port for c in fleet.calls("/v1/chat/completions")] == [9101, 9102]


def test_heartbeat_comments_while_the_node_is_still_prefilling(client: TestClient, fleet: Fleet) -> None:
    # The fake node sends nothing for 20 heartbeat periods: the client still hears from the gateway.
    # (Not a race: the gateway's 0.05 s wait is armed before the node's 1 s sleep starts, and
    # asyncio runs due timers in deadline order, so even a loop stalled past both sees the
    # heartbeat's first.)
    fleet.behave["a"] = lambda r: sse(chunks=[chat_chunk("ok"), b"data: [DONE]\n\n"], prefill=1.0)
    text = stream_text(client, "/v1/chat/completions", {"model": "smol", "messages": []}, stick(client, "k", "a"))
    assert text.startswith(": keep-alive\n\n")
    assert text.rstrip().endswith("data: [DONE]") and '"ok"' in text and "error" not in text


def test_a_stream_silent_past_the_stall_timeout_ends_with_the_terminal_error(tmp_path: Path, fleet: Fleet) -> None:
    # The node sent an event, then nothing (stopped): heartbeats keep the client company until the
    # stall timeout, then the protocol's terminal error; the node's breaker records a failure.
    # (Not a race: each beat's timer is due before the 0.3 s stall timer armed after the last
    # write, and asyncio runs due timers in deadline order, so a keep-alive precedes the error.)
    fleet.behave["a"] = lambda r: sse(chunks=[chat_chunk("Hel")], stall=NEVER)
    with gateway(tmp_path, fleet, stall_timeout=0.3, migration_limit=0) as c:
        text = stream_text(c, "/v1/chat/completions", {"model": "smol", "messages": []}, stick(c, "k", "a"))
        events = [e for e in text.split("\n\n") if e]
        assert text.count('"Hel"') == 1 and ": keep-alive" in events
        error = json.loads(events[-2].removeprefix("data: "))["error"]
        assert error["code"] == "upstream_failed" and "no bytes from the upstream for 0.3 s" in error["message"]
        assert events[-1] == "data: [DONE]"
        assert len(fleet.calls("/v1/chat/completions")) == 1
        assert pool_of(c).nodes["a"].breaker.failures == 1


def test_a_stream_silent_past_the_stall_timeout_before_its_first_byte_is_retried(tmp_path: Path,
                                                                                 fleet: Fleet) -> None:
    fleet.behave["a"] = lambda r: sse(chunks=[chat_chunk("never")], prefill=NEVER)
    fleet.behave["b"] = lambda r: sse(chunks=[chat_chunk("ok"), b"data: [DONE]\n\n"])
    with gateway(tmp_path, fleet, stall_timeout=0.2, heartbeat=30) as c:  # nothing reached the client yet
        text = stream_text(c, "/v1/chat/completions", {"model": "smol", "messages": []}, stick(c, "k", "a"))
        assert '"ok"' in text and "never" not in text and "error" not in text
        assert [r.url.port for r in fleet.calls("/v1/chat/completions")] == [9101, 9102]


def test_a_silent_stream_is_waited_for_without_a_stall_timeout(tmp_path: Path, fleet: Fleet) -> None:
    # 0 turns it off: a stream silent for longer than a small timeout would allow still completes.
    fleet.behave["a"] = lambda r: sse(chunks=[chat_chunk("Hel"), b"data: [DONE]\n\n"], prefill=0.5)
    with gateway(tmp_path, fleet, stall_timeout=0, heartbeat=30) as c:
        text = stream_text(c, "/v1/chat/completions", {"model": "smol", "messages": []}, stick(c, "k", "a"))
        assert '"Hel"' in text and text.rstrip().endswith("data: [DONE]") and "error" not in text


def test_session_ids_are_checked_before_they_reach_an_upstream_url(client: TestClient, fleet: Fleet) -> None:
    r = client.post("/v1/chat/completions", json={"model": "smol", "messages": [], "session_id": "../../admin"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_session_id"
    assert not fleet.calls("/v1/chat/completions")


def test_every_node_full_is_429_not_503(client: TestClient, fleet: Fleet) -> None:
    fleet.behave["a"] = fleet.behave["b"] = lambda r: httpx.Response(429, headers={"Retry-After": "7"}, json={})
    r = client.post("/v1/chat/completions", json={"model": "smol", "messages": []})
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert r.json()["error"]["code"] == "upstreams_full"


def test_an_empty_stream_is_retried_not_left_hanging(client: TestClient, fleet: Fleet) -> None:
    fleet.behave["a"] = lambda r: sse(chunks=[])
    fleet.behave["b"] = lambda r: sse(chunks=[chat_chunk("ok"), b"data: [DONE]\n\n"])
    text = stream_text(client, "/v1/chat/completions", {"model": "smol", "messages": []}, stick(client, "k", "a"))
    assert '"ok"' in text and text.rstrip().endswith("data: [DONE]")


def test_the_chat_page_and_health_need_no_key(client: TestClient) -> None:
    page = client.get("/", headers={"Authorization": ""})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    health = client.get("/health", headers={"Authorization": ""})
    assert health.status_code == 200 and set(health.json()["nodes_up"]) == {"a", "b"}


def test_a_response_chain_whose_node_is_down_is_replayed_on_another(client: TestClient, fleet: Fleet) -> None:
    said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi Ada"}]}
    fleet.behave["a"] = lambda r: httpx.Response(200, json={"id": "resp_1", "object": "response", "model": "up-model",
                                                            "status": "completed", "output": [said]})
    first = client.post("/v1/responses", json={"model": "smol", "input": "I am Ada"}, headers=stick(client, "k", "a"))
    assert first.json()["id"] == "resp_1"
    pool_of(client).nodes["a"].live.up = False
    fleet.behave["b"] = lambda r: httpx.Response(200, json={"id": "resp_2", "object": "response", "output": []})
    r = client.post("/v1/responses", json={"model": "smol", "input": "Who am I?", "previous_response_id": "resp_1"})
    assert r.status_code == 200 and r.headers["x-hearth-upstream"] == "b"
    sent = json.loads(fleet.calls("/v1/responses")[-1].content)
    assert "previous_response_id" not in sent
    assert sent["input"] == [{"type": "message", "role": "user", "content": "I am Ada"}, said,
                             {"type": "message", "role": "user", "content": "Who am I?"}]


def test_a_rollback_through_the_gateway_refreshes_its_transcript_copy(client: TestClient, fleet: Fleet) -> None:
    kept = [{"role": "user", "content": "first"}]

    def node(r: httpx.Request) -> httpx.Response:
        if r.url.path.endswith("/history"):
            return httpx.Response(200, json={"object": "list", "data": kept})
        return httpx.Response(200, json={"object": "session", "session_id": "s", "message_count": 1})

    fleet.behave["a"] = node
    store = pool_of(client).store
    client.portal.call(store.assign, "session:s", "a")
    client.portal.call(store.save_transcript, "s", "smol", kept + [{"role": "assistant", "content": "old"}] * 3)
    r = client.post("/v1/sessions/s/rollback", json={"keep_messages": 1})
    assert r.status_code == 200 and fleet.calls("/v1/sessions/s/rollback")[0].url.port == 9101
    client.portal.call(gateway_of(client.app).proxy.continuity.idle)
    assert client.portal.call(store.transcript, "s") == ("smol", kept)


def test_drain_drops_a_stale_copy_instead_of_moving_it_over_the_live_session(client: TestClient,
                                                                             fleet: Fleet) -> None:
    # `a` crashed and came back with its data dir: it still lists "moved-on", which continued on
    # `b` meanwhile. Moving a's copy would overwrite b's newer one; drain deletes it instead.
    store = pool_of(client).store
    client.portal.call(store.assign, "session:moved-on", "b")

    def node_a(r: httpx.Request) -> httpx.Response:
        if r.method == "GET" and r.url.path == "/v1/sessions":
            return httpx.Response(200, json={"object": "list", "data": [{"session_id": "moved-on"}]})
        if r.method == "DELETE" and r.url.path == "/v1/sessions/moved-on":
            return httpx.Response(200, json={"deleted": True})
        return httpx.Response(500, json={"error": {"message": f"unexpected {r.method} {r.url.path}"}})

    fleet.behave["a"] = node_a
    report = client.post("/admin/nodes/a/drain").json()
    assert report["moved"] == [] and report["failed"] == [] and report["stale"] == ["moved-on"]
    assert [(r.method, r.url.path) for r in fleet.seen if r.url.port == 9101 and r.url.path != "/health"] == [
        ("GET", "/v1/sessions"), ("DELETE", "/v1/sessions/moved-on")]
    assert [r for r in fleet.seen if r.url.port == 9102 and r.url.path != "/health"] == []  # b's copy untouched
    assert client.portal.call(store.node_of, "session:moved-on") == "b"


def test_a_session_its_node_lost_is_restored_from_the_transcript_not_started_afresh(client: TestClient,
                                                                                    fleet: Fleet) -> None:
    # `a` was replaced with an empty disk: the session the gateway holds there is gone. Its next
    # turn says session_create false, gets 404, and the gateway restores the session from its
    # transcript on `a` and sends the turn again.
    history = [{"role": "user", "content": "I am Ada"}, {"role": "assistant", "content": "Hi Ada"}]
    store = pool_of(client).store
    client.portal.call(store.assign, "session:lost", "a")
    client.portal.call(store.save_transcript, "lost", "smol", history)
    on_a: dict[str, list[Any]] = {}

    def node_a(r: httpx.Request) -> httpx.Response:
        if r.method == "POST" and r.url.path == "/v1/chat/completions":
            body = json.loads(r.content)
            if body["session_id"] not in on_a and body.get("session_create") is False:
                return httpx.Response(404, json={"error": {"message": "session lost not found",
                                                           "code": "session_not_found"}})
            return httpx.Response(200, json=OK_CHAT)
        if r.method == "GET" and r.url.path == "/v1/sessions/lost":
            return httpx.Response(200 if "lost" in on_a else 404, json={})
        if r.method == "POST" and r.url.path == "/v1/sessions":
            body = json.loads(r.content)
            on_a[body["session_id"]] = body["messages"]
            return httpx.Response(200, json={"object": "session", "session_id": body["session_id"]})
        if r.url.path.endswith("/history"):
            return httpx.Response(200, json={"object": "list", "data": on_a.get("lost", [])})
        return httpx.Response(500, json={"error": {"message": f"unexpected {r.method} {r.url.path}"}})

    fleet.behave["a"] = node_a
    r = client.post("/v1/chat/completions", json={"model": "smol", "session_id": "lost",
                                                  "messages": [{"role": "user", "content": "Who am I?"}]})
    assert r.status_code == 200 and r.headers["x-hearth-upstream"] == "a"
    assert on_a["lost"] == history  # restored from the gateway's copy
    turns = [json.loads(c.content) for c in fleet.calls("/v1/chat/completions")]
    assert [t["session_create"] for t in turns] == [False, False]  # refused, then run on the restored session
    # A 404 that is not a lost session is the client's answer, unchanged.
    on_a.clear()
    fleet.behave["a"] = lambda r: (httpx.Response(200, json={}) if r.method == "GET" else
                                   httpx.Response(404, json={"error": {"message": "no such model", "code": "x"}}))
    r = client.post("/v1/chat/completions", json={"model": "smol", "session_id": "lost",
                                                  "messages": [{"role": "user", "content": "Again?"}]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "x"
