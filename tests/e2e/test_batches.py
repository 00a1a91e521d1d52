"""The Batch API on a real server with the real model, through the official `openai` SDK
(docs/api.md, "Batches"): a batch stopped by `kill -9` in the middle resumes on the same data
dir with every line in the output exactly once and no recorded line run again; cancellation;
two tenants' isolation. Runs are held mid-way with the test gates (hearth.test_gate), never
timed."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from hearth import test_gate
from tests.helpers import Server, start_server, stop_server, wait_until
from tests.helpers.prometheus import sample

pytestmark = pytest.mark.slow

ALICE, BOB, ADMIN = "sk-alice", "sk-bob", "sk-admin"
CHAT = "/v1/chat/completions"


def rows(n: int) -> bytes:
    return b"".join(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": CHAT, "body": {
        "model": "default", "temperature": 0, "max_tokens": 4,
        "messages": [{"role": "user", "content": f"Count to {i + 1}."}]}}).encode() + b"\n" for i in range(n))


def oai(s: Server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.base_url, api_key=key, timeout=600, max_retries=0)


def serve(tmp: Path, gates: Path, port: int | None = None) -> Server:
    keys = tmp / "keys.txt"
    keys.write_text(f"{ALICE} name=alice tenant=team-a\n{BOB} name=bob\n")
    return start_server(tmp, "--api-key-file", str(keys), "--admin-key", ADMIN, "--parallel", "2", "--ctx", "2048",
                        port=port, env={test_gate.ENV: str(gates)})


def hold(gates: Path, point: str) -> tuple[Path, Path]:
    gates.mkdir(exist_ok=True)
    h = test_gate.hold_path(gates, point)
    h.touch()
    return h, test_gate.waiting_path(gates, point)


def submit(c: openai.OpenAI, n: int) -> Any:
    f = c.files.create(file=("in.jsonl", io.BytesIO(rows(n))), purpose="batch")
    assert f.purpose == "batch" and f.bytes == len(rows(n))
    return c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                            metadata={"run": "e2e"})


def output_lines(c: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(x) for x in c.files.content(file_id).text.splitlines()]


def test_a_batch_killed_mid_way_resumes_with_every_line_exactly_once(tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    h, waiting = hold(gates, "batch-line-3")
    s = serve(tmp_path, gates)
    port = int(s.url.rsplit(":", 1)[1])
    try:
        with oai(s, ALICE) as c:
            b = submit(c, 6)
            assert b.status in ("validating", "in_progress") and b.request_counts is not None
            assert b.request_counts.total == 6
            wait_until(waiting.exists, "line 3 at its gate")
            wait_until(lambda: c.batches.retrieve(b.id).request_counts.completed == 3,  # type: ignore[union-attr]
                       "lines 0-2 answered")
            assert c.batches.retrieve(b.id).status == "in_progress"
    finally:
        s.proc.kill()  # kill -9: no shutdown, nothing flushed but what was already on disk
        s.proc.wait(10)
    h.unlink()
    waiting.unlink(missing_ok=True)
    s = serve(tmp_path, gates, port=port)  # the same node: same data dir, same port
    try:
        with oai(s, ALICE) as c:
            wait_until(lambda: c.batches.retrieve(b.id).status == "completed", "the resumed batch to complete")
            done = c.batches.retrieve(b.id)
            assert done.request_counts is not None
            assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (6, 6, 0)
            assert done.metadata == {"run": "e2e"} and done.error_file_id is None
            out = output_lines(c, done.output_file_id)
            assert sorted(o["custom_id"] for o in out) == [f"q{i}" for i in range(6)]  # each exactly once
            for o in out:
                assert o["error"] is None and o["response"]["status_code"] == 200
                assert o["response"]["body"]["object"] == "chat.completion"
                assert o["response"]["body"]["choices"][0]["message"]["role"] == "assistant"
        # the restarted node answered the three unrecorded lines and nothing else
        metrics = httpx.get(f"{s.url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30).text
        assert sample(metrics, "hearth_http_requests_total", endpoint=CHAT) == 3
    finally:
        stop_server(s)


def test_cancel_and_two_tenants(tmp_path: Path) -> None:
    gates = tmp_path / "gates"
    h, waiting = hold(gates, "batch-line-1")
    s = serve(tmp_path, gates)
    try:
        with oai(s, ALICE) as alice, oai(s, BOB) as bob:
            b = submit(alice, 3)
            wait_until(waiting.exists, "line 1 at its gate")
            for call in (lambda: bob.batches.retrieve(b.id), lambda: bob.batches.cancel(b.id),
                         lambda: bob.files.retrieve(b.input_file_id), lambda: bob.files.content(b.input_file_id)):
                with pytest.raises(openai.NotFoundError):
                    call()
            assert list(bob.batches.list()) == [] and list(bob.files.list()) == []
            assert [x.id for x in alice.batches.list()] == [b.id]
            cancelling = alice.batches.cancel(b.id)
            assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
            h.unlink()
            wait_until(lambda: alice.batches.retrieve(b.id).status == "cancelled", "the batch to be cancelled")
            done = alice.batches.retrieve(b.id)
            assert done.request_counts is not None and done.request_counts.completed == 1
            assert [o["custom_id"] for o in output_lines(alice, done.output_file_id)] == ["q0"]
            with pytest.raises(openai.NotFoundError):
                bob.files.content(done.output_file_id or "")
            with pytest.raises(openai.BadRequestError) as e:  # a line the server checks, with its number
                alice.files.create(file=("bad.jsonl", io.BytesIO(rows(2) + b"{oops\n")), purpose="batch")
            assert "line 3" in str(e.value)
    finally:
        stop_server(s)


def test_a_graceful_stop_mid_batch_records_no_cut_answer(tmp_path: Path) -> None:
    """SIGTERM while lines generate: `hearth serve` cancels every run as it stops, and the lines
    it cut must not be recorded as their answers (finish_reason "cancelled"): they run again
    after the restart. The verdict holds whether or not a line was running at the signal."""
    gates = tmp_path / "gates"
    gates.mkdir()
    s = serve(tmp_path, gates)
    port = int(s.url.rsplit(":", 1)[1])
    long_rows = b"".join(json.dumps({"custom_id": f"l{i}", "method": "POST", "url": CHAT, "body": {
        "model": "default", "temperature": 0, "max_tokens": 48, "ignore_eos": True,
        "messages": [{"role": "user", "content": f"Tell a story about the number {i}."}]}}).encode() + b"\n"
        for i in range(8))
    try:
        with oai(s, ALICE) as c:
            f = c.files.create(file=("long.jsonl", io.BytesIO(long_rows)), purpose="batch")
            b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
            wait_until(lambda: c.batches.retrieve(b.id).request_counts.completed >= 1,  # type: ignore[union-attr]
                       "a first line answered")
    finally:
        stop_server(s)  # SIGTERM
    s = serve(tmp_path, gates, port=port)
    try:
        with oai(s, ALICE) as c:
            wait_until(lambda: c.batches.retrieve(b.id).status == "completed", "the resumed batch to complete")
            out = output_lines(c, c.batches.retrieve(b.id).output_file_id)
        assert sorted(o["custom_id"] for o in out) == sorted(f"l{i}" for i in range(8))
        for o in out:
            body = o["response"]["body"]
            assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 48
    finally:
        stop_server(s)
