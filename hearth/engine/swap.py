"""Swapped-out sequence state: session KV that left its slot, and paused requests' KV, in host
RAM, then on disk.

An entry is one session's KV as llama.cpp's seq-state bytes plus the exact token ids they
hold, and the class of the turn that left it (`Priority`: 0 flex, 1 default, 2 priority).
`put` keeps it in RAM; past the RAM budget entries are written to `<dir>/<owner>.kv` by a
background thread (the engine thread never waits on disk writes) and dropped from RAM once the
file is in place. Which go first (issue 40): the lowest class, then the least recently used
within it, so a `flex` owner's KV leaves RAM before any interactive session's, however
recently either was used. Without a directory the same order says whose KV is forgotten.
`take` hands an entry back (from RAM, or read from disk) and forgets it: the slot it goes into
is now where it lives.

File format (no pickle): b"HKV1", u32 LE header length, a JSON header {fingerprint,
n_tokens, kv_bytes, xxh3_128}, the token ids (int32 LE), then the KV bytes. Written to a
temporary name and renamed, so a crash never leaves a half file under the real name. A file
whose fingerprint differs from the running model's, or whose checksum fails, is ignored and
deleted (the session's next turn re-prefills from its transcript).

The checksum guards against torn and bit-rotted files, not an attacker (the directory is the
server's own): xxh3-128 runs at memory speed where SHA-256 held a resume from disk to ~0.5 GB/s.
Files written before the change carry `sha256` and still load.

Stateless prompts' KV is not kept here but in the prompt cache (hearth.engine.prefix_cache).
`Residency` reads the sessions' entries in RAM as prefix sources too.

Paused requests (preempt.py) keep their KV here too, under owners of their own: `paused~<n>`
(`paused_owner`), a name no session id can take (`~` is outside the session id alphabet,
hearth/ids.py) and one that is safe as a file name. They share the one RAM budget
(`--session-ram-mb`) and the one spill order with the sessions: a paused `flex` request's KV
goes to disk before an interactive session's, and within a class the least recently used goes
first (a paused entry is the most recent at its pause). What differs, because a paused request
must resume with its exact KV (and no transcript to re-prefill from):
- they are never forgotten for the budget: without a directory, sessions' entries are forgotten
  to make room and a pause that would put the paused KV alone past the budget is not made
  (`room_for_paused`: the caller asks before it copies anything); with a directory, a paused
  entry whose write fails stays in RAM (pinned, logged) instead of being dropped;
- they never outlive their request or the process: the engine drops each when its request
  resumes or ends however it ends, `flush` (graceful shutdown) does not write them, and a
  `paused~*.kv` file found at start belongs to no request of this process: it is removed;
- they are no session: `owners`, `where`-based reports and `prefix_candidates` list sessions
  only, and `check_owner` (the id rule for session files, used outside this module) refuses them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import xxhash

from hearth.ids import is_session_id

log = logging.getLogger("hearth.swap")

MAGIC = b"HKV1"
PAUSED_OWNER = re.compile(r"^paused~[0-9]{1,20}$")  # `~`: never in a session id (hearth/ids.py)


def check_owner(owner: str) -> None:
    """Owners name files here: only valid session ids get near a path."""
    if not is_session_id(owner):
        raise ValueError(f"invalid session id {owner!r}")


def paused_owner(n: int) -> str:
    """The owner of a paused request's KV (n: the pause's number in this process)."""
    return f"paused~{n}"


def is_paused_owner(owner: str) -> bool:
    return PAUSED_OWNER.fullmatch(owner) is not None


def _check_entry_owner(owner: str) -> None:
    """Either kind of owner names a file: a session id, or a paused request's id."""
    if not is_paused_owner(owner):
        check_owner(owner)


@dataclass(slots=True)
class _Entry:
    tokens: list[int]
    data: bytes | None  # None: only on disk
    n_bytes: int
    priority: int = 1  # the class of the turn that left it here: the lowest spills first
    paused: bool = False  # a paused request's (never forgotten for the budget, never flushed)
    pinned: bool = False  # a paused entry whose write failed: it stays in RAM


def _spill_order(entries: OrderedDict[str, _Entry]) -> list[str]:
    """Owners of the entries in RAM, first to leave first: the lowest class, then the least
    recently used (`entries` is in recency order; sorted is stable)."""
    return sorted((o for o, e in entries.items() if e.data is not None and not e.pinned),
                  key=lambda o: entries[o].priority)


@dataclass(slots=True, frozen=True)
class SwapBytes:
    """What the store holds, by kind (KV bytes; one consistent read)."""

    session_ram: int = 0
    paused_ram: int = 0
    paused_disk: int = 0


