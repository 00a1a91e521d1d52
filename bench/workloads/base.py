"""What a workload gets (a ready server) and returns (summarized metrics plus raw data)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import httpx

from bench.client import RequestSpec, StreamResult, stream_chat
from bench.config import Settings
from bench.cpu import CpuSnapshot, cpu_usage, wait_idle

T = TypeVar("T")


@dataclass
class WorkloadContext:
    """One ready server. `request(tag)` builds the request every server gets for that tag.

    The tag goes at the start of the prompt so no server can reuse a cached prefix of an earlier
    request (llama-server and llama-cpp-python both keep the last prompt's KV cache).
    """

    client: httpx.AsyncClient
    base_url: str
    settings: Settings
    supports_ignore_eos: bool
    eog_token_ids: list[int]
    model_id: str = "bench"
    server_pid: int = 0
    server_name: str = ""
    contention: dict[str, int] = field(default_factory=lambda: {"rounds": 0, "retries": 0, "contaminated_rounds": 0})

    def request(self, tag: str, max_tokens: int | None = None) -> RequestSpec:
        bias = None if self.supports_ignore_eos else {str(t): -100.0 for t in self.eog_token_ids}
        return RequestSpec(
            prompt=f"[{tag}] {self.settings.prompt}",
            max_tokens=max_tokens or self.settings.max_tokens,
            ignore_eos=self.supports_ignore_eos,
            logit_bias=bias,
            model=self.model_id,
        )

    async def send(self, tag: str, max_tokens: int | None = None) -> StreamResult:
        return await stream_chat(self.client, self.base_url, self.request(tag, max_tokens))

    async def round(self, tag: str, streams: int) -> tuple[list[StreamResult], dict[str, float]]:
        """Start `streams` requests together and wait for all of them, on a machine kept to ourselves.

        If other processes used more than `settings.max_foreign_cpu` of the CPU meanwhile (the
        server's threads spin, so even a little contention wrecks the numbers), wait for the machine
        to go idle and run the round again, up to `settings.retries` times. The returned CPU record
        says how many attempts it took and whether the kept round is still contaminated.
        """

        async def attempt(n: int) -> list[StreamResult]:
            return list(await asyncio.gather(*(self.send(f"{tag}-a{n}-s{i}") for i in range(streams))))

        return await self.measure(attempt)

    async def measure(
        self, attempt_fn: Callable[[int], Awaitable[T]], wait_s: float | None = None
    ) -> tuple[T, dict[str, float]]:
        """Like `round`, for any measurement: `attempt_fn(attempt)` is re-run (after waiting up to
        `wait_s` for an idle machine) while other processes used more than `max_foreign_cpu`."""
        s = self.settings
        for attempt in range(s.retries + 1):
            start = CpuSnapshot.take(self.server_pid)
            value = await attempt_fn(attempt)
            usage = cpu_usage(start, CpuSnapshot.take(self.server_pid))
            usage["attempt"] = attempt
            usage["contaminated"] = usage["foreign_share"] > s.max_foreign_cpu
            if not usage["contaminated"] or attempt == s.retries:
                self.contention["rounds"] += 1
                self.contention["retries"] += attempt
                self.contention["contaminated_rounds"] += int(usage["contaminated"])
                return value, usage
            await asyncio.to_thread(wait_idle, s.retry_wait_s if wait_s is None else wait_s)
        raise AssertionError("unreachable")


@dataclass
class WorkloadResult:
    metrics: dict[str, dict[str, object]] = field(default_factory=dict)
    raw: dict[str, object] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class Workload(Protocol):
    name: str

    async def run(self, ctx: WorkloadContext) -> WorkloadResult: ...


def check_streams(results: Sequence[StreamResult], expected_tokens: int, out: WorkloadResult) -> list[StreamResult]:
    """Record errors and short generations; return the streams that produced tokens."""
    good: list[StreamResult] = []
    for r in results:
        if r.error:
            out.errors.append(r.error)
            continue
        if r.n_tokens != expected_tokens:
            out.warnings.append(
                f"stream generated {r.n_tokens} tokens, expected {expected_tokens} (finish_reason={r.finish_reason})"
            )
        if r.token_times:
            good.append(r)
    return good


def stream_record(r: StreamResult) -> dict[str, object]:
    """Compact raw record of one stream (times relative to its start)."""
    return {
        "n_tokens": r.n_tokens,
        "n_chunks": len(r.token_times),
        "token_count_source": "usage" if r.usage_tokens is not None else "chunks",
        "ttft_s": r.ttft,
        "tpot_s": r.tpot,
        "total_s": (r.token_times[-1] - r.t_start) if r.token_times else None,
        "finish_reason": r.finish_reason,
        "error": r.error,
    }
