"""The request journal in-process (hearth.observability.journal, GET /admin/journal/ID): off, it
stores nothing; on, each request's body and answer are kept gzip-compressed under their SHA-256
(identical contents once), read back by their tenant or the admin only, and pruned by age and
size with the blobs no record names."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from hearth.api.context import node_of
from hearth.observability.journal import Entry, Journal
from hearth.tenants import ApiKey
from tests.api.conftest import ANSWER, serve

CHAT = {"model": "fake", "max_tokens": 50, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
ALICE = {"Authorization": "Bearer ka"}
BOB = {"Authorization": "Bearer kb"}
ADMIN = {"Authorization": "Bearer adm"}
KEYS = [ApiKey("ka", "alice", "team-a"), ApiKey("kb", "bob", "team-b")]


def blobs(root: Path) -> list[Path]:
    return sorted((root / "journal").rglob("*.gz"))


async def test_off_stores_nothing(tmp_path: Path) -> None:
    async with serve(tmp_path) as h:
        body = (await h.post("/v1/chat/completions", CHAT)).json()
        assert node_of(h.app).journal is None
        assert (await h.client.get(f"/admin/journal/{body['id']}")).status_code == 404
    assert not (tmp_path / "journal").exists() and not (tmp_path / "journal.db").exists()


async def test_on_keeps_bodies_and_answers_per_tenant(tmp_path: Path) -> None:
    async with serve(tmp_path, journal=True, named_keys=KEYS, admin_key="adm") as h:
        first = (await h.post("/v1/chat/completions", CHAT, headers=ALICE)).json()
        second = (await h.post("/v1/chat/completions", CHAT, headers=ALICE)).json()
        r = await h.client.get(f"/admin/journal/{first['id']}", headers=ALICE)
        assert r.status_code == 200, r.text
        rec = r.json()
        assert rec["request"] == CHAT and rec["path"] == "/v1/chat/completions" and rec["model"] == "fake"
        assert rec["answer"]["text"] == first["choices"][0]["message"]["content"] == ANSWER
        assert rec["answer"]["finish_reason"] == "stop" and "owner" not in rec
        # another tenant: the same 404 as an id nobody has; the admin sees it
        assert (await h.client.get(f"/admin/journal/{first['id']}", headers=BOB)).status_code == 404
        assert (await h.client.get("/admin/journal/chatcmpl-none", headers=BOB)).status_code == 404
        assert (await h.client.get(f"/admin/journal/{second['id']}", headers=ADMIN)).status_code == 200
        # content-addressed and compressed: the same body and answer twice are two blobs, not four
        files = blobs(tmp_path)
        assert len(files) == 2
        for f in files:
            assert f.name == hashlib.sha256(gzip.decompress(f.read_bytes())).hexdigest() + ".gz"
        contents = [json.loads(gzip.decompress(f.read_bytes())) for f in files]
        assert CHAT in contents and any(c.get("text") == ANSWER for c in contents)


def entry(rid: str, text: str) -> Entry:
    return Entry(rid, "t", "chat", "/v1/chat/completions", "m", json.dumps({"q": rid}).encode(),
                 {"text": text, "tool_calls": [], "finish_reason": "stop"})


def test_retention_by_size_and_age(tmp_path: Path) -> None:
    j = Journal(tmp_path, max_bytes=10_000)
    j.record(entry("a", "shared answer"))
    j.record(entry("b", "shared answer"))
    assert j.flush()
    assert j.get("a") is not None and len(blobs(tmp_path)) == 3  # two bodies, one answer
    j.max_bytes = 1  # every record over budget: all go, oldest first, with the blobs
    j.record(entry("c", "x"))
    assert j.flush()
    assert j.get("a") is None and j.get("b") is None and j.get("c") is None
    assert blobs(tmp_path) == []
    j.max_bytes = 10_000
    j.record(entry("d", "y"))
    assert j.flush()
    assert j.get("d") is not None and len(blobs(tmp_path)) == 2
    j.max_age = -1.0  # every record is past its age at the next write, that one included
    j.record(entry("e", "z"))
    assert j.flush()
    assert j.get("d") is None and j.get("e") is None and blobs(tmp_path) == []
    j.close()
