"""Through the real server and model: a cancel stops a prefill midway (its batch neighbour's
greedy continuation is unchanged), speculative decoding emits exactly the tokens of plain
decoding, and the KV type is part of a snapshot's identity."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_http import wait_idle
from tests.helpers import Server, start_server, stop_server, wait_until

pytestmark = pytest.mark.slow

# Speculative decoding off: how many tokens a step drafts depends on the room a neighbour's prefill
# chunk leaves, so the batches would differ between the reference and the run beside the prefill.
NEIGHBOUR = {"messages": [{"role": "user", "content": "Tell me a story about a dragon."}], "temperature": 0,
             "max_tokens": 48, "ignore_eos": True, "cache_prompt": False, "speculative": False}


def stream_text(server: Server, body: dict[str, Any], on_token: Any = None) -> tuple[str, str | None, int]:
    text, finish, n = "", None, 0
    with httpx.stream("POST", f"{server.base_url}/chat/completions", json={**body, "stream": True},
                      timeout=300) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for ch in json.loads(line[6:])["choices"]:
                if ch["delta"].get("content"):
                    text += ch["delta"]["content"]
                    n += 1
                    if on_token is not None:
                        on_token(n)
                finish = ch["finish_reason"] or finish
    return text, finish, n


def test_cancel_inside_a_shared_prefill_keeps_the_neighbour_exact(server: Server) -> None:
    """Why this cannot flake: the neighbour's budget (1,500 tokens) far outlasts the test's steps,
    and the test cancels it itself once it has the reference's 48 tokens, so it is still decoding
    when the long prompt arrives, whatever the machine's speed. Both long prompts recompute their
    whole prompt (cache_prompt false): a retry does not start from the previous one's chunks."""
    wait_idle(server)
    reference, _, _ = stream_text(server, NEIGHBOUR)
    long_prompt = " ".join(["the keeper climbed the stairs of the old lighthouse at dusk"] * 150)  # ~1,800 tokens
    for attempt in range(3):  # the cancel must land while a decode holds the long prompt's chunk
        before = server.metric("hearth_interrupted_decodes_total")
        started, enough = threading.Event(), threading.Event()
        got: dict[str, Any] = {}

        def on_neighbour_token(n: int, started: threading.Event = started, enough: threading.Event = enough) -> None:
            if n == 3:
                started.set()
            if n >= 48:  # one token per content chunk at most (no speculation): the reference's length
                enough.set()

        def neighbour(got: dict[str, Any] = got, attempt: int = attempt) -> None:
            got["n"] = stream_text(server, {**NEIGHBOUR, "max_tokens": 1500, "cancel_id": f"neighbour-{attempt}"},
                                   on_neighbour_token)

        def long(got: dict[str, Any] = got, attempt: int = attempt) -> None:
            got["l"] = stream_text(server, {"messages": [{"role": "user", "content": long_prompt}],
                                            "max_tokens": 8, "cancel_id": f"long-{attempt}", "cache_prompt": False})

        tn = threading.Thread(target=neighbour)
        tn.start()
        assert started.wait(120)
        tl = threading.Thread(target=long)
        tl.start()
        wait_until(lambda: server.metric("hearth_running_sequences") == 2)  # the long prompt is prefilling
        r = httpx.post(f"{server.base_url}/cancel", json={"cancel_id": f"long-{attempt}"}, timeout=10)
        assert r.status_code == 200 and r.json()["cancelled"] == 1
        tl.join(120)
        assert enough.wait(300)
        r = httpx.post(f"{server.base_url}/cancel", json={"cancel_id": f"neighbour-{attempt}"}, timeout=10)
        assert r.status_code == 200 and r.json()["cancelled"] == 1
        tn.join(120)
        text_l, finish_l, n_l = got["l"]
        assert finish_l == "cancelled" and n_l == 0 and text_l == ""
        # the neighbour's greedy continuation is the one it has alone: the interrupted step's
        # work was rolled back from its KV and decoded again
        text_n, finish_n, _ = got["n"]
        assert finish_n == "cancelled" and text_n.startswith(reference), (text_n, reference)
        if server.metric("hearth_interrupted_decodes_total") > before:
            break
    else:
        pytest.fail("no cancel landed inside a decode in 3 attempts")
    wait_idle(server)


# A text the default model repeats (its guesses prove right, so drafts are sent: speculation
# drafts only where the sequence's own guesses were right, and SmolLM2 does not copy a list).
COPY = "Repeat this line ten times: the quick brown fox jumps over the lazy dog"


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.7, "seed": 42, "top_p": 0.9}])
def test_speculative_decoding_emits_exactly_the_plain_tokens(server: Server, sampling: dict[str, Any]) -> None:
    wait_idle(server)
    body = {"messages": [{"role": "user", "content": COPY}], "max_tokens": 64, "ignore_eos": True,
            "cache_prompt": False, "logprobs": True, **sampling}

    def tokens(speculative: bool) -> list[str]:
        r = httpx.post(f"{server.base_url}/chat/completions", json={**body, "speculative": speculative}, timeout=300)
        assert r.status_code == 200, r.text
        return [t["token"] for t in r.json()["choices"][0]["logprobs"]["content"]]

    accepted = server.metric("hearth_spec_accepted_tokens_total")
    plain, spec = tokens(False), tokens(True)
    assert len(plain) == 64 and spec == plain
    if sampling["temperature"] == 0:  # the model copies the list: drafts were accepted
        assert server.metric("hearth_spec_accepted_tokens_total") > accepted


def test_the_kv_type_is_recorded_in_snapshots_and_checked_on_load(server: Server, tmp_path: Path) -> None:
    q8 = start_server(tmp_path, "--parallel", "1", "--ctx", "1024", "--kv-type", "q8_0")
    try:
        sid = "kvtype-q8"
        r = httpx.post(f"{q8.base_url}/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 8, "temperature": 0,
            "session_id": sid})
        assert r.status_code == 200, r.text
        snap = httpx.post(f"{q8.base_url}/sessions/{sid}/save", json={}, timeout=60).json()
        manifest = json.loads((tmp_path / "home" / "snapshots" / snap["snapshot_id"] / "manifest.json").read_text())
        assert manifest["engine"]["kv_type"] == "q8_0"
        archive = httpx.get(f"{q8.base_url}/snapshots/{snap['snapshot_id']}/archive", timeout=60).content
        # it loads back where the type matches ...
        assert httpx.post(f"{q8.base_url}/snapshots/{snap['snapshot_id']}/load",
                          json={"session_id": "kvtype-back"}, timeout=60).status_code == 201
    finally:
        stop_server(q8)
    # ... and not into the shared f16 server: 409 naming both types
    r = httpx.post(f"{server.base_url}/snapshots/import", content=archive, timeout=60)
    assert r.status_code == 201, r.text
    r = httpx.post(f"{server.base_url}/snapshots/{snap['snapshot_id']}/load", json={}, timeout=60)
    assert r.status_code == 409 and r.json()["error"]["code"] == "snapshot_incompatible"
    assert "q8_0" in r.json()["error"]["message"] and "f16" in r.json()["error"]["message"]
