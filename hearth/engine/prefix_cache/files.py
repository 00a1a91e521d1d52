"""Prompt-cache blocks on disk: one file per block, named by the block's hash.

A block is `n_tokens` (1..block_tokens) consecutive prompt tokens at positions `start`.. and
their KV, in the runner's per-block payload form (`KVCodec.kv_split`). Its key chains the
tokens before it: `key = blake2b(parent_key + tokens as int32 LE)`, 16 bytes, where the
first block's parent is the chain's root (the model's fingerprint and a salt). So two prompts
share every block up to the first one that differs, and a block is stored once however many
conversations share it.

File `<key hex>.kvb` (no pickle): b"HKB2", u32 LE header length, a JSON header {fingerprint,
parent, start, n_tokens, kv_bytes, xxh3_128, kept}, the tokens (int32 LE), then the payload.
The payload's checksum is xxh3-128 (the `xxhash` package): an integrity check against torn or
flipped bytes at memory speed (~20x SHA-256's), so reading a block back costs what the disk
costs. It guards against corruption, not forgery: a file a hostile writer crafts with a right
checksum is still refused unless its name is the key of its parent and tokens, its fingerprint
is this model's and its sizes fit the layout; the KV bytes themselves are data llama.cpp reads
by the layout, never code. (The keys, blake2b, are content addresses shared with routers: they
did not change with the checksum.)

Version 1 (b"HKB1", a SHA-256 per payload, written before 2026-11-28) is not read: such a file
fails the magic check like any foreign file, is counted in `rejected_files` and deleted at the
start scan, and its prompt is cached again, in this format, the next time it is prefilled.
Written to a hidden temporary name and renamed into place, so `kill -9` mid-write leaves at
worst a `.tmp` file, which the next start deletes, never a half file under a real name.

Reading checks, before anything is used: the name is a key (32 hex digits: no path is built
from anything else), the magic, the header's types and ranges, the fingerprint, that the key
is the hash of the parent and tokens the file holds (a file cannot claim another prefix's
place), the file's exact size; and, when the payload is read, its checksum, computed on
each chunk as it is read (while it is in cache) into the buffer the payload lives in. A file failing
any check raises BadBlockFile and is never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

MAGIC = b"HKB2"
OLD_MAGICS = (b"HKB1",)  # earlier formats: refused (see above)
SUFFIX = ".kvb"
KEY_BYTES = 16
_KEY_RE = re.compile(r"^[0-9a-f]{32}$")
_MAX_HEADER = 1 << 16
_CHUNK = 1 << 20  # payload bytes read and hashed at a time (they stay in the CPU's cache between)


class BadBlockFile(ValueError):
    """A block file that is truncated, corrupt, foreign or hostile: ignored, never loaded."""


def root_key(fingerprint: dict[str, Any], salt: str = "") -> bytes:
    """The chain's root for one model and KV layout (and one salt: prompts under different
    salts share nothing)."""
    blob = json.dumps(fingerprint, sort_keys=True).encode() + b"\0" + salt.encode()
    return hashlib.blake2b(blob, digest_size=KEY_BYTES, person=b"hearth-root").digest()


def block_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    return hashlib.blake2b(parent + np.asarray(tokens, dtype="<i4").tobytes(), digest_size=KEY_BYTES,
                           person=b"hearth-block").digest()


# A router's view inside a block (docs/api.md, "Tails"): a block's first 16, 32, ... tokens are
# keyed too, so a router can count a match that ends inside a block (a conversation's cached
# last, partial block) to within TAIL_STEP tokens. Short keys: they only predict, never address.
TAIL_STEP = 16
TAIL_KEY_BYTES = 8


def tail_keys(parent: bytes, tokens: Sequence[int], block_tokens: int) -> list[bytes]:
    """Keys of the first TAIL_STEP·k tokens of the block at `parent` holding `tokens` (its
    tokens, at most a block's), k = 1, 2, ... up to its length and below a whole block (a full
    block's whole is its `block_key`): blake2b(parent + those tokens as int32 LE, 8 bytes)."""
    h = hashlib.blake2b(parent, digest_size=TAIL_KEY_BYTES, person=b"hearth-tail")
    raw = np.asarray(tokens[:block_tokens - 1], dtype="<i4").tobytes()
    out: list[bytes] = []
    for end in range(TAIL_STEP, min(len(tokens), block_tokens - 1) + 1, TAIL_STEP):
        h.update(raw[4 * (end - TAIL_STEP):4 * end])
        out.append(h.copy().digest())
    return out


def is_key_hex(name: str) -> bool:
    return bool(_KEY_RE.match(name))


@dataclass(frozen=True, slots=True)
class BlockHeader:
    key: bytes
    parent: bytes
    start: int
    tokens: list[int]
    kv_bytes: int
    checksum: str  # xxh3-128 of the payload, hex
    kept: bool
    file_bytes: int


def block_path(directory: Path, key: bytes) -> Path:
    return directory / f"{key.hex()}{SUFFIX}"


def write_block(directory: Path, key: bytes, parent: bytes, start: int, tokens: Sequence[int], payload: bytes,
                fingerprint: dict[str, Any], kept: bool) -> BlockHeader:
    """Write one block atomically; returns its header as `read_header` would read it back.
    OSError as the OS raises it."""
    digest = xxhash.xxh3_128_hexdigest(payload)
    header = json.dumps({"fingerprint": fingerprint, "parent": parent.hex(), "start": start,
                         "n_tokens": len(tokens), "kv_bytes": len(payload), "xxh3_128": digest,
                         "kept": kept}).encode()
    path = block_path(directory, key)
    tmp = directory / f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with tmp.open("wb") as f:
            f.write(MAGIC + struct.pack("<I", len(header)) + header)
            f.write(np.asarray(tokens, dtype="<i4").tobytes())
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    size = 8 + len(header) + 4 * len(tokens) + len(payload)
    return BlockHeader(key, parent, start, list(tokens), len(payload), digest, kept, size)


def read_header(path: Path, fingerprint: dict[str, Any], max_tokens: int, payload_bytes: Any) -> BlockHeader:
    """The header and tokens of a block file, without its payload. `payload_bytes(n)` is the
    payload size a block of n tokens must have. BadBlockFile if any check fails."""
    name = path.name
    if not name.endswith(SUFFIX) or not is_key_hex(name[: -len(SUFFIX)]):
        raise BadBlockFile("not a block file name")
    key = bytes.fromhex(name[: -len(SUFFIX)])
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) == 8 and head[:4] in OLD_MAGICS:
                raise BadBlockFile("an earlier Hearth's block format (its prompt is cached again when it recurs)")
            if len(head) != 8 or head[:4] != MAGIC:
                raise BadBlockFile("not a Hearth prompt-cache block")
            (hlen,) = struct.unpack("<I", head[4:])
            if hlen > _MAX_HEADER:
                raise BadBlockFile("header too large")
            raw = f.read(hlen)
            h = json.loads(raw)
            if not isinstance(h, dict):
                raise BadBlockFile("header is not an object")
            parent_hex, start, n, kv_bytes = h["parent"], h["start"], h["n_tokens"], h["kv_bytes"]
            digest, kept = h["xxh3_128"], h.get("kept", False)
            if not (isinstance(parent_hex, str) and is_key_hex(parent_hex) and isinstance(digest, str)
                    and re.fullmatch(r"[0-9a-f]{32}", digest) and isinstance(kept, bool)
                    and all(type(v) is int for v in (start, n, kv_bytes))):
                raise BadBlockFile("bad header fields")
            if h.get("fingerprint") != fingerprint:
                raise BadBlockFile("written by another model or KV layout")
            if not 1 <= n <= max_tokens or start < 0 or start % max_tokens:
                raise BadBlockFile("token count or position out of range")
            if kv_bytes != payload_bytes(n):
                raise BadBlockFile("payload size does not match the token count")
            if size != 8 + hlen + 4 * n + kv_bytes:
                raise BadBlockFile("file is truncated or has trailing bytes")
            traw = f.read(4 * n)
            if len(traw) != 4 * n:
                raise BadBlockFile("file is truncated")
    except (OSError, ValueError, KeyError, TypeError) as e:
        if isinstance(e, BadBlockFile):
            raise
        raise BadBlockFile(f"unreadable: {e}") from e
    tokens = np.frombuffer(traw, dtype="<i4").tolist()
    if min(tokens) < 0:
        raise BadBlockFile("negative token id")
    parent = bytes.fromhex(parent_hex)
    if block_key(parent, tokens) != key:
        raise BadBlockFile("its name is not the hash of its parent and tokens")
    return BlockHeader(key, parent, start, tokens, kv_bytes, digest, kept, size)


def read_payload(path: Path, header: BlockHeader) -> bytearray:
    """The block's payload, checked against the header's size and checksum: read in chunks
    straight into the one buffer it is returned in, each chunk hashed as it arrives."""
    data = bytearray(header.kv_bytes)
    view = memoryview(data)
    h = xxhash.xxh3_128()
    got = 0
    try:
        with path.open("rb", buffering=0) as f:
            f.seek(header.file_bytes - header.kv_bytes)
            while got < header.kv_bytes:
                n = f.readinto(view[got:got + _CHUNK])
                if not n:
                    break
                h.update(view[got:got + n])
                got += n
            more = f.read(1)  # a file that grew since its header was read
    except OSError as e:
        raise BadBlockFile(f"unreadable: {e}") from e
    finally:
        view.release()
    if got != header.kv_bytes or more or h.hexdigest() != header.checksum:
        raise BadBlockFile("checksum mismatch")
    return data
