"""The batch runner: the node's batches, each a task that sends its lines to the node itself
(dispatch.py) and records each answer durably (store.py) before counting it.

Order of a batch's life (OpenAI's statuses): `validating` (created) → `in_progress` (its task
started) → `finalizing` (every line answered; the output and error files are being written) →
`completed`. `POST .../cancel` makes it `cancelling`: no new line starts, the lines in flight
finish, and it ends `cancelled` with the partial results in its files. Past its completion
window (`expires_at`) no new line starts and the batch ends `expired`, its unstarted lines in the
error file as `batch_expired`. A batch whose saved input cannot be read ends `failed`.

A batch whose key is gone (removed from the key file: by a reload, hearth/http/keyring.py, or
between two starts) runs no more lines, as on the gateway (hearth/gateway/batches/runner.py):
its name is looked up before each line starts (and before a refused line is sent again); once
it is missing the batch ends `failed` with an `errors` entry `invalid_api_key`, each line not
yet run is in its error file with that error, and the lines that finished keep their output.
Lines already running finish. The admin's batches, and any on a node without keys, are never
stopped this way.

Durability: a line is done when its record is in `results.jsonl` (fsynced). On start the node
resumes every batch not in a final status, skipping the custom_ids already recorded, so a
restart or a `kill -9` neither loses a line nor writes one twice (a line that was in flight when
the process died runs again: its answer was never recorded). Finalizing writes files whose ids
are derived from the batch's, so a crash mid-way rewrites the same files, never a second pair.

Sharing the node: at most `concurrency` lines run at once over all batches (`batch_concurrency`
in Settings), so interactive traffic keeps the other slots; every line is sent with
`service_tier: "flex"` (the lowest admission class, which the scheduler may preempt for
interactive work; a node whose scheduler does not know the field yet ignores it: OpenAI bodies
accept unknown fields). A 429 (the caller's key limits, a full queue) or a 503 (model loading,
node busy) is not the line's answer: it is retried, backing off, until the batch is cancelled or
expires.

Test gate (hearth/test_gate.py): before line `i` (0-based) starts, `batch-line-<i>`; the
batch's task waits there holding its slot, so no later line starts either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp

from hearth.api.batches.files import FileStore
from hearth.api.batches.store import LIVE, Batch, BatchStore
from hearth.errors import Conflict
from hearth.http.batches import dispatch
from hearth.http.batches.lines import Line, dumps
from hearth.http.batches.pace import run_lines
from hearth.http.batches.requests import EXPIRED, SERVICE_TIER, derived_file_id, line_out

log = logging.getLogger("hearth.api")

RETRY_FIRST = 0.25  # seconds before the first retry of a 429 / 503; doubled up to RETRY_MAX
RETRY_MAX = 8.0
class Batches:
    """The Batch API's state on one node: files, batches and their runs."""

    def __init__(self, data_dir: Path, concurrency: int = 2, clock: Callable[[], float] = time.time,
                 key_names: frozenset[str] = frozenset()) -> None:
        # The node's key names (replaced by a reload of the keys): a batch created with a key the
        # node no longer has runs no more lines (`_key_gone`).
        self.key_names = key_names
        self.files = FileStore(data_dir / "batches" / "files")
        self.store = BatchStore(data_dir / "batches" / "jobs")
        self.concurrency = max(1, concurrency)
        self.clock = clock
        self.app: ASGIApp | None = None
        self._slots: asyncio.Semaphore | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # Set when the node begins to stop (`stop`): its runs are being cancelled, so an answer
        # that arrives from now on may be cut short and is not recorded (the line runs again on
        # the next start), no line starts, and no batch is finalized.
        self.stopping = False

    def now(self) -> int:
        return int(self.clock())

    # lifecycle

    def start(self, app: ASGIApp) -> None:
        """Bind the node's app (the lines' path) and resume every batch that was not finished."""
        self.app = app
        for b in self.store.load():
            if b.status in LIVE:
                self.launch(b)

    def stop(self) -> None:
        """The node is stopping: call before its runs are cancelled (`hearth serve`'s signal
        handler does), so that a line cut short by that is not taken for its answer."""
        self.stopping = True

    async def shutdown(self) -> None:
        """Stop every run where it is: its recorded lines stay, the next start resumes it."""
        self.stop()
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t

    def launch(self, b: Batch) -> None:
        if self.app is None or b.id in self._tasks:
            return  # not started yet: start() resumes it
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.concurrency)
        task = asyncio.create_task(self._run(b), name=f"batch {b.id}")
        self._tasks[b.id] = task
        task.add_done_callback(lambda t: self._ended(b, t))

    def _ended(self, b: Batch, task: asyncio.Task[None]) -> None:
        self._tasks.pop(b.id, None)
        if not task.cancelled() and (e := task.exception()) is not None:
            # e.g. the disk filled: the batch stays as it was on disk, and the next start resumes it
            log.error("batch %s stopped: %s: %s", b.id, type(e).__name__, e)

    async def idle(self) -> None:
        """Wait until no batch is running (tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def cancel(self, b: Batch) -> None:
        if b.status in ("cancelling", "cancelled"):
            return
        if b.status not in ("validating", "in_progress"):
            raise Conflict(f"Cannot cancel a batch with status '{b.status}'.", code="batch_not_cancellable")
        self._set(b, "cancelling")
        if b.id not in self._tasks:
            self.launch(b)

    # the run

    def _set(self, b: Batch, status: str) -> None:
        b.obj["status"] = status
        b.obj[f"{status}_at"] = self.now()
        b.save()

    def _expired(self, b: Batch) -> bool:
        return self.now() >= int(b.obj["expires_at"])

    async def _run(self, b: Batch) -> None:
        if b.status == "validating":
            self._set(b, "in_progress")
        try:
            lines = await asyncio.to_thread(b.lines)
        except (OSError, ValueError, KeyError, TypeError) as e:
            b.obj["errors"] = {"object": "list", "data": [{"code": "invalid_input", "message": f"the batch's saved "
                                                            f"input cannot be read: {e}", "param": None, "line": None}]}
            self._set(b, "failed")
            return
        expired = False
        if b.status == "in_progress":
            expired = await self._send_all(b, lines)
        if self.stopping:
            return  # lines may be missing: the next start resumes the batch
        if b.status == "in_progress" and (gone := self._key_gone(b)) is not None:
            await self._stop_for_key(b, lines, gone)
        elif b.status == "cancelling":
            await self._finish(b, "cancelled")
        elif expired:
            for line in lines:
                if line.custom_id not in b.done:
                    await self._record(b, line.custom_id, False, line_out(line, None, EXPIRED))
            await self._finish(b, "expired")
        else:
            if b.status != "finalizing":
                self._set(b, "finalizing")
            await self._finish(b, "completed")

    async def _send_all(self, b: Batch, lines: list[Line]) -> bool:
        """Run every line not yet done, at most `concurrency` at once over all batches; True
        when the window ran out first."""
        assert self._slots is not None
        slots = self._slots

        async def stopped() -> bool:
            return b.status == "cancelling" or self.stopping or self._key_gone(b) is not None

        expired = await run_lines([ln for ln in lines if ln.custom_id not in b.done], slots, stopped,
                                  lambda: self._expired(b), lambda line: self._one(b, line), "batch-line",
                                  f"batch {b.id}")
        return expired or (self._expired(b) and any(ln.custom_id not in b.done for ln in lines))

    def _key_gone(self, b: Batch) -> dict[str, Any] | None:
        """The error of a batch whose creating key the node no longer has (None while it has it,
        when it has no keys at all, or for the admin): the gateway's rule (key_gone there)."""
        who = b.caller
        if not self.key_names or who.admin or who.key_name is None or who.key_name in self.key_names:
            return None
        return {"code": "invalid_api_key",
                "message": f"the API key {who.key_name!r} that created this batch is no longer configured: the batch "
                           "was stopped, and its lines not yet run were not run"}

    async def _stop_for_key(self, b: Batch, lines: list[Line], gone: dict[str, Any]) -> None:
        """Every line not yet run goes to the error file with `gone`; the batch ends `failed`."""
        for line in lines:
            if line.custom_id not in b.done:
                await self._record(b, line.custom_id, False, line_out(line, None, gone))
        b.obj["errors"] = {"object": "list", "data": [{**gone, "param": None, "line": None}]}
        await self._finish(b, "failed")

    async def _one(self, b: Batch, line: Line) -> None:
        if self.app is None:
            return
        body = {**line.body, "service_tier": SERVICE_TIER}
        delay = RETRY_FIRST
        while True:
            try:
                answer = await dispatch.call(self.app, b.caller, line.url, body)
            except Exception as e:  # the app answers every error itself; this is a defect: record it
                log.exception("batch %s line %s failed", b.id, line.custom_id)
                await self._record(b, line.custom_id, False, line_out(
                    line, None, {"code": "internal_error", "message": f"{type(e).__name__}: {e}"}))
                return
            if self.stopping:
                return  # the node's shutdown may have cut this answer short: it runs again
            if answer.status not in (429, 503):
                break
            if b.status == "cancelling" or self._expired(b) or self._key_gone(b) is not None:
                return  # not answered: a cancelled batch leaves it out, an expired or stopped one marks it
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
        ok = 200 <= answer.status < 300
        response = {"status_code": answer.status, "request_id": answer.request_id, "body": answer.body}
        await self._record(b, line.custom_id, ok, line_out(line, response, None))

    async def _record(self, b: Batch, custom_id: str, ok: bool, out: dict[str, Any]) -> None:
        async with self._locks.setdefault(b.id, asyncio.Lock()):  # one append at a time per batch
            await asyncio.to_thread(b.record, custom_id, ok, out)

    async def _finish(self, b: Batch, status: str) -> None:
        """Write the output and error files from the recorded lines (in input order), then the
        final status."""
        results = await asyncio.to_thread(b.results)
        order = {ln.custom_id: ln.index for ln in await asyncio.to_thread(b.lines)}
        results.sort(key=lambda r: order.get(str(r.get("custom_id")), len(order)))
        for kind, key, ok in (("output", "output_file_id", True), ("errors", "error_file_id", False)):
            chosen = [r["line"] for r in results if bool(r.get("ok")) == ok]
            if chosen:
                fid = derived_file_id(b.id, kind)
                await asyncio.to_thread(self.files.create, b"".join(dumps(x) for x in chosen),
                                        f"{b.id}_{kind}.jsonl", "batch_output", b.owner, fid)
                b.obj[key] = fid
        self._set(b, status)
