"""The Hearth nodes of the fleet behind its gateway, driven by the official SDKs: the four
protocols, session affinity, prefix affinity, moves and drain with KV, overload, keys."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.e2e.gateway.conftest import (
    GW_ADMIN,
    GW_KEY,
    LONG_RUN,
    LONG_TOKENS,
    Fleet,
    Gateway,
    cancel_at_first_piece,
    node_get,
    node_key,
    start_gateway,
    stop,
    upstreams_toml,
)
from tests.helpers import Server, sample, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fleet")]  # all of it up

MSG = [{"role": "user", "content": "Name three colours."}]


def sessions_on(nodes: dict[str, Server], name: str) -> set[str]:
    return {s["session_id"] for s in node_get(nodes[name], name, "/v1/sessions").json()["data"]}


def test_four_protocols_streamed_equals_unstreamed(gw: Gateway, oai: openai.OpenAI, ac: anthropic.Anthropic) -> None:
    """Each pair runs on one node (pinned) and recomputes its whole prompt (`cache_prompt:
    false`): llama.cpp's kernels are not batch-invariant, so the second of a pair reusing the
    first's prefix (or one an earlier test left in a slot) could differ in the logits' last bits
    and, at a near tie, in its text; with the same path both are bit-exact."""
    pin = {"X-Session-Id": "protocols"}  # stream and non-stream on one node
    exact = {"cache_prompt": False}
    r = oai.chat.completions.create(model="smol", messages=MSG, max_tokens=16, temperature=0, extra_headers=pin,
                                    extra_body=exact)
    assert r.model == "smol" and r.choices[0].message.content
    chunks = oai.chat.completions.create(model="smol", messages=MSG, max_tokens=16, temperature=0, stream=True,
                                         extra_headers=pin, extra_body=exact)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content

    c = oai.completions.create(model="smol", prompt="Once upon a time", max_tokens=12, temperature=0,
                               extra_headers=pin, extra_body=exact)
    cs = oai.completions.create(model="smol", prompt="Once upon a time", max_tokens=12, temperature=0, stream=True,
                                extra_headers=pin, extra_body=exact)
    assert "".join(x.choices[0].text for x in cs) == c.choices[0].text

    resp = oai.responses.create(model="smol", input="Name three colours.", max_output_tokens=16, temperature=0,
                                extra_headers=pin, extra_body=exact)
    events = list(oai.responses.create(model="smol", input="Name three colours.", max_output_tokens=16,
                                       temperature=0, stream=True, extra_headers=pin, extra_body=exact))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert resp.output_text and streamed == resp.output_text
    chained = oai.responses.create(model="smol", input="And three more?", previous_response_id=resp.id,
                                   max_output_tokens=8, extra_headers={})  # routed by the chain, no pin
    assert chained.status in ("completed", "incomplete") and chained.output_text

    t0 = {"temperature": 0, **exact}
    m = ac.messages.create(model="smol", max_tokens=16, messages=MSG, extra_headers=pin, extra_body=t0)  # type: ignore[arg-type]
    with ac.messages.stream(model="smol", max_tokens=16, messages=MSG,  # type: ignore[arg-type]
                            extra_headers=pin, extra_body=t0) as st:
        text = st.get_final_text()
    assert m.model == "smol" and m.content[0].text == text  # type: ignore[union-attr]


def test_sessions_stay_on_their_node_and_reuse_their_kv(gw: Gateway, oai: openai.OpenAI, ac: anthropic.Anthropic,
                                                       nodes: dict[str, Server]) -> None:
    sids = [f"sticky-{i}" for i in range(3)]
    for turn in range(3):
        for sid in sids:
            r = oai.chat.completions.create(model="smol", max_tokens=3, temperature=0, extra_body={"session_id": sid},
                                            messages=[{"role": "user", "content": f"Turn {turn}: say a word."}])
            if turn:
                assert r.usage and r.usage.prompt_tokens_details
                assert r.usage.prompt_tokens_details.cached_tokens, f"{sid} turn {turn} re-prefilled"
    on = {n: sessions_on(nodes, n) for n in nodes}
    for sid in sids:
        holders = [n for n in nodes if sid in on[n]]
        assert holders == [gw.session_node(sid)], sid
    assert gw.admin("GET", f"/admin/sessions/{sids[0]}").json()["transcript_messages"] >= 6
    # the other protocols continue the same sessions, on the same nodes, from their KV
    m = ac.messages.create(model="smol", max_tokens=3, messages=[{"role": "user", "content": "One more word."}],
                           extra_body={"session_id": sids[0]})
    assert m.usage.cache_read_input_tokens
    resp = oai.responses.create(model="smol", input="And another.", max_output_tokens=3,
                                extra_body={"session_id": sids[1]})
    assert resp.usage and resp.usage.input_tokens_details.cached_tokens
    on = {n: sessions_on(nodes, n) for n in nodes}
    assert all([n for n in nodes if sid in on[n]] == [gw.session_node(sid)] for sid in sids)


def test_stateless_conversations_follow_their_prefix(gw: Gateway, oai: openai.OpenAI) -> None:
    for conv in range(2):
        messages: list[dict[str, str]] = [{"role": "system", "content": f"You are assistant number {conv}."}]
        for turn in range(3):
            messages.append({"role": "user", "content": f"Question {turn}: what is {turn} plus {conv}?"})
            r = oai.chat.completions.create(model="smol", messages=messages, max_tokens=4, temperature=0)  # type: ignore[arg-type]
            if turn:
                assert r.usage and r.usage.prompt_tokens_details and r.usage.prompt_tokens_details.cached_tokens
            messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})


def test_cancel_by_id_reaches_the_node_running_the_request(gw: Gateway) -> None:
    # LONG_RUN: the run cannot end on its own in the moment between its first piece and the cancel
    finish, pieces, r = cancel_at_first_piece(gw, "smol", "gw-cancel", LONG_TOKENS,
                                              ignore_eos=True, speculative=False)
    assert r.status_code == 200 and r.json()["cancelled"] >= 1
    assert finish == "cancelled" and pieces < LONG_TOKENS


def test_a_client_leaving_mid_stream_stops_the_node(gw: Gateway, nodes: dict[str, Server]) -> None:
    """The gateway closes its upstream connection when its client leaves: the node sees the
    disconnect and stops decoding (no tokens generated for nobody). Why this cannot flake: the
    verdict is the node's own record (a run cancelled by a disconnect, short of its max_tokens),
    not a count of tokens raced against the machine's speed; the run (LONG_RUN) cannot end on
    its own in the moment between the client's tenth piece and its leaving."""
    def node_metric(name: str, metric_name: str) -> float:
        try:
            return nodes[name].metric(metric_name, headers={"Authorization": f"Bearer {node_key(name)}"})
        except KeyError:  # a labelled counter is listed from its first increment on
            return 0.0

    by_disconnect = 'hearth_cancellations_total{cause="disconnect"}'
    cancelled = {n: node_metric(n, by_disconnect) for n in nodes}
    with httpx.stream("POST", gw.base_url + "/chat/completions", timeout=120,
                      headers={"Authorization": f"Bearer {GW_KEY}"},
                      json={"model": "smol", "stream": True, "ignore_eos": True, **LONG_RUN,
                            "messages": [{"role": "user", "content": "Write a long story."}]}) as r:
        node = r.headers["x-hearth-upstream"]
        before = node_metric(node, "hearth_generated_tokens_total")
        received = 0
        for line in r.iter_lines():
            if '"content":"' in line and '"role"' not in line:
                received += 1
                if received == 10:
                    break  # leaving: the connection closes here
    wait_until(lambda: node_metric(node, by_disconnect) > cancelled[node], "the node to cancel the run", 120)
    produced = node_metric(node, "hearth_generated_tokens_total") - before
    assert produced < LONG_TOKENS, f"{produced} tokens: the run went on to its end after the client left"


