"""The start prefetch (issue 38): the blocks of the most recently used prompts read into RAM at
load, bounded by a count, bytes and a deadline, each block checked; and how a prompt's recency
survives a restart (the file mtime, touched when a request's prefetch uses the prompt)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from hearth.engine.prefix_cache import PrefixCache
from hearth.engine.prefix_cache import files as block_files
from tests.unit.engine.test_prefix_cache import B, corrupt, loaded, make, put


def prompt(first: int, n_blocks: int, extra: int = 3) -> list[int]:
    return list(range(first, first + n_blocks * B + extra))


def age(tmp: Path, cache: PrefixCache, tokens: list[int], when: float) -> None:
    """Set the mtime of `tokens`' block files (as if written or last used at `when`)."""
    for key in cache.chain(tokens):
        os.utime(block_files.block_path(tmp, key), (when, when))
    partial = len(tokens) % B
    if partial:  # the last, partial block: the one file whose key is not in the full chain
        for f in tmp.glob("*.kvb"):
            h = block_files.read_header(f, cache.fingerprint, B, lambda n: 4 * n)
            if h.start == len(tokens) - partial and h.tokens == tokens[-partial:]:
                os.utime(f, (when, when))


def written(tmp: Path, prompts: list[list[int]]) -> None:
    """Each prompt stored, the first oldest (an hour apart)."""
    first = make(tmp)
    for p in prompts:
        put(first, p)
    now = time.time()
    for i, p in enumerate(prompts):
        age(tmp, first, p, now - 3600 * (len(prompts) - i))
    first.close()


def in_ram(cache: PrefixCache, p: list[int]) -> bool:
    m = cache.match(p)
    return m is not None and m.n_tokens == len(p)


def test_the_newest_prompts_are_read_into_ram_and_no_others(tmp_path: Path) -> None:
    a, b, c = prompt(100, 2), prompt(200, 3), prompt(300, 1)
    written(tmp_path, [a, b, c])  # c newest
    again = make(tmp_path)
    assert again.match(a) is None and again.match(c) is None  # a restart: nothing in RAM
    whole, read = again.prefetch_recent(2, 1 << 20)
    assert whole == 2
    assert in_ram(again, c) and in_ram(again, b) and again.match(a) is None
    n_bytes = 4 * (B + 3 + B + B + B + 3)  # the fake codec: 4 bytes a token
    assert read == n_bytes == again.stats().loaded_bytes
    assert loaded(again, c) == c and loaded(again, b) == b  # the right KV under each key
    again.close()


def test_the_byte_bound_skips_a_prompt_that_does_not_fit_and_takes_an_older_one_that_does(tmp_path: Path) -> None:
    small, big = prompt(100, 1, 0), prompt(200, 4)
    written(tmp_path, [small, big])  # big newest
    again = make(tmp_path)
    whole, read = again.prefetch_recent(4, 4 * B * 2)  # room for two blocks: not big's five
    assert whole == 1 and read == 4 * B
    assert in_ram(again, small) and again.match(big) is None
    again.close()


def test_the_count_bound_deadline_and_ram_budget(tmp_path: Path) -> None:
    a, b = prompt(100, 1), prompt(200, 1)
    written(tmp_path, [a, b])
    again = make(tmp_path)
    assert again.prefetch_recent(0, 1 << 20) == (0, 0)
    assert again.prefetch_recent(2, 1 << 20, deadline=time.monotonic() - 1) == (0, 0)
    assert again.match(a) is None and again.match(b) is None
    again.close()
    tight = make(tmp_path, ram=4 * B)  # the cache's own RAM budget caps the start prefetch
    whole, read = tight.prefetch_recent(2, 1 << 20)
    assert whole == 0 and read == 0
    tight.close()


def test_a_shared_prefix_is_read_once_and_serves_both(tmp_path: Path) -> None:
    shared = prompt(100, 2, 0)
    a, b = [*shared, 7, 8, 9], [*shared, 17, 18]
    written(tmp_path, [a, b])
    again = make(tmp_path)
    whole, read = again.prefetch_recent(2, 1 << 20)
    assert whole == 2
    assert read == 4 * (2 * B + 3 + 2)  # the shared blocks once
    assert in_ram(again, a) and in_ram(again, b)
    again.close()


def test_a_corrupt_block_prefetched_at_start_is_refused_and_never_used(tmp_path: Path) -> None:
    a = prompt(100, 2)
    written(tmp_path, [a])
    cache = make(tmp_path)
    second = block_files.block_path(tmp_path, cache.chain(a)[1])
    cache.close()
    corrupt(second, second.stat().st_size - 1)  # the payload: found only when it is read
    again = make(tmp_path)  # the scan reads headers only: it still knows the block
    assert again.cached(a) == len(a)
    whole, _ = again.prefetch_recent(4, 1 << 20)
    assert whole == 0
    assert loaded(again, a) == a[:B]  # the first block only: the bad one and its child are gone
    assert again.stats().rejected_files == 1
    assert not second.exists() and again.cached(a) == B
    again.close()


def test_a_prompt_a_request_used_ranks_first_after_the_next_restart(tmp_path: Path) -> None:
    a, b = prompt(100, 2), prompt(200, 2)
    written(tmp_path, [a, b])  # b newer
    served = make(tmp_path)
    assert served.prefetch(a) == len(a)  # a request for a: its last block's file is touched
    served.close()
    again = make(tmp_path)
    assert again.prefetch_recent(1, 1 << 20)[0] == 1
    assert in_ram(again, a) and again.match(b) is None
    again.close()


def test_the_start_prefetch_keeps_each_blocks_recency(tmp_path: Path) -> None:
    a, b = prompt(100, 1), prompt(200, 1)
    written(tmp_path, [a, b])
    again = make(tmp_path)
    blocks = again._index.blocks  # what eviction ranks by
    before = {k: x.last_used for k, x in blocks.items()}
    assert again.prefetch_recent(2, 1 << 20)[0] == 2
    assert {k: x.last_used for k, x in blocks.items()} == before  # not the order they were read in
    again.close()
