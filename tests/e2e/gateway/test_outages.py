"""Nodes of the fleet failing under the gateway: a SIGSTOPped node (routed around, back without
flapping); a node killed (-9) mid-stream under each streaming protocol's official SDK (the
answer continues on another node and the SDK sees one uninterrupted answer, the session holds
the turn once, and its next turn continues there); a response chain
whose node died; the foreign engine killed mid-stream.

Killed nodes stay dead until a later test's fixture restarts them (`Fleet.heal`): each test
here asks only for the nodes it needs (two Hearth nodes: the victim and the one taking over)."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import openai
import pytest

from tests.e2e.gateway.conftest import GW_KEY, LONG_RUN, LONG_TOKENS, STALL_TIMEOUT, Fleet, Gateway, node_get

pytestmark = pytest.mark.slow

STORY = "Write a long story about a dragon."
MIGRATED_TOKENS = 128  # a killed answer's whole length: the part before the kill and the continuation


@pytest.fixture
def pair(whole_fleet: Fleet) -> Fleet:
    """The fleet with at least two Hearth nodes up: one to kill, one to take over."""
    whole_fleet.heal(hearth=2, foreign=False)
    return whole_fleet


def open_session(fleet: Fleet, sid: str, first_turn: str) -> tuple[str, str]:
    """A session's first turn (chat), its transcript copied by the gateway: (its node, the reply)."""
    with openai.OpenAI(base_url=fleet.gw.base_url, api_key=GW_KEY, max_retries=0) as oai:
        first = oai.chat.completions.create(model="smol", max_tokens=8, temperature=0, extra_body={"session_id": sid},
                                            messages=[{"role": "user", "content": first_turn}])
    reply = first.choices[0].message.content
    assert reply is not None
    fleet.gw.wait(lambda: fleet.gw.admin("GET", f"/admin/sessions/{sid}").json()["transcript_messages"] == 2,
                  "the transcript copy")
    return fleet.gw.session_node(sid), reply


def continued_elsewhere(fleet: Fleet, sid: str, owner: str, turns: list[str], replies: list[str]) -> None:
    """The session now lives on another node, which holds the whole transcript, each turn once:
    the turn before the kill, the turn the kill cut (its answer whole: the part the killed node
    wrote and the part the other node continued), and the turn after it."""
    now = fleet.gw.session_node(sid)
    assert now != owner
    history = node_get(fleet.nodes[now], now, f"/v1/sessions/{sid}/history").json()["data"]
    assert [m["role"] for m in history] == ["user", "assistant"] * len(turns)
    assert [m["content"] for m in history[::2]] == turns
    assert [m["content"] for m in history[1::2]][:len(replies)] == replies
    assert fleet.gw.admin("GET", f"/admin/sessions/{sid}").json()["transcript_messages"] == len(history)
    fleet.gw.wait(lambda: not fleet.gw.status()[owner]["up"], "the killed node to be marked down")


def test_sigstopped_node_is_routed_around_and_comes_back_without_flapping(fleet: Fleet, oai: openai.OpenAI) -> None:
    """A stream in flight on the stopped node continues on another node after the stall timeout
    and ends while the node is still stopped; new requests go around it; it comes back up once."""
    gw = fleet.gw
    frozen, _ = open_session(fleet, "frozen", "Say hi.")
    started, received, ended = threading.Event(), [], threading.Event()

    def stream() -> None:
        chunks = oai.chat.completions.create(model="smol", max_tokens=LONG_TOKENS, stream=True,
                                             extra_body={"session_id": "frozen", "ignore_eos": True, **LONG_RUN},
                                             messages=[{"role": "user", "content": STORY}])
        try:
            for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content:
                    received.append(chunk.choices[0].delta.content)
                    if len(received) == 3:
                        started.set()
        except openai.APIError as e:
            received.append(e)
        finally:
            ended.set()

    before = gw.status()
    with ThreadPoolExecutor(1) as ex:
        streaming = ex.submit(stream)
        assert started.wait(60), "the stream did not start"
        os.kill(fleet.nodes[frozen].proc.pid, signal.SIGSTOP)
        try:
            gw.wait(lambda: not gw.status()[frozen]["up"], "the stopped node to be marked down")
            for i in range(4):  # none may wait on the stopped node: the client timeout would fire
                r = httpx.post(gw.base_url + "/chat/completions", headers={"Authorization": f"Bearer {GW_KEY}"},
                               timeout=60, json={"model": "smol", "max_tokens": 4,
                                                 "messages": [{"role": "user", "content": f"Ping {i}"}]})
                assert r.status_code == 200 and r.headers["x-hearth-upstream"] != frozen
            # the stream in flight ends while the node is still stopped (it would wait for ever without a stall
            # timeout), continued on another node
            assert ended.wait(STALL_TIMEOUT + 120), "the stream on the stopped node did not end"
        finally:
            os.kill(fleet.nodes[frozen].proc.pid, signal.SIGCONT)
        streaming.result()
    assert not [x for x in received if isinstance(x, openai.APIError)]
    assert len(received) > 3
    gw.wait(lambda: gw.status()[frozen]["up"], "the node to come back")
    after = gw.status()
    assert after[frozen]["transitions"] == before[frozen]["transitions"] + 2  # down once, up once
    assert all(after[n]["transitions"] == before[n]["transitions"] for n in after if n != frozen)
    assert after[frozen]["breaker"] == "closed"  # one failed stream, not enough to open it


