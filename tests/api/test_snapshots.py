"""A malformed manifest on disk is that snapshot's 422; the listing and the others stay 200."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.api.conftest import Harness


@pytest.mark.parametrize("fields", [{"created_at": "zzz"}, {"session": "oops"},
                                    {"session": {"session_id": "s1", "n_tokens": 1, "max_seq_len": "x"}}])
async def test_a_malformed_manifest_is_a_422_for_its_snapshot_only(h: Harness, tmp_path: Path,
                                                                  fields: dict[str, object]) -> None:
    r = await h.client.post("/v1/chat/completions", json={"session_id": "s1", "max_tokens": 3,
                                                           "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    good = (await h.client.post("/v1/sessions/s1/save", json={"title": "good"})).json()["snapshot_id"]
    bad = (await h.client.post("/v1/sessions/s1/save", json={"title": "bad"})).json()["snapshot_id"]
    path = tmp_path / "snapshots" / bad / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))

    listing = await h.client.get("/v1/snapshots")
    assert listing.status_code == 200 and [s["snapshot_id"] for s in listing.json()["data"]] == [good]
    for method, url in (("GET", f"/v1/snapshots/{bad}"), ("POST", f"/v1/snapshots/{bad}/load"),
                        ("GET", f"/v1/snapshots/{bad}/archive")):
        r = await h.client.request(method, url)
        assert r.status_code == 422 and r.json()["error"]["code"] == "snapshot_corrupt", (method, url, r.text)
    r = await h.client.post(f"/v1/snapshots/{good}/load", json={"session_id": "s2"})
    assert r.status_code == 201, r.text
