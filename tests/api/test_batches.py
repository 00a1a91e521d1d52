"""The Batch API in-process (api/batches, docs/api.md "Batches"): /v1/files and /v1/batches over
the scripted fake runner, every endpoint and its errors, cancellation, expiry, a resumed batch
(a new runner on the same data dir) and two tenants. Runs are held mid-way with the test gates
(hearth/test_gate.py), never timed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hearth import test_gate
from hearth.api.batches.runner import Batches
from hearth.api.context import node_of
from hearth.http.batches import dispatch, requests
from hearth.tenants import OPEN, ApiKey
from tests.api.conftest import Harness, serve
from tests.helpers import until

CHAT = "/v1/chat/completions"


def line(cid: str, url: str = CHAT, **body: Any) -> dict[str, Any]:
    b = {"model": "fake", "max_tokens": 3, "messages": [{"role": "user", "content": f"say {cid}"}], **body}
    return {"custom_id": cid, "method": "POST", "url": url, "body": b}


def jsonl(rows: list[Any]) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows)


def batches_of(h: Harness) -> Batches:
    return node_of(h.app).batches


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    async with serve(tmp_path) as harness:
        batches_of(harness).start(harness.app)  # what the app's lifespan does
        try:
            yield harness
        finally:
            await batches_of(harness).shutdown()


async def upload(h: Harness, content: bytes, purpose: str = "batch", headers: dict[str, str] | None = None,
                 name: str = "in.jsonl") -> httpx.Response:
    return await h.client.post("/v1/files", files={"file": (name, content, "application/jsonl")},
                               data={"purpose": purpose}, headers=headers)


async def submit(h: Harness, rows: list[Any], headers: dict[str, str] | None = None,
                 endpoint: str = CHAT) -> dict[str, Any]:
    r = await upload(h, jsonl(rows), headers=headers)
    assert r.status_code == 200, r.text
    r = await h.post("/v1/batches", {"input_file_id": r.json()["id"], "endpoint": endpoint,
                                     "completion_window": "24h"}, headers=headers)
    assert r.status_code == 200, r.text
    batch: dict[str, Any] = r.json()
    return batch


async def output(h: Harness, file_id: str | None, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    assert file_id is not None
    r = await h.client.get(f"/v1/files/{file_id}/content", headers=headers)
    assert r.status_code == 200, r.text
    return [json.loads(x) for x in r.text.splitlines()]


def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str) -> tuple[Path, Path]:
    folder = tmp_path / "gates"
    folder.mkdir(exist_ok=True)
    monkeypatch.setenv(test_gate.ENV, str(folder))
    hold = test_gate.hold_path(folder, point)
    hold.touch()
    return hold, test_gate.waiting_path(folder, point)


# files


async def test_a_file_is_uploaded_listed_read_and_deleted(h: Harness) -> None:
    content = jsonl([line("a"), line("b")])
    r = await upload(h, content, name="mine.jsonl")
    assert r.status_code == 200, r.text
    f = r.json()
    assert f["object"] == "file" and f["purpose"] == "batch" and f["bytes"] == len(content)
    assert f["filename"] == "mine.jsonl" and f["id"].startswith("file-")
    assert (await h.client.get(f"/v1/files/{f['id']}")).json() == f
    listed = (await h.client.get("/v1/files")).json()
    assert listed["object"] == "list" and [x["id"] for x in listed["data"]] == [f["id"]]
    r = await h.client.get(f"/v1/files/{f['id']}/content")
    assert r.status_code == 200 and r.content == content
    r = await h.client.delete(f"/v1/files/{f['id']}")
    assert r.json() == {"id": f["id"], "object": "file", "deleted": True}
    for path in (f"/v1/files/{f['id']}", f"/v1/files/{f['id']}/content"):
        r = await h.client.get(path)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


async def test_files_list_pages_newest_first(h: Harness) -> None:
    ids = [(await upload(h, jsonl([line("a")]))).json()["id"] for _ in range(3)]
    page = (await h.client.get("/v1/files", params={"limit": 2})).json()
    assert [x["id"] for x in page["data"]] == ids[::-1][:2] and page["has_more"] is True
    rest = (await h.client.get("/v1/files", params={"limit": 2, "after": page["last_id"]})).json()
    assert [x["id"] for x in rest["data"]] == [ids[0]] and rest["has_more"] is False
    assert (await h.client.get("/v1/files", params={"purpose": "batch_output"})).json()["data"] == []


@pytest.mark.parametrize(("rows", "message", "param"), [
    ([line("a"), b"{not json"], "line 2: not acceptable JSON", None),
    ([line("a"), line("b"), line("a")], "line 3: duplicate custom_id 'a'", "custom_id"),
    ([{**line("a"), "method": "GET"}], "line 1: method must be", "method"),
    ([line("a", url="/v1/messages")], "line 1: url must be one of", "url"),
    ([line("a", stream=True)], "line 1: body.stream is not supported", "body.stream"),
    ([{**line("a"), "extra": 1}], "line 1: unknown field 'extra'", "extra"),
    ([{"custom_id": "a", "method": "POST", "url": CHAT, "body": []}], "line 1: body must be a JSON object", "body"),
    ([{**line("a"), "custom_id": 7}], "line 1: custom_id must be", "custom_id"),
    ([b"[1, 2]"], "line 1: each line must be a JSON object", None),
    ([b"", b"  "], "the file holds no requests", "file"),
])
async def test_every_line_is_checked_at_upload(h: Harness, rows: list[Any], message: str, param: str | None) -> None:
    r = await upload(h, jsonl(rows))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"].startswith(message) and err["param"] == param
    assert (await h.client.get("/v1/files")).json()["data"] == []  # nothing kept


async def test_blank_lines_do_not_shift_line_numbers(h: Harness) -> None:
    r = await upload(h, jsonl([line("a"), b"", b"{oops"]))
    assert r.json()["error"]["message"].startswith("line 3:")


async def test_upload_errors(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    r = await upload(h, jsonl([line("a")]), purpose="fine-tune")
    assert r.status_code == 400 and r.json()["error"]["param"] == "purpose"
    r = await h.client.post("/v1/files", data={"purpose": "batch"})
    assert r.status_code == 400
    r = await h.post("/v1/files", {"purpose": "batch"})
    assert r.status_code == 400 and "multipart/form-data" in r.json()["error"]["message"]
    monkeypatch.setattr(requests, "MAX_FILE_BYTES", 100)
    r = await upload(h, jsonl([line("a"), line("b")]))
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"


async def test_unknown_and_malformed_file_ids_are_404(h: Harness) -> None:
    for fid in ("file-" + "0" * 32, "file-..%2F..%2Fhearth.db", "nope"):
        for path in (f"/v1/files/{fid}", f"/v1/files/{fid}/content"):
            assert (await h.client.get(path)).status_code == 404
        assert (await h.client.delete(f"/v1/files/{fid}")).status_code == 404


# batches


async def test_a_batch_runs_every_line_once_in_openais_line_format(h: Harness) -> None:
    b = await submit(h, [line(f"r{i}") for i in range(5)] + [line("bad", messages="not a list")],
                     endpoint=CHAT)
    assert b["object"] == "batch" and b["status"] in ("validating", "in_progress")
    assert b["completion_window"] == "24h" and b["expires_at"] == b["created_at"] + 24 * 3600
    await batches_of(h).idle()
    done = (await h.client.get(f"/v1/batches/{b['id']}")).json()
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 6, "completed": 5, "failed": 1}
    for key in ("in_progress_at", "finalizing_at", "completed_at"):
        assert isinstance(done[key], int)
    out = await output(h, done["output_file_id"])
    assert [o["custom_id"] for o in out] == [f"r{i}" for i in range(5)]  # input order
    for o in out:
        assert o["id"].startswith("batch_req_") and o["error"] is None
        assert o["response"]["status_code"] == 200 and o["response"]["request_id"]
        assert o["response"]["body"]["object"] == "chat.completion"
        assert o["response"]["body"]["choices"][0]["message"]["content"]
    errors = await output(h, done["error_file_id"])
    assert [e["custom_id"] for e in errors] == ["bad"]
    assert errors[0]["response"]["status_code"] == 400 and errors[0]["response"]["body"]["error"]["message"]
    f = (await h.client.get(f"/v1/files/{done['output_file_id']}")).json()
    assert f["purpose"] == "batch_output"


@pytest.mark.parametrize(("url", "body", "obj"), [
    ("/v1/completions", {"model": "fake", "prompt": "hi", "max_tokens": 3}, "text_completion"),
    ("/v1/responses", {"model": "fake", "input": "hi", "max_output_tokens": 3}, "response"),
])
async def test_other_endpoints(h: Harness, url: str, body: dict[str, Any], obj: str) -> None:
    b = await submit(h, [{"custom_id": "x", "method": "POST", "url": url, "body": body}], endpoint=url)
    await batches_of(h).idle()
    done = (await h.client.get(f"/v1/batches/{b['id']}")).json()
    assert done["request_counts"] == {"total": 1, "completed": 1, "failed": 0}, done
    assert (await output(h, done["output_file_id"]))[0]["response"]["body"]["object"] == obj


async def test_create_errors(h: Harness) -> None:
    fid = (await upload(h, jsonl([line("a"), line("b", url="/v1/completions")]))).json()["id"]
    ok = {"input_file_id": fid, "endpoint": CHAT, "completion_window": "24h"}
    cases: list[tuple[dict[str, Any], int, str | None, str]] = [
        ({**ok, "input_file_id": "file-" + "f" * 32}, 404, "file_id", "No such File"),
        ({**ok, "input_file_id": 3}, 400, "input_file_id", "input_file_id is required"),
        ({**ok, "endpoint": "/v1/messages"}, 400, "endpoint", "endpoint must be one of"),
        ({**ok, "completion_window": "1h"}, 400, "completion_window", "completion_window must be"),
        ({**ok, "metadata": {"k": 1}}, 400, "metadata", "metadata must be"),
        ({**ok, "priority": 1}, 400, "priority", "Unrecognized request argument"),
        (ok, 400, "endpoint", "line 2: url /v1/completions does not match"),
    ]
    for body, status, param, message in cases:
        r = await h.post("/v1/batches", body)
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert err["param"] == param and err["message"].startswith(message), err
    assert (await h.client.get("/v1/batches")).json()["data"] == []


async def test_a_batch_output_file_is_not_an_input(h: Harness) -> None:
    b = await submit(h, [line("a")])
    await batches_of(h).idle()
    out = (await h.client.get(f"/v1/batches/{b['id']}")).json()["output_file_id"]
    r = await h.post("/v1/batches", {"input_file_id": out, "endpoint": CHAT, "completion_window": "24h"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_file_id"


async def test_unknown_batch_ids_are_404(h: Harness) -> None:
    for bid in ("batch_" + "0" * 32, "batch_../x", "x"):
        assert (await h.client.get(f"/v1/batches/{bid}")).status_code == 404
        assert (await h.post(f"/v1/batches/{bid}/cancel")).status_code == 404


async def test_batches_list_pages_newest_first_with_metadata(h: Harness) -> None:
    fid = (await upload(h, jsonl([line("a")]))).json()["id"]
    ids = []
    for i in range(3):
        r = await h.post("/v1/batches", {"input_file_id": fid, "endpoint": CHAT, "completion_window": "24h",
                                         "metadata": {"n": str(i)}})
        ids.append(r.json()["id"])
    await batches_of(h).idle()
    page = (await h.client.get("/v1/batches", params={"limit": 2})).json()
    assert [b["id"] for b in page["data"]] == ids[::-1][:2] and page["has_more"] is True
    assert page["data"][0]["metadata"] == {"n": "2"}
    rest = (await h.client.get("/v1/batches", params={"after": page["last_id"]})).json()
    assert [b["id"] for b in rest["data"]] == [ids[0]] and rest["has_more"] is False
    assert (await h.client.get("/v1/batches", params={"limit": 0})).status_code == 400


async def test_cancel_keeps_the_finished_lines(h: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hold, waiting = gate(tmp_path, monkeypatch, "batch-line-2")
    b = await submit(h, [line(f"r{i}") for i in range(5)])
    await until(waiting.exists, "line 2 at its gate")
    await until(lambda: batches_of(h).store.get(b["id"], OPEN).completed == 2,
                "lines 0 and 1 recorded")
    r = await h.post(f"/v1/batches/{b['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelling" and r.json()["cancelling_at"]
    hold.unlink()
    await batches_of(h).idle()
    done = (await h.client.get(f"/v1/batches/{b['id']}")).json()
    assert done["status"] == "cancelled" and done["request_counts"] == {"total": 5, "completed": 2, "failed": 0}
    assert [o["custom_id"] for o in await output(h, done["output_file_id"])] == ["r0", "r1"]
    r = await h.post(f"/v1/batches/{b['id']}/cancel")  # cancelling a cancelled batch is a no-op
    assert r.status_code == 200 and r.json()["status"] == "cancelled"


async def test_a_finished_batch_cannot_be_cancelled(h: Harness) -> None:
    b = await submit(h, [line("a")])
    await batches_of(h).idle()
    r = await h.post(f"/v1/batches/{b['id']}/cancel")
    assert r.status_code == 409 and "completed" in r.json()["error"]["message"]


async def test_lines_past_the_window_expire(h: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hold, waiting = gate(tmp_path, monkeypatch, "batch-line-1")
    b = await submit(h, [line(f"r{i}") for i in range(4)])
    await until(waiting.exists, "line 1 at its gate")
    batches = batches_of(h)
    batches.clock = lambda: b["expires_at"] + 1.0  # line 1 was admitted before the window closed
    hold.unlink()
    await batches.idle()
    done = (await h.client.get(f"/v1/batches/{b['id']}")).json()
    assert done["status"] == "expired" and done["expired_at"] == b["expires_at"] + 1
    assert done["request_counts"] == {"total": 4, "completed": 2, "failed": 2}
    errors = await output(h, done["error_file_id"])
    assert [(e["custom_id"], e["error"]["code"], e["response"]) for e in errors] == [
        ("r2", "batch_expired", None), ("r3", "batch_expired", None)]


async def test_a_restarted_runner_resumes_without_rerunning(h: Harness, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    hold, waiting = gate(tmp_path, monkeypatch, "batch-line-3")
    b = await submit(h, [line(f"r{i}") for i in range(6)])
    await until(waiting.exists, "line 3 at its gate")
    first = batches_of(h)
    await until(lambda: first.store.get(b["id"], OPEN).completed == 3, "lines 0-2 recorded")
    sent = _count_calls(monkeypatch)
    await first.shutdown()  # the node stops mid-batch (the gate's thread lets go below)
    hold.unlink()
    with (first.store.get(b["id"], OPEN).dir / "results.jsonl").open("ab") as f:
        f.write(b'{"custom_id": "r3", "ok"')  # a torn append: the process died mid-write
    second = Batches(node_of(h.app).settings.data_dir)  # a new process on the same data dir
    assert second.store.get(b["id"], OPEN).status == "in_progress"
    second.start(h.app)
    await second.idle()
    done = second.store.get(b["id"], OPEN).public()
    assert done["status"] == "completed" and done["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
    assert sent == ["r3", "r4", "r5"]  # the recorded lines never run again
    out = await output(h, done["output_file_id"])
    assert [o["custom_id"] for o in out] == [f"r{i}" for i in range(6)]


def _count_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The custom_ids of the lines sent to the node from now on."""
    sent: list[str] = []
    real = dispatch.call

    async def counting(app: Any, who: Any, url: str, body: dict[str, Any]) -> dispatch.Answer:
        sent.append(body["messages"][0]["content"].removeprefix("say "))
        return await real(app, who, url, body)

    monkeypatch.setattr(dispatch, "call", counting)
    return sent


