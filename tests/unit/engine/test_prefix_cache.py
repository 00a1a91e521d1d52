"""The prompt cache on its own: blocks, the hash chain, tiers, budgets, restarts and bad files,
with the fake runner's codec (a block's payload is its tokens as int32, so every load is checked
against the tokens it claims)."""

from __future__ import annotations

import errno
import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from hearth.engine.fake_runner import FakeRunner
from hearth.engine.prefix_cache import PrefixCache
from hearth.engine.prefix_cache import files as block_files

B = 8  # tokens per block in these tests


def state(tokens: list[int]) -> bytes:
    return b"FAKE" + np.asarray(tokens, dtype="<i4").tobytes()


def make(tmp: Path | None, ram: int = 1 << 20, disk: int = 1 << 20, runner: FakeRunner | None = None,
         **kw: int) -> PrefixCache:
    r = runner or FakeRunner()
    return PrefixCache(r, r.fingerprint, directory=tmp, ram_budget=ram, disk_budget=disk, block_tokens=B,
                       min_new=kw.pop("min_new", 1), **kw)


def put(cache: PrefixCache, tokens: list[int], keep: int = 0, counted: int = 0) -> int:
    n = cache.offer(tokens, lambda: state(tokens), keep=keep, counted=counted)
    assert cache.flush()
    return n


def loaded(cache: PrefixCache, prompt: list[int]) -> list[int]:
    """The tokens a match's joined KV holds (the fake state is the token list)."""
    m = cache.match(prompt)
    if m is None:
        return []
    data = FakeRunner().kv_join(m.parts)
    return np.frombuffer(data[4:], dtype="<i4").tolist()


def test_a_prefix_is_found_up_to_the_first_token_that_differs(tmp_path: Path) -> None:
    cache = make(tmp_path)
    a = list(range(1, 30))  # 3 full blocks and a partial one
    put(cache, a)
    assert loaded(cache, a) == a
    b = [*a[:13], 99, *a[14:]]  # differs inside the second block
    assert loaded(cache, b) == a[:13]
    assert loaded(cache, [*a[:20], 7, 7]) == a[:20]
    assert cache.match([5, 6, 7]) is None
    cache.close()


def test_shared_prefixes_are_stored_once(tmp_path: Path) -> None:
    cache = make(tmp_path)
    shared = list(range(1000, 1000 + 4 * B))  # 4 full blocks
    for i in range(20):
        put(cache, [*shared, 5000 + i, 5001, 5002])
    entries = cache.entries()
    assert sum(e.n_tokens for e in entries) == 4 * B + 20 * 3  # distinct tokens, not 20 copies
    assert len(list(tmp_path.glob("*.kvb"))) == 4 + 20
    for i in range(20):
        assert loaded(cache, [*shared, 5000 + i, 5001, 5002, 1]) == [*shared, 5000 + i, 5001, 5002]
    cache.close()


def test_a_restart_knows_the_blocks_without_reading_their_kv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    a = list(range(1, 30))
    first = make(tmp_path)
    put(first, a)
    first.close()
    reads: list[Path] = []
    real = block_files.read_payload
    monkeypatch.setattr(block_files, "read_payload", lambda p, h: reads.append(p) or real(p, h))
    again = make(tmp_path)
    assert again.stats().tiers["disk"].blocks == 4 and reads == []
    assert again.cached(a) == len(a)
    assert again.match(a) is None  # nothing in RAM yet: the engine thread never reads a file
    assert again.prefetch(a) == len(a) and len(reads) == 4
    m = again.match(a)
    assert m is not None and m.tier == "disk" and loaded(again, a) == a
    again.use(m)
    assert again.match(a).tier == "ram"  # type: ignore[union-attr]
    assert again.stats().tiers["disk"].hits == 1
    again.close()


def bad_files(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("*.kvb"))


def corrupt(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", ["truncated", "flipped_payload", "flipped_header", "renamed", "foreign",
                                    "negative_token", "wrong_size", "not_json", "trailing", "wrong_checksum",
                                    "sha256_header", "old_format"])