def metric(gw: Gateway, name: str) -> float:
    text = httpx.get(gw.url + "/metrics", headers={"Authorization": f"Bearer {GW_KEY}"}).text
    return sample(text, name, default=0.0)


def test_routing_quality_is_measured(fleet: Fleet, gw: Gateway, oai: openai.OpenAI) -> None:
    """Decisions by branch, predicted and reported cached tokens, for this test's own traffic (not
    what earlier tests happened to leave): a session's second turn is a sticky hit, a stateless
    conversation's second turn a prefix hit, and both find cached tokens on their node."""
    names = ['hearth_gateway_route_decisions_total{branch="sticky_hit"}',
             'hearth_gateway_route_decisions_total{branch="prefix_hit"}',
             "hearth_gateway_reported_cached_tokens_total", "hearth_gateway_predicted_cached_tokens_total",
             "hearth_gateway_ttft_seconds_count"]
    before = {n: metric(gw, n) for n in names}
    for turn in range(2):
        oai.chat.completions.create(model="smol", max_tokens=3, temperature=0, extra_body={"session_id": "rq-sticky"},
                                    messages=[{"role": "user", "content": f"Turn {turn}: say a word."}])
    messages = [{"role": "system", "content": "You measure routing quality for the gateway's tests."},
                {"role": "user", "content": "Say one word."}]
    r = oai.chat.completions.create(model="smol", messages=messages, max_tokens=3, temperature=0)  # type: ignore[arg-type]
    messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                 {"role": "user", "content": "And another one."}]
    oai.chat.completions.create(model="smol", messages=messages, max_tokens=3, temperature=0)  # type: ignore[arg-type]
    after = {n: metric(gw, n) for n in names}
    assert all(after[n] > before[n] for n in names), {n: (before[n], after[n]) for n in names}
    assert metric(gw, "hearth_gateway_node_up") == len(fleet.nodes) + 1  # the Hearth nodes and the foreign one


