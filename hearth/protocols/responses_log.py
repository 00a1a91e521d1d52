"""The recorded stream events of background responses (a node's and the gateway's), for
`GET /v1/responses/{id}?stream=true&starting_after=N`: each run appends its numbered SSE events
to an `EventLog`, and any number of readers replay it from a sequence number and then follow it
live until its terminal event.

Bounds (a log lives in memory; the response itself is in SQLite, `responses_store`):
- one log keeps at most `max_bytes` of encoded events (MAX_EVENT_BYTES); past that its oldest
  events are dropped, and a read that starts before the oldest one kept is refused
  (`EventsExpired`, 410) rather than skip events;
- a log is kept while its run is live, then for `keep_seconds` (KEEP_AFTER_END) after its
  terminal event, and at most `max_ended_bytes` of ended logs in all (MAX_ENDED_BYTES, the
  oldest ended first). A node that restarts has none: its background responses' events are gone
  (GET without `stream` still answers from the store).

Invariant: every reader gets each event at most once and in order, and, unless refused or
overtaken by the byte cap, every event after its starting point exactly once, then the end. All
of this runs on the event loop: no locks, and a reader checks and waits with no await between.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from hearth.errors import BadRequest, HearthError
from hearth.http.sse import sse_event

MAX_EVENT_BYTES = 16 * 1024 * 1024  # per response
KEEP_AFTER_END = 600.0  # seconds a finished run's events stay replayable (OpenAI keeps ~10 minutes)
MAX_ENDED_BYTES = 256 * 1024 * 1024  # ended logs in all


class EventsExpired(HearthError):
    """The events asked for are no longer kept."""

    status = 410
    code = "events_expired"


class EventLog:
    """One response's SSE events, numbered from 0 as they are appended."""

    def __init__(self, response_id: str, max_bytes: int = MAX_EVENT_BYTES) -> None:
        self.response_id = response_id
        self.max_bytes = max_bytes
        self._events: list[bytes] = []
        self._start = 0  # index in _events of the oldest kept event (dropped ones are compacted lazily)
        self._first = 0  # sequence number of _events[_start]
        self.next_seq = 0
        self.nbytes = 0
        self.closed = False
        self.ended_at: float | None = None
        self._wake = asyncio.Event()

    @property
    def first_kept(self) -> int:
        """The sequence number of the oldest event kept (`next_seq` when none is)."""
        return self._first

    def append(self, events: list[dict[str, Any]]) -> None:
        """Number and record `events` (dicts with `type`), and wake the readers."""
        if self.closed:
            raise RuntimeError(f"{self.response_id}: the event log is closed")
        if not events:
            return
        for e in events:
            data = sse_event(e["type"], {**e, "sequence_number": self.next_seq})
            self._events.append(data)
            self.nbytes += len(data)
            self.next_seq += 1
        self._trim()
        self._notify()

    def close(self, now: float) -> None:
        """The run has ended (its terminal event is the last appended)."""
        if not self.closed:
            self.closed, self.ended_at = True, now
            self._notify()

    def _notify(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    def _trim(self) -> None:
        while self.nbytes > self.max_bytes and self._start < len(self._events) - 1:  # the newest always stays
            self.nbytes -= len(self._events[self._start])
            self._start += 1
            self._first += 1
        if self._start > 1024 and self._start * 2 > len(self._events):
            del self._events[:self._start]
            self._start = 0

    def check(self, after: int) -> None:
        """Raise EventsExpired unless every event after `after` is still kept."""
        if after + 1 < self._first:
            raise EventsExpired(
                f"the events of {self.response_id} before sequence number {self._first} are no longer kept "
                f"(at most {self.max_bytes} bytes of events per response): resume from a later one, or GET "
                "the response without stream", param="starting_after")

    def since(self, after: int) -> list[bytes]:
        """The events numbered after `after` (all kept ones: `check` first)."""
        pos = max(after + 1, self._first)
        return self._events[self._start + pos - self._first:]

    async def follow(self, after: int = -1) -> AsyncIterator[bytes]:
        """The events after `after`, then each new one as it comes (several at once when they
        came together), until the log is closed. A reader the byte cap overtakes (it fell
        `max_bytes` behind) ends there, without its terminal event: resuming then is refused.
        Call `check(after)` first: a refused start ends the stream at once."""
        pos = after + 1
        while True:
            wake = self._wake
            if pos < self._first:
                return
            batch = self.since(pos - 1)
            if batch:
                pos += len(batch)
                yield b"".join(batch)
                continue
            if self.closed:
                return
            await wake.wait()


class EventLogs:
    """The logs of the node's background responses: live ones, and ended ones for a while."""

    def __init__(self, max_bytes: int = MAX_EVENT_BYTES, keep_seconds: float = KEEP_AFTER_END,
                 max_ended_bytes: int = MAX_ENDED_BYTES, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes, self.keep_seconds, self.max_ended_bytes = max_bytes, keep_seconds, max_ended_bytes
        self.clock = clock
        self._live: dict[str, EventLog] = {}
        self._ended: OrderedDict[str, EventLog] = OrderedDict()  # oldest ended first
        self._ended_bytes = 0

    def open(self, response_id: str) -> EventLog:
        log = EventLog(response_id, self.max_bytes)
        self._live[response_id] = log
        return log

    def close(self, log: EventLog) -> None:
        """`log`'s run ended: kept for `keep_seconds`, within the ended logs' byte budget."""
        log.close(self.clock())
        if self._live.pop(log.response_id, None) is log:
            self._ended[log.response_id] = log
            self._ended_bytes += log.nbytes
        self._purge()

    def get(self, response_id: str) -> EventLog | None:
        self._purge()
        return self._live.get(response_id) or self._ended.get(response_id)

    def __len__(self) -> int:
        self._purge()
        return len(self._live) + len(self._ended)

    def _purge(self) -> None:
        expiry = self.clock() - self.keep_seconds
        while self._ended:
            rid, log = next(iter(self._ended.items()))
            if self._ended_bytes <= self.max_ended_bytes and (log.ended_at or 0.0) > expiry:
                break
            del self._ended[rid]
            self._ended_bytes -= log.nbytes


SHUTDOWN_GRACE = 10.0  # seconds a shutting-down server waits for its background runs to record their end
# The error of a background response cut by its server's shutdown (node or gateway)...
SHUTDOWN_MESSAGE = "the server shut down before the response finished"
SHUTDOWN_ERROR = {"code": "server_shutdown", "message": SHUTDOWN_MESSAGE}
# ... and of one its server never finished recording (it stopped; found at the next start).
ORPHAN_ERROR = {"code": "server_restarted", "message": "the server stopped before the response finished"}


def stream_query(query: Mapping[str, str]) -> tuple[bool, int]:
    """`GET /v1/responses/{id}`'s `stream` (`true` / `false`, default false) and `starting_after`
    (an integer >= 0; -1 when absent: from the first event). Other parameters (`include`,
    `include_obfuscation`) are accepted and ignored."""
    raw = query.get("stream", "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise BadRequest(f"stream must be true or false, not {raw[:40]!r}", param="stream")
    after = query.get("starting_after")
    if after is None:
        return raw in ("true", "1"), -1
    if not after.isascii() or not after.isdigit() or len(after) > 18:
        raise BadRequest(f"starting_after must be an integer >= 0, not {after[:40]!r}", param="starting_after")
    return raw in ("true", "1"), int(after)
