"""The snapshot store on disk: atomic writes, verification, archives that cannot escape."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from hearth.chat.types import Message, ToolCall
from hearth.errors import BadRequest, Conflict, NotFound
from hearth.sessions import snapshots as snapmod
from hearth.sessions.snapshots import MemberLimits, SnapshotCorrupt, SnapshotStore

MODEL = {"id": "m", "sha256": "ab" * 32, "arch": "llama", "n_ctx_train": 8192}
ENGINE = {"kv_type": "f16", "v": 1}
LIMITS = MemberLimits(kv_bytes=1 << 20, n_tokens=4096)
MESSAGES = [Message("system", "sys"), Message("user", "hi"),
            Message("assistant", "", tool_calls=[ToolCall("c1", "f", '{"a": 1}')], reasoning="hmm")]


def save(store: SnapshotStore, **kw: object) -> dict:
    return store.create(model=MODEL, engine=ENGINE, session={"session_id": "s", "n_tokens": 3},
                        messages=MESSAGES, tokens=[1, 2, 3], kv=b"kv-bytes" * 100, **kw)  # type: ignore[arg-type]


def test_round_trip_and_metadata_edits(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    m = save(store, title="t", tags=["a"])
    data = store.read(m["id"], MODEL, ENGINE)
    assert data.tokens == [1, 2, 3] and data.kv == b"kv-bytes" * 100
    assert data.messages == MESSAGES
    edited = store.update(m["id"], title="new", tags=["b", "c"])
    assert (edited["title"], edited["tags"], edited["files"]) == ("new", ["b", "c"], m["files"])
    assert store.get(m["id"])["title"] == "new"
    assert [s["id"] for s in store.list()] == [m["id"]]
    with pytest.raises(BadRequest):
        store.update(m["id"], tags=["x" * 65])
    store.delete(m["id"])
    with pytest.raises(NotFound):
        store.get(m["id"])


def test_an_identity_the_reader_would_refuse_fails_the_save_not_the_loads(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    with pytest.raises(ValueError, match="sha256"):
        store.create(model={**MODEL, "sha256": "v1"}, engine=ENGINE, session={"session_id": "s", "n_tokens": 3},
                     messages=MESSAGES, tokens=[1, 2, 3], kv=b"kv")
    assert store.list() == [] and [p.name for p in tmp_path.iterdir()] == []


def test_a_save_that_dies_midway_leaves_no_visible_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SnapshotStore(tmp_path)
    real_write = snapmod._write
    calls = {"n": 0}

    def dying_write(path: Path, data: bytes) -> None:
        calls["n"] += 1
        if calls["n"] == 3:  # after transcript and tokens, while writing kv.bin
            path.write_bytes(data[: len(data) // 2])
            raise KeyboardInterrupt("killed")
        real_write(path, data)

    monkeypatch.setattr(snapmod, "_write", dying_write)
    with pytest.raises(KeyboardInterrupt):
        save(store)
    assert store.list() == []
    # A harder death (no cleanup at all): a leftover temporary directory is invisible and
    # removed when the store opens again.
    (tmp_path / ".tmp-deadbeef").mkdir()
    (tmp_path / ".tmp-deadbeef" / "kv.bin").write_bytes(b"half")
    assert SnapshotStore(tmp_path).list() == []
    assert not (tmp_path / ".tmp-deadbeef").exists()


def test_corruption_and_incompatibility_are_detected(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    m = save(store)
    with pytest.raises(Conflict):
        store.read(m["id"], {**MODEL, "sha256": "cd" * 32}, ENGINE)
    with pytest.raises(Conflict):
        store.read(m["id"], MODEL, {**ENGINE, "v": 2})
    with pytest.raises(Conflict, match="holds a f16 KV cache; this server runs --kv-type q8_0"):
        store.read(m["id"], MODEL, {**ENGINE, "kv_type": "q8_0"})
    kv = tmp_path / m["id"] / "kv.bin"
    kv.write_bytes(b"x" + kv.read_bytes()[1:])
    with pytest.raises(SnapshotCorrupt):
        store.read(m["id"], MODEL, ENGINE)
    (tmp_path / m["id"] / "tokens.bin").unlink()
    with pytest.raises(SnapshotCorrupt):
        store.read(m["id"], MODEL, ENGINE)


def test_ids_are_validated_before_any_path(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    for bad in ("../x", "snap_../../etc", "snap_" + "g" * 32, "/etc/passwd"):
        with pytest.raises(BadRequest):
            store.get(bad)


def _archive(members: dict[str, bytes], *, link: str | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
    return buf.getvalue()


def test_archives_round_trip_and_hostile_ones_are_refused(tmp_path: Path) -> None:
    src, dst = SnapshotStore(tmp_path / "a"), SnapshotStore(tmp_path / "b")
    m = save(src)
    tar_path = tmp_path / "x.tar"
    tar_path.write_bytes(b"".join(src.archive(m["id"])))
    with tarfile.open(tar_path) as tar:  # a standard tar, readable by any tool
        assert sorted(tar.getnames()) == sorted(f"{m['id']}/{n}" for n in snapmod.ALL_FILES)
    assert dst.import_archive(tar_path, LIMITS)["id"] == m["id"]
    assert dst.read(m["id"], MODEL, ENGINE).kv == b"kv-bytes" * 100
    with pytest.raises(Conflict):
        dst.import_archive(tar_path, LIMITS)

    sid = "snap_" + "1" * 32
    good = {f"{sid}/{n}": (tmp_path / "a" / m["id"] / n).read_bytes() for n in snapmod.ALL_FILES}
    good[f"{sid}/manifest.json"] = json.dumps({**json.loads(good[f"{sid}/manifest.json"]), "id": sid}).encode()
    hostile = [
        {**good, "../evil": b"x"},
        {**good, f"{sid}/../../evil": b"x"},
        {k: v for k, v in good.items() if not k.endswith("kv.bin")},
        {**good, f"{sid}/kv.bin": b"tampered"},
        {**good, f"{sid}/manifest.json": b"not json"},
    ]
    for i, members in enumerate(hostile):
        p = tmp_path / f"h{i}.tar"
        p.write_bytes(_archive(members))
        with pytest.raises(SnapshotCorrupt):
            dst.import_archive(p, LIMITS)
    p = tmp_path / "link.tar"
    p.write_bytes(_archive(good, link=f"{sid}/extra"))
    with pytest.raises(SnapshotCorrupt):
        dst.import_archive(p, LIMITS)
    assert [s["id"] for s in dst.list()] == [m["id"]], "no refused archive became visible"
    assert not list((tmp_path / "b").glob(".tmp-*"))
    assert not (tmp_path.parent / "evil").exists() and not (tmp_path / "evil").exists()
