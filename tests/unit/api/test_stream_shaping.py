"""Flush control and held reasoning regroup events without changing what they add up to."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from hearth.api.http import stream_shaping
from hearth.api.http.stream_shaping import coalesce, hold_reasoning
from hearth.chat.types import ChatEvent, Done, Finish, ReasoningDelta, Started, TextDelta, ToolCallDelta, Usage


async def source(events: list[ChatEvent], gaps: dict[int, float] | None = None) -> AsyncIterator[ChatEvent]:
    for i, ev in enumerate(events):
        if gaps and i in gaps:
            await asyncio.sleep(gaps[i])
        yield ev


def tokens(n: int) -> list[ChatEvent]:
    return [TextDelta(0, f"t{i} ", n_tokens=1) for i in range(n)]


async def drain(it: AsyncIterator[ChatEvent]) -> list[ChatEvent]:
    return [ev async for ev in it]


def text(events: list[ChatEvent]) -> str:
    return "".join(ev.text for ev in events if isinstance(ev, TextDelta))


async def test_every_n_tokens_sends_the_first_at_once_then_groups() -> None:
    evs = [Started(3), *tokens(10), Finish(0, "stop"), Done(Usage())]
    out = await drain(coalesce(source(evs), 4, None))
    deltas = [ev for ev in out if isinstance(ev, TextDelta)]
    assert [d.n_tokens for d in deltas] == [1, 4, 4, 1]  # the first alone, the rest before the finish
    assert text(out) == text(evs)
    assert isinstance(out[0], Started) and isinstance(out[-2], Finish) and isinstance(out[-1], Done)


async def test_every_ms_sends_what_is_held_when_the_model_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why this cannot flake: coalesce's clock is frozen, so the three first tokens arrive
    "at once" however slowly this loop runs (a real clock let a stall of 100 ms split them);
    and the model's pause lasts until the client has received the held delta (not a fixed
    0.5 s raced against the 100 ms flush timer). If the held delta were only sent with the
    next tokens, the source would wait for ever and the test would hit its deadline."""
    monkeypatch.setattr(stream_shaping, "time", SimpleNamespace(monotonic=lambda: 1000.0))
    evs = [*tokens(3), *tokens(2), Finish(0, "stop")]
    got: list[ChatEvent] = []
    resumed = asyncio.Event()

    async def pausing() -> AsyncIterator[ChatEvent]:
        for i, ev in enumerate(evs):
            if i == 3:  # the model pauses until the held tokens reached the client
                await resumed.wait()
                got.append(Started(0))  # marks where the model went on
            yield ev

    async def consume() -> None:
        async for ev in coalesce(pausing(), None, 100):
            got.append(ev)
            if isinstance(ev, TextDelta) and ev.n_tokens == 2 and not resumed.is_set():
                resumed.set()

    await asyncio.wait_for(consume(), 30)
    deltas = [ev.n_tokens for ev in got if isinstance(ev, TextDelta)]
    # the first token at once; the two after it when their 100 ms were up, before the model
    # sent anything more; the last two with the finish
    assert deltas == [1, 2, 2]
    assert [type(ev).__name__ for ev in got] == ["TextDelta", "TextDelta", "Started", "TextDelta", "Finish"]
    assert text(got) == text(evs)


async def test_kinds_and_candidates_are_never_merged_together() -> None:
    evs: list[ChatEvent] = [TextDelta(0, "a", n_tokens=1), ReasoningDelta(0, "r", 1), ReasoningDelta(0, "s", 1),
                            TextDelta(1, "b", n_tokens=1), ToolCallDelta(0, 0, "c1", "f", "{"),
                            ToolCallDelta(0, 0, arguments='"x"'), ToolCallDelta(0, 0, arguments="}")]
    out = await drain(coalesce(source(evs), 100, None))
    assert [type(e).__name__ for e in out] == ["TextDelta", "ReasoningDelta", "TextDelta", "ToolCallDelta"]
    assert out[-1] == ToolCallDelta(0, 0, "c1", "f", '{"x"}')


async def test_held_reasoning_arrives_whole_before_the_answer() -> None:
    evs: list[ChatEvent] = [Started(1), ReasoningDelta(0, "think ", 1), ReasoningDelta(1, "other", 1),
                            ReasoningDelta(0, "more", 1), TextDelta(0, "answer", n_tokens=1),
                            Finish(0, "stop"), Finish(1, "stop"), Done(Usage())]
    out = await drain(hold_reasoning(source(evs)))
    assert out[1] == ReasoningDelta(0, "think more", 2) and out[2] == TextDelta(0, "answer", n_tokens=1)
    assert out[4] == ReasoningDelta(1, "other", 1) and out[5] == Finish(1, "stop")
