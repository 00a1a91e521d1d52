"""Gateway throughput under many concurrent clients (issue 39 item 8), run by `bench.gateway --only load`.

A fast fake OpenAI-compatible engine (raw ASGI under uvicorn: it answers at once) is the
gateway's one `openai`-kind upstream with `max_in_flight = 128`. One load process with one
httpx client runs `c` workers (c in --load-concurrency), each sending requests back to back for
--load-seconds, plain and streamed (--load-chunks chunks), straight to the engine and through the
gateway, alternated. Reported per case: requests/s, p50/p99 latency, errors by kind (a closed
connection with no answer is `RemoteProtocolError`/`ReadError`), and the gateway's CPU share
of one core over the case (from /proc).

The load client's pool is sized for the load (`max_connections` and `max_keepalive_connections`
= c): httpx's defaults (100 connections, 20 kept alive) would close and reopen every connection
past the 20th after each request, so a run at 64 clients measured the client's churn as much as
the gateway (the direct-upstream figures are there to show what the client itself can do).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.cpu import session_cpu_s
from bench.servers import free_port
from bench.stats import median

WORKERS_PER_CLIENT = 16


def fake_engine(port: int, chunks: int) -> None:
    """An OpenAI-compatible engine that answers at once: `/v1/models`, and `/v1/chat/completions`
    plain or streamed (`chunks` content chunks, then the finish, the usage and [DONE])."""
    import uvicorn

    created = int(time.time())
    models = json.dumps({"object": "list", "data": [{"id": "m", "object": "model", "created": created,
                                                     "owned_by": "fake"}]}).encode()
    plain = json.dumps({"id": "chatcmpl-x", "object": "chat.completion", "created": created, "model": "m",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello there"},
                                     "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}).encode()
    base = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": created, "model": "m"}

    def event(payload: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps({**base, **payload}).encode() + b"\n\n"

    stream = (event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
              + event({"choices": [{"index": 0, "delta": {"content": " tok"}, "finish_reason": None}]}) * chunks
              + event({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
              + event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": chunks,
                                                "total_tokens": 5 + chunks}})
              + b"data: [DONE]\n\n")

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] == "/v1/models":
            out, kind = models, b"application/json"
        elif b'"stream":true' in body.replace(b" ", b""):
            out, kind = stream, b"text/event-stream"
        else:
            out, kind = plain, b"application/json"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", kind), (b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", backlog=4096)


async def _case(clients: list[httpx.AsyncClient], url: str, model: str, stream: bool, c: int,
                seconds: float) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "temperature": 0,
            **({"stream": True} if stream else {})}
    latencies: list[float] = []
    errors: dict[str, int] = {}
    stop = time.perf_counter() + seconds

    async def worker(client: httpx.AsyncClient) -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            try:
                if stream:
                    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                        done = False
                        async for line in r.aiter_lines():
                            done = done or line == "data: [DONE]"
                        ok = r.status_code == 200 and done
                else:
                    r = await client.post(url + "/v1/chat/completions", json=body)
                    ok = r.status_code == 200 and bool(r.json().get("choices"))
                if not ok:
                    errors[f"status_{r.status_code}"] = errors.get(f"status_{r.status_code}", 0) + 1
                    continue
            except httpx.HTTPError as e:
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                continue
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(clients[i % len(clients)]) for i in range(c)))
    wall = time.perf_counter() - t0
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else None
    return {"requests": len(latencies), "errors": errors, "requests_per_s": len(latencies) / wall,
            "latency_p50_ms": (median(latencies) or 0) * 1000, "latency_p99_ms": (p99 or 0) * 1000}


async def load(tmp: Path, args: Any, start_gateway: Any) -> dict[str, Any]:
    """The cases above; `start_gateway(tmp, toml_text)` starts the gateway (bench.gateway's)."""
    port = free_port()
    engine = subprocess.Popen([sys.executable, "-m", "bench.gateway_load", str(port), str(args.load_chunks)],
                              stdout=(tmp / "engine.log").open("wb"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    toml = (f'[[upstream]]\nname = "fake"\nurl = "{url}"\nkind = "openai"\nmodels = {{ "smol" = "m" }}\n'
            f"max_in_flight = {args.load_max_in_flight}\n")
    gw = None
    out: dict[str, Any] = {"max_in_flight": args.load_max_in_flight, "seconds": args.load_seconds,
                           "stream_chunks": args.load_chunks, "client_default_limits": args.load_default_limits,
                           "one_client": args.load_one_client}
    try:
        # The wait queue holds every client past max_in_flight: with its default (64), the 193rd
        # of 256 clients is answered 429 queue_full at once, back-pressure by design and not what
        # this case measures (refusals are reported apart from dropped connections all the same).
        gw = await start_gateway(tmp, toml, "--max-waiting", str(max(args.load_concurrency))).ready()
        for c in args.load_concurrency:
            # httpcore's pool scans every connection on each request (a client with 64 connections
            # spent 63 % of its CPU there): one client per WORKERS_PER_CLIENT workers keeps the
            # load process from being what is measured. --load-one-client: the setup.
            n = 1 if args.load_one_client else max(1, c // WORKERS_PER_CLIENT)
            size = -(-c // n)
            limits = httpx.Limits(keepalive_expiry=2.0) if args.load_default_limits else \
                httpx.Limits(max_connections=size, max_keepalive_connections=size, keepalive_expiry=2.0)
            clients = [httpx.AsyncClient(timeout=httpx.Timeout(60, connect=10), limits=limits) for _ in range(n)]
            try:
                for mode in ("plain", "stream"):
                    stream = mode == "stream"
                    for base, model in ((url, "m"), (gw.url, "smol")):
                        await _case(clients, base, model, stream, c, 0.5)  # warm: connections opened
                    cases: dict[str, list[dict[str, Any]]] = {"direct": [], "gateway": []}
                    for r in range(args.load_rounds * 2):
                        target, base, model = (("direct", url, "m"), ("gateway", gw.url, "smol"))[r % 2]
                        before, client_before = session_cpu_s(gw.proc.pid), time.process_time()
                        t0 = time.perf_counter()
                        case = await _case(clients, base, model, stream, c, args.load_seconds)
                        wall = time.perf_counter() - t0
                        gateway_cpu = session_cpu_s(gw.proc.pid) - before
                        client_cpu = time.process_time() - client_before
                        case |= {"gateway_core_share": gateway_cpu / wall, "client_core_share": client_cpu / wall,
                                 "gateway_cpu_ms_per_request": 1e3 * gateway_cpu / max(1, case["requests"]),
                                 "client_cpu_ms_per_request": 1e3 * client_cpu / max(1, case["requests"])}
                        cases[target].append(case)
                    out[f"{mode}_{c}"] = summary = {target: _merge(runs) for target, runs in cases.items()}
                    print(f"[gateway-bench] load {mode} c={c}: " + json.dumps(summary), file=sys.stderr, flush=True)
            finally:
                for client in clients:
                    await client.aclose()
    finally:
        if gw is not None:
            gw.stop()
        engine.terminate()
        engine.wait(15)
    return out


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one case: median rates and latencies, errors summed."""
    errors: dict[str, int] = {}
    for r in runs:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return {"requests_per_s": median([r["requests_per_s"] for r in runs]),
            "latency_p50_ms": median([r["latency_p50_ms"] for r in runs]),
            "latency_p99_ms": median([r["latency_p99_ms"] for r in runs]),
            **{k: median([r[k] for r in runs]) for k in ("gateway_core_share", "client_core_share",
                                                           "gateway_cpu_ms_per_request", "client_cpu_ms_per_request")},
            "requests": sum(r["requests"] for r in runs), "errors": errors}


if __name__ == "__main__":
    fake_engine(int(sys.argv[1]), int(sys.argv[2]))