def test_kill_mid_chat_stream_continues_on_another_node_as_one_answer(pair: Fleet, oai: openai.OpenAI) -> None:
    owner, reply = open_session(pair, "fo-chat", "My name is Ada. Say hi.")
    stream = oai.chat.completions.create(model="smol", max_tokens=MIGRATED_TOKENS, stream=True,
                                         stream_options={"include_usage": True},
                                         extra_body={"session_id": "fo-chat", "ignore_eos": True, "speculative": False},
                                         messages=[{"role": "user", "content": STORY}])
    received, ids, finishes, usage = [], set(), [], None
    for chunk in stream:  # no exception: the answer goes on on the other node
        ids.add(chunk.id)
        usage = chunk.usage or usage
        for choice in chunk.choices:
            if choice.delta.content:
                received.append(choice.delta.content)
                if len(received) == 3:
                    pair.kill(owner)  # kill -9, mid-stream
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    assert len(ids) == 1 and finishes == ["length"] and len(received) > 3
    assert usage is not None and usage.completion_tokens >= MIGRATED_TOKENS - 2  # both parts (re-tokenized)

    after = oai.chat.completions.create(model="smol", max_tokens=8, temperature=0, extra_body={"session_id": "fo-chat"},
                                        messages=[{"role": "user", "content": "What is my name?"}])
    assert after.choices[0].message.content is not None
    continued_elsewhere(pair, "fo-chat", owner, ["My name is Ada. Say hi.", STORY, "What is my name?"],
                        [reply, "".join(received)])


def test_a_node_replaced_with_an_empty_disk_gets_its_sessions_back_from_the_transcript(
        pair: Fleet, oai: openai.OpenAI) -> None:
    owner, reply = open_session(pair, "fo-disk", "My name is Cy. Say hi.")
    pair.kill(owner)
    shutil.rmtree(pair.tmp / owner / "home")  # the machine replaced: same address, nothing on disk
    pair.heal(hearth=len(pair.nodes), foreign=False)
    after = oai.chat.completions.create(model="smol", max_tokens=8, temperature=0, extra_body={"session_id": "fo-disk"},
                                        messages=[{"role": "user", "content": "What is my name?"}])
    assert after.choices[0].message.content is not None
    assert pair.gw.session_node("fo-disk") == owner  # it stayed where it was, restored there
    history = node_get(pair.nodes[owner], owner, "/v1/sessions/fo-disk/history").json()["data"]
    assert [m["content"] for m in history[::2]] == ["My name is Cy. Say hi.", "What is my name?"]
    assert history[1]["content"] == reply and len(history) == 4


