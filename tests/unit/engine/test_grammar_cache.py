"""GrammarCache: compiled once per text, private copies, refusals not cached, eviction frees."""

from __future__ import annotations

import pytest

from hearth.engine.grammar_cache import GrammarCache


class Compiler:
    def __init__(self) -> None:
        self.compiled: list[str] = []
        self.freed: list[str] = []

    def compile(self, text: str) -> list[str]:
        if "bad" in text:
            raise ValueError("refused")
        self.compiled.append(text)
        return [text]

    def free(self, entry: list[str]) -> None:
        self.freed.append(entry[0])


def test_compiles_once_and_hands_out_private_copies() -> None:
    c = Compiler()
    cache: GrammarCache[list[str]] = GrammarCache(c.compile, list, c.free)
    cache.compile("a")
    cache.compile("a")
    one, two = cache.instance("a"), cache.instance("a")
    assert one == two == ["a"] and one is not two
    assert c.compiled == ["a"]
    st = cache.stats()
    assert (st.misses, st.hits, st.entries) == (1, 1, 1)  # instance() does not count the request again


def test_a_refusal_is_raised_each_time_and_not_kept() -> None:
    c = Compiler()
    cache: GrammarCache[list[str]] = GrammarCache(c.compile, list, c.free)
    for _ in range(2):
        with pytest.raises(ValueError):
            cache.compile("bad")
    assert cache.stats().entries == 0 and cache.stats().misses == 0


def test_least_recently_used_is_evicted_and_freed() -> None:
    c = Compiler()
    cache: GrammarCache[list[str]] = GrammarCache(c.compile, list, c.free, capacity=2)
    cache.compile("a")
    cache.compile("b")
    cache.compile("a")  # a is now the most recent
    cache.compile("c")
    assert c.freed == ["b"]
    cache.compile("a")
    assert c.compiled == ["a", "b", "c"]
    cache.instance("b")  # evicted meanwhile: compiled again, a miss
    assert c.compiled[-1] == "b" and cache.stats().misses == 4 and c.freed == ["b", "c"]
    cache.clear()
    assert sorted(c.freed) == ["a", "b", "b", "c"] and cache.stats().entries == 0


def test_the_text_budget_bounds_the_cache_but_keeps_the_newest() -> None:
    c = Compiler()
    cache: GrammarCache[list[str]] = GrammarCache(c.compile, list, c.free, max_bytes=10)
    cache.compile("x" * 8)
    cache.compile("y" * 20)  # over the budget alone: kept (the request needs it), the older freed
    assert c.freed == ["x" * 8] and cache.stats().entries == 1