# tenants


KEYS = [ApiKey("ka", "alice", "team-a"), ApiKey("kb", "bob", "team-b")]
ALICE = {"Authorization": "Bearer ka"}
BOB = {"Authorization": "Bearer kb"}
ADMIN = {"Authorization": "Bearer adm"}


async def test_two_tenants_see_only_their_own(tmp_path: Path) -> None:
    async with serve(tmp_path, named_keys=KEYS, admin_key="adm") as t:
        batches_of(t).start(t.app)
        try:
            b = await submit(t, [line("a")], headers=ALICE)
            await batches_of(t).idle()
            done = (await t.client.get(f"/v1/batches/{b['id']}", headers=ALICE)).json()
            assert done["status"] == "completed", done
            fid, out = done["input_file_id"], done["output_file_id"]
            for path in (f"/v1/batches/{b['id']}", f"/v1/files/{fid}", f"/v1/files/{out}",
                         f"/v1/files/{out}/content", f"/v1/files/{fid}/content"):
                assert (await t.client.get(path, headers=BOB)).status_code == 404, path
                assert (await t.client.get(path, headers=ADMIN)).status_code == 200, path
            assert (await t.post(f"/v1/batches/{b['id']}/cancel", headers=BOB)).status_code == 404
            r = await t.post("/v1/batches", {"input_file_id": fid, "endpoint": CHAT, "completion_window": "24h"},
                             headers=BOB)
            assert r.status_code == 404
            assert (await t.client.get("/v1/batches", headers=BOB)).json()["data"] == []
            assert (await t.client.get("/v1/files", headers=BOB)).json()["data"] == []
            assert [x["id"] for x in (await t.client.get("/v1/batches", headers=ALICE)).json()["data"]] == [b["id"]]
            assert (await t.client.get("/v1/batches")).status_code == 401
            # the line ran as alice: counted to her key
            usage = {u["name"]: u for u in (await t.client.get("/admin/keys/usage", headers=ADMIN)).json()["data"]}
            assert usage["alice"]["requests"] >= 4 and usage["bob"]["completion_tokens"] == 0
        finally:
            await batches_of(t).shutdown()


