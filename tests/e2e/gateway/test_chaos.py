"""Chaos under the gateway, bounded and on loopback (issue 25): concurrent conversations, session
turns and stateless ones, stream through the gateway while Hearth nodes are killed (-9) and
restarted on their data dirs, and SIGSTOPped past the gateway's stall timeout. Afterwards:

- no client saw an error: every streamed answer ended with one finish (a node that died or
  stalled mid-answer was continued on another, the client's stream went on);
- every turn a client saw answered is in its session's history exactly once, in order, with
  the text the client received (also when a session goes back to a node that was restarted on
  its data dir with an older copy of it).

The chaos is driven by the clients' progress (after so many turns answered, hit a node that is
answering right now), not by the clock; the verdict holds for any interleaving, so it does not
depend on when exactly a kill lands."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import openai
import pytest

from tests.e2e.gateway.conftest import GW_KEY, STALL_TIMEOUT, Fleet

pytestmark = pytest.mark.slow

TURNS = 6  # per conversation: a client starts a new one after these, until the chaos is over
MAX_CONVERSATIONS = 8  # per client (bounds the test if the chaos cannot find a busy node)
MAX_TOKENS = 24
TOPICS = ("rivers", "bread", "owls", "copper", "tides", "maps", "bells", "moss")


@dataclass
class Conversation:
    name: str
    session: bool  # a Hearth session (the node keeps the history) or stateless (the client does)
    seen: list[tuple[str, str]] = field(default_factory=list)  # (user turn, the answer the client saw)
    errors: list[str] = field(default_factory=list)


class Progress:
    """Turns answered so far, for the chaos thread to wait on."""

    def __init__(self) -> None:
        self._n = 0
        self._cond = threading.Condition()

    def bump(self) -> None:
        with self._cond:
            self._n += 1
            self._cond.notify_all()

    def wait_for(self, n: int, stop: threading.Event) -> bool:
        with self._cond:
            while self._n < n and not stop.is_set():
                self._cond.wait(0.2)
            return self._n >= n


def client(gw_url: str, name: str, session: bool, progress: Progress, chaos_over: threading.Event
           ) -> list[Conversation]:
    """Conversations one after another until the chaos is over (so it always finds a node
    answering), each of TURNS turns; stops at the first error."""
    out: list[Conversation] = []
    while len(out) < MAX_CONVERSATIONS and not (out and chaos_over.is_set()):
        conv = Conversation(f"{name}-{len(out)}", session)
        out.append(conv)
        converse(gw_url, conv, progress)
        if conv.errors:
            break
    return out


def converse(gw_url: str, conv: Conversation, progress: Progress) -> None:
    history: list[dict[str, str]] = []
    with openai.OpenAI(base_url=gw_url, api_key=GW_KEY, max_retries=3) as oai:
        for turn in range(TURNS):
            user = f"Turn {turn} of {conv.name}: say one sentence about {TOPICS[turn % len(TOPICS)]}."
            messages = [{"role": "user", "content": user}]
            extra: dict[str, object] = {"session_id": conv.name} if conv.session else {}
            try:
                stream = oai.chat.completions.create(
                    model="smol", max_tokens=MAX_TOKENS, temperature=0, stream=True, extra_body=extra,
                    messages=messages if conv.session else [*history, *messages])  # type: ignore[list-item]
                text, finishes, ids = [], [], set()
                for chunk in stream:
                    ids.add(chunk.id)
                    if chunk.choices and chunk.choices[0].delta.content:
                        text.append(chunk.choices[0].delta.content)
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finishes.append(chunk.choices[0].finish_reason)
            except openai.APIError as e:
                conv.errors.append(f"turn {turn}: {type(e).__name__}: {e}")
                return
            if len(finishes) != 1 or len(ids) != 1:
                conv.errors.append(f"turn {turn}: finishes {finishes}, completion ids {ids}")
                return
            answer = "".join(text)
            conv.seen.append((user, answer))
            history += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
            progress.bump()


def busy_node(fleet: Fleet, stop: threading.Event) -> str | None:
    """A Hearth node answering a request right now (the one to hit), waiting for one."""
    while not stop.is_set():
        status = fleet.gw.status()
        busy = [n for n in fleet.alive() if status[n]["up"] and status[n]["in_flight"] > 0]
        if busy:
            return busy[0]
        time.sleep(0.05)
    return None


def chaos(fleet: Fleet, progress: Progress, stop: threading.Event, log: list[str]) -> None:
    """Kill a busy node and restart it on its data dir; SIGSTOP a busy node past the stall
    timeout; kill again. Each restart waits until the gateway routes to the node again."""
    def hit(after: int, action: Callable[[str], None], what: str) -> None:
        if progress.wait_for(after, stop) and (name := busy_node(fleet, stop)) is not None:
            log.append(f"{what} {name}")
            action(name)

    def kill_and_restart(name: str) -> None:
        fleet.kill(name)
        time.sleep(3)  # dead for a while: turns arrive while it is down
        fleet.heal(foreign=False)

    def freeze(name: str) -> None:
        os.kill(fleet.nodes[name].proc.pid, signal.SIGSTOP)
        try:
            time.sleep(STALL_TIMEOUT + 3)
        finally:
            os.kill(fleet.nodes[name].proc.pid, signal.SIGCONT)

    hit(4, kill_and_restart, "kill -9")
    hit(12, freeze, "SIGSTOP")
    hit(20, kill_and_restart, "kill -9")


def test_no_turn_is_lost_and_no_client_sees_a_mid_stream_error_under_chaos(fleet: Fleet) -> None:
    run = uuid.uuid4().hex[:8]  # session ids of their own on a fleet reused by other tests
    clients = [(f"chaos-{run}-s1", True), (f"chaos-{run}-s2", True), (f"chaos-{run}-p1", False),
               (f"chaos-{run}-p2", False)]
    progress, stop, chaos_over, log = Progress(), threading.Event(), threading.Event(), []
    with ThreadPoolExecutor(len(clients) + 1) as ex:
        talks = [ex.submit(client, fleet.gw.base_url, name, session, progress, chaos_over)
                 for name, session in clients]
        for t in talks:  # every client stopped (errors): the chaos stops waiting for progress
            t.add_done_callback(lambda _: stop.set() if all(t.done() for t in talks) else None)
        try:
            chaos(fleet, progress, stop, log)
        finally:
            chaos_over.set()
            convs = [c for t in talks for c in t.result()]
    assert len(log) == 3, log  # every hit landed on a node answering a stream
    assert not [e for c in convs for e in c.errors], ({c.name: c.errors for c in convs if c.errors}, log)
    assert all(len(c.seen) == TURNS for c in convs)
    fleet.heal(foreign=False)
    with openai.OpenAI(base_url=fleet.gw.base_url, api_key=GW_KEY, max_retries=3) as oai:
        for c in (c for c in convs if c.session):
            r = oai.get(f"/sessions/{c.name}/history", cast_to=object)
            history = r["data"] if isinstance(r, dict) else []
            got = [(m["role"], m["content"]) for m in history]
            want = [(role, text) for user, answer in c.seen for role, text in (("user", user), ("assistant", answer))]
            assert got == want, (c.name, log)
