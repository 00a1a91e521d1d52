"""Ollama's /api/chat and /api/generate through a real gateway over two real Hearth nodes (the
default model), read with the official `ollama` Python client: a node killed (-9) mid-stream is
continued on the other and the client reads one answer, equal to the non-streamed one at
temperature 0, with one final object counting the whole of it; the gateway's ledger holds one
row for the turn (both nodes, one failover); bad input is a 4xx in Ollama's shape.

The kill is deterministic: each node runs with a test gate folder (hearth/test_gate.py) holding
`ollama-line-3`, so the node that takes the stream stops before its fourth line, with three
lines relayed; the test kills it there, then lets the other node (which is held nowhere once
the hold is gone) continue."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from tests.e2e.gateway.conftest import (
    GW_KEY,
    NODE_ARGS,
    Gateway,
    node_key,
    start_gateway,
    stop,
    upstreams_toml,
)
from tests.helpers import Server, start_server, stop_server, wait_until

pytestmark = pytest.mark.slow

GATE = "ollama-line-3"
OPTIONS = {"temperature": 0, "num_predict": 40}
STORY = [{"role": "user", "content": "Write a short story about a dragon who likes tea."}]


@dataclass
class Pair:
    gw: Gateway
    nodes: dict[str, Server]
    tmp: Path

    def gates(self, name: str) -> Path:
        return self.tmp / name / "gates"

    def start(self, name: str, port: int | None = None) -> Server:
        (self.tmp / name).mkdir(exist_ok=True)
        self.gates(name).mkdir(exist_ok=True)
        return start_server(self.tmp / name, *NODE_ARGS, "--api-key", node_key(name), "--admin-key",
                            f"node-{name}-admin", port=port, env={"HEARTH_TEST_GATE": str(self.gates(name))})

    def revive(self) -> None:
        """Every node running and routed to again (one killed by an earlier test restarted)."""
        for name, s in list(self.nodes.items()):
            if s.proc.poll() is not None:
                self.nodes[name] = self.start(name, port=int(s.url.rsplit(":", 1)[1]))

        def routed() -> bool:
            status = {n["name"]: n for n in self.gw.admin("GET", "/admin/status").json()["nodes"]}
            return all(status[n]["up"] and status[n]["breaker"] != "open" for n in self.nodes)

        self.gw.wait(routed, "the gateway to route to both nodes")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("ollama-pair")
    p = Pair(None, {}, tmp)  # type: ignore[arg-type]
    with ThreadPoolExecutor(2) as ex:
        p.nodes = dict(zip(("a", "b"), ex.map(p.start, ("a", "b")), strict=True))
    # A long stall timeout: on a loaded machine a niced node can be starved for many seconds; the
    # kill is seen at once (the connection closes), never by a stall.
    p.gw = start_gateway(tmp, upstreams_toml(p.nodes), "--probe-interval", "0.3", "--probe-timeout", "3",
                         "--stall-timeout", "300")
    yield p
    stop(p.gw.proc)
    for s in p.nodes.values():
        if s.proc.poll() is None:
            stop_server(s)


@pytest.fixture
def client(pair: Pair) -> Iterator[ollama.Client]:
    pair.revive()
    c = ollama.Client(host=pair.gw.url, headers={"Authorization": f"Bearer {GW_KEY}"})
    yield c
    c._client.close()


def killed_mid_stream(pair: Pair, stream: Callable[[], Iterator[Any]]) -> tuple[list[Any], str]:
    """Read `stream` while the node that serves it is held before its fourth line and killed
    there: (every part the client read, the killed node's name)."""
    for name in pair.nodes:
        (pair.gates(name) / f"{GATE}.waiting").unlink(missing_ok=True)  # left by a node killed while held
        (pair.gates(name) / f"{GATE}.hold").touch()
    parts: list[Any] = []
    try:
        with ThreadPoolExecutor(1) as ex:
            reading = ex.submit(lambda: parts.extend(stream()))
            held: list[str] = []

            def one_is_held() -> bool:
                held[:] = [n for n in pair.nodes if (pair.gates(n) / f"{GATE}.waiting").exists()]
                return bool(held) or reading.done()

            wait_until(one_is_held, "a node to hold the stream before its fourth line", 120)
            assert held, f"the stream ended before its fourth line: {reading.result()}"
            victim = held[0]
            pair.nodes[victim].proc.kill()  # kill -9, three lines relayed
            pair.nodes[victim].proc.wait(10)
            for name in pair.nodes:
                (pair.gates(name) / f"{GATE}.hold").unlink(missing_ok=True)
            reading.result(300)
    finally:
        for name in pair.nodes:
            (pair.gates(name) / f"{GATE}.hold").unlink(missing_ok=True)
    return parts, victim


def the_row(pair: Pair, endpoint: str, since: float) -> dict[str, Any]:
    """The gateway's ledger row of the one `endpoint` turn since `since` (written off the request path)."""
    found: list[dict[str, Any]] = []

    def written() -> bool:
        rows = pair.gw.admin("GET", "/admin/usage", params={"since": str(since)}).json()["data"]
        found[:] = [r for r in rows if r["endpoint"] == endpoint]
        return bool(found)

    wait_until(written, f"the {endpoint} row", 30, interval=0.1)
    assert len(found) == 1, found
    return found[0]


def test_a_chat_stream_whose_node_is_killed_is_the_non_streamed_answer(pair: Pair, client: ollama.Client) -> None:
    whole = client.chat(model="smol", messages=STORY, options=OPTIONS, stream=False)
    assert whole.message.content and whole.eval_count
    since = time.time()
    parts, victim = killed_mid_stream(pair, lambda: client.chat(model="smol", messages=STORY, options=OPTIONS,
                                                                 stream=True))
    assert "".join(p.message.content or "" for p in parts) == whole.message.content  # none lost, none twice
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done
    end = parts[-1]
    assert (end.eval_count, end.prompt_eval_count, end.done_reason) == (
        whole.eval_count, whole.prompt_eval_count, whole.done_reason)
    assert end.total_duration and end.eval_duration and end.prompt_eval_duration is not None
    assert end.prompt_eval_duration + end.eval_duration == end.total_duration
    row = the_row(pair, "ollama_chat", since)
    other = next(n for n in pair.nodes if n != victim)
    assert (row["nodes"], row["node"], row["failovers"], row["status"]) == (f"{victim},{other}", other, 1, 200)
    assert (row["generated_tokens"], row["prompt_tokens"]) == (end.eval_count, end.prompt_eval_count)


def test_a_generate_stream_whose_node_is_killed_is_the_non_streamed_answer(pair: Pair,
                                                                          client: ollama.Client) -> None:
    prompt = STORY[0]["content"]
    whole = client.generate(model="smol", prompt=prompt, options=OPTIONS, stream=False)
    assert whole.response and whole.eval_count
    since = time.time()
    parts, victim = killed_mid_stream(pair, lambda: client.generate(model="smol", prompt=prompt, options=OPTIONS,
                                                                     stream=True))
    assert "".join(p.response for p in parts) == whole.response
    assert [p.done for p in parts].count(True) == 1 and parts[-1].eval_count == whole.eval_count
    row = the_row(pair, "ollama_generate", since)
    assert row["failovers"] == 1 and row["nodes"].split(",")[0] == victim
    assert row["generated_tokens"] == whole.eval_count


def rows_since(pair: Pair, since: float, n: int) -> list[dict[str, Any]]:
    """The gateway's `n` ledger rows since `since` (written off the request path), oldest first."""
    found: list[dict[str, Any]] = []

    def written() -> bool:
        found[:] = pair.gw.admin("GET", "/admin/usage", params={"since": str(since)}).json()["data"]
        return len(found) >= n

    wait_until(written, f"{n} rows", 30, interval=0.1)
    return sorted(found, key=lambda r: r["at"])


def test_bad_input_is_ollamas_4xx_and_embeddings_turns_are_rows(pair: Pair, client: ollama.Client) -> None:
    since = time.time()
    with pytest.raises(ollama.ResponseError) as e:  # the node's 400, in Ollama's shape, through the gateway
        client.chat(model="smol", messages=STORY, options={"num_predict": 0})
    assert e.value.status_code == 400 and "num_predict" in e.value.error
    r = httpx.post(pair.gw.url + "/api/chat", json={"model": "smol", "messages": "hi"},
                   headers={"Authorization": f"Bearer {GW_KEY}"}, timeout=60)
    assert r.status_code == 400 and list(r.json()) == ["error"]
    with pytest.raises(ollama.ResponseError) as e:  # a chat model does not embed: the node's clear 400
        client.embed(model="smol", input=["one", "two"])
    assert e.value.status_code == 400
    r = httpx.post(pair.gw.url + "/v1/embeddings", json={"model": "smol", "input": "one"},
                   headers={"Authorization": f"Bearer {GW_KEY}"}, timeout=60)
    assert r.status_code == 400 and set(r.json()) == {"error"} and "message" in r.json()["error"]
    rows = rows_since(pair, since, 4)
    assert [(row["endpoint"], row["status"], row["model"]) for row in rows] == [
        ("ollama_chat", 400, "smol"), ("ollama_chat", 400, "smol"), ("ollama_embed", 400, "smol"),
        ("embeddings", 400, "smol")]


def node_row(pair: Pair, name: str, answer_id: str) -> dict[str, Any]:
    r = httpx.get(f"{pair.nodes[name].url}/admin/usage", params={"request_id": answer_id},
                  headers={"Authorization": f"Bearer node-{name}-admin"}, timeout=30)
    assert r.status_code == 200, r.text
    [row] = r.json()["data"]
    return dict(row)


def settled_row(pair: Pair, answer_id: str) -> dict[str, Any]:
    """The gateway's row of `answer_id`: written once its node's counts were looked up (off the
    request path: the row is not there before)."""
    found: list[dict[str, Any]] = []

    def written() -> bool:
        found[:] = pair.gw.admin("GET", "/admin/usage", params={"request_id": answer_id}).json()["data"]
        return bool(found)

    wait_until(written, f"the gateway's row of {answer_id}", 60, interval=0.1)
    assert len(found) == 1, found
    return found[0]


def hold(pair: Pair, names: list[str]) -> None:
    for name in names:
        (pair.gates(name) / f"{GATE}.waiting").unlink(missing_ok=True)
        (pair.gates(name) / f"{GATE}.hold").touch()


def held(pair: Pair) -> list[str]:
    return [n for n in pair.nodes if (pair.gates(n) / f"{GATE}.waiting").exists()]


def release(pair: Pair) -> None:
    for name in pair.nodes:
        (pair.gates(name) / f"{GATE}.hold").unlink(missing_ok=True)


LONG = {"temperature": 0, "num_predict": 300}


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
def test_an_ollama_stream_its_client_left_counts_the_nodes_exact_tokens(pair: Pair, client: ollama.Client,
                                                                        path: str) -> None:
    # The node holds before its fourth line, so the client certainly leaves mid-answer (three
    # lines read, no final object): the gateway saw no counts, the node's ledger has them.
    pair.revive()
    body: dict[str, Any] = {"model": "smol", "options": LONG, "stream": True}
    body |= {"messages": STORY} if path == "/api/chat" else {"prompt": STORY[0]["content"]}
    hold(pair, list(pair.nodes))
    try:
        with httpx.stream("POST", pair.gw.url + path, json=body, timeout=300,
                          headers={"Authorization": f"Bearer {GW_KEY}"}) as r:
            assert r.status_code == 200
            answer_id = r.headers["x-hearth-answer-id"]  # the node's name for the answer, passed on
            lines = r.iter_lines()
            read = [next(lines) for _ in range(3)]
            assert all('"done":false' in x.replace(" ", "") for x in read)
            wait_until(lambda: bool(held(pair)), "the node to hold before its fourth line", 120)
            [node] = held(pair)
        # the client has left; the node goes on and sees the gateway close its stream
    finally:
        release(pair)
    row = settled_row(pair, answer_id)
    theirs = node_row(pair, node, answer_id)
    assert (row["node"], row["cancelled"], theirs["cancelled"]) == (node, "disconnect", "disconnect")
    assert (row["prompt_tokens"], row["cached_tokens"], row["generated_tokens"], row["discarded_tokens"]) == (
        theirs["prompt_tokens"], theirs["cached_tokens"], theirs["generated_tokens"], theirs["discarded_tokens"])
    assert theirs["generated_tokens"] >= 3 and theirs["prompt_tokens"] > 0


def test_a_failed_over_ollama_stream_its_client_left_counts_the_continuations_exact_tokens(
        pair: Pair, client: ollama.Client) -> None:
    # The node that takes the stream is killed before its fourth line; the other continues it
    # and holds before its own fourth line, where the client leaves. The killed node wrote no
    # row (kill -9 mid-answer): the turn's row is the first answer's id with the continuation's
    # exact counts, as its node counted them (only what it generated, not the partial it was sent).
    pair.revive()
    since = time.time()
    hold(pair, list(pair.nodes))
    try:
        with httpx.stream("POST", pair.gw.url + "/api/chat", timeout=300,
                          json={"model": "smol", "messages": STORY, "options": LONG, "stream": True},
                          headers={"Authorization": f"Bearer {GW_KEY}"}) as r:
            assert r.status_code == 200
            answer_id = r.headers["x-hearth-answer-id"]
            lines = r.iter_lines()
            read = [next(lines) for _ in range(3)]
            wait_until(lambda: bool(held(pair)), "a node to hold before its fourth line", 120)
            [victim] = held(pair)
            pair.nodes[victim].proc.kill()
            pair.nodes[victim].proc.wait(10)
            other = next(n for n in pair.nodes if n != victim)
            (pair.gates(victim) / f"{GATE}.waiting").unlink(missing_ok=True)
            read += [next(lines) for _ in range(3)]  # the continuation's first three lines
            wait_until(lambda: held(pair) == [other], "the continuation to hold before its fourth line", 120)
        assert all('"done":false' in x.replace(" ", "") for x in read)
    finally:
        release(pair)
    row = settled_row(pair, answer_id)
    assert (row["nodes"], row["failovers"], row["cancelled"]) == (f"{victim},{other}", 1, "disconnect")
    r = httpx.get(f"{pair.nodes[other].url}/admin/usage", params={"since": str(since)},
                  headers={"Authorization": f"Bearer node-{other}-admin"}, timeout=30)
    [theirs] = r.json()["data"]  # the continuation: the one request on that node since
    assert theirs["request_id"] != answer_id  # the continuation's own answer, on its own node
    assert (row["generated_tokens"], row["discarded_tokens"]) == (theirs["generated_tokens"],
                                                                    theirs["discarded_tokens"])
    assert theirs["generated_tokens"] >= 3
