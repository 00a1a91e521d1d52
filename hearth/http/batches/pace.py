"""A batch's lines run as tasks, at most a semaphore's worth at once over all batches: the loop
the node's runner (`hearth.api.batches.runner`) and the gateway's (`hearth.gateway.batches.
runner`) share. Each decides what "stopped" means (a cancel, a shutdown) and what happens after
an expiry; this owns the pacing, the test gate before each line, and the invariant that a line
in flight when the loop is left (shutdown, cancellation) is cancelled and awaited, unrecorded,
so that it runs again later."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from typing import Any

from hearth import test_gate
from hearth.http.batches.lines import Line


async def _each(lines: Iterable[Line] | AsyncIterable[Line]) -> AsyncIterator[Line]:
    if isinstance(lines, AsyncIterable):
        async for line in lines:
            yield line
    else:
        for line in lines:
            yield line


async def run_lines(pending: Iterable[Line] | AsyncIterable[Line], slots: asyncio.Semaphore,
                    stopped: Callable[[], Awaitable[bool]], expired: Callable[[], bool],
                    run: Callable[[Line], Coroutine[Any, Any, None]],
                    gate: str, name: str) -> bool:
    """Run `run(line)` for each of `pending` in order (a list, or lines read as they are needed:
    the gateway reads a batch's input from its store a chunk at a time), as slots free, until
    `stopped()` (checked before and after waiting for a slot); True if the loop ended because
    `expired()`. Waits for the lines started. The test gate `{gate}-{index}` holds a line once it has its slot."""
    running: set[asyncio.Task[None]] = set()
    ran_out = False

    def ended(t: asyncio.Task[None]) -> None:
        running.discard(t)
        slots.release()

    try:
        async for line in _each(pending):
            if await stopped():
                break
            if expired():
                ran_out = True  # the lines started still finish (gathered below)
                break
            await slots.acquire()
            try:
                if os.environ.get(test_gate.ENV):
                    await asyncio.to_thread(test_gate.wait_at_gate, f"{gate}-{line.index}")
            except BaseException:
                slots.release()
                raise
            if await stopped():  # cancelled (or shut down) while it waited
                slots.release()
                break
            task = asyncio.create_task(run(line), name=f"{name} line {line.index}")
            running.add(task)
            task.add_done_callback(ended)
        if running:
            await asyncio.gather(*list(running))
    finally:
        for t in list(running):  # shutting down: stop the lines in flight (they run again)
            t.cancel()
        for t in list(running):
            with contextlib.suppress(BaseException):
                await t
    return ran_out