def write_kv_file(path: Path, tokens: list[int], data: bytes, fingerprint: dict[str, Any]) -> None:
    header = json.dumps({"fingerprint": fingerprint, "n_tokens": len(tokens), "kv_bytes": len(data),
                         "xxh3_128": xxhash.xxh3_128_hexdigest(data)}).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with tmp.open("wb") as f:
        f.write(MAGIC + struct.pack("<I", len(header)) + header)
        f.write(np.asarray(tokens, dtype="<i4").tobytes())
        f.write(data)
    os.replace(tmp, path)


def _read_header(f: BinaryIO) -> Any:
    """The JSON header after the magic and its length; ValueError if it is no KV file."""
    head = f.read(8)
    if len(head) != 8 or head[:4] != MAGIC:
        raise ValueError("not a Hearth KV file")
    (hlen,) = struct.unpack("<I", head[4:])
    if hlen > 1 << 20:
        raise ValueError("KV file header too large")
    try:
        return json.loads(f.read(hlen))
    except ValueError as e:
        raise ValueError(f"bad KV file header: {e}") from e


def read_kv_file(path: Path, fingerprint: dict[str, Any], *, with_data: bool = True
                 ) -> tuple[list[int], bytes | None]:
    """Tokens and KV bytes of a file; ValueError if it is malformed, corrupt or incompatible."""
    with path.open("rb") as f:
        header = _read_header(f)
        try:
            n_tokens, kv_bytes = int(header["n_tokens"]), int(header["kv_bytes"])
            algo = "xxh3_128" if "xxh3_128" in header else "sha256"
            digest = str(header[algo])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"bad KV file header: {e}") from e
        if header.get("fingerprint") != fingerprint:
            raise ValueError("KV file was written by another model or KV layout")
        raw = f.read(4 * n_tokens)
        if len(raw) != 4 * n_tokens:
            raise ValueError("KV file is truncated")
        tokens = np.frombuffer(raw, dtype="<i4").tolist()
        if not with_data:
            return tokens, None
        data = f.read(kv_bytes + 1)
        if len(data) != kv_bytes or _checksum(algo, data) != digest:
            raise ValueError("KV file checksum mismatch")
        return tokens, data


def _checksum(algo: str, data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data) if algo == "xxh3_128" else hashlib.sha256(data).hexdigest()