def test_a_bad_file_is_ignored_and_never_loaded(tmp_path: Path, damage: str) -> None:
    a = list(range(1, 2 * B + 1))  # two full blocks
    first = make(tmp_path)
    put(first, a)
    first.close()
    last = next(p for p in bad_files(tmp_path) if json.loads(header_of(p))["start"] == B)
    raw = last.read_bytes()
    hlen = struct.unpack("<I", raw[4:8])[0]
    header = json.loads(raw[8:8 + hlen])
    rest = raw[8 + hlen:]

    def rewrite(h: dict[str, object], body: bytes = rest) -> None:
        blob = json.dumps(h).encode()
        last.write_bytes(raw[:4] + struct.pack("<I", len(blob)) + blob + body)

    if damage == "truncated":
        last.write_bytes(raw[:-3])
    elif damage == "flipped_payload":
        corrupt(last, len(raw) - 1)  # found only when the payload is read: the checksum
    elif damage == "flipped_header":
        corrupt(last, 10)
    elif damage == "renamed":
        last.rename(tmp_path / f"{'0' * 32}.kvb")
    elif damage == "foreign":
        rewrite({**header, "fingerprint": {"fake": 2}})
    elif damage == "negative_token":
        toks = np.frombuffer(rest[:4 * B], dtype="<i4").copy()
        toks[0] = -5
        rewrite(header, toks.tobytes() + rest[4 * B:])
    elif damage == "wrong_size":
        rewrite({**header, "kv_bytes": header["kv_bytes"] + 4}, rest + b"\0\0\0\0")
    elif damage == "not_json":
        last.write_bytes(raw[:8] + b"{" * hlen + rest)
    elif damage == "trailing":
        last.write_bytes(raw + b"x")
    elif damage == "wrong_checksum":  # the header's checksum, not the payload, changed
        digest = header["xxh3_128"]
        rewrite({**header, "xxh3_128": ("0" if digest[0] != "0" else "1") + digest[1:]})
    elif damage == "sha256_header":  # the current magic over version 1's header
        h = {k: v for k, v in header.items() if k != "xxh3_128"}
        rewrite({**h, "sha256": hashlib.sha256(rest[4 * B:]).hexdigest()})
    elif damage == "old_format":  # exactly what version 1 wrote: b"HKB1", a SHA-256
        h = {k: v for k, v in header.items() if k != "xxh3_128"}
        blob = json.dumps({**h, "sha256": hashlib.sha256(rest[4 * B:]).hexdigest()}).encode()
        last.write_bytes(b"HKB1" + struct.pack("<I", len(blob)) + blob + rest)
    again = make(tmp_path)
    got = again.prefetch(a)
    assert got == B  # the good first block only
    assert loaded(again, a) == a[:B]
    assert again.stats().rejected_files == 1
    assert len(bad_files(tmp_path)) == 1  # the bad one is deleted
    again.close()


@pytest.mark.parametrize("flip", [None, 0, 17, -1])
def test_a_payload_is_checked_whole_when_read_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        flip: int | None) -> None:
    monkeypatch.setattr(block_files, "_CHUNK", 5)  # a block's 32 payload bytes in 7 reads
    a = list(range(1, B + 1))
    first = make(tmp_path)
    put(first, a)
    first.close()
    (path,) = bad_files(tmp_path)
    if flip is not None:
        corrupt(path, path.stat().st_size - 4 * B + flip % (4 * B))  # a byte of the first, a middle or the last chunk
    again = make(tmp_path)
    assert again.prefetch(a) == (B if flip is None else 0)
    assert loaded(again, a) == (a if flip is None else [])
    assert again.stats().rejected_files == (0 if flip is None else 1)
    again.close()


def test_blocks_read_back_are_one_buffer_each(tmp_path: Path) -> None:
    """A payload read from disk is the bytearray it was read into (no copy after the read),
    and what the runner's join gets."""
    a = list(range(1, 2 * B + 1))
    first = make(tmp_path)
    put(first, a)
    first.close()
    again = make(tmp_path)
    assert again.prefetch(a) == 2 * B
    m = again.match(a)
    assert m is not None and all(type(p) is bytearray for p, _, _ in m.parts)
    assert loaded(again, a) == a
    again.close()


def header_of(path: Path) -> bytes:
    raw = path.read_bytes()
    hlen = struct.unpack("<I", raw[4:8])[0]
    return raw[8:8 + hlen]


def test_a_block_whose_parent_is_gone_is_dropped_at_start(tmp_path: Path) -> None:
    a = list(range(1, 3 * B + 1))
    first = make(tmp_path)
    put(first, a)
    first.close()
    head = next(p for p in bad_files(tmp_path) if json.loads(header_of(p))["start"] == 0)
    head.unlink()
    again = make(tmp_path)
    assert again.entries() == [] and bad_files(tmp_path) == []
    again.close()


def test_a_half_written_file_from_a_killed_writer_is_removed(tmp_path: Path) -> None:
    (tmp_path / f".{'a' * 32}.kvb.123.456.tmp").write_bytes(b"HKB1 half")
    cache = make(tmp_path)
    assert list(tmp_path.iterdir()) == []
    cache.close()


def test_ram_budget_evicts_least_recently_used_and_kept_blocks_last(tmp_path: Path) -> None:
    per_block = 4 * B
    cache = make(None, ram=3 * per_block, disk=0)  # RAM only: evicted means gone
    kept = [1] * B
    put(cache, kept, keep=B)
    for i in range(2, 6):
        put(cache, [i] * B)
    st = cache.stats().tiers["ram"]
    assert st.bytes <= 3 * per_block and st.evictions == 2
    assert cache.match(kept) is not None  # asked for: kept while newer strangers went
    assert cache.match([2] * B) is None and cache.match([5] * B) is not None
    cache.close()


