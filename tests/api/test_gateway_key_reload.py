"""`POST /admin/keys/reload` on the gateway, in-process (hearth/http/keyring.py; docs/gateway.md,
"Reloading the keys"): the gateway's client keys reloaded from its --api-key-file as a node's
are: admin-only, counts of what changed, a removed key 401 and a new one served through the
fleet, an invalid file changing nothing, and a batch whose key a reload removed ending `failed`
(the gateway's key_gone, checked before each line). Batch lines are held with the test gate."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearth import test_gate
from hearth.tenants import read_key_file
from tests.api.test_gateway_batches import (
    ALICE,
    BOB,
    CHAT,
    assert_stopped_for_its_key,
    held_before,
    line,
    stopped_for_its_key,
    world,
)
from tests.helpers import sample, until

CAROL = {"Authorization": "Bearer kc"}
ADMIN = {"Authorization": "Bearer gw-adm"}
BODY = {"model": "smol", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
START = "ka name=alice tenant=team-a\nkb name=bob tenant=team-b\n"


def keyfile(tmp_path: Path, text: str = START) -> Path:
    path = tmp_path / "gw-keys.txt"
    path.write_text(text)
    return path


async def test_the_gateways_keys_reload(tmp_path: Path) -> None:
    path = keyfile(tmp_path)
    async with world(tmp_path, keys=read_key_file(path), api_key_file=path, admin_key="gw-adm") as w:
        path.write_text("ka name=alice tenant=team-a rpm=9\nkc name=carol tenant=team-c\n")
        assert (await w.gw.post("/admin/keys/reload", headers=ALICE)).status_code == 403
        r = await w.gw.post("/admin/keys/reload", headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json() == {"object": "keys.reload", "added": 1, "removed": 1, "changed": 1, "unchanged": 0}
        assert (await w.gw.post(CHAT, json=BODY, headers=CAROL)).status_code == 200  # new: served by a node
        r = await w.gw.post(CHAT, json=BODY, headers=BOB)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
        rows = {u["name"]: u for u in (await w.gw.get("/admin/keys/usage", headers=ADMIN)).json()["data"]}
        assert set(rows) == {"alice", "carol"} and rows["alice"]["limits"]["rpm"] == 9
        path.write_text("ka name=alice tenant=team-a\nkc name=carol tenant=team-c cache=everyone\n")
        r = await w.gw.post("/admin/keys/reload", headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_key_file", r.text
        assert f"{path}:2:" in r.json()["error"]["message"]
        assert (await w.gw.post(CHAT, json=BODY, headers=CAROL)).status_code == 200  # unchanged
        text = (await w.gw.get("/metrics", headers=ADMIN)).text
        assert sample(text, "hearth_key_reloads_total", result="ok") == 1
        assert sample(text, "hearth_key_reloads_total", result="refused") == 1 and sample(text, "hearth_api_keys") == 2


async def test_a_gateway_without_a_key_file_has_none_to_reload(tmp_path: Path) -> None:
    async with world(tmp_path, admin_key="gw-adm") as w:  # keys given, no file
        r = await w.gw.post("/admin/keys/reload", headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["code"] == "no_key_file", r.text


async def test_a_batch_whose_key_a_reload_removed_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Alice's batch ran line 0 and is held before line 1; a reload removes her key: no other
    line runs (none reaches a node), the batch ends failed with invalid_api_key."""
    folder, hold = held_before(tmp_path, monkeypatch, 1)
    path = keyfile(tmp_path)
    async with world(tmp_path, concurrency=1, keys=read_key_file(path), api_key_file=path) as w:
        try:
            batch = await w.submit([line(f"k{i}") for i in range(4)])
            await until(test_gate.waiting_path(folder, "gateway-batch-line-1").exists, "held before line 1")
            served = sum(w.fleet.served.values())
            path.write_text("kb name=bob tenant=team-b\n")
            r = await w.gw.post("/admin/keys/reload", headers=BOB)  # no admin key: any key may
            assert r.status_code == 200 and r.json()["removed"] == 1, r.text
            hold.unlink()
            assert_stopped_for_its_key(*await stopped_for_its_key(w, batch["id"]))
            assert sum(w.fleet.served.values()) == served  # nothing more ran
        finally:
            hold.unlink(missing_ok=True)
