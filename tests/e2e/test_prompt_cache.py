"""The durable prompt cache end to end: a stateless conversation (the client resends everything,
no session_id) keeps its prefix across a graceful restart and a `kill -9`.

Temperature-0 answers are compared with a reference server that ran the same conversation
without a restart. The restarted server's third turn reuses the second turn's KV from disk,
bit for bit what the reference reused from its slot, and prefills the same new tokens in the
same shape, so the answers must be equal (a prefix computed in another batch shape could move
the logits' last bits, hence a reference server and not the same request sent twice)."""

from __future__ import annotations

import json
import signal
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.helpers import Server, start_server, stop_server, wait_until

pytestmark = pytest.mark.slow

ARGS = ("--parallel", "2", "--ctx", "4096")
SYSTEM = {"role": "system", "content": "You are the ship's navigator. " + " ".join(
    f"Rule {i}: keep the logbook entry number {i} short, factual and dated." for i in range(1, 31))}
QUESTIONS = ["Which way is north?", "How far is the next port?", "Should we reef the sails?"]


def chat(s: Server, messages: list[dict[str, Any]]) -> Any:
    with openai.OpenAI(base_url=s.base_url, api_key="none", timeout=600, max_retries=0) as c:
        return c.chat.completions.create(model="default", messages=messages, temperature=0,  # type: ignore[arg-type]
                                         max_tokens=16)


def conversation(s: Server, turns: int, answers: list[str] | None = None) -> tuple[list[dict[str, Any]], list[Any]]:
    """Run `turns` stateless turns (each resends the whole conversation); the assistant turns are
    `answers` where given (so two servers see the same prompts), else the server's own."""
    messages: list[dict[str, Any]] = [SYSTEM]
    replies = []
    for i in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[i]})
        r = chat(s, messages)
        replies.append(r)
        text = answers[i] if answers else r.choices[0].message.content
        messages.append({"role": "assistant", "content": text})
    return messages, replies


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Any]]:
    """Three turns on a server that is never restarted."""
    s = start_server(tmp_path_factory.mktemp("reference"), *ARGS)
    try:
        _, replies = conversation(s, 3)
    finally:
        stop_server(s)
    yield replies


def cached_through(home: Path) -> int:
    """How far the blocks on disk reach: the largest end position of any block file (headers
    only; a file exists only once complete: written to a temporary name, then renamed)."""
    end = 0
    for path in home.glob("prompt-cache/*/*.kvb"):
        raw = path.read_bytes()
        (hlen,) = struct.unpack("<I", raw[4:8])
        h = json.loads(raw[8:8 + hlen])
        end = max(end, h["start"] + h["n_tokens"])
    return end


@pytest.mark.parametrize("how", ["graceful", "kill -9"])
def test_a_stateless_conversation_continues_after_a_restart_from_the_disk_cache(
        tmp_path: Path, reference: list[Any], how: str) -> None:
    answers = [r.choices[0].message.content for r in reference]
    s = start_server(tmp_path, *ARGS)
    try:
        messages, replies = conversation(s, 2, answers)
        assert [r.choices[0].message.content for r in replies] == answers[:2]
        second = replies[1].usage
        # The third turn reuses turn 2's prompt and its answer (the slot's tokens, offered whole;
        # the answer's tail is the last block written): the reference's cached count is how far.
        reused = reference[2].usage.prompt_tokens_details.cached_tokens
        if how == "kill -9":  # the writer works in the background: wait until all of it is on disk
            wait_until(lambda: cached_through(tmp_path / "home") >= reused,
                       "the second turn's blocks, its answer's included, on disk")
            s.proc.send_signal(signal.SIGKILL)
            s.proc.wait(10)
    finally:
        stop_server(s)  # graceful: SIGTERM, and the cache finishes its writes before exiting
    assert cached_through(tmp_path / "home") >= max(reused, second.prompt_tokens)
    s = start_server(tmp_path, *ARGS)
    try:
        third = chat(s, [*messages, {"role": "user", "content": QUESTIONS[2]}])
        assert third.choices[0].message.content == answers[2]
        usage = third.usage
        assert usage.prompt_tokens == reference[2].usage.prompt_tokens
        assert usage.prompt_tokens_details.cached_tokens == reference[2].usage.prompt_tokens_details.cached_tokens
        assert usage.prompt_tokens_details.cached_tokens >= 0.9 * usage.prompt_tokens
    finally:
        stop_server(s)


def test_bad_cache_files_are_ignored_at_start_and_the_answer_is_unchanged(tmp_path: Path,
                                                                          reference: list[Any]) -> None:
    answers = [r.choices[0].message.content for r in reference]
    s = start_server(tmp_path, *ARGS)
    try:
        messages, _ = conversation(s, 2, answers)
    finally:
        stop_server(s)
    files = sorted((tmp_path / "home").glob("prompt-cache/*/*.kvb"))
    assert files
    for path in files:  # flip a byte in every payload: each fails its checksum when read
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 0xFF
        path.write_bytes(bytes(raw))
    (files[0].parent / ("f" * 32 + ".kvb")).write_bytes(b"HKB1 not a block")
    s = start_server(tmp_path, *ARGS)
    try:
        third = chat(s, [*messages, {"role": "user", "content": QUESTIONS[2]}])
        assert third.usage.prompt_tokens_details.cached_tokens == 0  # nothing corrupt was loaded
        assert "ignoring prompt-cache" in s.log.read_text()
    finally:
        stop_server(s)
