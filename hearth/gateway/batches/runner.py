"""The gateway's batch runner: each batch a task that sends its lines through the gateway's own
app (hearth/http/batches/dispatch.py: the route, its checks, the caller's tenant and key limits,
then the turn path that picks a node, retries on another before the first byte and moves a
broken stream), as `service_tier: "flex"`, and records each answer in the store before counting
it (store/batches.py). So a batch's lines spread over every node that serves the model, as the
gateway's routing places them, and fill what interactive traffic leaves (the nodes admit `flex`
last and pause it for others).

Statuses and files are the node's (hearth/api/batches/runner.py; OpenAI's): `validating` →
`in_progress` → `finalizing` → `completed`, or `cancelling` → `cancelled`, `expired` past the
completion window (unstarted lines in the error file as `batch_expired`), `failed` when the
saved input cannot be read.

A node's death: the lines it had finished are recorded and never sent again; a line in flight
on it is retried by the turn path on another node, or its answer is a 429 / 502 / 503 / 504 (no
node could take it yet, or it broke where it cannot be continued), which is not the line's
answer: the runner sends it again, backing off, until the batch is cancelled or expires.

Several gateways on one database: the batch is run by the gateway that created it
(`batches.gateway`); a batch whose gateway is gone (its lease in `gateways` ran out, or this
gateway before a restart) is adopted at start and every `adopt_interval` seconds, and resumes
where the records say. A cancel on any gateway writes `cancelling` to the store; the running
gateway reads the status before each line.

A batch whose key is gone (removed from the key file of the gateway that runs it: by a reload,
hearth/http/keyring.py, which replaces `key_names`, or between two starts) runs no more lines:
when a gateway takes it up (its own at start, or one adopted), before each line and before a
refused line is sent again, the key's name is looked up; once it is missing the batch
ends `failed` with an `errors` entry `invalid_api_key`, each line not yet run is in its error
file with that error, and the lines that finished keep their output. Its status is in the store,
so every gateway on the database answers it failed. The admin's batches, and any on a gateway
without keys, are never stopped this way.

Test gate (hearth/test_gate.py): before line `i` (0-based) starts, `gateway-batch-line-<i>`
(the batch's task waits there holding its slot, so no later line starts either).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.types import ASGIApp

from hearth.errors import Conflict
from hearth.gateway.fleet.periodic import Periodic
from hearth.gateway.store.batches import LIVE, BatchRow, BatchTables
from hearth.http.batches import dispatch
from hearth.http.batches.lines import Line, dumps
from hearth.http.batches.pace import run_lines
from hearth.http.batches.requests import EXPIRED, SERVICE_TIER, derived_file_id, line_out
from hearth.tenants import Caller

log = logging.getLogger("hearth.gateway")

RETRY_FIRST = 0.25  # seconds before the first retry of a refused line; doubled up to RETRY_MAX
RETRY_MAX = 8.0
RETRY_STATUSES = (429, 502, 503, 504)  # not a line's answer: nothing could run it yet


def caller_json(who: Caller) -> dict[str, Any]:
    """The caller a batch's lines run as (no key: its name, tenant and class)."""
    return {"tenant": who.tenant, "key_name": who.key_name, "admin": who.admin, "shared_cache": who.shared_cache,
            "weight": who.weight, "priority": who.priority, "max_priority": who.max_priority}


def caller_of(obj: dict[str, Any]) -> Caller:
    return Caller(str(obj.get("tenant", "")), obj.get("key_name"), bool(obj.get("admin")),
                  bool(obj.get("shared_cache")), weight=float(obj.get("weight", 1.0)),
                  priority=str(obj.get("priority", "default")), max_priority=str(obj.get("max_priority", "default")))


def key_gone(who: Caller, key_names: frozenset[str]) -> dict[str, Any] | None:
    """The error of a batch whose creating key this gateway no longer has (None while it has it,
    when it has no keys at all, or for the admin)."""
    if not key_names or who.admin or who.key_name is None or who.key_name in key_names:
        return None
    return {"code": "invalid_api_key",
            "message": f"the API key {who.key_name!r} that created this batch is no longer configured: the batch "
                       "was stopped, and its lines not yet run were not run"}


def read_line(index: int, raw: bytes) -> Line:
    """Request `index` of a batch's input, as the upload checked it."""
    rec = json.loads(raw)
    return Line(index, str(rec["custom_id"]), str(rec["url"]), dict(rec["body"]))