async def test_lines_go_as_flex_as_their_caller_and_429_503_are_retried(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's side of a line, on a stand-in app: the body gets service_tier "flex", the
    caller recorded at creation is the one it runs as, and a 503 / 429 is retried (not its answer)."""
    from hearth.api.batches import runner as runner_mod
    from hearth.http.auth import INPROCESS_CALLER

    monkeypatch.setattr(runner_mod, "RETRY_FIRST", 0.0)
    seen: list[tuple[Any, dict[str, Any]]] = []
    statuses = [503, 429, 200]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        msg = await receive()
        seen.append((scope[INPROCESS_CALLER], json.loads(msg["body"])))
        await send({"type": "http.response.start", "status": statuses.pop(0),
                    "headers": [(b"content-type", b"application/json"), (b"x-request-id", b"req-1")]})
        await send({"type": "http.response.body", "body": b'{"ok": true}'})

    async with serve(tmp_path, named_keys=KEYS) as t:
        batches_of(t).start(app)
        try:
            b = await submit(t, [line("a", service_tier="priority")], headers=ALICE)
            await batches_of(t).idle()
            done = (await t.client.get(f"/v1/batches/{b['id']}", headers=ALICE)).json()
            assert done["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
            out = await output(t, done["output_file_id"], headers=ALICE)
            assert out[0]["response"] == {"status_code": 200, "request_id": "req-1", "body": {"ok": True}}
        finally:
            await batches_of(t).shutdown()
    assert len(seen) == 3
    for who, body in seen:
        assert who.tenant == "team-a" and who.key_name == "alice"
        assert body["service_tier"] == "flex" and body["messages"][0]["content"] == "say a"


async def test_answers_have_the_documented_shapes(h: Harness) -> None:
    """What /openapi.json says the routes answer (api/batches/wire.py) is what they answer."""
    from hearth.api.batches import wire

    r = await upload(h, jsonl([line("a"), line("bad", messages="x")]))
    f = wire.FileObject.model_validate(r.json())
    r = await h.post("/v1/batches", {"input_file_id": f.id, "endpoint": CHAT, "completion_window": "24h"})
    created = wire.BatchObject.model_validate(r.json())
    await batches_of(h).idle()
    done = wire.BatchObject.model_validate((await h.client.get(f"/v1/batches/{created.id}")).json())
    assert done.status == "completed" and done.output_file_id and done.error_file_id
    wire.BatchList.model_validate((await h.client.get("/v1/batches")).json())
    wire.FileList.model_validate((await h.client.get("/v1/files")).json())
    wire.FileDeleted.model_validate((await h.client.delete(f"/v1/files/{f.id}")).json())
    doc = (await h.client.get("/openapi.json")).json()
    assert "multipart/form-data" in doc["paths"]["/v1/files"]["post"]["requestBody"]["content"]


async def test_a_batch_whose_key_was_removed_runs_no_more_lines(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The key file changed between two starts of the node: alice's key is gone, so her batch
    runs no more lines: it ends failed with invalid_api_key (the gateway's rule), its finished
    line kept in the output, the others in its error file with that error, not run as her."""
    hold, waiting = gate(tmp_path, monkeypatch, "batch-line-1")
    async with serve(tmp_path, named_keys=KEYS, admin_key="adm") as t:
        first = batches_of(t)
        first.start(t.app)
        b = await submit(t, [line("a"), line("b"), line("c")], headers=ALICE)
        await until(waiting.exists, "line 1 at its gate")
        await until(lambda: first.store.get(b["id"], OPEN).completed == 1, "line 0 recorded")
        await first.shutdown()
        hold.unlink()
        second = Batches(tmp_path, key_names=frozenset({"bob"}))
        second.start(t.app)
        await second.idle()
        done = second.store.get(b["id"], OPEN).public()
    assert done["status"] == "failed" and done["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    assert done["errors"]["data"][0]["code"] == "invalid_api_key" and done["output_file_id"]
    errors = [json.loads(e) for e in (second.files.root / f"{done['error_file_id']}.jsonl").read_text().splitlines()]
    assert [(e["custom_id"], e["response"], e["error"]["code"]) for e in errors] == \
        [("b", None, "invalid_api_key"), ("c", None, "invalid_api_key")]


async def test_lines_cut_short_by_a_stopping_node_are_not_recorded(tmp_path: Path) -> None:
    """`hearth serve` on SIGTERM marks the batches stopping, then cancels every run: the lines
    cut short answer 200 with finish_reason "cancelled", and must not be taken for their
    answers. Held in the engine by the scripted runner's gate, so the runs are certainly cut."""
    import threading

    from tests.fakes import scripted_backend

    weights = tmp_path / "fake.gguf"
    weights.write_bytes(b"fake weights")
    held = threading.Event()
    backend, runner = scripted_backend("A long and complete answer.", parallel=2, path=weights, gate=held,
                                       gate_generating=True)
    async with serve(tmp_path, backend=backend, runner=runner) as t:
        first = batches_of(t)
        first.start(t.app)
        b = await submit(t, [line(f"r{i}") for i in range(4)])
        await until(runner.entered.is_set, "a line's generation in the engine")
        first.stop()  # what the signal handler does, in this order
        t.backend.cancel_all()
        held.set()
        await first.idle()
        mid = first.store.get(b["id"], OPEN)
        assert mid.status == "in_progress" and mid.completed == 0 and not mid.done  # nothing cut was recorded
    async with serve(tmp_path, answer="A long and complete answer.") as t:  # the node started again
        second = batches_of(t)
        second.start(t.app)
        await second.idle()
        done = second.store.get(b["id"], OPEN).public()
        assert done["status"] == "completed" and done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
        out = await output(t, done["output_file_id"])
        await second.shutdown()
    assert [o["custom_id"] for o in out] == ["r0", "r1", "r2", "r3"]
    for o in out:
        choice = o["response"]["body"]["choices"][0]
        assert choice["finish_reason"] == "length" and o["response"]["body"]["usage"]["completion_tokens"] == 3


async def test_a_chunked_upload_is_refused(h: Harness) -> None:
    async def chunks() -> Any:
        yield b"--x\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--x--\r\n"

    r = await h.client.post("/v1/files", content=chunks(), headers={"content-type": "multipart/form-data; boundary=x"})
    assert r.status_code == 400 and "Content-Length" in r.json()["error"]["message"]


async def test_a_batch_whose_saved_input_is_unreadable_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hold, waiting = gate(tmp_path, monkeypatch, "batch-line-0")
    async with serve(tmp_path) as t:
        first = batches_of(t)
        first.start(t.app)
        b = await submit(t, [line("a")])
        await until(waiting.exists, "line 0 at its gate")
        await first.shutdown()
        hold.unlink()
        (first.store.get(b["id"], OPEN).dir / "input.jsonl").write_bytes(b"{torn")
        (tmp_path / "batches" / "jobs" / ".batch_0123.tmp").mkdir()  # a creation a crash cut short
        second = Batches(tmp_path)
        second.start(t.app)
        await second.idle()
        done = second.store.get(b["id"], OPEN).public()
    assert done["status"] == "failed" and isinstance(done["failed_at"], int)
    assert done["errors"]["data"][0]["code"] == "invalid_input"
    assert not (tmp_path / "batches" / "jobs" / ".batch_0123.tmp").exists()
