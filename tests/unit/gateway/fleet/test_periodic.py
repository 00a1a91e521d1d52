"""The fleet's loops: a round that raises is logged and the loop goes on; stop ends it."""

from __future__ import annotations

import asyncio

import pytest

from hearth.gateway.fleet.periodic import Periodic


async def test_a_round_that_raises_does_not_end_the_loop_and_stop_ends_it(caplog: pytest.LogCaptureFixture) -> None:
    rounds = 0
    third = asyncio.Event()

    async def round() -> None:
        nonlocal rounds
        rounds += 1
        if rounds == 1:
            raise RuntimeError("a bad answer")
        if rounds == 3:
            third.set()

    p = Periodic(0, round, "test round")
    p.start()
    await asyncio.wait_for(third.wait(), 10)
    await p.stop()
    assert p._task is None and rounds >= 3  # stop waited for the task's end
    assert "test round failed" in caplog.text
    await p.stop()  # stopping twice is harmless
