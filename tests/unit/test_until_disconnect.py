"""hearth.http.sse.until_disconnect: the work's result, ClientGone when the client leaves
first (the work cancelled, on_disconnect called once), someone else's cancel passed on, and
a disconnect after the work returned changing nothing."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from starlette.requests import Request

from hearth.http.sse import ClientGone, until_disconnect


class Client:
    """A request whose `receive` yields http.disconnect once `leave()` is called."""

    def __init__(self) -> None:
        self.left = asyncio.Event()

    def leave(self) -> None:
        self.left.set()

    async def receive(self) -> dict[str, Any]:
        await self.left.wait()
        return {"type": "http.disconnect"}


def req(c: Client) -> Request:
    return cast(Request, c)


async def test_the_work_result_comes_back() -> None:
    async def work() -> int:
        await asyncio.sleep(0)
        return 7

    assert await until_disconnect(req(Client()), work) == 7


async def test_a_client_that_leaves_cancels_the_work_and_raises_client_gone() -> None:
    c, calls = Client(), []
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def work() -> int:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1

    async def leave_when_started() -> None:
        await started.wait()
        c.leave()

    leaving = asyncio.create_task(leave_when_started())
    with pytest.raises(ClientGone):
        await until_disconnect(req(c), work, lambda: calls.append(1))
    await leaving
    assert cancelled.is_set() and calls == [1]
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    await asyncio.sleep(0)  # no cancel left pending on this task


async def test_someone_elses_cancel_is_passed_on() -> None:
    started = asyncio.Event()

    async def work() -> int:
        started.set()
        await asyncio.Event().wait()
        return 1

    task = asyncio.create_task(until_disconnect(req(Client()), work))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_disconnect_after_the_work_returned_changes_nothing() -> None:
    c, calls = Client(), []

    async def work() -> int:
        c.leave()  # the disconnect is there before the work returns; the watcher sees it after
        return 3

    assert await until_disconnect(req(c), work, lambda: calls.append(1)) == 3
    for _ in range(5):
        await asyncio.sleep(0)  # a stray cancel would land here
    assert calls == []
