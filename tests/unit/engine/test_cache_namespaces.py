"""Prompt-cache namespaces (one per tenant): the durable cache, slot choice and placement reuse
KV only within a request's own namespace; digests show only the asker's; a restart keeps every
namespace's blocks."""

from __future__ import annotations

from pathlib import Path

from hearth.engine.kv import SlotTable
from tests.unit.engine.test_prefix_cache import B, loaded, make, state

A = list(range(1, 4 * B + 3))  # 4 full blocks and a partial one


def test_a_namespace_finds_only_its_own_blocks(tmp_path: Path) -> None:
    cache = make(tmp_path)
    cache.offer(A, lambda: state(A), ns="tenant\0a")
    assert cache.flush()
    assert cache.match(A, ns="tenant\0b") is None and cache.match(A) is None
    m = cache.match(A, ns="tenant\0a")
    assert m is not None and m.n_tokens == len(A)
    assert cache.cached(A, ns="tenant\0a") == len(A) and cache.cached(A, ns="tenant\0b") == 0
    assert cache.prefetch(A, ns="tenant\0b") == 0
    # the same tokens in another namespace are stored again, under their own chain
    cache.offer(A, lambda: state(A), ns="tenant\0b")
    assert cache.flush()
    assert len(cache.entries()) == 2 * 5
    cache.close()


def test_an_offer_in_hand_counts_as_cached_only_in_its_namespace(tmp_path: Path) -> None:
    cache = make(tmp_path)
    with cache._lock:  # hold the writer back: the offer is in hand, not stored
        assert cache.offer(A, lambda: state(A), counted=len(A), ns="tenant\0a") == len(A)
        assert cache.cached(A, ns="tenant\0a") == len(A) and cache.cached(A, ns="tenant\0b") == 0
        assert cache.offer(A, lambda: state(A), counted=len(A), ns="tenant\0b") == len(A)  # written again
    assert cache.flush()
    cache.close()


def test_a_digest_shows_only_the_askers_namespace(tmp_path: Path) -> None:
    cache = make(tmp_path)
    for ns in ("", "tenant\0a"):
        cache.offer(A, lambda: state(A), ns=ns)
    assert cache.flush()
    mine, theirs = cache.digest("tenant\0a"), cache.digest()
    assert mine["root"] != theirs["root"] and mine["root"] == cache.root("tenant\0a").hex()
    assert len(mine["ram"]) == len(theirs["ram"]) == 5 and not set(mine["ram"]) & set(theirs["ram"])
    assert {k.hex() for k in cache.chain(A, "tenant\0a")} < set(mine["ram"])  # a router's hashes match
    assert cache.digest("tenant\0b")["ram"] == []
    cache.close()


def test_a_restart_keeps_every_namespaces_blocks(tmp_path: Path) -> None:
    first = make(tmp_path)
    for ns in ("", "tenant\0a"):
        first.offer(A, lambda: state(A), ns=ns)
    assert first.flush()
    first.close()
    again = make(tmp_path)
    assert len(again.entries()) == 10
    assert again.prefetch(A, ns="tenant\0a") == len(A) and again.prefetch(A, ns="tenant\0c") == 0
    m = again.match(A, ns="tenant\0a")
    assert m is not None and m.n_tokens == len(A)
    assert again.prefetch(A) == len(A) and loaded(again, A) == A  # the default namespace's, from its own files
    again.close()


def test_a_slot_of_another_namespace_shares_nothing() -> None:
    table = SlotTable(2)
    table.slots[0].tokens[:] = A
    table.slots[0].ns = "tenant\0a"
    p = table.acquire([*A, 7], 1, ns="tenant\0b")
    assert p.reuse == 0
    table.release(p.slots[0])
    p.slots[0].tokens.clear()
    p = table.acquire([*A, 7], 1, ns="tenant\0a")
    assert p.slots[0] is table.slots[0] and p.reuse == len(A)
