"""Snapshots on disk (format version 1, docs/sessions.md): immutable copies of a session.

    <root>/<snapshot_id>/manifest.json    metadata, model and engine identity, file checksums
                         transcript.json  the session's messages
                         tokens.bin       the KV token ids (int32 LE)
                         kv.bin           llama.cpp seq-state bytes

Every snapshot is written into `<root>/.tmp-<random>/` and renamed into place, so a crash
mid-save never leaves a visible half snapshot (leftover temporaries are removed at start).
Metadata edits rewrite manifest.json through a temporary file and `os.replace`. Ids are
validated before any path is built. Nothing read is unpickled: JSON and raw bytes only.
Archives are plain tar streams of the four files under `<snapshot_id>/`; an import is
unpacked member by member (regular files with the four expected names only) into a
temporary directory and verified before it is renamed into place.

A snapshot's owner (hearth.tenants) is this node's fact, not the snapshot's: it lives in
`<root>/<snapshot_id>/owner` (the tenant's name as text), written into the temporary directory
before the rename (so a snapshot is never visible without it), and never archived. A snapshot
without the file (made before owners) is the admin's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from hearth import jsonsafe
from hearth.chat.types import Message
from hearth.errors import BadRequest, Conflict, HearthError, NotFound
from hearth.hashing import sha256_file
from hearth.ids import is_snapshot_id
from hearth.sessions.ids import check_snapshot_id, new_snapshot_id
from hearth.sessions.manifest import DATA_FILES, ManifestInvalid, check_manifest
from hearth.sessions.transcript import message_from_json, message_to_json
from hearth.tenants import ADMIN, NAME, OPEN, Caller
from hearth.test_gate import SNAPSHOT_WRITE, wait_at_gate

log = logging.getLogger("hearth.snapshots")

FORMAT_VERSION = 1
OWNER_FILE = "owner"  # beside the snapshot's files; not one of them (never archived)
ALL_FILES = ("manifest.json", *DATA_FILES)
MAX_MANIFEST_BYTES = 1 << 20
MAX_TRANSCRIPT_BYTES = 64 << 20
CHUNK = 1 << 20
# Tar framing around the four members: a PAX and a ustar header each, padding, the end blocks.
TAR_OVERHEAD = 64 << 10


class SnapshotCorrupt(HearthError):
    status = 422
    code = "snapshot_corrupt"
    type = "invalid_request_error"


@dataclass(frozen=True, slots=True)
class MemberLimits:
    """The most an imported snapshot's members may hold: what this server's KV can take back."""

    kv_bytes: int
    n_tokens: int

    def member_bytes(self, name: str) -> int:
        return {"manifest.json": MAX_MANIFEST_BYTES, "transcript.json": MAX_TRANSCRIPT_BYTES,
                "tokens.bin": 4 * self.n_tokens, "kv.bin": self.kv_bytes}[name]

    @property
    def archive_bytes(self) -> int:
        return sum(self.member_bytes(n) for n in ALL_FILES) + TAR_OVERHEAD


@dataclass(slots=True)
class SnapshotData:
    manifest: dict[str, Any]
    messages: list[Message]
    tokens: list[int]
    kv: bytes


def _write(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_meta(title: Any, description: Any, tags: Any) -> None:
    if title is not None and (not isinstance(title, str) or len(title) > 200):
        raise BadRequest("title must be a string of at most 200 characters", param="title")
    if description is not None and (not isinstance(description, str) or len(description) > 4000):
        raise BadRequest("description must be a string of at most 4000 characters", param="description")
    if tags is not None and (not isinstance(tags, list) or len(tags) > 32
                             or not all(isinstance(t, str) and 0 < len(t) <= 64 for t in tags)):
        raise BadRequest("tags must be a list of at most 32 strings of 1-64 characters", param="tags")


class SnapshotStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        for leftover in root.glob(".tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        for leftover in root.glob(".import-*"):
            leftover.unlink(missing_ok=True)

    def _dir(self, snap_id: str) -> Path:
        return self.root / check_snapshot_id(snap_id)

    # ---- write ----------------------------------------------------------------------------

    def create(self, *, model: dict[str, Any], engine: dict[str, Any], session: dict[str, Any],
               messages: list[Message], tokens: list[int], kv: bytes, title: str | None = None,
               description: str | None = None, tags: list[str] | None = None, owner: str = ADMIN
               ) -> dict[str, Any]:
        check_meta(title, description, tags)
        snap_id = new_snapshot_id()
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            blobs = {
                "transcript.json": json.dumps([message_to_json(m) for m in messages]).encode(),
                "tokens.bin": np.asarray(tokens, dtype="<i4").tobytes(),
                "kv.bin": kv,
            }
            files = {}
            for name, data in blobs.items():
                _write(tmp / name, data)
                files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            wait_at_gate(SNAPSHOT_WRITE)  # tests only (HEARTH_TEST_GATE): at once otherwise
            manifest = {
                "id": snap_id, "format_version": FORMAT_VERSION, "created_at": int(time.time()),
                "model": model, "engine": engine, "session": session,
                "title": title or "", "description": description or "", "tags": tags or [], "files": files,
            }
            # A backend's identity that the reader would refuse fails the save, not every later load.
            check_manifest(manifest, repair_text=False)
            _write(tmp / "manifest.json", json.dumps(manifest, indent=1).encode())
            _write_owner(tmp, owner)
            _fsync_dir(tmp)
            os.rename(tmp, self.root / snap_id)
            _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return manifest

    def update(self, snap_id: str, *, title: str | None = None, description: str | None = None,
               tags: list[str] | None = None) -> dict[str, Any]:
        check_meta(title, description, tags)
        manifest = self.get(snap_id)
        for key, value in (("title", title), ("description", description), ("tags", tags)):
            if value is not None:
                manifest[key] = value
        d = self._dir(snap_id)
        tmp = d / f".manifest.{uuid.uuid4().hex}.tmp"
        _write(tmp, json.dumps(manifest, indent=1).encode())
        os.replace(tmp, d / "manifest.json")
        return manifest

    def delete(self, snap_id: str) -> None:
        d = self._dir(snap_id)
        if not (d / "manifest.json").is_file():
            raise NotFound(f"snapshot {snap_id} not found", param="snapshot_id", code="snapshot_not_found")
        # Rename first so a crash mid-delete leaves a temporary (cleaned at start), not a half snapshot.
        doomed = self.root / f".tmp-{uuid.uuid4().hex}"
        os.rename(d, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    # ---- read ------------------------------------------------------------------------------

    def owner(self, snap_id: str, caller: Caller = OPEN) -> str:
        """The owner of a snapshot `caller` sees; the same 404 as a missing one otherwise."""
        d = self._dir(snap_id)
        if not (d / "manifest.json").is_file():
            raise _not_found(snap_id)
        owner = _read_owner(d)
        if not caller.sees(owner):
            raise _not_found(snap_id)
        return owner

    def get(self, snap_id: str) -> dict[str, Any]:
        path = self._dir(snap_id) / "manifest.json"
        if not path.is_file():
            raise NotFound(f"snapshot {snap_id} not found", param="snapshot_id", code="snapshot_not_found")
        try:
            if path.stat().st_size > MAX_MANIFEST_BYTES:
                raise ManifestInvalid(f"larger than {MAX_MANIFEST_BYTES} bytes")
            # Repaired, not refused: an older server could write lone surrogates into a title.
            manifest = check_manifest(jsonsafe.loads(path.read_bytes(), repair_surrogates=True), repair_text=True)
            if manifest["id"] != snap_id:
                raise ManifestInvalid("the manifest id does not match its directory")
        except (ValueError, OSError) as e:  # JSONRejected and ManifestInvalid are ValueErrors
            raise SnapshotCorrupt(f"snapshot {snap_id} has an unreadable manifest: {e}") from e
        return manifest

    def list(self, caller: Caller = OPEN) -> list[dict[str, Any]]:
        """Every readable snapshot `caller` sees, newest first. A corrupt one is left out (and
        logged, with its id, so an admin can delete it): it never hides the others."""
        out = []
        for d in self.root.iterdir():
            if is_snapshot_id(d.name) and caller.sees(_read_owner(d)):
                try:
                    out.append(self.get(d.name))
                except NotFound:
                    continue  # deleted meanwhile
                except HearthError as e:
                    log.warning("snapshot listing skips %s: %s", d.name, e.message)
        return sorted(out, key=lambda m: m["created_at"], reverse=True)

    def read(self, snap_id: str, model: dict[str, Any], engine: dict[str, Any]) -> SnapshotData:
        """The snapshot's contents, after checking it fits this server (409) and its
        checksums (422)."""
        manifest = self.get(snap_id)
        if manifest.get("format_version") != FORMAT_VERSION:
            raise Conflict(f"snapshot format {manifest.get('format_version')} is not supported "
                           f"(this server reads version {FORMAT_VERSION})", code="snapshot_incompatible")
        theirs = manifest["model"]
        if theirs.get("sha256") != model.get("sha256"):
            raise Conflict(f"snapshot {snap_id} was made with model {theirs.get('id')!r} "
                           f"(sha256 {str(theirs.get('sha256'))[:12]}…), not the one this server runs "
                           f"({model.get('id')!r}, {str(model.get('sha256'))[:12]}…)", code="snapshot_incompatible")
        theirs_kv = (manifest.get("engine") or {}).get("kv_type")
        if theirs_kv != engine.get("kv_type"):
            raise Conflict(f"snapshot {snap_id} holds a {theirs_kv} KV cache; this server runs "
                           f"--kv-type {engine.get('kv_type')}", code="snapshot_incompatible")
        if manifest.get("engine") != engine:
            raise Conflict(f"snapshot {snap_id} was made by another engine build or KV layout "
                           f"({manifest.get('engine')} vs {engine})", code="snapshot_incompatible")
        d = self._dir(snap_id)
        self._verify(d, manifest, ("transcript.json",))
        try:
            messages = _transcript(d / "transcript.json", repair=True)
        except ValueError as e:
            raise SnapshotCorrupt(f"snapshot {snap_id} has a malformed transcript: {e}") from e
        # The KV is loaded whole anyway: checked on the very bytes that are loaded.
        blobs = {name: _read_checked(d / name, manifest["files"][name]) for name in ("tokens.bin", "kv.bin")}
        if len(blobs["tokens.bin"]) % 4:
            raise SnapshotCorrupt(f"snapshot {snap_id} has a malformed tokens.bin")
        tokens = np.frombuffer(blobs["tokens.bin"], dtype="<i4").tolist()
        return SnapshotData(manifest, messages, tokens, blobs["kv.bin"])

    @staticmethod
    def _verify(d: Path, manifest: dict[str, Any], names: tuple[str, ...] = DATA_FILES) -> None:
        """Each of `names` has the size and checksum its (validated) manifest lists; files are
        hashed in chunks, never read whole."""
        for name in names:
            meta = manifest["files"][name]
            try:
                size = (d / name).stat().st_size
                ok = size == meta["bytes"] and sha256_file(d / name) == meta["sha256"]
            except OSError as e:
                raise SnapshotCorrupt(f"{name} is missing: {e}") from e
            if not ok:
                raise SnapshotCorrupt(f"{name} does not match its checksum: the snapshot is corrupt")

    # ---- archives ----------------------------------------------------------------------------

    def archive(self, snap_id: str) -> Iterator[bytes]:
        """A tar stream of the snapshot, generated file by file (no temporary archive)."""
        self.get(snap_id)
        d = self._dir(snap_id)
        sizes = {name: (d / name).stat().st_size for name in ALL_FILES}

        def stream() -> Iterator[bytes]:
            for name in ALL_FILES:
                info = tarfile.TarInfo(f"{snap_id}/{name}")
                info.size, info.mode, info.mtime = sizes[name], 0o644, int(time.time())
                yield info.tobuf(format=tarfile.PAX_FORMAT)
                sent = 0
                with (d / name).open("rb") as f:
                    while sent < info.size and (block := f.read(min(CHUNK, info.size - sent))):
                        sent += len(block)
                        yield block
                if sent != info.size:
                    raise OSError(f"{name} changed size while it was archived")
                if info.size % tarfile.BLOCKSIZE:
                    yield b"\0" * (tarfile.BLOCKSIZE - info.size % tarfile.BLOCKSIZE)
            yield b"\0" * (2 * tarfile.BLOCKSIZE)

        return stream()

    def import_archive(self, archive: Path, limits: MemberLimits, owner: str = ADMIN) -> dict[str, Any]:
        """Unpack and verify an archive (a file on disk); it becomes visible only when whole.
        Members are bounded by `limits`, the manifest must have its exact shape and the
        transcript must parse as messages, so what is imported can be listed and loaded."""
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            snap_id = self._unpack(archive, tmp, limits)
            try:
                manifest = check_manifest(jsonsafe.loads((tmp / "manifest.json").read_bytes()), repair_text=False)
            except ValueError as e:
                raise SnapshotCorrupt(f"the archive's manifest is invalid: {e}") from e
            if manifest["id"] != snap_id:
                raise SnapshotCorrupt("the archive's manifest does not name its snapshot")
            if manifest["format_version"] != FORMAT_VERSION:
                raise SnapshotCorrupt(f"unsupported snapshot format {manifest['format_version']}")
            self._verify(tmp, manifest)
            try:
                _transcript(tmp / "transcript.json", repair=False)
            except ValueError as e:
                raise SnapshotCorrupt(f"the archive's transcript is invalid: {e}") from e
            if (tmp / "tokens.bin").stat().st_size % 4:
                raise SnapshotCorrupt("the archive's tokens.bin is not a list of int32 token ids")
            dest = self.root / snap_id
            if dest.exists():
                raise Conflict(f"snapshot {snap_id} already exists here", code="snapshot_exists")
            _write_owner(tmp, owner)
            _fsync_dir(tmp)
            os.rename(tmp, dest)
            _fsync_dir(self.root)
            return manifest
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @staticmethod
    def _unpack(archive: Path, dest: Path, limits: MemberLimits) -> str:
        snap_id: str | None = None
        seen: set[str] = set()
        try:
            with tarfile.open(archive, mode="r:") as tar:
                for member in tar:
                    parts = member.name.split("/")
                    if (not member.isfile() or len(parts) != 2 or parts[1] not in ALL_FILES
                            or not is_snapshot_id(parts[0]) or parts[1] in seen
                            or (snap_id is not None and parts[0] != snap_id)):
                        raise SnapshotCorrupt(f"unexpected archive member {member.name!r}: a snapshot archive "
                                              "holds only <snapshot_id>/{" + ",".join(ALL_FILES) + "}")
                    if member.size > limits.member_bytes(parts[1]):
                        raise SnapshotCorrupt(f"{member.name} is {member.size} bytes, more than this server can "
                                              f"load ({limits.member_bytes(parts[1])} bytes)")
                    snap_id = parts[0]
                    seen.add(parts[1])
                    src: IO[bytes] | None = tar.extractfile(member)
                    assert src is not None
                    with (dest / parts[1]).open("wb") as out:
                        shutil.copyfileobj(src, out, CHUNK)
                        out.flush()
                        os.fsync(out.fileno())
        except tarfile.TarError as e:
            raise SnapshotCorrupt(f"not a readable tar archive: {e}") from e
        if snap_id is None or seen != set(ALL_FILES):
            raise SnapshotCorrupt(f"the archive lacks {sorted(set(ALL_FILES) - seen)}")
        return snap_id


def _transcript(path: Path, *, repair: bool) -> list[Message]:
    """The messages of a transcript.json; ValueError if it is not one. With `repair`, lone
    surrogates an older server stored become U+FFFD; otherwise they are refused."""
    if path.stat().st_size > MAX_TRANSCRIPT_BYTES:
        raise ValueError(f"larger than {MAX_TRANSCRIPT_BYTES} bytes")
    raw = jsonsafe.loads(path.read_bytes(), repair_surrogates=repair)
    if not isinstance(raw, list):
        raise ValueError("the transcript is not a list")
    return [message_from_json(m) for m in raw]


def _read_checked(path: Path, meta: dict[str, Any]) -> bytes:
    try:
        data = path.read_bytes() if path.stat().st_size == meta["bytes"] else None
    except OSError as e:
        raise SnapshotCorrupt(f"{path.name} is missing: {e}") from e
    if data is None or hashlib.sha256(data).hexdigest() != meta["sha256"]:
        raise SnapshotCorrupt(f"{path.name} does not match its checksum: the snapshot is corrupt")
    return data


def _not_found(snap_id: str) -> NotFound:
    return NotFound(f"snapshot {snap_id} not found", param="snapshot_id", code="snapshot_not_found")


def _write_owner(d: Path, owner: str) -> None:
    if owner != ADMIN:  # no file: the admin's, as every snapshot from before owners
        _write(d / OWNER_FILE, owner.encode())


def _read_owner(d: Path) -> str:
    """The owner recorded in a snapshot directory. A file that is not a tenant name (edited by
    hand, cut short) makes the snapshot the admin's: never visible to a tenant by mistake."""
    try:
        text = (d / OWNER_FILE).read_bytes()[:256].decode("ascii")
    except (OSError, UnicodeDecodeError):  # none (the usual case for the admin's), or unreadable
        return ADMIN
    return text if NAME.fullmatch(text) else ADMIN
