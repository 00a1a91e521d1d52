"""The cost of the gateway's shared state (issue 28), against fake Hearth nodes that answer at
once (so the gateways are the bottleneck, as in bench/gateway_cpu.py):

1. latency per session turn (non-streamed chat with a `session_id`: the gateway reads the
   transcript and the binding, writes the binding and the turn's transcript copy) through one
   gateway on SQLite vs one on PostgreSQL (a real server, Debian's, tests/helpers/postgres.py):
   p50 / p99 and the difference;
2. session turns per second with many clients in flight, one gateway vs two (both on the same
   PostgreSQL, the clients split between them) in front of the same fake nodes, and meanwhile
   the gateways' usage ledgers (one row per turn): the deepest writer queue /metrics showed,
   rows dropped;
3. after `kill -9` of one of two gateways, the time until the first successful request through
   the other (a client that switches on its connection error).

    .venv/bin/python -m bench.gateway_state                 # writes bench/results/latest-gateway-state.{json,png}
    .venv/bin/python -m bench.gateway_state --requests 200 --concurrency 16 --kills 5

Not a test: numbers, no thresholds. On a 2-core machine the gateways, the fake nodes,
PostgreSQL and this client share the cores: two gateways cannot be twice one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.servers import free_port

RESULTS = Path(__file__).parent / "results"
SESSIONS = 32  # distinct conversations the requests rotate over


def fake_node(port: int) -> None:
    """A Hearth node as the gateway sees it for session turns: chat answers, /history, /health."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def chat(request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"id": "chatcmpl-x", "object": "chat.completion", "created": 1, "model": body["model"],
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9}})

    async def history(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"role": "user", "content": "hi"},
                                                        {"role": "assistant", "content": "ok"}]})

    app = Starlette(routes=[Route("/health", health), Route("/v1/chat/completions", chat, methods=["POST"]),
                            Route("/v1/sessions/{sid}/history", history)])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


class Gateways:
    """Fake nodes and gateway processes in one temporary directory."""

    def __init__(self, root: Path, nodes: int = 2) -> None:
        self.root = root
        self.node_ports = [free_port() for _ in range(nodes)]
        self.procs: list[subprocess.Popen[bytes]] = [
            subprocess.Popen([sys.executable, "-m", "bench.gateway_state", "--fake-node", str(p)])
            for p in self.node_ports]
        self.toml = root / "fleet.toml"
        self.toml.write_text("".join(f'[[upstream]]\nname = "n{i}"\nurl = "http://127.0.0.1:{p}"\n'
                                     'models = { "smol" = "m" }\nmax_in_flight = 64\n\n'
                                     for i, p in enumerate(self.node_ports)))

    def gateway(self, database: str | None) -> tuple[str, subprocess.Popen[bytes]]:
        port = free_port()
        args = ["--database", database] if database else []
        home = self.root / f"gw-{port}"
        proc = subprocess.Popen([sys.executable, "-m", "hearth.cli.main", "gateway", "--upstreams", str(self.toml),
                                 "--port", str(port), "--log-level", "warning", "--digest-interval", "0",
                                 "--max-waiting", "1024", *args],
                                env={**os.environ, "HEARTH_GATEWAY_HOME": str(home)}, start_new_session=True,
                                stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    time.sleep(1)  # the first probes of the nodes
                    return url, proc
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.1)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                p.wait(15)


def turn(i: int) -> dict[str, Any]:
    return {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "session_id": f"bench-{i % SESSIONS}"}


async def latencies(url: str, requests: int) -> list[float]:
    out = []
    async with httpx.AsyncClient(timeout=60) as c:
        for i in range(requests + 20):
            t0 = time.perf_counter()
            r = await c.post(url + "/v1/chat/completions", json=turn(i))
            r.raise_for_status()
            if i >= 20:  # warm-up: connections, the first rows
                out.append(time.perf_counter() - t0)
    return out


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def throughput(urls: list[str], requests: int, concurrency: int) -> tuple[float, dict[str, float]]:
    """Turns/s over the gateways at `urls`, and their usage ledgers meanwhile: the deepest queue
    any /metrics scrape (every 50 ms) saw, rows dropped, rows committed (issue 41: does the
    writer keep up?)."""
    done = 0
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency * 2 + 2)) as c:
        async def client(k: int) -> None:
            nonlocal done
            url = urls[k % len(urls)]
            while done < requests:
                done += 1
                (await c.post(url + "/v1/chat/completions", json=turn(k * 1000 + done))).raise_for_status()

        async def ledgers() -> dict[str, float]:
            out = {"written": 0.0, "dropped": 0.0}
            for u in urls:
                text = (await c.get(u + "/metrics")).text
                out["written"] += _metric(text, "hearth_usage_ledger_written_total")
                out["dropped"] += _metric(text, "hearth_usage_ledger_dropped_total")
            return out

        peak = 0.0
        running = True

        async def watch() -> None:
            nonlocal peak
            while running:
                for u in urls:
                    peak = max(peak, _metric((await c.get(u + "/metrics")).text, "hearth_usage_ledger_queue_depth"))
                await asyncio.sleep(0.05)

        await asyncio.gather(*(client(k) for k in range(concurrency)))  # warm-up
        done = 0
        before = await ledgers()
        watcher = asyncio.create_task(watch())
        t0 = time.perf_counter()
        await asyncio.gather(*(client(k) for k in range(concurrency)))
        rps = requests / (time.perf_counter() - t0)
        running = False
        await watcher
        after = await ledgers()
        return rps, {"peak_queue_depth": peak, "dropped": after["dropped"] - before["dropped"],
                     "written": after["written"] - before["written"]}