def test_disk_budget_and_ram_tier_together(tmp_path: Path) -> None:
    cache = make(tmp_path, ram=1 << 20, disk=1)  # every write goes over the disk budget at once
    put(cache, list(range(1, B + 1)))
    st = cache.stats()
    assert st.tiers["disk"].blocks == 0 and st.tiers["disk"].evictions >= 1
    assert st.tiers["ram"].blocks == 1  # still served from RAM
    cache.close()


def test_a_full_disk_stops_writes_but_not_serving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*a: object, **k: object) -> block_files.BlockHeader:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(block_files, "write_block", full)
    cache = make(tmp_path)
    a = list(range(1, 20))
    put(cache, a)
    st = cache.stats()
    assert st.disk_full and st.write_errors >= 1 and st.written_blocks == 0
    assert loaded(cache, a) == a  # RAM still serves
    put(cache, list(range(100, 120)))
    assert cache.stats().write_errors == st.write_errors  # no more attempts while full
    cache.close()


def test_an_offer_copies_the_kv_only_when_enough_is_new(tmp_path: Path) -> None:
    cache = make(tmp_path, min_new=4)
    a = list(range(1, 20))
    put(cache, a)
    calls: list[list[int]] = []

    def data(tokens: list[int]) -> bytes:
        calls.append(tokens)
        return state(tokens)

    two, four = [*a, 50, 51], [*a, 50, 51, 52, 53]
    cache.offer(two, lambda: data(two))
    assert calls == [] and cache.cached(two) == len(a)  # 2 new tokens: not worth a copy of the KV
    cache.offer(four, lambda: data(four))
    assert cache.flush() and calls == [four] and cache.cached(four) == len(four)
    cache.close()


def test_counted_tokens_are_the_new_ones_at_the_breakpoint(tmp_path: Path) -> None:
    cache = make(tmp_path)
    system = list(range(1, 2 * B + 1))
    assert put(cache, [*system, 70, 71], keep=len(system), counted=len(system)) == len(system)
    assert put(cache, [*system, 80, 81], keep=len(system), counted=len(system)) == 0  # already cached
    assert all(e.kept for e in cache.entries() if e.start < len(system))
    cache.close()


def test_clear_empties_every_tier_and_resumes_writes(tmp_path: Path) -> None:
    cache = make(tmp_path)
    put(cache, list(range(1, 20)))
    assert cache.clear() == 3
    assert cache.entries() == [] and bad_files(tmp_path) == []
    assert cache.stats().tiers["ram"].bytes == 0 and cache.stats().tiers["disk"].bytes == 0
    cache.close()


def test_digest_lists_blocks_by_tier(tmp_path: Path) -> None:
    cache = make(tmp_path)
    put(cache, list(range(1, 20)))
    d = cache.digest()
    keys = sorted(e.hash for e in cache.entries())
    assert d["block_tokens"] == B and d["ram"] == keys and d["disk"] == keys
    # the chain is public: the first block's hash is blake2b(root, tokens)
    root = block_files.root_key(FakeRunner().fingerprint)
    assert block_files.block_key(root, list(range(1, B + 1))).hex() in keys
    cache.close()


def test_a_salt_separates_chains() -> None:
    fp = FakeRunner().fingerprint
    assert block_files.root_key(fp) != block_files.root_key(fp, "tenant-a")


def test_offers_the_writer_has_not_stored_yet_count_as_cached(tmp_path: Path) -> None:
    cache = make(tmp_path)
    a = list(range(1, 30))
    copies: list[int] = []

    def data() -> bytes:
        copies.append(1)
        return state(a)

    with cache._lock:  # hold the writer back: both offers arrive before it stores anything
        first = cache.offer(a, data, keep=len(a), counted=len(a))
        assert cache.cached(a) == len(a)
    again = cache.offer(a, data, keep=len(a), counted=len(a))
    assert (first, again, len(copies)) == (len(a), 0, 1)  # one copy, written once
    assert cache.flush() and cache.cached(a) == len(a)
    cache.close()


def test_a_block_this_process_wrote_and_dropped_from_ram_is_read_back(tmp_path: Path) -> None:
    cache = make(tmp_path, ram=3 * 4 * B)  # RAM for three blocks
    a, b = list(range(1, 3 * B + 1)), list(range(100, 100 + 3 * B))
    put(cache, a)
    put(cache, b)  # pushes a's blocks out of RAM: they are on disk only
    st = cache.stats()
    assert st.tiers["ram"].blocks == 3 and st.tiers["disk"].blocks == 6 and cache.match(a) is None
    assert cache.prefetch(a) == len(a)  # each block read back and its checksum verified
    assert cache.stats().rejected_files == 0 and loaded(cache, a) == a
    cache.close()
