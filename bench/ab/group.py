"""The servers of one A/B section, started together and kept up for the whole section, and the
alternation itself: each round sends the same request(s) to every server in turn, starting
with a different server each round (A, B, then B, A, ...), so slow drift of the machine's speed
hits all of them alike and each round's ratio compares neighbours in time."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from bench.config import Settings
from bench.cpu import CpuSnapshot, cpu_usage
from bench.servers import LAUNCHERS, Launch, RunningServer, free_port
from bench.stats import percentile

T = TypeVar("T")


@dataclass(frozen=True)
class Variant:
    """A server to run: `kind` is a launcher in bench.servers, `extra` its additional flags."""

    name: str
    kind: str
    extra: tuple[str, ...] = ()


@dataclass
class Member:
    variant: Variant
    server: RunningServer
    data_dir: Path | None  # Hearth's --data-dir (snapshots land there)

    @property
    def url(self) -> str:
        return self.server.base_url


def _launch(v: Variant, s: Settings, port: int, data_dir: Path | None) -> Launch:
    launch = LAUNCHERS[v.kind](s, port)
    argv = [*launch.argv, *v.extra]
    if data_dir is not None:  # two Hearths must not share a database or KV directory
        argv += ["--data-dir", str(data_dir)]
    return dataclasses.replace(launch, argv=argv, notes={**launch.notes, "extra": list(v.extra)})


@contextlib.asynccontextmanager
async def started(variants: list[Variant], s: Settings, log: Callable[[str], None]) -> AsyncIterator[dict[str, Member]]:
    """Start every variant (one after another, so start-up costs do not overlap) and stop them all."""
    scratch = Path(tempfile.mkdtemp(prefix="hearth-ab-"))
    members: dict[str, Member] = {}
    try:
        async with contextlib.AsyncExitStack() as stack:
            for v in variants:
                port = free_port()
                data_dir = scratch / v.name if v.kind == "hearth" else None
                server = RunningServer(v.name, _launch(v, s, port, data_dir), port, s)
                log(f"starting {v.name}: {' '.join(server.launch.argv[1:])}")
                await stack.enter_async_context(server)
                members[v.name] = Member(v, server, data_dir)
            async with httpx.AsyncClient(timeout=httpx.Timeout(s.request_timeout_s, connect=10.0)) as client:
                for m in members.values():  # warm-up: first-request costs are not measured
                    await client.post(
                        f"{m.url}/v1/chat/completions",
                        json={
                            "max_tokens": 8,
                            "temperature": 0,
                            "messages": [{"role": "user", "content": "Say hello."}],
                        },
                    )
            yield members
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def order(names: list[str], round_no: int) -> list[str]:
    """Round r starts with server r mod n: A B C, B C A, C A B, ..."""
    k = round_no % len(names)
    return names[k:] + names[:k]


async def alternate(
    names: list[str], rounds: int, measure: Callable[[str, int], Awaitable[T]], members: dict[str, Member]
) -> list[dict[str, Any]]:
    """Run `measure(server, round)` for every server of every round, in alternating order.
    Each round records per server the measurement and the CPU others used meanwhile."""
    out: list[dict[str, Any]] = []
    sessions = [m.server.proc.pid for m in members.values() if m.server.proc is not None]
    for r in range(rounds):
        rec: dict[str, Any] = {"round": r, "order": order(names, r)}
        for name in rec["order"]:
            before = [CpuSnapshot.take(pid) for pid in sessions]
            value = await measure(name, r)
            after = [CpuSnapshot.take(pid) for pid in sessions]
            usage = [cpu_usage(a, b) for a, b in zip(before, after, strict=True)]
            servers_s = sum(u["server_s"] for u in usage)
            busy, wall, client = usage[0]["busy_s"], usage[0]["wall_s"], usage[0]["client_s"]
            foreign = max(busy - servers_s - client, 0.0)
            share = foreign / ((os.cpu_count() or 1) * wall) if wall > 0 else 0.0
            rec[name] = {"value": value, "foreign_cpu_share": round(share, 4)}
        out.append(rec)
    return out


def ratios(rounds: list[dict[str, Any]], num: str, den: str, key: Callable[[Any], float | None]) -> list[float]:
    """Per round: key(num's value) / key(den's value), where both are known."""
    got: list[float] = []
    for rec in rounds:
        a, b = key(rec[num]["value"]), key(rec[den]["value"])
        if a is not None and b:
            got.append(a / b)
    return got


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "median": percentile(values, 50),
        "p10": percentile(values, 10),
        "p90": percentile(values, 90),
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "n": len(values),
        "samples": [round(v, 4) for v in values],
    }
