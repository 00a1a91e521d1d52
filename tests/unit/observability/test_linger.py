"""The batching background writer under the usage ledger (hearth.observability.linger): a full
queue never blocks, and a flush writes everything that was put."""

from __future__ import annotations

import threading

from hearth.observability.linger import Lingering


def test_a_full_queue_never_blocks_and_a_flush_writes_everything_put() -> None:
    gate = threading.Event()
    written: list[int] = []

    def write(batch: list[int]) -> None:
        gate.wait(30.0)  # the writer is stuck until the queue has filled
        written.extend(batch)

    w: Lingering[int] = Lingering(write, name="test-linger", linger=0.0, capacity=3)
    accepted = [w.put(i) for i in range(10)]  # never waits
    # at most 3 wait, and the stuck writer holds one batch taken from those waiting (<= 3)
    assert accepted[:3] == [True, True, True] and accepted.count(True) <= 6 and not all(accepted)
    gate.set()
    assert w.flush(30.0)
    assert written == [i for i, ok in enumerate(accepted) if ok]
    w.close()
