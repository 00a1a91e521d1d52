"""What a hostile request does to everyone else: /health latency while the worst requests run.

For each hostile request kind, one client sends it back to back for `--seconds` while another polls
`GET /health` every `--interval` seconds; the report is /health's p50 / p99 / max per kind (and
for an idle baseline), with the hostile requests' statuses and times. The kinds are the ones
issue 13 found: huge /tokenize and chat bodies, an expanding JSON schema, bodies past the limit
(declared and chunked), JSON nested past any recursion limit, millions of JSON values, lone
surrogates, an oversized snapshot import, and a 1M-token /detokenize.

    .venv/bin/python -m bench.hostile                      # starts its own server (default model)
    .venv/bin/python -m bench.hostile --url http://127.0.0.1:8000 --seconds 5 --kinds tokenize_31mb

Writes bench/results/hostile-<timestamp>.json (and prints a table). Timings mean something only on
an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.servers import free_port
from bench.stats import percentile

MB = 1 << 20


@dataclass(frozen=True)
class Hostile:
    method: str
    path: str
    body: Callable[[], bytes | Callable[[], AsyncIterator[bytes]]]
    headers: dict[str, str]


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


async def _chunks(total: int, chunk: bytes) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        yield chunk
        sent += len(chunk)


JSON = {"content-type": "application/json"}
USER = [{"role": "user", "content": "hi"}]
KINDS: dict[str, Hostile] = {
    "tokenize_31mb": Hostile("POST", "/tokenize", lambda: _json({"content": "x" * (31 * MB)}), JSON),
    "chat_10mb_prompt": Hostile("POST", "/v1/chat/completions", lambda: _json(
        {"messages": [{"role": "user", "content": "word " * (2 * MB)}], "max_tokens": 4}), JSON),
    "schema_min_items_1e7": Hostile("POST", "/v1/chat/completions", lambda: _json(
        {"messages": USER, "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "array", "items": {"type": "integer"}, "minItems": 10_000_000}}}}), JSON),
    "body_400mb_declared": Hostile("POST", "/v1/chat/completions",
                                   lambda: lambda: _chunks(400 * MB, b" " * MB),
                                   {**JSON, "content-length": str(400 * MB)}),
    "body_400mb_chunked": Hostile("POST", "/v1/chat/completions", lambda: lambda: _chunks(400 * MB, b" " * MB), JSON),
    "json_nested_100k": Hostile("POST", "/v1/chat/completions",
                                lambda: b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", JSON),
    "json_3m_values": Hostile("POST", "/v1/chat/completions",
                              lambda: b'{"messages": [' + b"0," * 3_000_000 + b"0]}", JSON),
    "lone_surrogates": Hostile("POST", "/v1/chat/completions", lambda: _json(
        {"messages": [{"role": "user", "content": "\ud800" * 100_000}], "max_tokens": 4}), JSON),
    "snapshot_import_400mb": Hostile("POST", "/v1/snapshots/import", lambda: lambda: _chunks(400 * MB, b"\0" * MB),
                                     {"content-type": "application/x-tar"}),
    "detokenize_1m": Hostile("POST", "/detokenize", lambda: _json({"tokens": [42] * 1_000_000}), JSON),
}


async def poll_health(client: httpx.AsyncClient, stop: asyncio.Event, interval: float) -> list[float]:
    out: list[float] = []
    while not stop.is_set():
        t0 = time.perf_counter()
        r = await client.get("/health", timeout=120)
        out.append(time.perf_counter() - t0)
        r.raise_for_status()
        await asyncio.sleep(max(0.0, interval - out[-1]))
    return out


async def run_kind(url: str, kind: str | None, seconds: float, interval: float) -> dict[str, Any]:
    stop = asyncio.Event()
    results: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=url) as health, httpx.AsyncClient(base_url=url) as attacker:
        poller = asyncio.create_task(poll_health(health, stop, interval))
        deadline = time.monotonic() + seconds
        if kind is None:
            await asyncio.sleep(seconds)
        else:
            h = KINDS[kind]
            payload = h.body()
            while time.monotonic() < deadline:
                content = payload() if callable(payload) else payload
                t0 = time.perf_counter()
                try:
                    r = await attacker.request(h.method, h.path, content=content, headers=h.headers, timeout=300)
                    results.append({"status": r.status_code, "seconds": time.perf_counter() - t0})
                except httpx.HTTPError as e:  # a server that closes on a refused upload
                    results.append({"status": type(e).__name__, "seconds": time.perf_counter() - t0})
        stop.set()
        latencies = await poller
    ms = sorted(x * 1000 for x in latencies)
    return {"kind": kind or "idle", "health_polls": len(ms),
            "health_ms": {"p50": percentile(ms, 50), "p99": percentile(ms, 99), "max": ms[-1] if ms else None},
            "hostile_requests": len(results),
            "hostile_statuses": sorted({str(r["status"]) for r in results}),
            "hostile_seconds_median": percentile(sorted(r["seconds"] for r in results), 50) if results else None}


def start_server(home: Path, ctx: int | None, threads: int | None) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    args = [sys.executable, "-m", "hearth.cli.main", "serve", "--port", str(port)]
    if ctx:
        args += ["--ctx", str(ctx)]
    if threads:
        args += ["--threads", str(threads)]
    log = (home / "server.log").open("wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HEARTH_HOME": str(home)})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {(home / 'server.log').read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not become ready")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (default: start one with the default model)")
    ap.add_argument("--seconds", type=float, default=10.0, help="per kind")
    ap.add_argument("--interval", type=float, default=0.05, help="between /health polls")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, from: " + ", ".join(KINDS))
    ap.add_argument("--ctx", type=int, default=None, help="--ctx for a started server (default: the model's)")
    ap.add_argument("--threads", type=int, default=None, help="--threads for a started server")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        ap.error(f"unknown kinds: {', '.join(sorted(unknown))}")
    proc = None
    with tempfile.TemporaryDirectory(prefix="hearth-hostile-") as home:
        if args.url:
            url = args.url
        else:
            proc, url = start_server(Path(home), args.ctx, args.threads)
        try:
            rows = [asyncio.run(run_kind(url, k, args.seconds, args.interval)) for k in [None, *kinds]]
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
    print(f"{'kind':<24}{'polls':>7}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}  hostile (n, statuses, median s)")
    for row in rows:
        h = row["health_ms"]
        med = row["hostile_seconds_median"]
        print(f"{row['kind']:<24}{row['health_polls']:>7}{h['p50']:>10.1f}{h['p99']:>10.1f}{h['max']:>10.1f}  "
              f"{row['hostile_requests']}, {'/'.join(row['hostile_statuses']) or '-'}, "
              f"{'-' if med is None else f'{med:.2f}'}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"hostile-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps({"url": url if args.url else "started", "seconds": args.seconds,
                                "interval": args.interval, "rows": rows}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
