import asyncio

import pytest

from hearth.backends.local.admission import AdmissionQueue
from hearth.errors import TooManyRequests


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_runs_up_to_slots_then_queues_fifo() -> None:
    q = AdmissionQueue(2, max_waiting=4, max_wait=5)
    await q.acquire()
    await q.acquire()
    order: list[int] = []

    async def wait(i: int) -> None:
        await q.acquire()
        order.append(i)

    tasks = [asyncio.create_task(wait(i)) for i in range(3)]
    await settle()
    assert q.waiting == 3
    q.release()
    q.release()
    await settle()
    assert order == [0, 1] and q.waiting == 1
    q.release()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2] and q.in_use == 2


async def test_full_queue_is_a_429_with_retry_after() -> None:
    q = AdmissionQueue(1, max_waiting=1, max_wait=5)
    await q.acquire()
    waiter = asyncio.create_task(q.acquire())
    await settle()
    with pytest.raises(TooManyRequests) as e:
        await q.acquire()
    assert e.value.retry_after >= 1 and e.value.code == "queue_full"
    waiter.cancel()


async def test_wait_timeout_is_a_429_and_leaves_the_queue() -> None:
    q = AdmissionQueue(1, max_waiting=4, max_wait=0.05)
    await q.acquire()
    with pytest.raises(TooManyRequests, match="no free slot"):
        await q.acquire()
    assert q.waiting == 0 and q.in_use == 1


async def test_a_waiter_that_leaves_is_removed_at_once() -> None:
    q = AdmissionQueue(1, max_waiting=4, max_wait=5)
    await q.acquire()
    t = asyncio.create_task(q.acquire())
    await settle()
    assert q.waiting == 1
    t.cancel()
    await settle()
    assert q.waiting == 0
    q.release()
    assert q.in_use == 0


async def test_multi_slot_requests() -> None:
    q = AdmissionQueue(4, max_waiting=4, max_wait=5)
    await q.acquire(3)
    t = asyncio.create_task(q.acquire(2))
    await settle()
    assert q.waiting == 1
    q.release(3)
    await t
    assert q.in_use == 2


async def test_a_shorter_per_request_wait_and_closing_the_queue() -> None:
    from hearth.errors import Unavailable

    q = AdmissionQueue(1, max_waiting=4, max_wait=30)
    await q.acquire()
    with pytest.raises(TooManyRequests, match=r"within 0\.05 s"):
        await q.acquire(max_wait=0.05)
    waiter = asyncio.create_task(q.acquire())
    await settle()
    q.close()
    with pytest.raises(Unavailable):
        await waiter
    with pytest.raises(Unavailable, match="shutting down"):
        await q.acquire()
    assert q.waiting == 0


async def test_a_freed_slot_goes_to_the_higher_class_then_the_least_served_tenant() -> None:
    from hearth.backends.local.admission import Claim
    from hearth.engine.fair_share import Priority

    q = AdmissionQueue(1, max_waiting=8, max_wait=5)
    hog, holder = Claim("a"), Claim("z", priority=Priority.PRIORITY)  # nobody may preempt the holder
    await q.acquire(1, None, holder)
    q.fair.charge("a", 1000)  # a has had much of the engine before
    order: list[str] = []

    async def wait(name: str, claim: Claim) -> None:
        await q.acquire(1, None, claim)
        order.append(name)

    tasks = [asyncio.create_task(wait(name, claim)) for name, claim in (
        ("a2", hog), ("batch", Claim("c", priority=Priority.FLEX)), ("b", Claim("b")),
        ("urgent", Claim("a", priority=Priority.PRIORITY)))]
    await settle()
    q.fair.charge("a", 10)  # a's running request decodes on while they wait
    assert q.by_class() == {Priority.DEFAULT: 2, Priority.FLEX: 1, Priority.PRIORITY: 1}
    holders = [holder, Claim("a", priority=Priority.PRIORITY), Claim("b"), hog]  # who runs, in turn
    for holder, expected in zip(holders, (["urgent"], ["urgent", "b"], ["urgent", "b", "a2"],
                                          ["urgent", "b", "a2", "batch"]), strict=True):
        q.release(1, holder)
        await settle()
        assert order == expected  # class first, then b (served less since it came) before a's second
    await asyncio.gather(*tasks)
    snap = q.fair.snapshot()
    assert snap["a"].admitted == 2 and snap["b"].admitted == 1 and snap["c"].waiting == 0
    assert snap["a"].running == 0 and snap["b"].running == 0 and snap["c"].running == 1


async def test_a_higher_class_is_let_through_over_lower_running_work_to_preempt() -> None:
    from hearth.backends.local.admission import Claim
    from hearth.engine.fair_share import Priority

    q = AdmissionQueue(2, max_waiting=8, max_wait=5)
    flex, default, urgent = Claim("b", priority=Priority.FLEX), Claim("a"), Claim("c", priority=Priority.PRIORITY)
    await q.acquire(1, None, flex)
    await q.acquire(1, None, default)
    flex2 = asyncio.create_task(q.acquire(1, None, flex))
    await settle()
    assert not flex2.done()  # nothing below flex to pause: it waits for a slot
    await asyncio.wait_for(q.acquire(1, None, default), 1)  # over the flex one: let through at once
    await asyncio.wait_for(q.acquire(1, None, urgent), 1)  # over the defaults
    await asyncio.wait_for(q.acquire(1, None, urgent), 1)
    assert q.in_use == 5
    third = asyncio.create_task(q.acquire(1, None, urgent))
    await settle()
    assert not third.done()  # two priority sequences fill the two slots: the third waits
    q.release(1, urgent)
    await settle()
    assert third.done() and not flex2.done()
    for c in (urgent, urgent, default, default):
        q.release(1, c)
    await settle()
    assert flex2.done() and q.in_use == 2  # the first flex one (resumed) and the second
    flex2.result()


async def test_a_tenant_with_nothing_admitted_is_let_through_beside_one_admitted_several_times() -> None:
    from hearth.backends.local.admission import Claim

    q = AdmissionQueue(2, max_waiting=8, max_wait=5)
    a, b, c = Claim("a"), Claim("b"), Claim("c")
    await q.acquire(1, None, a)
    await q.acquire(1, None, a)
    await asyncio.wait_for(q.acquire(1, None, b), 1)  # a runs two: one of them pauses for b
    assert q.in_use == 3
    for claim in (b, a, c):  # b runs one already; a is the one running several; c: a has nothing left to give
        task = asyncio.create_task(q.acquire(1, None, claim))
        await settle()
        assert not task.done()
        task.cancel()
        await settle()


async def test_a_tenant_is_let_through_while_another_has_two_more_slots_than_it() -> None:
    """Fair shares of the slots: with A holding all four, B is let through twice (A pauses two,
    leaving two each), not a third time; A's own next request waits (it has no fewer than B)."""
    from hearth.backends.local.admission import Claim

    q = AdmissionQueue(4, max_waiting=8, max_wait=5)
    a, b = Claim("a"), Claim("b")
    for _ in range(4):
        await q.acquire(1, None, a)
    await asyncio.wait_for(q.acquire(1, None, b), 1)
    await asyncio.wait_for(q.acquire(1, None, b), 1)
    assert q.in_use == 6
    for claim in (b, a):
        task = asyncio.create_task(q.acquire(1, None, claim))
        await settle()
        assert not task.done()
        task.cancel()
        await settle()
