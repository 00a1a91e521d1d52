"""Affinity keys, conversation prefix hashes and the cost model."""

from __future__ import annotations

import random

import pytest

from hearth.gateway.routing.affinity import Affinity, affinity_of
from hearth.gateway.routing.policy import Candidate, Chooser
from hearth.gateway.routing.prefixes import PrefixTable, conversation, prefix_hashes


@pytest.mark.parametrize(("body", "headers", "want"), [
    ({"session_id": "s", "previous_response_id": "resp_1", "prompt_cache_key": "k"}, {"x-session-id": "h"},
     Affinity("session", "s")),
    ({"previous_response_id": "resp_1", "prompt_cache_key": "k"}, {"x-session-id": "h"},
     Affinity("response", "resp_1")),
    ({"prompt_cache_key": "k"}, {"x-session-id": "h"}, Affinity("header", "h")),
    ({"prompt_cache_key": "k"}, {}, Affinity("cache_key", "k")),
    ({"metadata": {"user_id": "u"}}, {}, Affinity("cache_key", "u")),
    ({"metadata": {"user_id": '{"device_id": "d", "session_id": "cc-1"}'}}, {}, Affinity("cache_key", "cc-1")),
    ({}, {"x-claude-code-session-id": "cc-2"}, Affinity("cache_key", "cc-2")),
    ({}, {"session-id": "codex-1", "thread-id": "t"}, Affinity("cache_key", "codex-1")),
    ({"prompt_cache_key": "k"}, {"session-id": "codex-1"}, Affinity("cache_key", "k")),
    ({}, {}, Affinity("none")),
    ({"metadata": {"user_id": 3}, "session_id": ""}, {}, Affinity("none")),
])
def test_affinity_order(body: dict[str, object], headers: dict[str, str], want: Affinity) -> None:
    assert affinity_of(body, headers) == want


def test_only_sessions_and_response_chains_bind() -> None:
    assert Affinity("session", "s").binding and Affinity("response", "r").binding
    assert not Affinity("header", "h").binding and not Affinity("cache_key", "k").binding


def test_prefix_hashes_chain_over_every_message() -> None:
    system = {"role": "system", "content": "You are helpful."}
    a = prefix_hashes("m", conversation({"messages": [system, {"role": "user", "content": "about cats"}]}))
    b = prefix_hashes("m", conversation({"messages": [system, {"role": "user", "content": "about dogs"}]}))
    assert a[0] == b[0]  # same system prompt
    assert a[1][0] != b[1][0]  # different conversations do not collide on the system prompt
    assert prefix_hashes("other", conversation({"messages": [system]}))[0][0] != a[0][0]  # seeded by model
    assert a[1][1] > a[0][1] > 0  # cumulative token estimates


def test_protocols_hash_their_own_conversation() -> None:
    anth = conversation({"system": "s", "messages": [{"role": "user", "content": "x"}]})
    resp = conversation({"instructions": "s", "input": "x"})
    assert anth[0] == resp[0] == {"system": "s"}
    assert len(anth) == len(resp) == 2


def test_prefix_table_finds_the_longest_seen_prefix_and_evicts_lru() -> None:
    turn1 = prefix_hashes("m", [{"u": 1}, {"a": 1}])
    turn2 = prefix_hashes("m", [{"u": 1}, {"a": 1}, {"u": 2}])
    t = PrefixTable(capacity=3)
    t.add(turn1)
    assert t.cached(turn2) == turn1[-1][1]
    t.add(prefix_hashes("m", [{"x": 1}]))
    t.add(prefix_hashes("m", [{"y": 1}]))
    assert len(t) == 3 and t.cached(turn2) == turn1[-1][1]  # turn1[0] went first; the longer prefix stays
    t.add(prefix_hashes("m", [{"z": 1}]))
    assert t.cached(turn2) == 0


def test_a_prefix_the_node_answered_is_predicted_with_the_node_own_count() -> None:
    turn1 = prefix_hashes("m", [{"u": "x" * 400}])
    turn2 = prefix_hashes("m", [{"u": "x" * 400}, {"a": "y" * 40}, {"u": "z"}])
    t = PrefixTable()
    t.add(turn1, prompt_tokens=431)  # what the node reported for turn 1's whole prompt
    assert t.cached(turn2) == 431 != turn1[-1][1]
    t.add(turn2)  # a later add without a count keeps the one known
    assert t.cached(prefix_hashes("m", [{"u": "x" * 400}, {"u": "w"}])) == 431
    assert t.cached(prefix_hashes("m", [*[{"u": "x" * 400}, {"a": "y" * 40}, {"u": "z"}], {"u": "v"}])) == turn2[-1][1]


