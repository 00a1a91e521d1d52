"""The event log of background responses: numbering, replay from a sequence number, the byte cap,
following the live run with each event delivered once, concurrent readers, retention."""

from __future__ import annotations

import asyncio
import json

import pytest

from hearth.errors import BadRequest
from hearth.protocols.responses_log import EventLog, EventLogs, EventsExpired, stream_query


def ev(i: int) -> dict[str, object]:
    return {"type": "response.output_text.delta", "delta": f"t{i}"}


def seqs(chunks: list[bytes]) -> list[int]:
    out = []
    for block in b"".join(chunks).split(b"\n\n"):
        if block:
            out.append(json.loads(block.split(b"data: ", 1)[1])["sequence_number"])
    return out


async def read_all(log: EventLog, after: int = -1) -> list[bytes]:
    return [chunk async for chunk in log.follow(after)]


async def test_events_are_numbered_and_replayed_after_a_sequence_number() -> None:
    log = EventLog("resp_x")
    log.append([ev(i) for i in range(5)])
    log.close(0.0)
    assert log.next_seq == 5
    assert seqs(await read_all(log)) == [0, 1, 2, 3, 4]
    assert seqs(await read_all(log, 2)) == [3, 4]
    assert seqs(await read_all(log, 4)) == []
    assert seqs(await read_all(log, 99)) == []
    first = (await read_all(log))[0]
    assert first.startswith(b"event: response.output_text.delta\ndata: ") and b'"sequence_number":0' in first


async def test_the_byte_cap_drops_the_oldest_and_refuses_reads_before_them() -> None:
    log = EventLog("resp_x", max_bytes=500)
    for i in range(40):
        log.append([ev(i)])
    assert log.nbytes <= 500 and log.first_kept > 0 and log.next_seq == 40
    with pytest.raises(EventsExpired):
        log.check(log.first_kept - 2)
    log.check(log.first_kept - 1)  # exactly the oldest kept: fine
    log.close(0.0)
    assert seqs(await read_all(log, log.first_kept - 1)) == list(range(log.first_kept, 40))


async def test_the_newest_event_is_kept_even_past_the_cap() -> None:
    log = EventLog("resp_x", max_bytes=10)
    log.append([ev(0), ev(1)])
    assert log.first_kept == 1 and log.since(-1) and seqs(log.since(-1)) == [1]


async def test_compaction_keeps_replay_right() -> None:
    log = EventLog("resp_x", max_bytes=50_000)
    for i in range(5000):
        log.append([ev(i)])
    first = log.first_kept
    assert first > 1024  # the list was compacted at least once
    log.close(0.0)
    assert seqs(await read_all(log, first - 1)) == list(range(first, 5000))
    assert seqs(await read_all(log, 4990)) == list(range(4991, 5000))


async def test_a_follower_gets_each_live_event_exactly_once_then_the_end() -> None:
    log = EventLog("resp_x")
    log.append([ev(0), ev(1)])
    got: list[bytes] = []

    async def reader() -> None:
        async for chunk in log.follow(0):
            got.append(chunk)

    task = asyncio.create_task(reader())
    i = 2
    for size in (1, 3, 1, 5, 2, 8, 1, 1, 4):  # batches, the reader sometimes waiting, sometimes behind
        log.append([ev(k) for k in range(i, i + size)])
        i += size
        if size % 2:
            await asyncio.sleep(0)
    log.close(0.0)
    await asyncio.wait_for(task, 5)
    assert seqs(got) == list(range(1, i))


async def test_concurrent_readers_from_different_points() -> None:
    log = EventLog("resp_x")
    starts = [-1, 0, 5, 20]
    tasks = [asyncio.create_task(read_all(log, s)) for s in starts]
    for i in range(30):
        log.append([ev(i)])
        if i % 4 == 0:
            await asyncio.sleep(0)
    log.close(0.0)
    results = await asyncio.wait_for(asyncio.gather(*tasks), 5)
    for s, chunks in zip(starts, results, strict=True):
        assert seqs(chunks) == list(range(s + 1, 30))


async def test_a_reader_overtaken_by_the_cap_ends_without_skipping() -> None:
    log = EventLog("resp_x", max_bytes=300)
    log.append([ev(0)])
    stream = log.follow(-1)
    first = await anext(stream)
    assert seqs([first]) == [0]
    for i in range(1, 40):  # the reader does not read meanwhile: it falls behind the cap
        log.append([ev(i)])
    log.close(0.0)
    assert [c async for c in stream] == []  # it ends rather than skip the dropped events


async def test_appending_to_a_closed_log_is_a_bug() -> None:
    log = EventLog("resp_x")
    log.close(0.0)
    with pytest.raises(RuntimeError):
        log.append([ev(0)])


async def test_ended_logs_are_kept_for_a_while_within_a_byte_budget() -> None:
    now = [0.0]
    logs = EventLogs(keep_seconds=60, max_ended_bytes=3000, clock=lambda: now[0])
    a, b = logs.open("resp_a"), logs.open("resp_b")
    a.append([ev(i) for i in range(10)])
    b.append([ev(i) for i in range(10)])
    assert logs.get("resp_a") is a and len(logs) == 2
    logs.close(a)
    now[0] = 30.0
    logs.close(b)
    assert logs.get("resp_a") is a  # ended, within its time
    now[0] = 61.0
    assert logs.get("resp_a") is None and logs.get("resp_b") is b  # a's time is up, b's is not
    c = logs.open("resp_c")
    c.append([ev(i) for i in range(40)])  # more than the ended budget on its own
    assert logs.get("resp_c") is c  # live logs are never dropped
    logs.close(c)
    assert logs.get("resp_b") is None and logs.get("resp_c") is None  # over budget: oldest ended first


def test_stream_query() -> None:
    assert stream_query({}) == (False, -1)
    assert stream_query({"stream": "true", "starting_after": "7"}) == (True, 7)
    assert stream_query({"stream": "False"}) == (False, -1)
    assert stream_query({"stream": "1", "starting_after": "0", "include_obfuscation": "false"}) == (True, 0)
    for bad in ({"stream": "yes"}, {"starting_after": "-1"}, {"starting_after": "x"}, {"starting_after": "1e3"},
                {"starting_after": "٣"}, {"starting_after": "9" * 40}):
        with pytest.raises(BadRequest):
            stream_query(bad)
