"""The usage ledger's store and writer (hearth.observability.ledger): rows land off the caller's
thread, filters and groups sum them, a full queue drops and counts instead of blocking, and the
key accounts resume from it after a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearth.http.key_usage import KeyAccounts
from hearth.observability.ledger import Ledger, UsageFilter, UsageRecord
from hearth.tenants import ApiKey

DAY = 86_400.0


def rec(at: float, tenant: str = "a", key: str | None = "ka", model: str = "m1", gen: int = 5,
        cancelled: str | None = None, via: str | None = None) -> UsageRecord:
    return UsageRecord(at=at, request_id="r", tenant=tenant, key=key, via=via, model=model, endpoint="chat",
                       prompt_tokens=10, cached_tokens=4, cache_tier="ram", generated_tokens=gen,
                       discarded_tokens=1 if cancelled else 0, finish_reason="stop", cancelled=cancelled,
                       queue_ms=1.0, ttft_ms=2.0, total_ms=3.0)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "usage.db")


def test_rows_round_trip_and_filters(ledger: Ledger) -> None:
    ledger.record(rec(10 * DAY, tenant="a", model="m1"))
    ledger.record(rec(10 * DAY + 5, tenant="b", key="kb", model="m2", cancelled="disconnect"))
    ledger.record(rec(11 * DAY, tenant="a", model="m2"))
    assert ledger.flush()
    assert len(ledger.rows(UsageFilter())) == 3
    [row] = ledger.rows(UsageFilter(tenant="b"))
    assert row == {"at": 10 * DAY + 5, "request_id": "r", "tenant": "b", "key": "kb", "via": None, "model": "m2",
                   "endpoint": "chat", "prompt_tokens": 10, "cached_tokens": 4, "cache_tier": "ram",
                   "generated_tokens": 5, "discarded_tokens": 1, "finish_reason": "stop", "cancelled": "disconnect",
                   "error": None, "queue_ms": 1.0, "ttft_ms": 2.0, "total_ms": 3.0}
    assert [r["at"] for r in ledger.rows(UsageFilter(tenant="a"))] == [11 * DAY, 10 * DAY]  # newest first
    assert [r["model"] for r in ledger.rows(UsageFilter(since=10 * DAY + 1, until=11 * DAY))] == ["m2"]
    assert ledger.rows(UsageFilter(model="m9")) == []
    ledger.close()


def test_groups_sum(ledger: Ledger) -> None:
    for at, tenant, model in ((10 * DAY, "a", "m1"), (10 * DAY + 1, "a", "m2"), (11 * DAY, "b", "m1")):
        ledger.record(rec(at, tenant=tenant, model=model, cancelled="cancel_call" if tenant == "b" else None))
    assert ledger.flush()
    by_day = ledger.totals(UsageFilter(), ["day"])
    assert [(r["day"], r["requests"], r["generated_tokens"], r["cancelled"]) for r in by_day] == [
        ("1970-01-11", 2, 10, 0), ("1970-01-12", 1, 5, 1)]
    by_model = ledger.totals(UsageFilter(tenant="a"), ["model"])
    assert [(r["model"], r["prompt_tokens"], r["cached_tokens"]) for r in by_model] == [("m1", 10, 4), ("m2", 10, 4)]
    [total] = ledger.totals(UsageFilter(), [])
    assert total["requests"] == 3 and total["discarded_tokens"] == 1
    [empty] = ledger.totals(UsageFilter(tenant="nobody"), [])
    assert empty["requests"] == 0 and empty["generated_tokens"] == 0
    with pytest.raises(ValueError):
        ledger.totals(UsageFilter(), ["at; DROP TABLE usage"])
    ledger.close()


def test_a_full_queue_drops_and_counts_never_blocks(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "usage.db", capacity=2)
    ledger._lock.acquire()  # the writer cannot commit: its first batch waits on the lock
    try:
        ledger.record(rec(1.0))  # taken by the writer (then it waits), or still queued
        for _ in range(5):
            ledger.record(rec(2.0))  # never blocks: at most 2 wait, the others are dropped
        assert ledger.dropped >= 3
    finally:
        ledger._lock.release()
    assert ledger.flush()
    assert ledger.written + ledger.dropped == 6
    assert len(ledger.rows(UsageFilter())) == ledger.written
    ledger.close()


def test_rows_that_come_while_the_writer_lingers_share_one_transaction(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "usage.db", linger=60.0)  # woken by the first row, it waits for more
    for i in range(50):
        ledger.record(rec(float(i)))
    assert ledger.flush(timeout=30.0)  # flush cuts the linger short
    assert ledger.commits == 1 and ledger.written == 50
    ledger.record(rec(99.0))
    assert ledger.flush(timeout=30.0)
    assert ledger.commits == 2 and len(ledger.rows(UsageFilter())) == 51
    ledger.close()


def test_close_writes_what_waits_without_waiting_out_the_linger(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "usage.db", linger=600.0)
    for i in range(3):
        ledger.record(rec(float(i)))
    ledger.close()  # joins the writer for at most 10 s: only a cut linger writes the rows in time
    reopened = Ledger(tmp_path / "usage.db")
    assert len(reopened.rows(UsageFilter())) == 3
    reopened.close()


def test_rows_survive_a_reopen_and_key_accounts_resume(tmp_path: Path) -> None:
    first = Ledger(tmp_path / "usage.db")
    first.record(rec(1000.0, key="alice", gen=7))  # long ago: in the totals, not in the window
    first.record(rec(1990.0, key="alice", gen=3))  # 10 s before "now": in the tpm window
    first.record(rec(1995.0, key="gw", tenant="t1", gen=2, via="gw"))  # a gateway key for tenant t1
    first.record(rec(1995.0, key="gone", gen=2))  # a key no longer in the key file
    first.close()
    second = Ledger(tmp_path / "usage.db")
    clock = [500.0]
    accounts = KeyAccounts([ApiKey("k1", "alice", "a", tpm=20), ApiKey("k2", "gw", "gw", role="gateway")],
                           clock=lambda: clock[0])
    accounts.restore(second.per_key(2000.0 - 60), 2000.0)
    usage = {(u["name"], u.get("via")): u for u in accounts.usage()}
    alice = usage[("alice", None)]
    assert (alice["requests"], alice["prompt_tokens"], alice["completion_tokens"], alice["cached_tokens"]) == \
        (2, 20, 10, 8)
    assert usage[("gw", None)]["completion_tokens"] == 2 and usage[("t1", "gw")]["completion_tokens"] == 2
    # the window holds the recent row's 13 tokens, 10 s old: alice (tpm=20) is admitted now ...
    accounts.admit("alice")
    accounts.release("alice")
    accounts.spend("alice", 5, 5, 0)  # ... and is over her limit with 10 more
    with pytest.raises(Exception, match="tpm=20"):
        accounts.admit("alice")
    second.close()
