"""The log handler that writes on a background thread (hearth.observability.logging) and the
batching writer under it (hearth.observability.linger): order kept, warnings on the stream
before `emit` returns, nothing lost at flush, and a full queue neither blocks nor drops lines."""

from __future__ import annotations

import io
import logging
import threading

from hearth.observability.linger import Lingering
from hearth.observability.logging import BackgroundStreamHandler


def _logger(stream: io.StringIO, name: str) -> tuple[logging.Logger, BackgroundStreamHandler]:
    handler = BackgroundStreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger(name)
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO)
    return log, handler


def test_lines_keep_their_order_and_flush_writes_them_all() -> None:
    stream = io.StringIO()
    log, handler = _logger(stream, "test.bg.order")
    for i in range(500):
        log.info("line %d", i)
    handler.flush()
    assert stream.getvalue().splitlines() == [f"INFO line {i}" for i in range(500)]
    handler.close()


def test_a_warning_is_on_the_stream_when_the_call_returns() -> None:
    stream = io.StringIO()
    log, handler = _logger(stream, "test.bg.warn")
    log.info("before")
    log.warning("it broke")  # no flush: a warning is written before emit returns, after what came before
    assert stream.getvalue().splitlines() == ["INFO before", "WARNING it broke"]
    handler.close()


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
