"""An arrival during a step the fake runner holds: the shape the interrupt tests share."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Protocol

from hearth.engine import Engine, EngineRequest, RequestOutput
from hearth.engine.fake_runner import FakeRunner
from tests.helpers import until


class DoneSink(Protocol):
    """A test sink: called with each output, `done` set by the last one."""

    done: threading.Event

    def __call__(self, out: RequestOutput) -> None: ...


async def arrive_during_held_step(eng: Engine, runner: FakeRunner, hold: threading.Event,
                                  first: tuple[EngineRequest, DoneSink], then: tuple[EngineRequest, DoneSink],
                                  what: str, *, on_held: Callable[[], None] | None = None,
                                  before_release: Callable[[], Awaitable[None]] | None = None) -> None:
    """Submit `first`; once the runner holds a step of it (`runner.held`), `on_held()`, then
    submit `then` and wait until its arrival interrupts that step (`what` names it in the
    failure); `await before_release()` if given; then let the runner go and wait until both
    are done. The engine is stopped and the hold cleared however it ends."""
    try:
        eng.submit(*first)
        assert await asyncio.to_thread(runner.held.wait, 10)
        if on_held is not None:
            on_held()
        eng.submit(*then)
        await until(lambda: len(runner.aborted) == 1, what)
        if before_release is not None:
            await before_release()
        hold.clear()
        for _, sink in (first, then):
            assert await asyncio.to_thread(sink.done.wait, 10)
    finally:
        hold.clear()
        eng.stop()