def test_move_carries_the_kv_and_continues_as_the_original_would(gw: Gateway, oai: openai.OpenAI,
                                                                 nodes: dict[str, Server]) -> None:
    first = oai.chat.completions.create(model="smol", max_tokens=12, temperature=0, extra_body={"session_id": "mv"},
                                        messages=[{"role": "user", "content": "Tell me about the sea."}])
    src = gw.session_node("mv")
    # A copy of the session stays on the source: the reference for the continuation.
    snap = gw.admin("POST", "/v1/sessions/mv/save", json={}).json()["snapshot_id"]
    assert gw.admin("POST", f"/v1/snapshots/{snap}/load", json={"session_id": "mv-ref"}).status_code == 201
    assert gw.session_node("mv-ref") == src
    # Replacing a session (force) is an admin operation at the gateway as on a node (docs/api.md).
    force = {"session_id": "mv-ref", "force": True}
    plain = httpx.post(f"{gw.url}/v1/snapshots/{snap}/load", json=force,
                       headers={"Authorization": f"Bearer {GW_KEY}"}, timeout=120)
    assert plain.status_code == 403 and plain.json()["error"]["code"] == "insufficient_permissions"
    assert gw.admin("POST", f"/v1/snapshots/{snap}/load", json=force).status_code == 201
    archive = gw.admin("GET", f"/v1/snapshots/{snap}/archive")  # snapshots through the gateway too
    assert archive.status_code == 200 and archive.headers["content-type"] == "application/x-tar"
    assert gw.admin("DELETE", f"/v1/snapshots/{snap}").json()["deleted"] is True
    imported = gw.admin("POST", "/v1/snapshots/import", content=archive.content)
    assert imported.status_code == 201 and imported.json()["snapshot_id"] == snap
    answer = gw.admin("GET", "/v1/snapshots").json()
    listed = answer["data"]
    assert answer["snapshots"] == listed  # superlinear's key, as on a node
    assert [(s["snapshot_id"], s["node"]) for s in listed] == [(snap, imported.headers["x-hearth-upstream"])]
    moved = gw.admin("POST", "/admin/sessions/mv/move", json={}).json()
    dst = moved["to"]
    assert moved["from"] == src and dst != src and moved["tokens"] > 0
    assert "mv" in sessions_on(nodes, dst) and "mv" not in sessions_on(nodes, src)
    turn = [{"role": "user", "content": "And about rivers?"}]
    there = oai.chat.completions.create(model="smol", max_tokens=12, temperature=0, messages=turn,  # type: ignore[arg-type]
                                        extra_body={"session_id": "mv"})
    ref = oai.chat.completions.create(model="smol", max_tokens=12, temperature=0, messages=turn,  # type: ignore[arg-type]
                                      extra_body={"session_id": "mv-ref"})
    assert gw.session_node("mv") == dst
    assert there.usage and there.usage.prompt_tokens_details and first.usage
    assert there.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens  # no re-prefill
    assert there.choices[0].message.content == ref.choices[0].message.content


def test_drain_moves_every_session_off_the_node(gw: Gateway, oai: openai.OpenAI, nodes: dict[str, Server]) -> None:
    for sid in ("dr-1", "dr-2", "dr-3"):
        oai.chat.completions.create(model="smol", max_tokens=4, messages=[{"role": "user", "content": "Hello"}],
                                    extra_body={"session_id": sid})
    victim = gw.session_node("dr-1")
    held = sessions_on(nodes, victim)
    out = subprocess.run([sys.executable, "-m", "hearth.cli.main", "gateway", "drain", victim, "--url", gw.url,
                          "--api-key", GW_ADMIN, "--json"], capture_output=True, text=True, timeout=300, check=True)
    report = json.loads(out.stdout)
    assert report["failed"] == [] and {m["session_id"] for m in report["moved"]} | set(report["stale"]) == held
    # stale: copies left on a node that crashed and came back after its sessions continued elsewhere
    assert all(gw.session_node(sid) != victim for sid in report["stale"])
    assert sessions_on(nodes, victim) == set()
    assert gw.status()[victim]["draining"]
    r = oai.chat.completions.create(model="smol", max_tokens=4, messages=[{"role": "user", "content": "Again"}],
                                    extra_body={"session_id": "dr-1"})
    assert r.usage and r.usage.prompt_tokens_details and r.usage.prompt_tokens_details.cached_tokens
    assert gw.session_node("dr-1") != victim
    status = subprocess.run([sys.executable, "-m", "hearth.cli.main", "gateway", "status", "--url", gw.url,
                             "--api-key", GW_ADMIN, "--json"], capture_output=True, text=True, timeout=60, check=True)
    assert {n["name"]: n["sessions"] for n in json.loads(status.stdout)["nodes"]}[victim] == 0
    assert gw.admin("POST", f"/admin/nodes/{victim}/undrain").json()["draining"] is False