class GatewayBatches:
    def __init__(self, tables: BatchTables, concurrency: int = 4, adopt_interval: float = 15.0,
                 clock: Callable[[], float] = time.time, key_names: frozenset[str] = frozenset()) -> None:
        self.tables = tables
        self.key_names = key_names  # the client keys' names this gateway has (key_gone)
        self.concurrency = max(1, concurrency)
        self.clock = clock
        self.app: ASGIApp | None = None
        self._slots: asyncio.Semaphore | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._adopter = Periodic(adopt_interval, self.adopt, "adopting batches")
        self.stopping = False  # set by `shutdown`: answers from now on may be cut short, not recorded
        # lines this gateway recorded, by (tenant, "completed" or "failed"): /metrics (metrics.py)
        self.lines: dict[tuple[str, str], int] = {}

    def now(self) -> int:
        return int(self.clock())

    @property
    def running(self) -> int:
        """Batches this gateway runs now."""
        return len(self._tasks)

    async def public(self, row: BatchRow) -> dict[str, Any]:
        """The batch object with its counts as the records say."""
        completed, failed = await self.tables.counts(row.obj["id"])
        counts = {"total": row.obj["request_counts"]["total"], "completed": completed, "failed": failed}
        return {**row.obj, "request_counts": counts}

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self, app: ASGIApp) -> None:
        """Bind the gateway's app (the lines' path) and run every live batch no live gateway runs."""
        self.app = app
        await self.adopt()
        self._adopter.start()

    async def adopt(self) -> None:
        for batch_id in await self.tables.adopt():
            self.launch(batch_id)

    async def shutdown(self) -> None:
        """Stop every run where it is: its recorded lines stay; a later start (here or on another
        gateway of the database) resumes it."""
        self.stopping = True
        await self._adopter.stop()
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t

    def launch(self, batch_id: str) -> None:
        if self.app is None or self.stopping or batch_id in self._tasks:
            return
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.concurrency)
        task = asyncio.create_task(self._run(batch_id), name=f"batch {batch_id}")
        self._tasks[batch_id] = task
        task.add_done_callback(lambda t: self._ended(batch_id, t))

    def _ended(self, batch_id: str, task: asyncio.Task[None]) -> None:
        self._tasks.pop(batch_id, None)
        if not task.cancelled() and (e := task.exception()) is not None:
            log.error("batch %s stopped: %s: %s", batch_id, type(e).__name__, e)

    async def idle(self) -> None:
        """Wait until no batch runs here (tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def cancel(self, row: BatchRow) -> dict[str, Any]:
        obj = dict(row.obj)
        if obj["status"] not in ("cancelling", "cancelled"):
            if obj["status"] not in ("validating", "in_progress"):
                raise Conflict(f"Cannot cancel a batch with status '{obj['status']}'.", code="batch_not_cancellable")
            obj["status"], obj["cancelling_at"] = "cancelling", self.now()
            if not await self.tables.save(obj, only_if=("validating", "in_progress")):
                fresh = await self.tables.batch(obj["id"])  # it moved on meanwhile: answer what it is
                return await self.public(fresh) if fresh is not None else obj
            if row.gateway == self.tables.store.instance:
                self.launch(obj["id"])  # not running here (a batch is resumed by its gateway): finish it
        return await self.public(BatchRow(obj, row.owner, row.caller, row.gateway))

    # ---- the run -------------------------------------------------------------------------------

    async def _set(self, obj: dict[str, Any], status: str) -> None:
        obj["status"] = status
        obj[f"{status}_at"] = self.now()
        await self.tables.save(obj)

    async def _status(self, batch_id: str) -> str:
        row = await self.tables.batch(batch_id)
        return str(row.obj["status"]) if row is not None else "cancelled"

    async def _lines(self, batch_id: str) -> AsyncIterator[Line]:
        """The batch's requests in order, read from its copy of the input a chunk at a time
        (blank lines skipped, as the upload's check counts them)."""
        index = 0
        async for _, raw in self.tables.input_lines(batch_id):
            if raw.strip():
                yield read_line(index, raw)
                index += 1

    async def _order(self, batch_id: str) -> dict[str, int]:
        """Each request's position by custom_id (every line read once: the ids are kept, never
        the requests)."""
        return {line.custom_id: line.index async for line in self._lines(batch_id)}

    async def _run(self, batch_id: str) -> None:
        row = await self.tables.batch(batch_id)
        if row is None or row.obj["status"] not in LIVE:
            return
        obj = row.obj
        if obj["status"] == "validating":
            await self._set(obj, "in_progress")
        try:
            order = await self._order(batch_id)
        except (ValueError, KeyError, TypeError) as e:
            obj["errors"] = {"object": "list", "data": [{"code": "invalid_input", "message": f"the batch's saved "
                                                         f"input cannot be read: {e}", "param": None, "line": None}]}
            await self._set(obj, "failed")
            return
        who = caller_of(row.caller)
        expired = False
        if obj["status"] == "in_progress":
            expired = await self._send_all(obj, who, order)
        if self.stopping:
            return
        fresh = await self.tables.batch(batch_id)  # a cancel on any gateway is in the store
        obj = fresh.obj if fresh is not None else obj
        if obj["status"] == "in_progress" and (gone := key_gone(who, self.key_names)) is not None:
            await self._stop_for_key(obj, row.owner, order, gone)
        elif obj["status"] == "cancelling":
            await self._finish(obj, row.owner, order, "cancelled")
        elif expired:
            await self._fail_unrun(obj, row.owner, EXPIRED)
            await self._finish(obj, row.owner, order, "expired")
        else:
            if obj["status"] != "finalizing":
                await self._set(obj, "finalizing")
            await self._finish(obj, row.owner, order, "completed")

    async def _fail_unrun(self, obj: dict[str, Any], owner: str, error: dict[str, Any]) -> None:
        """Every line not yet recorded goes to the error file with `error`."""
        done = {r.custom_id for r in await self.tables.results(obj["id"])}
        async for line in self._lines(obj["id"]):
            if line.custom_id not in done:
                await self._record(obj, owner, line.custom_id, False, line_out(line, None, error))

    def _expired(self, obj: dict[str, Any]) -> bool:
        return self.now() >= int(obj["expires_at"])

    async def _send_all(self, obj: dict[str, Any], who: Caller, order: dict[str, int]) -> bool:
        """Run every line not yet recorded, at most `concurrency` at once over all batches; True
        when the window ran out first."""
        assert self._slots is not None
        slots, batch_id = self._slots, str(obj["id"])
        done = {r.custom_id for r in await self.tables.results(batch_id)}

        async def stopped() -> bool:
            return self.stopping or key_gone(who, self.key_names) is not None \
                or await self._status(batch_id) != "in_progress"

        pending = (ln async for ln in self._lines(batch_id) if ln.custom_id not in done)
        await run_lines(pending, slots, stopped,
                        lambda: self._expired(obj), lambda line: self._one(obj, who, line),
                        "gateway-batch-line", f"batch {batch_id}")
        if not self._expired(obj):
            return False
        recorded = {r.custom_id for r in await self.tables.results(batch_id)}
        return any(cid not in recorded for cid in order)

    async def _stop_for_key(self, obj: dict[str, Any], owner: str, order: dict[str, int],
                            gone: dict[str, Any]) -> None:
        """The batch's key is gone (key_gone): every line not yet run goes to the error file with
        `gone`, and the batch ends `failed` with it in `errors`."""
        await self._fail_unrun(obj, owner, gone)
        obj["errors"] = {"object": "list", "data": [{**gone, "param": None, "line": None}]}
        await self._finish(obj, owner, order, "failed")

    async def _record(self, obj: dict[str, Any], tenant: str, custom_id: str, ok: bool, out: dict[str, Any]) -> None:
        """Record a line's answer; counted for /metrics when this write was the line's first."""
        if await self.tables.record(obj["id"], custom_id, ok, out):
            key = (tenant, "completed" if ok else "failed")
            self.lines[key] = self.lines.get(key, 0) + 1

    async def _one(self, obj: dict[str, Any], who: Caller, line: Line) -> None:
        assert self.app is not None
        body = {**line.body, "service_tier": SERVICE_TIER}
        delay = RETRY_FIRST
        while True:
            try:
                answer = await dispatch.call(self.app, who, line.url, body)
            except Exception as e:  # the app answers every error itself; this is a defect: record it
                log.exception("batch %s line %s failed", obj["id"], line.custom_id)
                await self._record(obj, who.tenant, line.custom_id, False, line_out(
                    line, None, {"code": "internal_error", "message": f"{type(e).__name__}: {e}"}))
                return
            if self.stopping:
                return  # the gateway's shutdown may have cut this answer short: it runs again
            if answer.status not in RETRY_STATUSES:
                break
            if self._expired(obj) or key_gone(who, self.key_names) is not None \
                    or await self._status(str(obj["id"])) != "in_progress":
                return  # not answered: a cancelled batch leaves it out, an expired or stopped one marks it
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
        ok = 200 <= answer.status < 300
        response = {"status_code": answer.status, "request_id": answer.request_id, "body": answer.body}
        await self._record(obj, who.tenant, line.custom_id, ok, line_out(line, response, None))

    async def _finish(self, obj: dict[str, Any], owner: str, order: dict[str, int], status: str) -> None:
        """Write the output and error files from the recorded lines (in input order), then the
        final status. Each file goes to the store a chunk at a time as its lines are encoded."""
        results = sorted(await self.tables.results(obj["id"]), key=lambda r: order.get(r.custom_id, len(order)))
        for kind, key, ok in (("output", "output_file_id", True), ("errors", "error_file_id", False)):
            if any(r.ok == ok for r in results):
                fid = derived_file_id(obj["id"], kind)
                await self.tables.put_file(
                    {"id": fid, "object": "file", "bytes": 0, "created_at": self.now(),
                     "expires_at": None, "filename": f"{obj['id']}_{kind}.jsonl", "purpose": "batch_output",
                     "status": "processed", "status_details": None}, owner,
                    (dumps(r.line) for r in results if r.ok == ok))
                obj[key] = fid
        await self._set(obj, status)
