"""Background responses (`"background": true`) on Hearth upstreams, run by the gateway itself so
that they survive the death of their node.

The request goes to a node as a plain streamed one (`stream: true`, `background` removed, `store`
kept) through the proxy's normal path: routing, retries before the first byte, stream migration
after it (a node that dies mid-run is continued on another, same response id, item ids and
sequence numbers). A task of the gateway's, tied to no client, reads that relayed stream and
records its events in an `EventLog` per response (the node's own class and caps,
`hearth.protocols.responses_log`), each response object in them marked `background: true`.

- The creating request waits for the first event (`response.created`), or gets the refusal the
  proxy answered (a node's 4xx, the fleet's 429 / 503) and nothing is kept. Non-streamed it is
  that response (`in_progress`); streamed it follows the log, and its client leaving ends only
  its reading.
- `GET /v1/responses/{id}` answers the latest object (`in_progress` with the output so far, the
  final one once ended); `?stream=true&starting_after=N` replays the log and follows it;
  `POST .../cancel` and `/v1/cancel` cancel the task: the upstream request closes (the node
  stops its run) and the log ends as a node ends a cancelled background run
  (`response.incomplete`, status `cancelled`).
- The response object is kept in the gateway's store (`GatewayStore.save_background`):
  at the start and at the end (the store first, then the terminal event, so a reader who saw
  the end reads the final object). A GET after the events expired or the gateway restarted
  answers from it, on any gateway of the store. A gateway that stops ends its runs as `failed`
  (`server_shutdown`); one that was killed leaves rows that are failed (`server_restarted`) when
  its store next opens, or by another gateway on the database once its lease ran out (leases.py).

Foreign (openai-kind) models never come here: the translating node app runs their background
responses itself (routes.generate delegates first).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hearth.errors import BadRequest, HearthError, Unavailable
from hearth.gateway.failover.cuts.responses import TERMINAL, ResponsesCut
from hearth.gateway.protocols import parse
from hearth.gateway.store.base import GatewayStore
from hearth.gateway.tenancy import caller, owns
from hearth.gateway.turn.proxy import Proxy
from hearth.http.sse import EventStreamResponse
from hearth.protocols.responses_log import (
    KEEP_AFTER_END,
    SHUTDOWN_ERROR,
    SHUTDOWN_GRACE,
    EventLog,
    EventLogs,
    EventsExpired,
    stream_query,
)
from hearth.tenants import Caller

log = logging.getLogger("hearth.gateway")

CANCEL_SETTLE_SECONDS = 5.0  # how long a cancel waits for the run to record its end (as a node's)
RESPONSES_PATHS = ("/v1/responses", "/responses")


def is_background(path: str, body: dict[str, Any]) -> bool:
    return path in RESPONSES_PATHS and body.get("background") is True


@dataclass(eq=False, slots=True)
class RelayedRun:
    """One background response the gateway runs: its log, what the client has been sent of it
    (`cut`, for the output so far and a cancel's closing events) and its latest object."""

    response: dict[str, Any]  # response.created's; the final one once ended
    log: EventLog
    task: asyncio.Task[None]
    cut: ResponsesCut = field(default_factory=ResponsesCut)
    reason: str | None = None  # why the gateway ends it: "cancel" or "shutdown"

    def current(self) -> dict[str, Any]:
        if self.log.closed:
            return self.response
        output = self.cut.output()
        return {**self.response, "output": output,
                "output_text": "".join(p.get("text") or "" for i in output if i.get("type") == "message"
                                       for p in i.get("content") or [] if p.get("type") == "output_text")}


class RelayedBackground:
    """Background responses the gateway runs on Hearth upstreams (relayed from a node's stream;
    the node's own are `hearth.api.openai.background_runs.BackgroundRuns`)."""

    def __init__(self, proxy: Proxy, store: GatewayStore, heartbeat: float | None,
                 logs: EventLogs | None = None) -> None:
        self.proxy, self.store, self.heartbeat = proxy, store, heartbeat
        self.logs = logs or EventLogs()
        self._runs: dict[str, RelayedRun] = {}  # live runs, by response id
        self._tasks: set[asyncio.Task[None]] = set()  # every task, before its first event too

    async def running(self, response_id: str, who: Caller) -> bool:
        return response_id in self._runs and await owns(self.store, who, "background", response_id)

    # ---- create ----------------------------------------------------------------------------------

    async def create(self, request: Request, body: dict[str, Any]) -> Response:
        if body.get("store") is False:  # the node's own check, before anything is sent
            raise BadRequest("background responses must be stored: background requires store to be true",
                             param="background")
        upstream = {k: v for k, v in body.items() if k != "background"}
        turn = await self.proxy.turn(request, {**upstream, "stream": True})
        begun: asyncio.Future[RelayedRun | Response] = asyncio.get_running_loop().create_future()
        begun.add_done_callback(lambda f: f.cancelled() or f.exception())  # its creator may have left
        task = asyncio.create_task(self._drive(turn, begun), name="gateway background response")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        first = await asyncio.shield(begun)
        if isinstance(first, Response):
            return first
        if body.get("stream") is True:
            return EventStreamResponse(first.log.follow(), heartbeat=self.heartbeat)
        return JSONResponse(first.response if first.log.closed else first.current())

    async def _drive(self, turn: Any, begun: asyncio.Future[RelayedRun | Response]) -> None:
        try:
            answer = await self.proxy.serve(turn)
        except BaseException as e:
            if not begun.done():
                begun.set_exception(e if isinstance(e, Exception) else Unavailable(
                    "the gateway is shutting down", code="upstream_failed", retry_after=2))
            if not isinstance(e, Exception):
                raise
            return
        if not isinstance(answer, EventStreamResponse):  # the node's refusal: the creator's answer
            begun.set_result(answer)
            return
        chunks, run = answer.chunks, None
        try:
            async for chunk in chunks:
                events = _events(chunk)
                if run is None and events:
                    run = await self._begin(events[0], begun, turn.who.tenant)
                if run is not None:
                    await self._record(run, events)
            if run is not None and not run.log.closed:  # the relay always ends with a terminal event
                await self._end(run, "failed", _error("the upstream stream ended without its final event"))
        except asyncio.CancelledError:
            if run is None:
                raise
            await self._end(run, "cancelled" if run.reason == "cancel" else "failed", SHUTDOWN_ERROR)
            if run.reason is None:
                raise
        except Exception as e:
            log.exception("background response %s failed", run.response["id"] if run else "(not begun)")
            if run is not None:
                await self._end(run, "failed", _error(f"{type(e).__name__}: {e}"))
            elif not begun.done():
                begun.set_exception(e)
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(aclose())
            if run is not None:
                self._runs.pop(run.response["id"], None)
            if not begun.done():
                begun.set_exception(Unavailable("the upstream ended the stream before the response began",
                                                code="upstream_failed", retry_after=2))

    async def _begin(self, first: dict[str, Any], begun: asyncio.Future[RelayedRun | Response],
                     owner: str) -> RelayedRun:
        response = first.get("response")
        if first.get("type") != "response.created" or not isinstance(response, dict) or \
                not isinstance(response.get("id"), str):
            raise ValueError(f"the stream began with {first.get('type')!r}, not response.created")
        task = asyncio.current_task()
        assert task is not None
        run = RelayedRun({**response, "background": True}, self.logs.open(response["id"]), task)
        await self.store.save_background(run.response)  # a database away: no run (the creator's 503)
        self._runs[response["id"]] = run
        await self.store.set_owner("background", response["id"], owner)
        begun.set_result(run)
        return run

    async def _record(self, run: RelayedRun, events: list[dict[str, Any]]) -> None:
        """Append one read's events; the terminal one's response stored first."""
        for d in events:
            if isinstance(d.get("response"), dict):
                d["response"] = {**d["response"], "background": True}
            run.cut.take(d["type"], d)
            if d["type"] in TERMINAL:
                run.response = d["response"]
                try:
                    await self.store.save_background(run.response)
                except HearthError as e:  # the database is away: readers of this gateway still see the end
                    log.warning("background response %s: its end is not stored: %s", run.response["id"], e)
        if run.log.closed:
            return
        run.log.append(events)
        if run.cut.done:
            self.logs.close(run.log)

    async def _end(self, run: RelayedRun, status: str, error: dict[str, str]) -> None:
        """End `run` here, as a node ends a background run cut short: its open item closed as
        incomplete, then `response.incomplete` (status cancelled) or `response.failed`."""
        if run.log.closed:
            return
        closing = run.cut.closing("incomplete")
        for e in closing:
            run.cut.take(e["type"], e)
        r = {**run.current(), "status": status, "completed_at": None, "usage": None,
             "incomplete_details": {"reason": "cancelled"} if status == "cancelled" else None,
             "error": None if status == "cancelled" else error}
        terminal = "response.incomplete" if status == "cancelled" else "response.failed"
        await self._record(run, [*closing, {"type": terminal, "response": r}])
        if not run.log.closed:  # _record closes on a terminal event; cut.done says it saw one
            self.logs.close(run.log)

    # ---- GET, cancel, shutdown -------------------------------------------------------------------

    async def answer(self, request: Request) -> Response | None:
        """`/v1/responses/{id}…` for a response the gateway runs or ran; None for any other."""
        rid: str = request.path_params["response_id"]
        if not await owns(self.store, caller(request), "background", rid):
            return None  # another tenant's: the node is asked, as the caller, and does not know it
        run = self._runs.get(rid)
        stored = run.current() if run is not None else await self.store.background(rid)
        if stored is None:
            return None
        if request.method == "DELETE":  # the node's stored copy goes as today (edge/)
            if run is not None:
                await self.cancel(rid)
            await self.store.drop_background(rid)
            return None
        if request.method == "POST":
            return JSONResponse(await self.cancel(rid))
        stream, after = stream_query(request.query_params)
        if not stream:
            return JSONResponse(stored)
        events = self.logs.get(rid)
        if events is None:
            raise EventsExpired(f"the events of {rid} are no longer kept (they are kept {KEEP_AFTER_END:g} s after "
                                "the run ends, and not across a restart): GET it without stream", param="stream")
        events.check(after)
        return EventStreamResponse(events.follow(after), heartbeat=self.heartbeat)

    async def cancel(self, response_id: str) -> dict[str, Any] | None:
        """Cancel the run and return its response as it ends (as it is, if it already ended
        or does not end within CANCEL_SETTLE_SECONDS); None when the gateway has no such run."""
        run = self._runs.get(response_id)
        if run is None:
            return await self.store.background(response_id)
        if not run.log.closed and run.reason is None:
            run.reason = "cancel"
            run.task.cancel()
        await asyncio.wait((run.task,), timeout=CANCEL_SETTLE_SECONDS)
        return run.current()

    async def shutdown(self, grace: float = SHUTDOWN_GRACE) -> None:
        """The gateway stops: every run ends as failed (`server_shutdown`), recorded before the
        store closes."""
        for run in self._runs.values():
            run.reason = run.reason or "shutdown"
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace)


def _error(message: str) -> dict[str, str]:
    return {"code": "server_error", "message": message}


def _events(chunk: bytes) -> list[dict[str, Any]]:
    """The events of one relayed read, parsed (heartbeat comments left out)."""
    out: list[dict[str, Any]] = []
    for raw in chunk.split(b"\n\n"):
        if not raw or raw.startswith(b":"):
            continue
        name, d = parse(raw)
        if isinstance(d, dict):
            d.setdefault("type", name)
            out.append(d)
    return out
