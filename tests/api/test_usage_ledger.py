"""The usage ledger in-process (api/http/usage_tap.py, api/usage.py): one row per request on
every protocol with the answer's own counts; cancelled and disconnected runs count what was
generated before the stop; GET /admin/usage filters, groups, and shows a tenant its own rows
only; the keys' usage survives a restart."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

from starlette.types import Message

from hearth.api.context import node_of
from hearth.observability.ledger import Ledger, UsageFilter
from hearth.tenants import ApiKey
from tests.api.conftest import Harness, serve
from tests.helpers import until

CHAT = {"model": "fake", "max_tokens": 50, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
ALICE = {"Authorization": "Bearer ka"}
BOB = {"Authorization": "Bearer kb"}
ADMIN = {"Authorization": "Bearer adm"}
KEYS = [ApiKey("ka", "alice", "team-a"), ApiKey("kb", "bob", "team-b")]


def ledger_of(h: Harness) -> Ledger:
    ledger = node_of(h.app).ledger
    assert ledger is not None
    assert ledger.flush()
    return ledger


def rows(h: Harness) -> list[dict[str, Any]]:
    return list(reversed(ledger_of(h).rows(UsageFilter())))  # oldest first


async def test_one_row_per_request_with_the_answers_counts(tmp_path: Path) -> None:
    async with serve(tmp_path) as h:
        chat = (await h.post("/v1/chat/completions", CHAT)).json()
        streamed = await h.sse("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}})
        completion = (await h.post("/v1/completions", {"model": "fake", "prompt": "x", "max_tokens": 5})).json()
        message = (await h.post("/v1/messages", CHAT)).json()
        got = rows(h)
        assert [r["endpoint"] for r in got] == ["chat", "chat", "completions", "messages"]
        assert all(r["model"] == "fake" and r["tenant"] == "" and r["key"] is None for r in got)
        u = chat["usage"]
        assert (got[0]["prompt_tokens"], got[0]["generated_tokens"], got[0]["finish_reason"]) == \
            (u["prompt_tokens"], u["completion_tokens"], "stop")
        assert got[0]["request_id"] == chat["id"] and got[0]["cancelled"] is None and got[0]["discarded_tokens"] == 0
        su = [d for _, d in streamed if isinstance(d, dict) and d.get("usage")][-1]["usage"]
        assert got[1]["generated_tokens"] == su["completion_tokens"] and got[1]["ttft_ms"] is not None
        assert got[2]["generated_tokens"] == completion["usage"]["completion_tokens"] == 5
        assert got[2]["finish_reason"] == "length"
        assert got[3]["generated_tokens"] == message["usage"]["output_tokens"]
        assert all(r["total_ms"] >= (r["ttft_ms"] or 0) >= (r["queue_ms"] or 0) >= 0 for r in got)


async def test_an_ollama_answer_names_its_row_in_a_header(tmp_path: Path) -> None:
    # Ollama's objects carry no id: the header is how a client (or a gateway) finds the row.
    async with serve(tmp_path) as h:
        chat = {"model": "fake", "messages": CHAT["messages"], "options": {"num_predict": 5}}
        whole = await h.post("/api/chat", {**chat, "stream": False})
        async with h.client.stream("POST", "/api/chat", json=chat) as r:
            assert r.status_code == 200
            lines = [json.loads(x) async for x in r.aiter_lines() if x]
        generated = await h.post("/api/generate", {"model": "fake", "prompt": "x", "stream": False,
                                                   "options": {"num_predict": 3}})
        ids = [whole.headers["x-hearth-answer-id"], r.headers["x-hearth-answer-id"],
               generated.headers["x-hearth-answer-id"]]
        got = rows(h)
        assert [x["request_id"] for x in got] == ids and len(set(ids)) == 3
        assert [x["endpoint"] for x in got] == ["ollama_chat", "ollama_chat", "ollama_generate"]
        assert got[1]["generated_tokens"] == lines[-1]["eval_count"]
        assert got[2]["generated_tokens"] == generated.json()["eval_count"]


async def test_a_cancelled_run_counts_its_tokens(tmp_path: Path) -> None:
    async with serve(tmp_path) as h:
        assert h.runner is not None
        h.runner.gate = gate = threading.Event()
        h.runner.gate_generating = True  # held in a decode after its first token
        task = asyncio.create_task(h.post("/v1/chat/completions", CHAT))
        assert await asyncio.to_thread(h.runner.entered.wait, 10)
        [run] = node_of(h.app).cancels._runs
        run.token.on_cancel(gate.set)
        [rid] = run.ids
        assert (await h.post("/v1/cancel", {"completion_id": rid})).json() == {"cancelled": 1}
        body = (await task).json()
        [row] = rows(h)
        assert row["cancelled"] == "cancel_call" and row["finish_reason"] == "cancelled"
        assert row["generated_tokens"] == body["usage"]["completion_tokens"] >= 1


async def test_a_disconnected_stream_counts_what_was_generated(tmp_path: Path) -> None:
    """Through raw ASGI: the client leaves while its run is held in the engine after its first token."""
    async with serve(tmp_path) as h:
        assert h.runner is not None
        h.runner.gate = gate = threading.Event()
        h.runner.gate_generating = True
        gone = asyncio.Event()
        sent: list[Message] = []
        messages = [{"type": "http.request", "body": json.dumps({**CHAT, "stream": True, "logprobs": True}).encode(),
                     "more_body": False}]

        async def receive() -> Message:
            if messages:
                return messages.pop(0)
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
                 "raw_path": b"/v1/chat/completions", "query_string": b"",
                 "headers": [(b"content-type", b"application/json")], "http_version": "1.1", "scheme": "http",
                 "server": ("test", 80), "client": ("test", 1), "root_path": "", "app": h.app}
        task = asyncio.create_task(h.app(scope, receive, send))
        assert await asyncio.to_thread(h.runner.entered.wait, 10)
        [run] = node_of(h.app).cancels._runs
        run.token.on_cancel(gate.set)
        gone.set()
        await asyncio.wait_for(task, 10)
        await until(lambda: h.backend.stats()["fake"].slots_busy == 0)
        await until(lambda: len(rows(h)) == 1, "the row, once the engine's last output was counted")
        [row] = rows(h)
        assert row["cancelled"] == "disconnect"
        # exact: every token the engine sampled for it, the one of the step in which the stop
        # arrived (the held decode, released by the cancel) included, and what the client got
        engine = h.backend.stats()["fake"].generated_tokens
        assert row["generated_tokens"] == run.token.generated == engine >= 2
        delivered = sum(len((d["choices"][0].get("logprobs") or {}).get("content") or [])
                        for d in _events(sent))
        assert row["discarded_tokens"] == row["generated_tokens"] - delivered


async def test_admin_usage_filters_groups_and_tenants(tmp_path: Path) -> None:
    async with serve(tmp_path, named_keys=KEYS, admin_key="adm") as h:
        for who in (ALICE, ALICE, BOB):
            assert (await h.post("/v1/chat/completions", CHAT, headers=who)).status_code == 200
        ledger_of(h)
        everyone = (await h.client.get("/admin/usage", headers=ADMIN)).json()["data"]
        assert sorted(r["key"] for r in everyone) == ["alice", "alice", "bob"]
        mine = (await h.client.get("/admin/usage", headers=ALICE)).json()["data"]
        assert [r["tenant"] for r in mine] == ["team-a", "team-a"]
        # a tenant asking for another's rows still sees only its own
        theirs = (await h.client.get("/admin/usage", params={"tenant": "team-b"}, headers=ALICE)).json()["data"]
        assert {r["tenant"] for r in theirs} == {"team-a"}
        by_key = (await h.client.get("/admin/usage", params={"group": "key"}, headers=ADMIN)).json()
        assert [(r["key"], r["requests"]) for r in by_key["data"]] == [("alice", 2), ("bob", 1)]
        [day] = (await h.client.get("/admin/usage", params={"group": "day,model"}, headers=BOB)).json()["data"]
        assert day["model"] == "fake" and day["requests"] == 1
        assert (await h.client.get("/admin/usage", params={"model": "other"}, headers=ADMIN)).json()["data"] == []
        future = (await h.client.get("/admin/usage", params={"since": "2999-01-01"}, headers=ADMIN)).json()
        assert future["data"] == []
        for params in ({"since": "yesterday"}, {"group": "hour"}, {"limit": "0"}):
            r = await h.client.get("/admin/usage", params=params, headers=ADMIN)
            assert r.status_code == 400 and r.json()["error"]["param"] in params, r.text
        assert (await h.client.get("/admin/keys/usage", headers=ALICE)).status_code == 403  # still the admin's
        assert (await h.client.get("/admin/usage")).status_code == 401


async def test_key_usage_survives_a_restart(tmp_path: Path) -> None:
    async with serve(tmp_path, named_keys=KEYS, admin_key="adm") as h:
        answer = (await h.post("/v1/chat/completions", CHAT, headers=ALICE)).json()
        ledger_of(h).close()  # as the app's lifespan does at shutdown
    async with serve(tmp_path, named_keys=KEYS, admin_key="adm") as h:
        usage = {u["name"]: u for u in (await h.client.get("/admin/keys/usage", headers=ADMIN)).json()["data"]}
        assert usage["alice"]["requests"] == 1
        assert usage["alice"]["completion_tokens"] == answer["usage"]["completion_tokens"]
        assert usage["alice"]["prompt_tokens"] == answer["usage"]["prompt_tokens"]
        assert usage["bob"]["requests"] == 0


async def test_no_ledger_when_off(tmp_path: Path) -> None:
    async with serve(tmp_path, usage_ledger=False) as h:
        assert (await h.post("/v1/chat/completions", CHAT)).status_code == 200
        assert node_of(h.app).ledger is None
        r = await h.client.get("/admin/usage")
        assert r.status_code == 404, r.text
    assert not (tmp_path / "usage.db").exists()


def _events(sent: list[Message]) -> list[dict[str, Any]]:
    """The chunks of a raw ASGI stream (its data lines)."""
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