def test_kill_mid_messages_stream_continues_on_another_node_as_one_message(
        pair: Fleet, ac: anthropic.Anthropic) -> None:
    owner, reply = open_session(pair, "fo-msg", "My name is Bo. Say hi.")
    received, types = [], []
    with ac.messages.stream(model="smol", max_tokens=MIGRATED_TOKENS, messages=[{"role": "user", "content": STORY}],
                            extra_body={"session_id": "fo-msg", "ignore_eos": True, "speculative": False}) as st:
        for event in st:
            types.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                received.append(event.delta.text)
                if len(received) == 3:
                    pair.kill(owner)
        final = st.get_final_message()
    assert len(received) > 3 and "error" not in types
    assert types.count("message_start") == 1 and types.count("message_stop") == 1
    assert [b.type for b in final.content] == ["text"] and final.content[0].text == "".join(received)
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens >= MIGRATED_TOKENS - 2

    after = ac.messages.create(model="smol", max_tokens=8, messages=[{"role": "user", "content": "What is my name?"}],
                               extra_body={"session_id": "fo-msg", "temperature": 0})
    assert after.content
    continued_elsewhere(pair, "fo-msg", owner, ["My name is Bo. Say hi.", STORY, "What is my name?"],
                        [reply, "".join(received)])


def test_kill_mid_responses_stream_continues_on_another_node_as_one_response(
        pair: Fleet, oai: openai.OpenAI) -> None:
    owner, reply = open_session(pair, "fo-resp", "My name is Cy. Say hi.")
    events = []
    stream = oai.responses.create(model="smol", input=STORY, max_output_tokens=MIGRATED_TOKENS, stream=True,
                                  extra_body={"session_id": "fo-resp", "ignore_eos": True, "speculative": False})
    for event in stream:
        events.append(event)
        if sum(ev.type == "response.output_text.delta" for ev in events) == 3:
            pair.kill(owner)
    deltas = [ev.delta for ev in events if ev.type == "response.output_text.delta"]
    assert len(deltas) > 3
    last = events[-1]
    assert last.type == "response.incomplete", [ev.type for ev in events[-3:]]  # max_output_tokens reached
    created = [ev for ev in events if ev.type == "response.created"]
    assert len(created) == 1 and last.response.id == created[0].response.id  # one response
    assert [ev.sequence_number for ev in events] == list(range(len(events)))  # none twice, none missing
    assert sum(ev.type == "response.output_item.added" for ev in events) == 1
    assert last.response.output_text == "".join(deltas)

    after = oai.responses.create(model="smol", input="What is my name?", max_output_tokens=8, temperature=0,
                                 extra_body={"session_id": "fo-resp"})
    assert after.status in ("completed", "incomplete")
    continued_elsewhere(pair, "fo-resp", owner, ["My name is Cy. Say hi.", STORY, "What is my name?"],
                        [reply, "".join(deltas)])


def test_a_response_chain_continues_after_its_node_dies(pair: Fleet, gw: Gateway) -> None:
    headers = {"Authorization": f"Bearer {GW_KEY}"}
    first = httpx.post(gw.base_url + "/responses", headers=headers, timeout=60, json={
        "model": "smol", "input": "My name is Ada.", "max_output_tokens": 8, "temperature": 0})
    assert first.status_code == 200
    owner = first.headers["x-hearth-upstream"]
    pair.kill(owner)
    second = httpx.post(gw.base_url + "/responses", headers=headers, timeout=60, json={
        "model": "smol", "input": "What is my name?", "previous_response_id": first.json()["id"],
        "max_output_tokens": 8, "temperature": 0})
    assert second.status_code == 200, second.text
    assert second.headers["x-hearth-upstream"] != owner
    # the new node prefilled the whole chain, replayed by the gateway: more than this turn's input
    assert second.json()["usage"]["input_tokens"] > first.json()["usage"]["input_tokens"]
    assert second.json()["output_text"]


def test_kill_mid_stream_of_the_foreign_engine_ends_with_anthropic_error_event(
        whole_fleet: Fleet, ac: anthropic.Anthropic) -> None:
    whole_fleet.heal(hearth=0, foreign=True)
    received = []
    story = [{"role": "user", "content": "A long story."}]
    with (pytest.raises(anthropic.APIStatusError) as e,
          ac.messages.stream(model="foreign", max_tokens=400, messages=story, extra_body={"ignore_eos": True}) as st):  # type: ignore[arg-type]
        for delta in st.text_stream:
            received.append(delta)
            if len(received) == 3:
                whole_fleet.kill("foreign")
    assert len(received) >= 3 and "failed mid-stream" in str(e.value)
