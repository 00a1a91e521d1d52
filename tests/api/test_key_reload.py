"""`POST /admin/keys/reload` on a node, in-process (hearth/http/keyring.py; docs/api.md,
"Reloading the keys"): admin-only, what changed in counts, a removed key's next request 401, a
new key served, a changed key's limits applied while an unchanged key's limit windows are kept,
an invalid file an error that changes nothing, a request already running finishing, and a batch
whose key a reload removed ending `failed`. The accounts' clock is the test's; runs and batch
lines are held with the test gates, never timed."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from hearth.api.context import node_of
from hearth.api.wire import usage as usage_wire
from hearth.tenants import OPEN, read_key_file
from tests.api.conftest import serve
from tests.api.test_batches import batches_of, gate, line, submit
from tests.helpers import sample, until

ALICE = {"Authorization": "Bearer ka"}
BOB = {"Authorization": "Bearer kb"}
CAROL = {"Authorization": "Bearer kc"}
ADMIN = {"Authorization": "Bearer adm"}
CHAT = {"model": "fake", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
START = "ka name=alice tenant=team-a rpm=2\nkb name=bob tenant=team-b\n"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def keyfile(tmp_path: Path, text: str = START) -> Path:
    path = tmp_path / "keys.txt"
    path.write_text(text)
    return path


async def test_reload_is_the_admins_and_answers_what_changed(tmp_path: Path) -> None:
    path = keyfile(tmp_path)
    async with serve(tmp_path, named_keys=read_key_file(path), api_key_file=path, admin_key="adm") as h:
        path.write_text("ka name=alice tenant=team-a rpm=3\nkc name=carol tenant=team-c\n")
        r = await h.post("/admin/keys/reload", headers=ALICE)  # a client key: not the admin
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error", r.text
        r = await h.post("/admin/keys/reload")
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
        assert (await h.post("/v1/chat/completions", CHAT, headers=CAROL)).status_code == 401  # not yet
        r = await h.post("/admin/keys/reload", headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json() == {"object": "keys.reload", "added": 1, "removed": 1, "changed": 1, "unchanged": 0}
        usage_wire.KeysReloaded.model_validate(r.json())
        assert "ka" not in r.text and "kc" not in r.text  # counts, never keys
        assert (await h.post("/v1/chat/completions", CHAT, headers=CAROL)).status_code == 200  # new: served
        r = await h.post("/v1/chat/completions", CHAT, headers=BOB)  # removed: 401 on its next request
        assert r.status_code == 401 and r.json()["error"]["message"] == "invalid API key", r.text
        assert (await h.post("/v1/chat/completions", CHAT, headers=ADMIN)).status_code == 200  # a flag: kept
        rows = {u["name"]: u for u in (await h.client.get("/admin/keys/usage", headers=ADMIN)).json()["data"]}
        assert set(rows) == {"alice", "carol"} and rows["alice"]["limits"]["rpm"] == 3
        r = await h.post("/admin/keys/reload", headers=ADMIN)  # the same file again: nothing changes
        assert r.json() == {"object": "keys.reload", "added": 0, "removed": 0, "changed": 0, "unchanged": 2}
        text = (await h.client.get("/metrics", headers=ADMIN)).text
        assert sample(text, "hearth_key_reloads_total", result="ok") == 2 and sample(text, "hearth_api_keys") == 2
        assert sample(text, "hearth_key_reloads_total", result="refused") == 0


async def test_limits_follow_a_reload_and_windows_are_kept(tmp_path: Path) -> None:
    """Alice (rpm=2) has used her minute; a reload that changes nothing of hers, or only another
    key, does not give her a new minute; raising her limit applies to her next request."""
    path = keyfile(tmp_path)
    clock = Clock()
    async with serve(tmp_path, named_keys=read_key_file(path), api_key_file=path, admin_key="adm") as h:
        node_of(h.app).keys._clock = clock
        for _ in range(2):
            assert (await h.post("/v1/chat/completions", CHAT, headers=ALICE)).status_code == 200
        assert (await h.post("/v1/chat/completions", CHAT, headers=ALICE)).status_code == 429
        path.write_text(START + "kc name=carol tenant=team-c\n")
        assert (await h.post("/admin/keys/reload", headers=ADMIN)).json()["unchanged"] == 2
        r = await h.post("/v1/chat/completions", CHAT, headers=ALICE)
        assert r.status_code == 429 and "rpm=2" in r.text, r.text  # not reset by the reload
        path.write_text(START.replace("rpm=2", "rpm=3"))
        assert (await h.post("/admin/keys/reload", headers=ADMIN)).json()["changed"] == 1
        assert (await h.post("/v1/chat/completions", CHAT, headers=ALICE)).status_code == 200  # the new limit
        r = await h.post("/v1/chat/completions", CHAT, headers=ALICE)
        assert r.status_code == 429 and "rpm=3" in r.text, r.text
        rows = {u["name"]: u for u in (await h.client.get("/admin/keys/usage", headers=ADMIN)).json()["data"]}
        assert rows["alice"]["requests"] == 3 and rows["alice"]["limited"] == 3  # one account all along
        clock.now += 60
        assert (await h.post("/v1/chat/completions", CHAT, headers=ALICE)).status_code == 200


@pytest.mark.parametrize(("text", "where"), [
    ("ka name=alice tenant=team-a\nkb name=bob tenant=team-b max_priority=urgent\n", ":2:"),
    ("ka name=alice\nka name=bob\n", ":2:"),
    ("# nobody\n", ":"),
])
async def test_an_invalid_file_is_a_400_and_changes_nothing(tmp_path: Path, text: str, where: str) -> None:
    path = keyfile(tmp_path)
    async with serve(tmp_path, named_keys=read_key_file(path), api_key_file=path, admin_key="adm") as h:
        path.write_text(text)
        r = await h.post("/admin/keys/reload", headers=ADMIN)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == "invalid_key_file"
        assert f"{path}{where}" in err["message"] and "unchanged" in err["message"]
        for who in (ALICE, BOB):  # the old keys are in force
            assert (await h.post("/v1/chat/completions", CHAT, headers=who)).status_code == 200
        text = (await h.client.get("/metrics", headers=ADMIN)).text
        assert sample(text, "hearth_key_reloads_total", result="refused") == 1
        assert sample(text, "hearth_key_reloads_total", result="ok") == 0 and sample(text, "hearth_api_keys") == 2
    path.unlink()
    async with serve(tmp_path, named_keys=read_key_file(keyfile(tmp_path)), api_key_file=path,
                     admin_key="adm") as h:
        path.unlink()  # unreadable now
        r = await h.post("/admin/keys/reload", headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_key_file", r.text
        assert (await h.post("/v1/chat/completions", CHAT, headers=ALICE)).status_code == 200


async def test_without_a_key_file_there_is_nothing_to_reload(tmp_path: Path) -> None:
    async with serve(tmp_path, api_keys=["k"]) as h:  # --api-key only
        r = await h.post("/admin/keys/reload", headers={"Authorization": "Bearer k"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "no_key_file", r.text
    async with serve(tmp_path) as h:  # no keys at all: the reload does not turn key checks on
        r = await h.post("/admin/keys/reload")
        assert r.status_code == 400 and "--api-key-file" in r.json()["error"]["message"], r.text
        assert (await h.post("/v1/chat/completions", CHAT)).status_code == 200


async def test_a_caller_may_remove_its_own_key(tmp_path: Path) -> None:
    """Without an admin key any key may use /admin/ (docs/api.md): alice reloads a file without
    her key; her reload is answered, her next request is a 401."""
    path = keyfile(tmp_path)
    async with serve(tmp_path, named_keys=read_key_file(path), api_key_file=path) as h:
        path.write_text("kb name=bob tenant=team-b\n")
        r = await h.post("/admin/keys/reload", headers=ALICE)
        assert r.status_code == 200 and r.json()["removed"] == 1, r.text
        assert (await h.post("/v1/chat/completions", CHAT, headers=ALICE)).status_code == 401
        assert (await h.post("/v1/chat/completions", CHAT, headers=BOB)).status_code == 200


async def test_a_request_already_running_finishes(tmp_path: Path) -> None:
    path = keyfile(tmp_path)
    async with serve(tmp_path, named_keys=read_key_file(path), api_key_file=path, admin_key="adm") as h:
        assert h.runner is not None
        h.runner.gate = held = threading.Event()
        h.runner.entered.clear()
        running = asyncio.create_task(h.post("/v1/chat/completions", CHAT, headers=BOB))
        try:
            assert await asyncio.to_thread(h.runner.entered.wait, 30), "bob's run never reached the engine"
            path.write_text("ka name=alice tenant=team-a\n")
            assert (await h.post("/admin/keys/reload", headers=ADMIN)).json()["removed"] == 1
        finally:
            held.set()
        r = await running
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        assert (await h.post("/v1/chat/completions", CHAT, headers=BOB)).status_code == 401


async def test_a_batch_whose_key_a_reload_removed_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Alice's batch ran line 0 and is held before line 1; a reload removes her key: the batch
    runs no other line and ends failed with invalid_api_key, line 0 kept in its output."""
    path = keyfile(tmp_path, START.replace(" rpm=2", ""))  # her upload and batch count as requests
    hold, waiting = gate(tmp_path, monkeypatch, "batch-line-1")
    async with serve(tmp_path, named_keys=read_key_file(path), api_key_file=path, admin_key="adm") as h:
        runner = batches_of(h)
        runner.start(h.app)
        try:
            b = await submit(h, [line("a"), line("b"), line("c")], headers=ALICE)
            await until(waiting.exists, "line 1 at its gate")
            await until(lambda: runner.store.get(b["id"], OPEN).completed == 1, "line 0 recorded")
            path.write_text("kb name=bob tenant=team-b\n")
            assert (await h.post("/admin/keys/reload", headers=ADMIN)).json()["removed"] == 1
            hold.unlink()
            await runner.idle()
            done = (await h.client.get(f"/v1/batches/{b['id']}", headers=ADMIN)).json()
            assert done["status"] == "failed" and done["errors"]["data"][0]["code"] == "invalid_api_key", done
            assert done["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
            out = (await h.client.get(f"/v1/files/{done['output_file_id']}/content", headers=ADMIN)).text
            assert [json.loads(x)["custom_id"] for x in out.splitlines()] == ["a"]
            err = (await h.client.get(f"/v1/files/{done['error_file_id']}/content", headers=ADMIN)).text
            assert [(e["custom_id"], e["error"]["code"]) for e in map(json.loads, err.splitlines())] == \
                [("b", "invalid_api_key"), ("c", "invalid_api_key")]
        finally:
            hold.unlink(missing_ok=True)  # a failed assert must not leave line 1's thread waiting
            await runner.shutdown()