def test_scan_counts_the_whole_prompt_of_every_protocol() -> None:
    from hearth.gateway.turn.scan import Scan

    chat = Scan()
    chat.feed(b'data: {"usage":{"prompt_tokens":120,"completion_tokens":3,'
              b'"prompt_tokens_details":{"cached_tokens":100}}}')
    assert (chat.prompt, chat.cached, chat.whole_prompt) == (120, 100, 120)
    messages = Scan()  # Anthropic's input_tokens leaves out what was read from (or written to) the cache
    messages.feed(b'event: message_start\ndata: {"message":{"usage":{"input_tokens":20,'
                  b'"cache_creation_input_tokens":5,"cache_read_input_tokens":100,"output_tokens":1}}}')
    assert (messages.prompt, messages.cached, messages.whole_prompt) == (20, 100, 125)
    responses = Scan(responses=True)
    responses.feed(b'data: {"usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":100}}}')
    assert responses.whole_prompt == 120


def test_cost_model_prefers_cache_times_load() -> None:
    ch = Chooser(random.Random(0))
    none = Affinity("none")
    # 1000 tokens: node a holds 900 of them but has 2 in flight: (100 × 3) < (1000 × 1)
    d = ch.choose([Candidate("a", 2, 8, 900), Candidate("b", 0, 8, 0)], 1000, none, None)
    assert d is not None and d.node == "a" and d.branch == "prefix_hit" and d.predicted_cached == 900
    # holding 100 is not worth waiting behind 2: (900 × 3) > (1000 × 1)
    d = ch.choose([Candidate("a", 2, 8, 100), Candidate("b", 0, 8, 0)], 1000, none, None)
    assert d is not None and d.node == "b" and d.branch == "least_cost"


def test_equal_costs_break_at_random() -> None:
    ch = Chooser(random.Random(1))
    picks = {ch.choose([Candidate("a", 0, 8, 0), Candidate("b", 0, 8, 0)], 10, Affinity("none"), None).node  # type: ignore[union-attr]
             for _ in range(50)}
    assert picks == {"a", "b"}


def test_sticky_wins_unless_saturated() -> None:
    ch = Chooser(random.Random(0))
    soft, binding = Affinity("cache_key", "k"), Affinity("session", "s")
    cands = [Candidate("a", 1, 2, 0), Candidate("b", 0, 2, 0)]
    d = ch.choose(cands, 100, soft, "a")
    assert d is not None and (d.node, d.branch) == ("a", "sticky_hit")
    full = [Candidate("a", 2, 2, 0), Candidate("b", 0, 2, 0)]
    d = ch.choose(full, 100, soft, "a")
    assert d is not None and (d.node, d.branch) == ("b", "load_override")
    assert ch.choose(full, 100, binding, "a") is None  # a session waits for its own node


def test_failover_and_first_assignment_branches() -> None:
    ch = Chooser(random.Random(0))
    d = ch.choose([Candidate("b", 0, 2, 0)], 100, Affinity("session", "s"), "a")  # a is not a candidate: down
    assert d is not None and (d.node, d.branch) == ("b", "failover")
    d = ch.choose([Candidate("b", 0, 2, 0)], 100, Affinity("session", "s"), None)
    assert d is not None and d.branch == "sticky_miss"


def test_all_saturated_means_wait() -> None:
    assert Chooser().choose([Candidate("a", 2, 2, 0)], 10, Affinity("none"), None) is None


def test_round_robin_baseline_ignores_cache_and_keys() -> None:
    ch = Chooser(random.Random(0), policy="round_robin")
    cands = [Candidate("a", 0, 8, 900), Candidate("b", 0, 8, 0), Candidate("c", 0, 8, 0)]
    picks = [ch.choose(cands, 1000, Affinity("session", "s"), "a").node for _ in range(6)]  # type: ignore[union-attr]
    assert picks == ["b", "c", "a", "b", "c", "a"]


def test_a_node_with_the_model_loaded_beats_one_that_would_load_it() -> None:
    ch, none = Chooser(), Affinity("none")
    # b holds more of the prompt and is idle, but would have to load the model first
    cands = [Candidate("a", 3, 8, 0, loaded=True), Candidate("b", 0, 8, 900, loaded=False)]
    assert ch.choose(cands, 1000, none, None).node == "a"  # type: ignore[union-attr]
    # unknown (no digest) counts as maybe loaded; only when every free node must load does one
    assert ch.choose([Candidate("a", 0, 8, 0), Candidate("b", 0, 8, 0, loaded=False)], 10, none,
                     None).node == "a"  # type: ignore[union-attr]
    assert ch.choose([Candidate("a", 8, 8, 0, loaded=True), Candidate("b", 0, 8, 0, loaded=False)], 10, none,
                     None).node == "b"  # type: ignore[union-attr]