async def failover(g: Gateways, database: str) -> float:
    """Seconds from kill -9 of the gateway a client uses to its first 200 through the other."""
    (first, proc), (second, other) = g.gateway(database), g.gateway(database)
    async with httpx.AsyncClient(timeout=30) as c:
        for i in range(10):
            (await c.post(first + "/v1/chat/completions", json=turn(i))).raise_for_status()
        proc.send_signal(signal.SIGKILL)
        killed = time.perf_counter()
        url, i = first, 0
        while True:
            i += 1
            try:
                r = await c.post(url + "/v1/chat/completions", json=turn(i))
                if r.status_code == 200 and url == second:
                    took = time.perf_counter() - killed
                    other.terminate()
                    other.wait(15)
                    return took
            except httpx.TransportError:
                url = second  # the client's retry on the other address
    raise AssertionError("unreachable")


def pcts(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {"p50_ms": 1e3 * s[len(s) // 2], "p99_ms": 1e3 * s[min(len(s) - 1, int(len(s) * 0.99))]}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 4))
    lat = result["latency"]
    for k, (name, off) in enumerate((("sqlite", -0.2), ("postgres", 0.2))):
        a.bar([0 + off, 1 + off], [lat[name]["p50_ms"], lat[name]["p99_ms"]], 0.4, label=name, color=f"C{k}")
    a.set_xticks([0, 1], ["p50", "p99"])
    a.set_ylabel("ms per session turn")
    a.set_title("one gateway: state in SQLite vs PostgreSQL")
    a.legend()
    rps = result["throughput"]
    b.bar(["one gateway", "two gateways"], [rps["one_gateway_rps"], rps["two_gateways_rps"]], color=["C1", "C2"])
    b.set_ylabel("session turns / s")
    b.set_title(f"PostgreSQL, {rps['concurrency']} clients in flight")
    kills = result["failover"]["seconds"]
    c.plot(range(1, len(kills) + 1), [1e3 * k for k in kills], "o")
    c.set_xlabel("kill")
    c.set_ylabel("ms to the first 200 through the other gateway")
    c.set_title("kill -9 of one of two gateways")
    c.set_ylim(bottom=0)
    fig.suptitle(f"gateway state (machine load {result['load']})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def measure(g: Gateways, pg: Any, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"latency": {}}
    for name in ("sqlite", "postgres"):
        url, proc = g.gateway(pg.create_database() if name == "postgres" else None)
        result["latency"][name] = pcts(asyncio.run(latencies(url, args.requests)))
        proc.terminate()
        proc.wait(15)
    db = pg.create_database()
    (one, p1), (two, p2) = g.gateway(db), g.gateway(db)
    rps1, ledger1 = asyncio.run(throughput([one], args.requests, args.concurrency))
    rps2, ledger2 = asyncio.run(throughput([one, two], args.requests, args.concurrency))
    for p in (p1, p2):
        p.terminate()
        p.wait(15)
    result["throughput"] = {"concurrency": args.concurrency, "one_gateway_rps": rps1, "two_gateways_rps": rps2}
    result["ledger"] = {"one_gateway": ledger1, "two_gateways": ledger2}
    kills = [asyncio.run(failover(g, pg.create_database())) for _ in range(args.kills)]
    result["failover"] = {"seconds": kills, "median_s": statistics.median(kills)}
    return result


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each number the median of the runs'; the kills of every run together."""
    med = statistics.median
    lat = {name: {k: med(r["latency"][name][k] for r in runs) for k in ("p50_ms", "p99_ms")}
           for name in ("sqlite", "postgres")}
    lat["added_by_postgres_ms"] = {k: lat["postgres"][k] - lat["sqlite"][k] for k in ("p50_ms", "p99_ms")}
    kills = [s for r in runs for s in r["failover"]["seconds"]]
    return {"latency": lat,
            "throughput": {"concurrency": runs[0]["throughput"]["concurrency"],
                           **{k: med(r["throughput"][k] for r in runs) for k in ("one_gateway_rps",
                                                                                  "two_gateways_rps")}},
            "failover": {"seconds": kills, "median_s": med(kills)},
            "ledger": {"peak_queue_depth": max(r["ledger"][k]["peak_queue_depth"] for r in runs for k in r["ledger"]),
                       "dropped": sum(r["ledger"][k]["dropped"] for r in runs for k in r["ledger"])}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fake-node", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--kills", type=int, default=5, help="per run")
    ap.add_argument("--runs", type=int, default=3, help="the whole measurement, repeated: medians reported")
    ap.add_argument("--out", type=Path, default=RESULTS / "latest-gateway-state.json")
    args = ap.parse_args()
    if args.fake_node:
        fake_node(args.fake_node)
        return 0
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from tests.helpers.postgres import start_postgres, stop_postgres

    load_before = "%.2f %.2f %.2f" % os.getloadavg()  # noqa: UP031
    pg = start_postgres()
    runs: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="hearth-gw-state-") as d:
            g = Gateways(Path(d))
            try:
                for _ in range(args.runs):
                    runs.append(measure(g, pg, args))
                    print(json.dumps(runs[-1]))
            finally:
                g.close()
    finally:
        stop_postgres(pg)
    result = median_of(runs)
    result.update(requests=args.requests, sessions=SESSIONS, postgres=sorted(os.listdir("/usr/lib/postgresql")),
                  runs=runs)
    result["load_before"] = load_before
    result["load"] = "%.2f %.2f %.2f" % os.getloadavg()  # noqa: UP031 (1, 5, 15 min, at the end)
    result["cpus"] = os.cpu_count()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
