"""Two gateway processes over the same nodes and one real PostgreSQL (issue 28): a conversation
alternating between them keeps its node and its cached tokens; one of them killed mid-stream,
the client retries on the other and the conversation goes on with its transcript; the database
away is a 503 with Retry-After, and the gateways come back by themselves when it returns.

Two of the fleet's Hearth nodes are enough to show that a conversation stays on its node."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import psycopg
import pytest

from tests.e2e.gateway.conftest import (
    GW_ADMIN,
    GW_KEY,
    LONG_RUN,
    Fleet,
    Gateway,
    node_get,
    start_gateway,
    stop,
    upstreams_toml,
)
from tests.helpers import wait_until
from tests.helpers.postgres import PASSWORD, Postgres

pytestmark = pytest.mark.slow

NODES = ("a", "b")
LEASE_TTL = 4.0  # a killed gateway's moves are settled by the other this long after its last beat


@pytest.fixture
def pair(fleet: Fleet, postgres: Postgres, tmp_path: Path) -> Iterator[tuple[Gateway, Gateway, str]]:
    """Two gateways on one fresh database, over nodes a and b; and the database's URL."""
    url = postgres.create_database()
    toml = upstreams_toml({n: fleet.nodes[n] for n in NODES})
    gws = [start_gateway(tmp_path, toml, "--database", url, "--probe-interval", "0.3", "--probe-timeout", "3",
                         "--lease-ttl", str(LEASE_TTL)) for _ in range(2)]
    yield gws[0], gws[1], url
    for g in gws:
        stop(g.proc)
        assert PASSWORD not in g.log.read_text()  # the URL's password is never logged


def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=GW_KEY, max_retries=0)


