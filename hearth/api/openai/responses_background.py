"""Background responses (`"background": true`): the run belongs to the node, not to a client.

The request is checked as any other; then its run is a task of the node's (`BackgroundRuns`):
it waits for a slot like any run (the stored response says `queued` meanwhile), runs under the
request's time cap, and can be cancelled by `POST /v1/responses/{id}/cancel` or `/v1/cancel`.
Its events go to an `EventLog` (`hearth.protocols.responses_log`), its state to the store: `in_progress` once
admitted, the final object at its end (the store first, then the terminal event, so a reader
who saw the end reads the final object).

The creating request waits for the admission only, so that a bad request, a full queue or a
node that is not ready is still its own 4xx / 429 / 503 (and nothing is kept). If its client
left while it waited, the run goes on, and such a failure is recorded as a `failed` response.
Then a non-streamed request gets the response as it was admitted (`in_progress`); a streamed one
reads the event log from the start, and a disconnect ends only its reading.

How each run ends: its own outcome (`completed`, `incomplete`, `failed`); a client's cancel is
`cancelled`; a node shutting down (`BackgroundRuns.shutdown`) is `failed` with
`server_shutdown`; a node killed outright leaves `queued` / `in_progress` rows, which the store
marks `failed` the next time it opens (`ResponseStore`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hearth.api.context import NodeContext
from hearth.api.http import runs
from hearth.api.http.cancels import LiveRun
from hearth.api.openai.responses_stream import ResponseAssembler
from hearth.chat.types import ChatRequest
from hearth.errors import HearthError
from hearth.protocols.responses_log import SHUTDOWN_ERROR, SHUTDOWN_MESSAGE, EventLog
from hearth.tenants import OPEN, Caller

log = logging.getLogger("hearth.api")



@dataclass(eq=False, slots=True)
class Launched:
    """A background run as its creating request sees it."""

    log: EventLog
    # Done once the run is admitted (result: the response as it was then) or refused (exception).
    admitted: asyncio.Future[dict[str, Any]] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


def launch(ctx: NodeContext, creq: ChatRequest, cancel_id: str | None, asm: ResponseAssembler,
           settle: Callable[[], None], who: Caller = OPEN) -> Launched:
    """Start the background run of `creq` (already keyed, `runs.keyed`), whose stored row
    (status `queued`) the caller `who` has written. `settle` runs once its outcome is stored."""
    rid = creq.request_id
    sid = who.session_key(creq.session.session_id) if creq.session else None  # as stored (hearth.tenants)
    run = ctx.cancels.open(cancel_id=cancel_id, session_id=sid, ids=[rid], owner=who.tenant)
    launched = Launched(ctx.background.logs.open(rid))
    task = asyncio.create_task(_drive(ctx, creq, run, asm, launched, settle, time.monotonic(), who),
                               name=f"background {rid}")
    ctx.background.add(rid, task, run.token)
    return launched


async def _drive(ctx: NodeContext, creq: ChatRequest, run: LiveRun, asm: ResponseAssembler, launched: Launched,
                 settle: Callable[[], None], arrived: float, who: Caller) -> None:
    store, events_log = ctx.responses, launched.log

    def end(tail: list[dict[str, Any]]) -> None:
        store.update(asm.response)  # the store first: whoever saw the terminal event reads the final object
        events_log.append(tail)
        ctx.background.logs.close(events_log)
        settle()

    try:
        gen = await runs.start_detached(ctx, "responses", creq, run, arrived, who.key_name, who.on_behalf)
    except BaseException as e:
        shutdown = run.token.reason == "shutdown" or isinstance(e, asyncio.CancelledError)
        message = SHUTDOWN_MESSAGE if shutdown else (e.message if isinstance(e, HearthError) else repr(e))
        events_log.append(asm.start())
        refused = asm.fail(message)
        if shutdown:
            asm.response["error"] = {"code": "server_shutdown", "message": message}
        elif isinstance(e, HearthError):  # the 4xx / 429 / 503 its request got, if it was still there
            asm.response["error"] = {"code": e.code, "message": message}
        end(refused)
        if isinstance(e, asyncio.CancelledError):
            launched.admitted.cancel()
            raise
        launched.admitted.set_exception(e)
        launched.admitted.exception()  # marked retrieved: its creating request may have left
        return
    store.update(asm.response)  # in_progress
    launched.admitted.set_result(copy.deepcopy(asm.response))
    events_log.append(asm.start())
    tail: list[dict[str, Any]] = []
    try:
        async for ev in gen.events:
            batch = asm.feed(ev)
            if batch:
                events_log.append(batch)
        if run.token.reason == "shutdown":
            tail = asm.fail(SHUTDOWN_MESSAGE)
        else:
            if run.token.reason == "cancel_call":
                asm.cancelled_as = "cancelled"
            tail = asm.finish()
    except asyncio.CancelledError:  # the node shuts down and the run did not end in time
        tail = asm.fail(SHUTDOWN_MESSAGE)
        raise
    except Exception as e:
        log.exception("background response %s failed", creq.request_id)
        tail = asm.fail(f"{type(e).__name__}: {e}")
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(gen.events.aclose())  # the slot goes back even if this task is cancelled
        if asm.error == SHUTDOWN_MESSAGE:
            asm.response["error"] = dict(SHUTDOWN_ERROR)
        end(tail)
