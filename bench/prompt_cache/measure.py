"""What is measured on one server for one fixture, in the order it is done (the server starts
with an empty state directory):

1. cold: the captured request (a, once: its prefill is minutes on 2 cores), then the state is
   made durable: Hearth's writer has put the blocks on disk (`wait_cache_written`),
   llama-server's slot 0 is saved (`POST /slots/0?action=save`);
2. in_slot: the same request again, `runs` times: the whole prompt in the slot's KV (what is
   left of a warm answer besides the prefix: the residual of step 5);
3. restart_graceful, restart_kill (b): stop the server (SIGTERM and wait; `kill -9`), start it
   on the same state, (llama-server: restore slot 0 from the file), send the request;
4. from_disk (d): as 3 (graceful) with the state files dropped from the page cache between the
   stop and the start, so the restore reads the disk;
5. second (c): as 3 (graceful), then the request of a second conversation (`variant`, a new
   one each run: conversations.py), whose blocks Hearth then writes; where its prompt first
   differs from every earlier one is read from the blocks written (blocks.branch_point).

Every request is bracketed by the foreign-CPU guard. A contaminated one after a restart is run
again with a new restart (up to `retries`); a cold one and a second conversation are only
flagged (what they measure is cached once they ran: running one again needs a new server or a
new conversation). Hearth's `/metrics` prompt-cache samples, where it has them, are kept beside each.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.agents import FixtureRequest, measure, prepare
from bench.client import first_model_id
from bench.config import Settings
from bench.cpu import wait_idle
from bench.prompt_cache import blocks
from bench.prompt_cache.conversations import TASKS, prompt_differences, second_conversation, with_task
from bench.prompt_cache.lifecycle import Restartable
from hearth.engine.prefix_cache.cache import BLOCK_TOKENS

PARTS = ("restart", "second", "disk", "shared")


@dataclass
class Plan:
    parts: list[str] = field(default_factory=lambda: list(PARTS))
    runs: int = 3  # restarts per kind (b, d) and in-slot repeats
    second_runs: int = 3  # second conversations per variant (c): each prefills its new tokens
    variants: list[str] = field(default_factory=lambda: ["other-dir", "next-day"])
    conversations: int = 20  # e
    shared_fixture: str = "claude-code-first"
    max_tokens: int = 1
    peer_cold_restart: bool = False  # measure llama-server's RAM cache after a restart (a cold prefill)


def client_for(s: Settings) -> httpx.AsyncClient:
    """A new connection per request: a kept-alive one may be closed by the server (llama-server
    closes idle ones after 5 s) or belong to the process a restart ended."""
    return httpx.AsyncClient(timeout=httpx.Timeout(s.request_timeout_s, connect=10.0),
                             limits=httpx.Limits(max_keepalive_connections=0))


def log(msg: str) -> None:
    print(f"[prompt_cache {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class FixtureRun:
    """One fixture against one running server (a `Restartable`), with one tag for all its
    conversations (so they share a prefix with each other and with nothing from elsewhere)."""

    def __init__(self, srv: Restartable, client: httpx.AsyncClient, s: Settings, plan: Plan,
                 captured: dict[str, Any], model_id: str | None, tag: str | None = None) -> None:
        self.srv, self.client, self.s, self.plan = srv, client, s, plan
        self.captured, self.model_id = captured, model_id
        self.tag = tag or f"bench-{uuid.uuid4().hex[:12]}"
        self.slot_file = f"slot-{self.tag}.bin"

    @property
    def hearth(self) -> bool:
        return self.srv.name == "hearth"

    def request(self, captured: dict[str, Any]) -> FixtureRequest:
        req = FixtureRequest(self.client, self.srv.base_url, captured, self.plan.max_tokens, self.model_id)
        req.body = prepare(captured, self.tag, self.plan.max_tokens, self.model_id)
        return req

    async def once(self, req: FixtureRequest) -> dict[str, Any]:
        """One request on the running server, CPU-guarded, not re-run."""
        record = await measure(self.srv.running, req.warm, 0, 0.0, self.s.max_foreign_cpu)
        if self.hearth:
            record["cache_metrics"] = await self.srv.cache_metrics(self.client)
        return record

    async def persist(self, record: dict[str, Any], files_before: int) -> dict[str, Any]:
        """Make what the request of `record` left durable: Hearth's blocks written (it had
        `files_before` block files before the request), llama-server's slot saved."""
        if not self.hearth:
            return await self.srv.slot(self.client, "save", self.slot_file)
        # The blocks its new tokens need: from the block holding the first uncached token to the
        # end (the last one partial, and perhaps written with the generated token: hence -1).
        prompt, cached = int(record["prompt_tokens"]), int(record.get("cached_tokens") or 0)
        new = max(0, -(-prompt // BLOCK_TOKENS) - cached // BLOCK_TOKENS - 1)
        return await self.srv.wait_cache_written(min_blocks=files_before + new)

    async def after_restart(self, req: FixtureRequest, how: str, *, evict: bool = False,
                            restore: bool = True, rerun: bool = True) -> dict[str, Any]:
        """Restart (`how`: graceful | kill), restore llama-server's slot, send `req`; re-run
        with a new restart while the CPU guard says others used the machine (if `rerun`: not
        for a request that leaves what it measured cached, as a second conversation does)."""
        record: dict[str, Any] = {}
        for attempt in range(self.s.retries + 1 if rerun else 1):
            restart = self.srv.stop(how)
            if evict:
                restart["evicted"] = self.srv.evict_page_cache()
            restart["startup_s"] = round(await self.srv.start(), 3)
            restored = None
            if restore and not self.hearth:
                restored = await self.srv.slot(self.client, "restore", self.slot_file)
            record = await self.once(req)
            if self.hearth:
                restart["log"] = self.srv.cache_log()
            record.update(restart=restart, restore=restored, attempt=attempt)
            restore_s = float(restored["wall_s"]) if restored else 0.0
            record["first_answer_s"] = None if record.get("ttft_s") is None else record["ttft_s"] + restore_s
            if not record["cpu"]["contaminated"] or not rerun:
                break
            await asyncio.to_thread(wait_idle, self.s.retry_wait_s)
        return record

    async def second(self, variant: str, n: int) -> dict[str, Any]:
        conv = second_conversation(self.captured, variant, n)
        before = self.srv.state_files()
        record = await self.after_restart(self.request(conv), "graceful", rerun=False)
        record["changed"] = prompt_differences(self.captured["body"], conv["body"])
        if self.hearth and record.get("prompt_tokens"):
            record["written"] = await self.persist(record, len(before))
            record["first_difference"] = blocks.branch_point(before, self.srv.state_files())
            if record["first_difference"] is None:  # too few new tokens for the cache to write (its min_new)
                record["first_difference_at_least"] = record.get("cached_tokens")
        return record


async def run_fixture(name: str, s: Settings, plan: Plan, fx: str, captured: dict[str, Any], state_dir: Path,
                      seed_dir: Path | None) -> dict[str, Any]:
    """Steps 1-5 of the module docstring for one server and fixture. `seed_dir`: where to copy
    Hearth's blocks of the cold request (part e starts from them)."""
    out: dict[str, Any] = {"state_dir": str(state_dir)}
    async with Restartable(name, s, state_dir) as srv, client_for(s) as client:
        out["command"], out["startup_s"] = srv.launch.argv, srv.running.startup_s
        run = FixtureRun(srv, client, s, plan, captured, await first_model_id(client, srv.base_url))
        conv1 = run.request(captured)
        cold = out["cold"] = await run.once(conv1)
        log(f"{name} {fx}: cold {cold.get('ttft_s')} s, {cold.get('prompt_tokens')} prompt tokens")
        if cold.get("status") != 200 or not cold.get("prompt_tokens"):
            return {**out, "status": "failed", "reason": str(cold.get("error") or cold)[:500]}
        out["tag"] = run.tag
        out["persist"] = await run.persist(cold, 0)
        out["disk"] = srv.disk_usage()
        if run.hearth:
            out["stored"] = blocks.stored(srv.state_files())
            if seed_dir is not None:
                for f in srv.state_files():
                    dest = seed_dir / f.relative_to(state_dir)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, dest)
        out["in_slot"] = [await run.once(conv1) for _ in range(plan.runs)]
        if "restart" in plan.parts:
            for how in ("graceful", "kill"):
                out[f"restart_{how}"] = [await run.after_restart(conv1, how) for _ in range(plan.runs)]
                log(f"{name} {fx}: after {how} restart: {[r.get('first_answer_s') for r in out[f'restart_{how}']]}")
            if not run.hearth and plan.peer_cold_restart:  # its RAM cache alone: a cold prefill again
                out["restart_ram_only"] = [await run.after_restart(conv1, "graceful", restore=False)]
        if "disk" in plan.parts:
            out["from_disk"] = [await run.after_restart(conv1, "graceful", evict=True) for _ in range(plan.runs)]
            log(f"{name} {fx}: from disk: {[r.get('first_answer_s') for r in out['from_disk']]}")
        if "second" in plan.parts:
            out["second"] = {}
            for variant in plan.variants:
                rows = out["second"][variant] = [await run.second(variant, n) for n in range(plan.second_runs)]
                log(f"{name} {fx}: second conversation ({variant}): "
                    f"{[(r.get('ttft_s'), r.get('cached_tokens'), r.get('first_difference')) for r in rows]}")
        out["disk_end"] = srv.disk_usage()
    out["status"] = "ok"
    return out


async def shared_prefix(s: Settings, plan: Plan, captured: dict[str, Any], tag: str | None,
                        seed_dir: Path | None, state_dir: Path) -> dict[str, Any]:
    """Part e, Hearth only: `plan.conversations` conversations that differ only in the user's
    task, one after another on one server; the disk they take against each one's KV alone.
    Starts from the seed (the blocks of the fixture's cold request: conversation 1)."""
    if seed_dir is not None and seed_dir.exists():
        shutil.copytree(seed_dir, state_dir, dirs_exist_ok=True)
    out: dict[str, Any] = {"conversations": []}
    async with Restartable("hearth", s, state_dir) as srv, client_for(s) as client:
        run = FixtureRun(srv, client, s, plan, captured, await first_model_id(client, srv.base_url), tag)
        for i in range(plan.conversations):
            task = TASKS[i % len(TASKS)] if i < len(TASKS) else f"{TASKS[i % len(TASKS)]} (#{i})"
            before = srv.state_files()
            rec = await run.once(run.request(with_task(captured, task)))
            if rec.get("prompt_tokens"):
                rec["written"] = await run.persist(rec, len(before))
                rec["first_difference"] = blocks.branch_point(before, srv.state_files()) if before else 0
            out["conversations"].append({"task": task, **rec})
            log(f"shared prefix: conversation {i + 1}: {rec.get('prompt_tokens')} tokens, "
                f"{rec.get('cached_tokens')} cached, TTFT {rec.get('ttft_s')} s, disk {srv.disk_usage()['bytes']} B")
        out["disk"] = srv.disk_usage()
        out["stored"] = blocks.stored(srv.state_files())
    out["status"] = "ok"
    return out


def work_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="hearth-prompt-cache-bench-"))