def read_kv_header(path: Path) -> int:
    """How many tokens a KV file holds, from its header alone (no check of what it was written
    by: for reporting a session whose model is not loaded). ValueError if it is no KV file."""
    with path.open("rb") as f:
        header = _read_header(f)
        try:
            return int(header["n_tokens"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"bad KV file header: {e}") from e


class SwapStore:
    def __init__(self, directory: Path | None, ram_budget: int, fingerprint: dict[str, Any]) -> None:
        self.dir = directory
        self.ram_budget = ram_budget
        self.fingerprint = fingerprint
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._writer: threading.Thread | None = None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            self._scan()

    def _scan(self) -> None:
        assert self.dir is not None
        for stale in self.dir.glob(".*.tmp"):
            stale.unlink(missing_ok=True)
        for path in sorted(self.dir.glob("*.kv"), key=lambda p: p.stat().st_mtime):
            owner = path.name[:-3]
            if is_paused_owner(owner):  # a paused request of a process that ended: nobody resumes it
                log.info("removing %s: the KV of a request paused by a previous run", path.name)
                path.unlink(missing_ok=True)
                continue
            try:
                check_owner(owner)
                tokens, _ = read_kv_file(path, self.fingerprint, with_data=False)
            except (ValueError, OSError) as e:
                log.warning("ignoring %s: %s", path.name, e)
                path.unlink(missing_ok=True)
                continue
            self._entries[owner] = _Entry(tokens, None, path.stat().st_size)

    def _path(self, owner: str) -> Path:
        _check_entry_owner(owner)
        assert self.dir is not None
        return self.dir / f"{owner}.kv"

    # ---- queries ---------------------------------------------------------------------------

    def where(self, owner: str) -> str | None:
        with self._lock:
            e = self._entries.get(owner)
            return None if e is None else ("host" if e.data is not None else "disk")

    def owners(self) -> list[tuple[str, str]]:
        """(owner, "host" or "disk") of every session's entry (paused requests' are no session)."""
        with self._lock:
            return [(o, "host" if e.data is not None else "disk") for o, e in self._entries.items() if not e.paused]

    def n_tokens(self, owner: str) -> int:
        with self._lock:
            e = self._entries.get(owner)
            return len(e.tokens) if e is not None else 0

    def ram_bytes(self) -> int:
        """KV bytes held in RAM, sessions' and paused requests': what the budget counts."""
        with self._lock:
            return self._ram_used()

    def bytes_held(self) -> SwapBytes:
        """Sessions' KV in RAM, paused requests' in RAM and on disk (for metrics)."""
        with self._lock:
            es = list(self._entries.values())
        return SwapBytes(session_ram=sum(e.n_bytes for e in es if not e.paused and e.data is not None),
                         paused_ram=sum(e.n_bytes for e in es if e.paused and e.data is not None),
                         paused_disk=sum(e.n_bytes for e in es if e.paused and e.data is None))

    def room_for_paused(self, n_bytes: int) -> bool:
        """Whether a paused request's KV of (at most) `n_bytes` may be put: always with a
        directory (what is past the budget goes to disk); without one, only if the paused
        entries in RAM and this one stay within the budget (sessions' entries are forgotten
        to make room; paused ones never are)."""
        if self.dir is not None:
            return True
        with self._lock:
            paused = sum(e.n_bytes for e in self._entries.values() if e.paused and e.data is not None)
        return paused + n_bytes <= self.ram_budget

    def prefix_candidates(self) -> list[tuple[str, list[int]]]:
        """What a prompt may copy a prefix from: sessions' entries in RAM, by owner."""
        with self._lock:
            return [(o, e.tokens) for o, e in self._entries.items() if e.data is not None and not e.paused]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _ram_used(self) -> int:
        """With the lock held."""
        return sum(e.n_bytes for e in self._entries.values() if e.data is not None)

    # ---- changes -----------------------------------------------------------------------------

    def put(self, owner: str, tokens: list[int], data: bytes, priority: int | None = None) -> None:
        """Keep an owner's KV in RAM (the most recently used now). `priority`: the class of the
        turn that left it (None: the class its entry had, else default). A paused request's
        owner (`paused_owner`): ask `room_for_paused` first."""
        _check_entry_owner(owner)
        with self._lock:
            old = self._entries.pop(owner, None)
            cls = priority if priority is not None else (old.priority if old is not None else 1)
            self._entries[owner] = _Entry(list(tokens), data, len(data), cls, paused=is_paused_owner(owner))
            self._over_budget()

    def peek(self, owner: str) -> tuple[list[int], bytes] | None:
        """The entry without removing it (read from disk if needed); None if absent or unreadable."""
        with self._lock:
            e = self._entries.get(owner)
            if e is None:
                return None
            if e.data is not None:
                return list(e.tokens), e.data
        try:
            tokens, data = read_kv_file(self._path(owner), self.fingerprint)
        except (ValueError, OSError) as err:
            log.warning("dropping swapped KV of %s: %s", owner, err)
            self.drop(owner)
            return None
        assert data is not None
        return tokens, data

    def take(self, owner: str) -> tuple[list[int], bytes] | None:
        got = self.peek(owner)
        self.drop(owner)
        return got

    def drop(self, owner: str) -> None:
        with self._lock:
            self._entries.pop(owner, None)
        if self.dir is not None:
            self._path(owner).unlink(missing_ok=True)

    def flush(self) -> None:
        """Write every RAM entry to disk now (graceful shutdown)."""
        if self.dir is None:
            return
        with self._lock:  # a paused request's KV dies with it: not written
            todo = [(o, e) for o, e in self._entries.items() if e.data is not None and not e.paused]
        for owner, e in todo:
            assert e.data is not None
            write_kv_file(self._path(owner), e.tokens, e.data, self.fingerprint)
            with self._lock:
                if self._entries.get(owner) is e:
                    e.data = None

    # ---- spilling past the RAM budget ----------------------------------------------------------

    def _over_budget(self) -> None:
        """Called with the lock held: start the writer if RAM use is over budget (it runs
        until RAM use is back under budget, then ends)."""
        used = self._ram_used()
        if used <= self.ram_budget:
            return
        if self.dir is None:  # nowhere to spill: forget sessions by the spill order (they will be re-prefilled)
            for owner in _spill_order(self._entries):
                if used <= self.ram_budget:
                    break
                if not self._entries[owner].paused:  # never: it must resume exact (room_for_paused)
                    used -= self._entries.pop(owner).n_bytes
            return
        if self._writer is None:
            self._writer = threading.Thread(target=self._spill, name="hearth-kv-spill", daemon=True)
            self._writer.start()

    def _spill(self) -> None:
        while True:
            with self._lock:
                used = self._ram_used()
                order = _spill_order(self._entries)
                if used <= self.ram_budget or not order:
                    self._writer = None  # under the lock, so the next put starts a new writer
                    return
                owner = order[0]
                e = self._entries[owner]
                tokens, data = e.tokens, e.data
            assert data is not None
            try:
                write_kv_file(self._path(owner), tokens, data, self.fingerprint)
            except OSError as err:
                with self._lock:
                    if self._entries.get(owner) is e:
                        if e.paused:  # it must resume exact: kept in RAM past the budget
                            log.error("could not spill the KV of %s to disk: %s; it stays in RAM", owner, err)
                            e.pinned = True
                        else:
                            log.error("could not spill KV of %s to disk: %s; dropping it", owner, err)
                            del self._entries[owner]
                continue
            with self._lock:
                if self._entries.get(owner) is e:
                    e.data = None  # now only on disk
                    continue
            # taken or replaced while it was written: the file is stale unless replaced by a newer put
            with self._lock:
                if owner not in self._entries:
                    self._path(owner).unlink(missing_ok=True)
