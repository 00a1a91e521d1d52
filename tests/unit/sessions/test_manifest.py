"""Snapshot manifests are checked strictly on import and on every read: a malformed one is a 422
for that snapshot alone, never a 500, and never hides the good ones from the listing."""

from __future__ import annotations

import io
import json
import tarfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from hearth.chat.types import Message
from hearth.sessions.snapshots import MemberLimits, SnapshotCorrupt, SnapshotStore

MODEL = {"id": "m", "sha256": "ab" * 32, "arch": "llama", "n_ctx_train": 8192}
ENGINE = {"kv_type": "f16", "v": 1}
LIMITS = MemberLimits(kv_bytes=1 << 20, n_tokens=4096)
BROKEN: list[tuple[str, Any]] = [
    ("created_at", "zzz"),  # made GET /v1/snapshots a 500 for everyone
    ("session", "oops"),  # made its load a 500
    ("session", {"session_id": "s", "n_tokens": 3, "max_seq_len": "many"}),
    ("session", {"session_id": "../x", "n_tokens": 3}),
    ("model", None),
    ("files", {"kv.bin": {"bytes": 1, "sha256": "00" * 32}}),
    ("files", {n: {"bytes": "1", "sha256": "00" * 32} for n in ("transcript.json", "tokens.bin", "kv.bin")}),
    ("tags", "not a list"),
    ("extra", 1),
]


def save(store: SnapshotStore, kv: bytes = b"kv" * 50) -> dict[str, Any]:
    return store.create(model=MODEL, engine=ENGINE, session={"session_id": "s", "n_tokens": 3, "max_seq_len": 64},
                        messages=[Message("user", "hi")], tokens=[1, 2, 3], kv=kv)


def rewrite(store: SnapshotStore, snap: str, **fields: Any) -> None:
    path = store.root / snap / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(fields)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(("key", "value"), BROKEN)
def test_a_broken_manifest_on_disk_is_corrupt_and_the_listing_shows_the_others(tmp_path: Path, key: str,
                                                                                value: Any) -> None:
    store = SnapshotStore(tmp_path)
    good, bad = save(store), save(store)
    rewrite(store, bad["id"], **{key: value})
    assert [m["id"] for m in store.list()] == [good["id"]]
    with pytest.raises(SnapshotCorrupt):
        store.get(bad["id"])
    with pytest.raises(SnapshotCorrupt):
        store.read(bad["id"], MODEL, ENGINE)
    store.delete(bad["id"])  # an admin can still remove it by id


def test_unreadable_manifests_are_corrupt(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    good, deep, text = save(store), save(store), save(store)
    (store.root / deep["id"] / "manifest.json").write_bytes(b"[" * 5000 + b"]" * 5000)
    (store.root / text["id"] / "manifest.json").write_bytes(b"\xff\xfe")
    assert [m["id"] for m in store.list()] == [good["id"]]


def test_a_title_an_older_server_stored_with_a_lone_surrogate_is_repaired(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    m = save(store)
    rewrite(store, m["id"], title="t\ud800")  # json.dumps writes it as an escape, as the old server did
    assert store.get(m["id"])["title"] == "t\ufffd"
    json.dumps(store.list(), ensure_ascii=False).encode()


def archive(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def members_of(store: SnapshotStore, m: dict[str, Any]) -> dict[str, bytes]:
    return {f"{m['id']}/{n}": (store.root / m["id"] / n).read_bytes()
            for n in ("manifest.json", "transcript.json", "tokens.bin", "kv.bin")}


def with_manifest(members: dict[str, bytes], snap: str, **fields: Any) -> dict[str, bytes]:
    manifest = json.loads(members[f"{snap}/manifest.json"])
    manifest.update(fields)
    return {**members, f"{snap}/manifest.json": json.dumps(manifest).encode()}


@pytest.mark.parametrize(("key", "value"), BROKEN)
def test_an_archive_with_a_broken_manifest_is_refused(tmp_path: Path, key: str, value: Any) -> None:
    src, dst = SnapshotStore(tmp_path / "a"), SnapshotStore(tmp_path / "b")
    m = save(src)
    tar = tmp_path / "x.tar"
    tar.write_bytes(archive(with_manifest(members_of(src, m), m["id"], **{key: value})))
    with pytest.raises(SnapshotCorrupt):
        dst.import_archive(tar, LIMITS)
    assert dst.list() == []


def test_an_archive_whose_transcript_is_hostile_is_refused(tmp_path: Path) -> None:
    import hashlib

    src, dst = SnapshotStore(tmp_path / "a"), SnapshotStore(tmp_path / "b")
    m = save(src)
    for transcript in (b"[" * 5000 + b"]" * 5000, b'[{"role": "user", "content": "\\ud800"}]', b'{"not": "a list"}',
                       b'[{"role": "wizard", "content": "x"}]'):
        members = members_of(src, m)
        files = json.loads(members[f"{m['id']}/manifest.json"])["files"]
        files["transcript.json"] = {"bytes": len(transcript), "sha256": hashlib.sha256(transcript).hexdigest()}
        members = with_manifest(members, m["id"], files=files)
        members[f"{m['id']}/transcript.json"] = transcript
        tar = tmp_path / "x.tar"
        tar.write_bytes(archive(members))
        with pytest.raises(SnapshotCorrupt, match="transcript"):
            dst.import_archive(tar, LIMITS)
    assert dst.list() == []


def test_members_are_bounded_by_the_kv_this_server_can_hold(tmp_path: Path) -> None:
    src, dst = SnapshotStore(tmp_path / "a"), SnapshotStore(tmp_path / "b")
    m = save(src, kv=b"k" * 5000)
    tar = tmp_path / "x.tar"
    tar.write_bytes(b"".join(src.archive(m["id"])))
    with pytest.raises(SnapshotCorrupt, match="more than this server can load"):
        dst.import_archive(tar, MemberLimits(kv_bytes=4999, n_tokens=4096))
    with pytest.raises(SnapshotCorrupt, match="more than this server can load"):
        dst.import_archive(tar, MemberLimits(kv_bytes=1 << 20, n_tokens=2))  # tokens.bin holds 3
    assert dst.import_archive(tar, MemberLimits(kv_bytes=5000, n_tokens=3))["id"] == m["id"]


def test_import_checksums_stream_instead_of_reading_members_whole(tmp_path: Path) -> None:
    src, dst = SnapshotStore(tmp_path / "a"), SnapshotStore(tmp_path / "b")
    m = save(src, kv=b"k" * (48 << 20))
    tar = tmp_path / "x.tar"
    with tar.open("wb") as f:
        for block in src.archive(m["id"]):
            f.write(block)
    del m
    tracemalloc.start()
    try:
        dst.import_archive(tar, MemberLimits(kv_bytes=64 << 20, n_tokens=4096))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"import held {peak >> 20} MiB at once for a 48 MiB kv.bin"