def history(gw: Gateway, sid: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{gw.base_url}/sessions/{sid}/history", headers={"Authorization": f"Bearer {GW_KEY}"}, timeout=30)
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def stored_transcript(url: str, sid: str) -> list[dict[str, Any]]:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT messages FROM transcripts WHERE session_id = %s", (sid,)).fetchone()
    assert row is not None
    return list(json.loads(row[0]))


def test_a_conversation_alternating_between_gateways_keeps_its_node_and_its_cache(
        pair: tuple[Gateway, Gateway, str]) -> None:
    g1, g2, url = pair
    sid = "alternating"
    with client(g1) as c1, client(g2) as c2:
        for turn, c in enumerate((c1, c2, c1, c2)):
            r = c.chat.completions.create(model="smol", max_tokens=3, temperature=0, extra_body={"session_id": sid},
                                          messages=[{"role": "user", "content": f"Turn {turn}: say a word."}])
            if turn:
                assert r.usage and r.usage.prompt_tokens_details
                assert r.usage.prompt_tokens_details.cached_tokens, f"turn {turn} re-prefilled"
            assert g1.session_node(sid) == g2.session_node(sid) in NODES
        assert len(history(g2, sid)) == 8
        # a previous_response_id chain, each turn through the other gateway
        previous = None
        for turn, c in enumerate((c1, c2, c1)):
            resp = c.responses.create(model="smol", input=f"Step {turn}: say a word.", max_output_tokens=3,
                                      temperature=0, previous_response_id=previous)
            if turn:
                assert resp.usage and resp.usage.input_tokens_details.cached_tokens, f"step {turn} re-prefilled"
            previous = resp.id
    with psycopg.connect(url) as conn:  # every turn of the chain on one node
        nodes = conn.execute("SELECT DISTINCT node FROM affinity WHERE key LIKE 'response:%'").fetchall()
    assert len(nodes) == 1 and nodes[0][0] in NODES


def test_a_gateway_killed_mid_stream_the_client_retries_on_the_other(
        pair: tuple[Gateway, Gateway, str]) -> None:
    g1, g2, url = pair
    sid = "survivor"
    first = [{"role": "user", "content": "Remember the word lantern."}]
    with client(g1) as c1, client(g2) as c2:
        r = c1.chat.completions.create(model="smol", max_tokens=8, temperature=0, messages=first,
                                       extra_body={"session_id": sid})
        kept = [*first, {"role": "assistant", "content": r.choices[0].message.content}]
        node = g1.session_node(sid)
        second = {"role": "user", "content": "Write a long story about it."}
        stream = c1.chat.completions.create(model="smol", stream=True, messages=[second], temperature=0,
                                            extra_body={"session_id": sid, **LONG_RUN})
        with pytest.raises((openai.APIConnectionError, httpx.HTTPError)):
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    g1.proc.kill()  # kill -9, mid-stream
                    g1.proc.wait(10)
        stream.close()
        # the client retries the turn on the other gateway (the node waits for the cut turn to end)
        retry = {"role": "user", "content": "Say the word again."}
        r = c2.chat.completions.create(model="smol", max_tokens=8, temperature=0, messages=[retry],
                                       extra_body={"session_id": sid})
        assert r.usage and r.usage.prompt_tokens_details and r.usage.prompt_tokens_details.cached_tokens
        assert g2.session_node(sid) == node
        now = history(g2, sid)
        # the turns before the cut, whole; the retried turn last; between them only what the node
        # kept of the cut turn (a cancelled turn keeps the text generated so far, docs/sessions.md)
        assert now[:2] == kept
        assert now[-2:] == [retry, {"role": "assistant", "content": r.choices[0].message.content}]
        cut = now[2:-2]
        assert cut == [] or (len(cut) == 2 and cut[0] == second and cut[1]["role"] == "assistant")
        assert stored_transcript(url, sid) == now  # the shared copy: what a dead node would be rebuilt from


def test_a_database_away_is_503_with_retry_after_then_the_gateways_recover(
        pair: tuple[Gateway, Gateway, str], postgres: Postgres) -> None:
    g1, g2, _ = pair
    with client(g1) as c1:
        c1.chat.completions.create(model="smol", max_tokens=2, messages=[{"role": "user", "content": "Hi."}],
                                   extra_body={"session_id": "outage"})
    postgres.stop()
    try:
        for g in (g1, g2):
            with client(g) as c, pytest.raises(openai.APIStatusError) as e:
                c.chat.completions.create(model="smol", max_tokens=2, messages=[{"role": "user", "content": "Hi."}],
                                          extra_body={"session_id": "outage"})
            assert e.value.status_code == 503 and e.value.response.headers["retry-after"]
            assert e.value.response.json()["error"]["code"] == "database_unavailable"
            with anthropic.Anthropic(base_url=g.url, api_key=GW_KEY, max_retries=0) as ac, \
                    pytest.raises(anthropic.APIStatusError) as ae:
                ac.messages.create(model="smol", max_tokens=2, messages=[{"role": "user", "content": "Hi."}],
                                   extra_body={"session_id": "outage"})
            assert ae.value.status_code == 503 and ae.value.response.headers["retry-after"]
            assert ae.value.response.json()["type"] == "error"
            assert httpx.get(g.url + "/health", timeout=10).status_code == 200  # the loop is not stalled
            with client(g) as c:  # a request that needs no state is served
                assert c.chat.completions.create(model="smol", max_tokens=2, messages=[
                    {"role": "user", "content": "Hi."}]).choices[0].finish_reason in ("stop", "length")
    finally:
        postgres.start()

    def served(g: Gateway) -> bool:
        with client(g) as c:
            try:
                c.chat.completions.create(model="smol", max_tokens=2, extra_body={"session_id": "outage"},
                                          messages=[{"role": "user", "content": "Back?"}])
            except openai.APIStatusError as e:
                assert e.status_code == 503
                return False
            return True

    for g in (g1, g2):
        wait_until(lambda g=g: served(g), "the gateway to serve sessions again", timeout=60, interval=0.5)
    # the first turn and one per gateway since: the four refused while it was away are in no copy
    assert [m["content"] for m in history(g2, "outage") if m["role"] == "user"] == ["Hi.", "Back?", "Back?"]


def on_node(fleet: Fleet, name: str, what: str) -> set[str]:
    key = "session_id" if what == "sessions" else "snapshot_id"
    return {s[key] for s in node_get(fleet.nodes[name], name, f"/v1/{what}").json()["data"]}


def moves(url: str) -> list[tuple[str, str, str | None]]:
    with psycopg.connect(url) as conn:
        return [tuple(r) for r in conn.execute("SELECT session_id, state, snapshot FROM moves").fetchall()]


def test_a_move_left_half_done_by_a_killed_gateway_is_rolled_back_by_the_other(
        pair: tuple[Gateway, Gateway, str], fleet: Fleet) -> None:
    g1, g2, url = pair
    sid = "half-moved"
    with client(g2) as c2:
        c2.chat.completions.create(model="smol", max_tokens=4, temperature=0, extra_body={"session_id": sid},
                                   messages=[{"role": "user", "content": "Tell me about the sea."}])
    src = g2.session_node(sid)
    [dst] = [n for n in NODES if n != src]
    before = history(g2, sid)
    stopped = fleet.nodes[dst].proc.pid
    os.kill(stopped, signal.SIGSTOP)  # the destination takes the snapshot and never answers: the move hangs there
    try:
        with ThreadPoolExecutor(1) as ex:
            moving = ex.submit(httpx.post, f"{g1.url}/admin/sessions/{sid}/move", json={"to": dst}, timeout=120,
                               headers={"Authorization": f"Bearer {GW_ADMIN}"})
            wait_until(lambda: [m[:2] for m in moves(url)] == [(sid, "copying")], "the move to reach the copy")
            [(_, _, snap)] = moves(url)
            g1.proc.kill()  # kill -9, mid-move
            g1.proc.wait(10)
            with pytest.raises(httpx.HTTPError):
                moving.result()
    finally:
        os.kill(stopped, signal.SIGCONT)
    wait_until(lambda: moves(url) == [], "the other gateway to settle the move", timeout=60, interval=0.2)
    assert "rolled back" in g2.log.read_text()
    # rolled back: the session on its source alone, the snapshot nowhere
    assert sid in on_node(fleet, src, "sessions") and sid not in on_node(fleet, dst, "sessions")
    assert all(snap not in on_node(fleet, n, "snapshots") for n in NODES)
    assert g2.session_node(sid) == src
    with client(g2) as c2:
        r = c2.chat.completions.create(model="smol", max_tokens=4, temperature=0, extra_body={"session_id": sid},
                                       messages=[{"role": "user", "content": "And about rivers?"}])
    assert r.usage and r.usage.prompt_tokens_details and r.usage.prompt_tokens_details.cached_tokens
    assert history(g2, sid)[:len(before)] == before
