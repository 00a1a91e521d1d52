"""Waiting for a condition another thread or process reaches. The deadline only catches a hang
(generous for a loaded CI machine): it never decides a verdict, the condition does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], what: str = "the condition", timeout: float = 120.0,
               interval: float = 0.01) -> None:
    """Poll `condition` until it holds, failing with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


async def until(condition: Callable[[], bool], what: str = "the condition", timeout: float = 60.0,
                interval: float = 0.002) -> None:
    """`wait_until` for a test on an event loop: sleeps yield to the loop between polls."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(interval)
