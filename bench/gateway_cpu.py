"""The gateway's own CPU per request and per relayed event, against a fake Hearth node that
streams chat chunks as fast as it can (so the node costs nothing and the machine's load does not
enter): CPU time of the gateway process from /proc, over many streamed requests.

    .venv/bin/python -m bench.gateway_cpu                      # 1-event and 200-event answers
    .venv/bin/python -m bench.gateway_cpu --events 100 --delay 0.003   # one event per upstream read
    .venv/bin/python -m bench.gateway_cpu --protocol ollama    # Ollama's /api/chat NDJSON lines instead

Prints CPU µs per relayed event and ms per request, and the first-event latency p50 through the
gateway vs direct to the fake node. Not a test: numbers, no thresholds.
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
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from bench.cpu import session_cpu_s
from bench.servers import free_port


def fake_node(port: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def chat(request: Request) -> Response:
        body = await request.json()
        n, delay = int(body.get("max_tokens", 1)), float(body.get("delay", 0))
        base = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": body["model"]}

        def chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
            return b"data: " + json.dumps({**base, "choices": [{"index": 0, "delta": delta,
                                                                 "finish_reason": finish}]}).encode() + b"\n\n"

        async def events() -> AsyncIterator[bytes]:
            yield chunk({"role": "assistant", "content": ""})
            for _ in range(n):
                if delay:
                    await asyncio.sleep(delay)
                yield chunk({"content": " tok"})
            yield chunk({}, "length")
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def ollama_chat(request: Request) -> Response:
        body = await request.json()
        n, delay = int(body["options"]["num_predict"]), float(body.get("delay", 0))
        base = {"model": f"{body['model']}:latest", "created_at": "2026-11-29T00:00:00Z"}

        def line(d: dict[str, object]) -> bytes:
            return json.dumps({**base, **d}, separators=(",", ":")).encode() + b"\n"

        async def lines() -> AsyncIterator[bytes]:
            for _ in range(n):
                if delay:
                    await asyncio.sleep(delay)
                yield line({"message": {"role": "assistant", "content": " tok"}, "done": False})
            yield line({"message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "length",
                        "total_duration": 1, "load_duration": 0, "prompt_eval_count": 1, "prompt_eval_duration": 1,
                        "eval_count": n, "eval_duration": 1})

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    app = Starlette(routes=[Route("/health", health), Route("/v1/chat/completions", chat, methods=["POST"]),
                            Route("/api/chat", ollama_chat, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


async def measure(events: int, requests: int, delay: float, protocol: str = "chat") -> dict[str, float | str]:
    node_port, gw_port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="hearth-gw-cpu-") as d:
        toml = Path(d) / "fleet.toml"
        toml.write_text(f'[[upstream]]\nname = "a"\nurl = "http://127.0.0.1:{node_port}"\n'
                        'models = { "smol" = "m" }\nmax_in_flight = 8\n')
        node = subprocess.Popen([sys.executable, "-m", "bench.gateway_cpu", "--fake-node", str(node_port)])
        gw = subprocess.Popen([sys.executable, "-m", "hearth.cli.main", "gateway", "--upstreams", str(toml),
                               "--port", str(gw_port), "--log-level", "warning"],
                              env={**os.environ, "HEARTH_GATEWAY_HOME": d}, start_new_session=True)
        try:
            async with httpx.AsyncClient(timeout=60) as c:
                gw_url, node_url = f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{node_port}"
                deadline = time.monotonic() + 60
                while True:
                    try:
                        if (await c.get(gw_url + "/health")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    assert time.monotonic() < deadline, "the gateway did not start"
                    await asyncio.sleep(0.1)

                ollama = protocol == "ollama"
                path = "/api/chat" if ollama else "/v1/chat/completions"
                limit = {"options": {"num_predict": events}} if ollama else {"max_tokens": events}

                async def one(url: str, model: str) -> float:
                    t0, first = time.perf_counter(), None
                    async with c.stream("POST", url + path, json={
                            "model": model, "messages": [{"role": "user", "content": "hi"}], **limit,
                            "stream": True, "delay": delay}) as r:
                        async for line in r.aiter_lines():
                            if first is None and (line.startswith("{") if ollama else line.startswith("data: ")):
                                first = time.perf_counter() - t0
                    assert first is not None
                    return first

                for _ in range(5):
                    await one(gw_url, "smol")
                before = session_cpu_s(gw.pid)
                through = sorted([await one(gw_url, "smol") for _ in range(requests)])
                used = session_cpu_s(gw.pid) - before
                direct = sorted([await one(node_url, "m") for _ in range(requests)])
        finally:
            for p in (gw, node):
                p.terminate()
                p.wait(15)
    # chat: the role chunk, the tokens, the finish chunk, [DONE]; ollama: the tokens, the final object
    relayed = requests * (events + (1 if protocol == "ollama" else 3))
    return {"protocol": protocol, "events_per_answer": events, "requests": requests, "delay_s": delay,
            "gateway_cpu_us_per_event": 1e6 * used / relayed, "gateway_cpu_ms_per_request": 1e3 * used / requests,
            "first_event_p50_gateway_ms": 1e3 * through[len(through) // 2],
            "first_event_p50_direct_ms": 1e3 * direct[len(direct) // 2]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fake-node", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--events", type=int, nargs="+", default=[1, 200])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--delay", type=float, default=0.0, help="seconds between the fake node's events")
    ap.add_argument("--protocol", choices=["chat", "ollama"], default="chat",
                    help="OpenAI chat SSE (default) or Ollama's /api/chat NDJSON")
    args = ap.parse_args()
    if args.fake_node:
        fake_node(args.fake_node)
        return 0
    for n in args.events:
        print(json.dumps(asyncio.run(measure(n, args.requests if n < 50 else max(20, args.requests // 6),
                                             args.delay, args.protocol))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
