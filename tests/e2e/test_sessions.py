"""Sessions end to end: the real server and model, driven through the openai and anthropic
SDKs and raw HTTP. Continuations are compared at temperature 0 against the same
conversation run without the event under test (swap, snapshot, archive, restart)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import numpy as np
import openai
import pytest

from hearth import test_gate
from tests.helpers import Server, start_server, stop_server, wait_until

pytestmark = pytest.mark.slow

SYSTEM = {"role": "system", "content": "You are a helpful assistant who answers briefly."}
Q1 = {"role": "user", "content": "Name three colors of the rainbow."}
Q2 = {"role": "user", "content": "Now name three animals that live on a farm."}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """4 slots, so 12 sessions must share them."""
    s = start_server(tmp_path_factory.mktemp("sessions"), "--parallel", "4", "--ctx", "2048")
    yield s
    stop_server(s)


def client(s: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.base_url, api_key="none", timeout=600, max_retries=0)


@pytest.fixture
def oai(srv: Server) -> Iterator[openai.OpenAI]:
    with client(srv) as c:  # closed after the test: one left to the garbage collector leaks its socket
        yield c


@pytest.fixture
def ac(srv: Server) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=srv.url, api_key="none", timeout=120, max_retries=0) as c:
        yield c


def turn(s: Server, sid: str, messages: list[dict[str, Any]], max_tokens: int = 24, **extra: Any) -> Any:
    with client(s) as c:  # closed here: a client left to the garbage collector leaks its socket
        return c.chat.completions.create(
            model="default", messages=messages, temperature=0, max_tokens=max_tokens,  # type: ignore[arg-type]
            extra_body={"session_id": sid, **extra})


def info(s: Server, sid: str) -> dict[str, Any]:
    r = httpx.get(f"{s.base_url}/sessions/{sid}", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def history(s: Server, sid: str) -> list[dict[str, Any]]:
    return httpx.get(f"{s.base_url}/sessions/{sid}/history", timeout=10).json()["data"]  # type: ignore[no-any-return]


def two_turns(s: Server, sid: str) -> tuple[Any, Any]:
    # The first turn recomputes everything (no prefix borrowed from another session), so two
    # sessions with the same messages hold bit-identical KV.
    first = turn(s, sid, [SYSTEM, Q1], cache_prompt=False)
    return first, turn(s, sid, [Q2])


def text(r: Any) -> str:
    return r.choices[0].message.content  # type: ignore[no-any-return]


# ---- turns ------------------------------------------------------------------------------------


def test_a_turn_prefills_only_its_new_tokens_and_the_transcript_grows(srv: Server) -> None:
    first, second = two_turns(srv, "grow")
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    kv_after_first = first.usage.prompt_tokens + first.usage.completion_tokens - 1
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens, "the first turn's prompt must come from the KV"
    assert cached <= kv_after_first
    new_tokens = second.usage.prompt_tokens - cached
    assert new_tokens < 40, f"only the new user message should be prefilled, got {new_tokens} tokens"
    h = history(srv, "grow")
    assert [m["role"] for m in h] == ["system", "user", "assistant", "user", "assistant"]
    assert h[2]["content"] == text(first) and h[4]["content"] == text(second)
    i = info(srv, "grow")
    assert i["message_count"] == 5 and i["residency"] == "resident"
    assert i["current_pos"] == second.usage.prompt_tokens + second.usage.completion_tokens - 1


def test_a_repeated_system_message_is_not_duplicated_and_a_different_one_needs_replace(srv: Server) -> None:
    turn(srv, "sys", [SYSTEM, Q1], max_tokens=4)
    turn(srv, "sys", [SYSTEM, Q2], max_tokens=4)
    assert [m["role"] for m in history(srv, "sys")].count("system") == 1
    with pytest.raises(openai.ConflictError) as e:
        turn(srv, "sys", [{"role": "system", "content": "Be rude."}, Q1], max_tokens=4)
    assert e.value.body["code"] == "system_mismatch"  # type: ignore[index]
    turn(srv, "sys", [{"role": "system", "content": "Be rude."}, Q1], max_tokens=4, replace_system=True)
    h = history(srv, "sys")
    assert h[0] == {"role": "system", "content": "Be rude."} and len(h) == 7


def test_twelve_sessions_on_four_slots_all_keep_their_kv(srv: Server) -> None:
    firsts = {}
    for i in range(12):
        firsts[i] = turn(srv, f"many{i}", [{"role": "user", "content": f"Session {i}: say hello to {i} friends."}],
                         max_tokens=8)
    where = [info(srv, f"many{i}")["residency"] for i in range(12)]
    assert where.count("resident") <= 4 and where.count("host") >= 8, where
    for i in range(12):
        r = turn(srv, f"many{i}", [{"role": "user", "content": "Again."}], max_tokens=4)
        assert r.usage.prompt_tokens_details.cached_tokens >= firsts[i].usage.prompt_tokens, f"session {i}"


def test_continuation_after_swap_out_equals_the_one_without(srv: Server) -> None:
    _, ref = two_turns(srv, "ref-swap")
    turn(srv, "swapped", [SYSTEM, Q1], cache_prompt=False)
    for i in range(5):  # more sessions than slots push "swapped" out to host RAM
        turn(srv, f"pusher{i}", [{"role": "user", "content": f"Count to {i}."}], max_tokens=4)
    assert info(srv, "swapped")["residency"] == "host"
    got = turn(srv, "swapped", [Q2])
    assert text(got) == text(ref)
    assert got.usage.prompt_tokens_details.cached_tokens == ref.usage.prompt_tokens_details.cached_tokens


def test_streamed_session_turn_equals_the_non_streamed_one(srv: Server, oai: openai.OpenAI) -> None:
    _, ref = two_turns(srv, "ref-stream")
    turn(srv, "streamed", [SYSTEM, Q1], cache_prompt=False)
    stream = oai.chat.completions.create(
        model="default", messages=[Q2], temperature=0, max_tokens=24, stream=True,  # type: ignore[list-item]
        stream_options={"include_usage": True}, extra_body={"session_id": "streamed"})
    parts, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        usage = chunk.usage or usage
    assert "".join(parts) == text(ref)
    assert usage is not None
    assert usage.prompt_tokens_details.cached_tokens == ref.usage.prompt_tokens_details.cached_tokens


def test_stateless_requests_reuse_a_sessions_prefix(srv: Server, oai: openai.OpenAI) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Describe a sunny beach in two sentences, please."}]
    turn(srv, "prefix-src", messages, max_tokens=4)
    r = oai.chat.completions.create(model="default", messages=messages, temperature=0,  # type: ignore[arg-type]
                                    max_tokens=4)
    assert r.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 1


def test_anthropic_and_responses_turns_continue_a_session(srv: Server, oai: openai.OpenAI,
                                                          ac: anthropic.Anthropic) -> None:
    a1 = ac.messages.create(model="default", max_tokens=8, messages=[Q1],  # type: ignore[list-item]
                            extra_body={"session_id": "proto", "temperature": 0})
    a2 = ac.messages.create(model="default", max_tokens=8, messages=[Q2],  # type: ignore[list-item]
                            extra_body={"session_id": "proto", "temperature": 0})
    a1_prompt = a1.usage.input_tokens + (a1.usage.cache_read_input_tokens or 0)
    assert (a2.usage.cache_read_input_tokens or 0) >= a1_prompt, "the first turn's prompt comes from the KV"
    r3 = oai.responses.create(model="default", input="And three fruits?", max_output_tokens=8,
                              temperature=0, extra_body={"session_id": "proto"})
    a2_prompt = a2.usage.input_tokens + (a2.usage.cache_read_input_tokens or 0)
    assert r3.usage is not None and r3.usage.input_tokens_details.cached_tokens >= a2_prompt
    roles = [m["role"] for m in history(srv, "proto")]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]


# ---- control ------------------------------------------------------------------------------------


def test_rollback_keeps_the_kv_of_the_kept_part(srv: Server) -> None:
    first, _ = two_turns(srv, "rb")
    r = httpx.post(f"{srv.base_url}/sessions/rb/rollback", json={"keep_messages": 3}, timeout=10)
    assert r.status_code == 200 and r.json()["message_count"] == 3
    assert [m["content"] for m in history(srv, "rb")][2] == text(first)
    again = turn(srv, "rb", [{"role": "user", "content": "Tell me a fun fact."}], max_tokens=4)
    assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    assert info(srv, "rb")["message_count"] == 5
    bad = httpx.post(f"{srv.base_url}/sessions/rb/rollback", json={"keep_messages": 99}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "keep_messages"


def test_resize_and_a_turn_that_would_overflow(srv: Server) -> None:
    created = httpx.post(f"{srv.base_url}/sessions", json={"session_id": "small", "max_seq_len": 64}, timeout=10)
    assert created.status_code == 201 and created.json()["max_seq_len"] == 64
    turn(srv, "small", [Q1], max_tokens=8)
    with pytest.raises(openai.BadRequestError) as e:
        turn(srv, "small", [{"role": "user", "content": "word " * 40}], max_tokens=8)
    assert "resize" in str(e.value) and "rollback" in str(e.value)
    assert info(srv, "small")["message_count"] == 2, "a refused turn stores nothing"
    r = httpx.post(f"{srv.base_url}/sessions/small/resize/next_pow2", timeout=10)
    assert r.status_code == 200 and r.json()["max_seq_len"] == 128
    turn(srv, "small", [{"role": "user", "content": "word " * 40}], max_tokens=8)
    r = httpx.post(f"{srv.base_url}/sessions/small/resize", json={"max_seq_len": 40}, timeout=10)
    assert r.status_code == 400 and "drop_oldest" in r.json()["error"]["message"]
    r = httpx.post(f"{srv.base_url}/sessions/small/resize", json={"max_seq_len": 100, "strategy": "drop_oldest"},
                   timeout=10)
    assert r.status_code == 200 and r.json()["message_count"] < 4
    r = httpx.post(f"{srv.base_url}/sessions/small/resize", json={"max_seq_len": 99999}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_seq_len"


def test_rollback_and_resize_answer_idle_with_a_current_pos_within_the_transcript(srv: Server) -> None:
    # regressions: "busy": true on an idle session; current_pos counting dropped turns and
    # exceeding the new max_seq_len
    two_turns(srv, "pos")
    full = info(srv, "pos")["current_pos"]
    r = httpx.post(f"{srv.base_url}/sessions/pos/rollback", json={"keep_messages": 2}, timeout=10).json()
    assert r["busy"] is False and r["status"] == "idle"
    assert 0 < r["current_pos"] < full and r["cache_position"] == r["current_pos"]
    assert r["session"]["session_id"] == "pos" and r["session"]["current_pos"] == r["current_pos"]
    assert info(srv, "pos")["current_pos"] == r["current_pos"]
    turn(srv, "pos", [Q2])
    assert info(srv, "pos")["current_pos"] > 64
    r = httpx.post(f"{srv.base_url}/sessions/pos/resize", json={"max_seq_len": 64, "strategy": "drop_oldest"},
                   timeout=10).json()
    assert r["busy"] is False and r["max_seq_len"] == 64 and r["old_max_seq_len"] == 2048
    assert r["current_pos"] <= 64 and r["mode"] == "drop_oldest"
    r = httpx.post(f"{srv.base_url}/sessions/pos/resize/next_pow2", timeout=10).json()
    assert r["busy"] is False and r["max_seq_len"] == 128 and r["old_max_seq_len"] == 64
    for strategy in ("auto", "gpu", "disk"):  # superlinear's values: nothing is dropped
        r = httpx.post(f"{srv.base_url}/sessions/pos/resize", json={"max_seq_len": 256, "strategy": strategy},
                       timeout=10)
        assert r.status_code == 200 and r.json()["mode"] == "reject" and r.json()["strategy"] == strategy
    bad = httpx.post(f"{srv.base_url}/sessions/pos/resize", json={"max_seq_len": 256, "strategy": "tape"}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "strategy"


def test_superlinear_shapes_sit_beside_hearths_own(srv: Server) -> None:
    turn(srv, "shapes", [Q1], max_tokens=4)
    h = httpx.get(f"{srv.base_url}/sessions/shapes/history", timeout=10).json()
    assert h["messages"] == h["data"] and len(h["messages"]) == 2
    listed = httpx.get(f"{srv.base_url}/sessions", timeout=10).json()
    assert listed["sessions"] == listed["data"] and any(x["session_id"] == "shapes" for x in listed["sessions"])
    snap = httpx.post(f"{srv.base_url}/sessions/shapes/save", json={}, timeout=60).json()["snapshot_id"]
    snaps = httpx.get(f"{srv.base_url}/snapshots", timeout=10).json()
    assert snaps["snapshots"] == snaps["data"] and any(x["snapshot_id"] == snap for x in snaps["snapshots"])
    loaded = httpx.post(f"{srv.base_url}/snapshots/{snap}/load", json={"session_id": "shapes-2"}, timeout=60).json()
    assert loaded["session"]["session_id"] == loaded["session_id"] == "shapes-2"
    assert loaded["session"]["message_count"] == 2 and loaded["status"] == "idle"


def test_a_busy_session_serializes_or_refuses(srv: Server) -> None:
    """Why this cannot flake: the long turn ends only when the test cancels it (1,500 tokens,
    ignore_eos: far more than the round trips it must outlast), after the refused turn, the refused
    delete and the waiting turn have all reached the server (the waiting one is seen in the cancel
    registry). The cancel finding it still running proves the session was busy throughout."""
    turn(srv, "busy", [Q1], max_tokens=4)
    results: dict[str, Any] = {}
    generated = srv.metric("hearth_generated_tokens_total")

    def long_turn() -> None:
        results["long"] = turn(srv, "busy", [{"role": "user", "content": "Write a long story."}], max_tokens=1500,
                               ignore_eos=True, cancel_id="busy-long")

    def waiting_turn() -> None:
        results["waited"] = turn(srv, "busy", [Q2], max_tokens=4)  # waits for the long turn, then runs

    t = threading.Thread(target=long_turn)
    t.start()
    srv.wait_metric("hearth_generated_tokens_total", lambda v: v > generated)  # it is writing its answer
    assert info(srv, "busy")["busy"]
    with pytest.raises(openai.ConflictError) as e:
        turn(srv, "busy", [Q2], max_tokens=4, session_wait=False)
    assert e.value.body["code"] == "session_busy"  # type: ignore[index]
    r = httpx.delete(f"{srv.base_url}/sessions/busy", timeout=10)
    assert r.status_code == 409
    w = threading.Thread(target=waiting_turn)
    w.start()
    srv.wait_metric("hearth_cancel_registry_runs", lambda v: v == 2)  # the waiting turn has arrived
    r = httpx.post(f"{srv.base_url}/cancel", json={"cancel_id": "busy-long"}, timeout=10)
    assert r.json() == {"cancelled": 1}, r.text  # the long turn was still running
    t.join(120)
    w.join(120)
    assert results["long"].choices[0].finish_reason == "cancelled"
    h = history(srv, "busy")
    assert [m["role"] for m in h] == ["user", "assistant"] * 3
    assert h[3]["content"] == text(results["long"]) and h[5]["content"] == text(results["waited"])


def test_a_cancelled_turn_keeps_what_was_generated(srv: Server) -> None:
    turn(srv, "cancelled", [Q1], max_tokens=4)
    with httpx.stream("POST", f"{srv.base_url}/chat/completions", timeout=60, json={
            "model": "default", "messages": [{"role": "user", "content": "Write a long story."}], "stream": True,
            "max_tokens": 1000, "ignore_eos": True, "session_id": "cancelled", "cancel_id": "cx1"}) as r:
        got, cancelled = 0, False
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                got += 1
                if got == 5:
                    assert httpx.post(f"{srv.base_url}/cancel", json={"cancel_id": "cx1"}, timeout=10).json()
            if '"finish_reason":"cancelled"' in line.replace(" ", ""):
                cancelled = True
    assert cancelled
    h = history(srv, "cancelled")
    assert len(h) == 4 and h[3]["role"] == "assistant" and len(h[3]["content"]) > 0
    nxt = turn(srv, "cancelled", [Q2], max_tokens=4)
    assert nxt.usage.prompt_tokens_details.cached_tokens > 0


def test_session_crud_and_bad_ids(srv: Server) -> None:
    base = srv.base_url
    r = httpx.post(f"{base}/sessions", json={}, timeout=10)
    assert r.status_code == 201 and r.json()["session_id"].startswith("sess_")
    assert httpx.post(f"{base}/sessions", json={"session_id": "crud"}, timeout=10).status_code == 201
    dup = httpx.post(f"{base}/sessions", json={"session_id": "crud"}, timeout=10)
    assert dup.status_code == 409 and dup.json()["error"]["code"] == "session_exists"
    for bad in ("..", "a/b", "x" * 129, "", "a b"):
        r = httpx.post(f"{base}/sessions", json={"session_id": bad}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_session_id", bad
    r = httpx.post(f"{base}/chat/completions", json={"messages": [Q1], "session_id": "../../etc/passwd"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_session_id"
    assert httpx.get(f"{base}/sessions/..", timeout=10).status_code in (400, 404)
    assert httpx.get(f"{base}/sessions/nope", timeout=10).json()["error"]["code"] == "session_not_found"
    assert "crud" in [s["session_id"] for s in httpx.get(f"{base}/sessions", timeout=10).json()["data"]]
    assert httpx.delete(f"{base}/sessions/crud", timeout=10).json()["deleted"] is True
    assert httpx.get(f"{base}/sessions/crud", timeout=10).status_code == 404
    r = httpx.post(f"{base}/sessions", json={"max_seq_len": 10**9}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_seq_len"
    r = httpx.post(f"{base}/sessions", json={"bogus": 1}, timeout=10)
    assert r.status_code == 400


# ---- snapshots ------------------------------------------------------------------------------------


def test_save_load_archive_import_continue_identically(srv: Server, tmp_path: Path) -> None:
    _, ref = two_turns(srv, "ref-snap")
    turn(srv, "snapped", [SYSTEM, Q1], cache_prompt=False)
    saved = httpx.post(f"{srv.base_url}/sessions/snapped/save", json={"title": "colors", "tags": ["demo"]},
                       timeout=60)
    assert saved.status_code == 201, saved.text
    snap = saved.json()
    sid = snap["snapshot_id"]
    assert snap["title"] == "colors" and snap["session"]["message_count"] == 3 and snap["session"]["n_tokens"] > 0
    loaded = httpx.post(f"{srv.base_url}/snapshots/{sid}/load", json={"session_id": "from-snap"}, timeout=60)
    assert loaded.status_code == 201 and loaded.json()["residency"] == "host"
    got = turn(srv, "from-snap", [Q2])
    assert text(got) == text(ref)
    assert got.usage.prompt_tokens_details.cached_tokens == ref.usage.prompt_tokens_details.cached_tokens
    again = httpx.post(f"{srv.base_url}/snapshots/{sid}/load", json={"session_id": "from-snap"}, timeout=60)
    assert again.status_code == 409 and again.json()["error"]["code"] == "session_exists"
    forced = httpx.post(f"{srv.base_url}/snapshots/{sid}/load", json={"session_id": "from-snap", "force": True},
                        timeout=60)
    assert forced.status_code == 201 and forced.json()["message_count"] == 3

    archive = httpx.get(f"{srv.base_url}/snapshots/{sid}/archive", timeout=60)
    assert archive.status_code == 200 and archive.headers["content-type"] == "application/x-tar"
    other = start_server(tmp_path, "--parallel", "2", "--ctx", "2048")  # another "machine"
    try:
        imported = httpx.post(f"{other.base_url}/snapshots/import", content=archive.content, timeout=60)
        assert imported.status_code == 201, imported.text
        assert imported.json()["snapshot_id"] == sid
        assert httpx.post(f"{other.base_url}/snapshots/{sid}/load", json={"session_id": "moved"},
                          timeout=60).status_code == 201
        moved = turn(other, "moved", [Q2])
        assert text(moved) == text(ref)
        assert moved.usage.prompt_tokens_details.cached_tokens == ref.usage.prompt_tokens_details.cached_tokens
        dup = httpx.post(f"{other.base_url}/snapshots/import", content=archive.content, timeout=60)
        assert dup.status_code == 409
        junk = httpx.post(f"{other.base_url}/snapshots/import", content=b"not a tar" * 100, timeout=60)
        assert junk.status_code == 422
    finally:
        stop_server(other)


def test_snapshot_metadata_listing_and_deletion(srv: Server) -> None:
    turn(srv, "meta", [Q1], max_tokens=4)
    sid = httpx.post(f"{srv.base_url}/sessions/meta/save", json={}, timeout=60).json()["snapshot_id"]
    r = httpx.patch(f"{srv.base_url}/snapshots/{sid}", json={"title": "T", "tags": ["x", "y"]}, timeout=10)
    assert r.status_code == 200 and (r.json()["title"], r.json()["tags"]) == ("T", ["x", "y"])
    bad = httpx.patch(f"{srv.base_url}/snapshots/{sid}", json={"session": {"n_tokens": 1}}, timeout=10)
    assert bad.status_code == 400, "only title, description and tags may change"
    listed = httpx.get(f"{srv.base_url}/snapshots", timeout=10).json()["data"]
    assert any(s["snapshot_id"] == sid and s["title"] == "T" for s in listed)
    assert httpx.get(f"{srv.base_url}/snapshots/snap_nothex", timeout=10).status_code == 400
    missing = "snap_" + "0" * 32
    assert httpx.get(f"{srv.base_url}/snapshots/{missing}", timeout=10).status_code == 404
    assert httpx.delete(f"{srv.base_url}/snapshots/{sid}", timeout=10).status_code == 200
    assert httpx.get(f"{srv.base_url}/snapshots/{sid}", timeout=10).status_code == 404


def test_a_corrupted_kv_bin_is_a_422(srv: Server) -> None:
    turn(srv, "corrupt", [Q1], max_tokens=4)
    sid = httpx.post(f"{srv.base_url}/sessions/corrupt/save", json={}, timeout=60).json()["snapshot_id"]
    home = srv.log.parent / "home"
    kv = home / "snapshots" / sid / "kv.bin"
    raw = bytearray(kv.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    kv.write_bytes(bytes(raw))
    r = httpx.post(f"{srv.base_url}/snapshots/{sid}/load", json={"session_id": "corrupt-copy"}, timeout=60)
    assert r.status_code == 422 and r.json()["error"]["code"] == "snapshot_corrupt"
    assert httpx.get(f"{srv.base_url}/sessions/corrupt-copy", timeout=10).status_code == 404


# ---- restarts ---------------------------------------------------------------------------------------


def test_sessions_survive_a_restart_with_their_kv_and_a_crash_without_losing_a_turn(tmp_path: Path) -> None:
    s = start_server(tmp_path, "--parallel", "2", "--ctx", "2048")
    try:
        _, ref = two_turns(s, "ref-restart")
        turn(s, "restarted", [SYSTEM, Q1], cache_prompt=False)
    finally:
        stop_server(s)  # SIGTERM: a graceful shutdown writes resident KV to disk
    s = start_server(tmp_path, "--parallel", "2", "--ctx", "2048")
    try:
        assert info(s, "restarted")["residency"] == "disk"
        got = turn(s, "restarted", [Q2])
        assert text(got) == text(ref)
        assert got.usage.prompt_tokens_details.cached_tokens == ref.usage.prompt_tokens_details.cached_tokens
        turn(s, "restarted", [{"role": "user", "content": "One more?"}], max_tokens=6)
        count = info(s, "restarted")["message_count"]
        s.proc.send_signal(signal.SIGKILL)  # a crash: no shutdown, no KV spill
        s.proc.wait(10)
    finally:
        stop_server(s)
    s = start_server(tmp_path, "--parallel", "2", "--ctx", "2048")
    try:
        after = info(s, "restarted")
        assert after["message_count"] == count, "no completed turn is lost in a crash"
        assert history(s, "restarted")[-1]["role"] == "assistant"
        r = turn(s, "restarted", [{"role": "user", "content": "Still there?"}], max_tokens=4)
        assert r.choices[0].finish_reason in ("stop", "length")
    finally:
        stop_server(s)


def test_a_save_killed_midway_leaves_no_snapshot(tmp_path: Path) -> None:
    """kill -9 the server while it writes a snapshot (its files are in the temporary directory,
    held there by the test gate, hearth.test_gate): after a restart no snapshot is listed, no
    temporary is left, and the session is intact."""
    gate = tmp_path / "gate"
    gate.mkdir()
    s = start_server(tmp_path, "--parallel", "1", "--ctx", "4096", env={test_gate.ENV: str(gate)})
    snapshots = tmp_path / "home" / "snapshots"
    try:
        long_text = " ".join(["The lighthouse keeper wrote a long letter about the sea."] * 150)
        turn(s, "big", [{"role": "user", "content": long_text}], max_tokens=4)
        def save() -> None:
            with contextlib.suppress(httpx.HTTPError):  # the server dies under it, by design
                httpx.post(f"{s.base_url}/sessions/big/save", json={}, timeout=60)

        test_gate.hold_path(gate, test_gate.SNAPSHOT_WRITE).touch()
        saver = threading.Thread(target=save, daemon=True)
        saver.start()
        # The save waits at the gate with its files written to the temporary directory and no
        # manifest or rename yet: the kill lands there, whatever the machine's speed.
        wait_until(lambda: test_gate.waiting_path(gate, test_gate.SNAPSHOT_WRITE).exists(),
                   "the save to reach the gate", 120)
        assert list(snapshots.glob(".tmp-*")), "the save is not writing into a temporary directory"
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait(10)
        assert not [p for p in snapshots.iterdir() if p.name.startswith("snap_")], "a half snapshot is visible"
    finally:
        stop_server(s)
    s = start_server(tmp_path, "--parallel", "1", "--ctx", "4096")
    try:
        assert httpx.get(f"{s.base_url}/snapshots", timeout=10).json()["data"] == []
        assert not list(snapshots.glob(".tmp-*")), "the leftover temporary was not cleaned"
        assert info(s, "big")["message_count"] == 2
        saved = httpx.post(f"{s.base_url}/sessions/big/save", json={}, timeout=60)
        assert saved.status_code == 201
    finally:
        stop_server(s)


def recraft(snap: Path, kv: bytes | None = None, tokens: list[int] | None = None) -> None:
    """Rewrite a snapshot's kv.bin / tokens.bin and its manifest to match (sizes and checksums),
    as a hostile archive would: every integrity check passes, only the content lies."""
    manifest = json.loads((snap / "manifest.json").read_text())
    blobs = {"kv.bin": kv, "tokens.bin": np.asarray(tokens, dtype="<i4").tobytes() if tokens is not None else None}
    for name, data in blobs.items():
        if data is not None:
            (snap / name).write_bytes(data)
            manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if tokens is not None:
        manifest["session"]["n_tokens"] = len(tokens)
    (snap / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("craft", ["cell count past the data", "a position out of order", "a negative token id",
                                   "fewer tokens than cells"])
def test_crafted_kv_in_a_snapshot_never_fails_a_turn(srv: Server, craft: str) -> None:
    sid = f"craft-{abs(hash(craft)) % 10**6}"
    turn(srv, sid, [Q1], max_tokens=4)
    snap_id = httpx.post(f"{srv.base_url}/sessions/{sid}/save", json={}, timeout=60).json()["snapshot_id"]
    snap = srv.log.parent / "home" / "snapshots" / snap_id
    kv = bytearray((snap / "kv.bin").read_bytes())
    tokens = np.frombuffer((snap / "tokens.bin").read_bytes(), dtype="<i4").tolist()
    header = 8  # llama.cpp's state header here; then u32 streams (1), u32 cells, 12 bytes per cell
    if craft == "cell count past the data":
        kv[header + 4:header + 8] = (1 << 30).to_bytes(4, "little")
        recraft(snap, kv=bytes(kv))
    elif craft == "a position out of order":
        kv[header + 8:header + 12] = (7).to_bytes(4, "little")  # the first cell claims position 7
        recraft(snap, kv=bytes(kv))
    elif craft == "a negative token id":
        recraft(snap, tokens=[-3, *tokens[1:]])
    else:
        recraft(snap, tokens=tokens[:-5])
    r = httpx.post(f"{srv.base_url}/snapshots/{snap_id}/load", json={"session_id": f"{sid}-copy"}, timeout=60)
    if craft == "fewer tokens than cells":  # legitimate (a session trimmed while swapped out): cut to the tokens
        assert r.status_code == 201, r.text
        got = turn(srv, f"{sid}-copy", [Q2], max_tokens=4)
        assert got.choices[0].finish_reason in ("stop", "length")
    else:
        assert r.status_code == 422 and r.json()["error"]["code"] == "snapshot_corrupt", r.text
        assert httpx.get(f"{srv.base_url}/sessions/{sid}-copy", timeout=10).status_code == 404


def _tar(members: dict[str, bytes]) -> bytes:
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _untar(data: bytes) -> dict[str, bytes]:
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def _crafted(members: dict[str, bytes], craft: str) -> dict[str, bytes]:
    """The archive's members with its KV or tokens made to lie, manifest sizes and checksums
    rewritten to match (every integrity check passes)."""
    files = {name.split("/")[1]: (name, data) for name, data in members.items()}
    kv = bytearray(files["kv.bin"][1])
    tokens = np.frombuffer(files["tokens.bin"][1], dtype="<i4").tolist()
    header = 8  # llama.cpp's state header here; then u32 streams (1), u32 cells, 12 bytes per cell
    if craft == "cell count past the data":
        kv[header + 4:header + 8] = (1 << 30).to_bytes(4, "little")
    elif craft == "a flipped header byte":
        kv[0] ^= 0xFF
    elif craft == "a negative token id":
        tokens = [-3, *tokens[1:]]
    else:  # fewer tokens than cells
        tokens = tokens[:-5]
    blobs = {"kv.bin": bytes(kv), "tokens.bin": np.asarray(tokens, dtype="<i4").tobytes()}
    manifest = json.loads(files["manifest.json"][1])
    for name, data in blobs.items():
        manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest["session"]["n_tokens"] = len(tokens)
    blobs["manifest.json"] = json.dumps(manifest).encode()
    return {files[n][0]: blobs.get(n, files[n][1]) for n in ("manifest.json", "transcript.json", "tokens.bin",
                                                               "kv.bin")}


@pytest.mark.parametrize("craft", ["cell count past the data", "fewer tokens than cells", "a negative token id",
                                   "a flipped header byte"])
def test_a_crafted_archive_never_gives_a_5xx_and_a_loaded_one_answers_as_a_clean_reprefill(
        srv: Server, craft: str) -> None:
    """Issue 27's four crafted archives, imported as a hostile client would send them: the import
    and the load answer 201 or 422, never a 5xx; a session loaded from one answers its next turn,
    and that answer equals the answer of the same transcript prefilled from scratch; every later
    request about it answers without a 5xx."""
    sid = "arc-" + hashlib.sha256(craft.encode()).hexdigest()[:8]
    turn(srv, sid, [SYSTEM, Q1], max_tokens=8, cache_prompt=False)
    snap = httpx.post(f"{srv.base_url}/sessions/{sid}/save", json={}, timeout=60).json()["snapshot_id"]
    archive = httpx.get(f"{srv.base_url}/snapshots/{snap}/archive", timeout=60)
    assert archive.status_code == 200
    assert httpx.delete(f"{srv.base_url}/snapshots/{snap}", timeout=10).status_code == 200
    crafted = _tar(_crafted(_untar(archive.content), craft))
    imported = httpx.post(f"{srv.base_url}/snapshots/import", content=crafted, timeout=60)
    assert imported.status_code in (201, 422), imported.text
    loaded = None
    if imported.status_code == 201:
        loaded = httpx.post(f"{srv.base_url}/snapshots/{snap}/load", json={"session_id": f"{sid}-c"}, timeout=60)
        assert loaded.status_code in (201, 422), loaded.text
    if loaded is not None and loaded.status_code == 201:
        got = turn(srv, f"{sid}-c", [Q2], max_tokens=8, cache_prompt=False)
        clean = httpx.post(f"{srv.base_url}/sessions", json={"session_id": f"{sid}-clean",
                                                                "messages": history(srv, sid)}, timeout=30)
        assert clean.status_code == 201, clean.text
        want = turn(srv, f"{sid}-clean", [Q2], max_tokens=8, cache_prompt=False)
        assert text(got) == text(want)
    for path in (f"/sessions/{sid}-c", f"/sessions/{sid}-c/history", f"/snapshots/{snap}", "/snapshots", "/sessions"):
        r = httpx.get(f"{srv.base_url}{path}", timeout=30)
        assert r.status_code < 500, (path, r.text)
    r = httpx.post(f"{srv.base_url}/chat/completions", json={"session_id": f"{sid}-c", "messages": [Q2],
                                                              "max_tokens": 2}, timeout=120)
    assert r.status_code == 200, r.text