def test_keys_hold_on_every_route(gw: Gateway, oai: openai.OpenAI) -> None:
    for method, path in (("POST", "/v1/chat/completions"), ("POST", "/v1/responses"), ("GET", "/v1/models"),
                         ("GET", "/v1/sessions"), ("GET", "/admin/status"), ("POST", "/v1/cancel"),
                         ("GET", "/metrics")):
        for headers in ({}, {"Authorization": "Bearer node-a-key"}):  # a node's key is not a gateway key
            r = httpx.request(method, gw.url + path, headers=headers, json={})
            assert r.status_code == 401, (method, path, headers)
    r = httpx.post(gw.url + "/v1/messages", headers={"x-api-key": "wrong"}, json={})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    for method, path in (("POST", "/admin/nodes/a/drain"), ("GET", "/admin/status"),
                         ("POST", "/admin/sessions/x/move")):
        r = httpx.request(method, gw.url + path, headers={"Authorization": f"Bearer {GW_KEY}"})
        assert r.status_code == 403, path  # an API key is not the admin key
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="gpt-4o", messages=MSG)  # type: ignore[arg-type]
    assert e.value.code == "model_not_found"


def test_overload_answers_only_200_and_429(nodes: dict[str, Server], tmp_path: Path) -> None:
    """A gateway of one slot per node and a queue of one, overloaded: the client hears 200 or a
    well-formed 429, nothing else. Why this cannot flake: every node is first taken by a long
    stream the test holds open (LONG_RUN, checked in /admin/status), so the burst after it finds
    no free node whatever the threads' timing: one request waits in the queue (a long
    --max-wait: it cannot time out meanwhile), the three others are refused at once; closing
    the streams then serves the waiting one."""
    g = start_gateway(tmp_path, upstreams_toml(nodes, max_in_flight=1), "--max-waiting", "1", "--max-wait", "120")
    headers = {"Authorization": f"Bearer {GW_KEY}"}
    try:
        def one(i: int) -> httpx.Response:
            return httpx.post(g.base_url + "/chat/completions", headers=headers,
                              timeout=120, json={"model": "smol", "max_tokens": 16,
                                                 "messages": [{"role": "user", "content": f"Story {i}"}]})

        with ThreadPoolExecutor(4) as ex, contextlib.ExitStack() as held:  # the streams close first
            for i in range(len(nodes)):  # answer headers come once the node has started: it is busy
                hog = held.enter_context(httpx.stream(
                    "POST", g.base_url + "/chat/completions", headers=headers, timeout=120,
                    json={"model": "smol", "stream": True, "ignore_eos": True, **LONG_RUN,
                          "messages": [{"role": "user", "content": f"A long story {i}."}]}))
                assert hog.status_code == 200
            assert all(st["in_flight"] == 1 for st in g.status().values())
            burst = [ex.submit(one, i) for i in range(4)]
            wait_until(lambda: sum(f.done() for f in burst) == 3, "three of the burst to be refused")
            assert g.admin("GET", "/admin/status").json()["waiting"] == 1
            held.close()  # the clients of the long streams leave: their nodes free up
            answers = [f.result() for f in burst]
        statuses = sorted(r.status_code for r in answers)
        assert statuses == [200, 429, 429, 429], statuses
        for r in answers:
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["type"] == "rate_limit_error"
    finally:
        stop(g.proc)


def test_models_lists_each_alias_once_with_each_nodes_status(fleet: Fleet) -> None:
    """The union of the nodes' models: `smol` once for every Hearth node (each has its default
    model loaded from its start) and `foreign` with no status (an openai-kind node has none)."""

    def listed() -> list[dict[str, Any]]:
        r = httpx.get(f"{fleet.gw.url}/v1/models", headers={"Authorization": f"Bearer {GW_KEY}"}, timeout=30)
        assert r.status_code == 200, r.text
        return list(r.json()["data"])

    # a node's status is asked within --digest-timeout: polled, so a slow answer is asked again
    wait_until(lambda: all(n["status"] == "loaded" for n in listed()[0]["nodes"]), "each node's status", 60)
    smol, foreign = listed()
    assert smol["id"] == "smol" and smol["status"] == {"value": "loaded"}
    assert [n["node"] for n in smol["nodes"]] == list(fleet.nodes)
    assert {n["model"] for n in smol["nodes"]} == {"smollm2-135m-instruct"}
    assert foreign["id"] == "foreign" and "status" not in foreign
    assert foreign["nodes"] == [{"node": "foreign", "model": "smollm2", "status": None}]
