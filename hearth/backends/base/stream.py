"""The stream a generation returns: ChatEvents, with cleanups that run exactly once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from hearth.chat.types import ChatEvent


class EventStream:
    """A stream of ChatEvents whose cleanups always run exactly once: when it is exhausted,
    or on `aclose()`, even if it was never iterated (an async generator that never started
    would skip its `finally`, leaking whatever the backend reserved for it)."""

    def __init__(self, events: AsyncIterator[ChatEvent], on_close: list[Callable[[], None]] | None = None) -> None:
        self._events = events
        self._on_close = on_close or []
        self._observers: list[Callable[[ChatEvent], None]] = []
        self._closed = False

    def observe(self, fn: Callable[[ChatEvent], None]) -> None:
        """Call `fn` with every event as it passes (metrics, logging)."""
        self._observers.append(fn)

    def on_close(self, fn: Callable[[], None]) -> None:
        if self._closed:
            fn()
        else:
            self._on_close.append(fn)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> ChatEvent:
        try:
            ev = await self._events.__anext__()
        except StopAsyncIteration:
            self._cleanup()
            raise
        for fn in self._observers:
            fn(ev)
        return ev

    async def aclose(self) -> None:
        try:
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        if self._closed:
            return
        self._closed = True
        for cb in self._on_close:
            cb()
