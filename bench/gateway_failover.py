"""A node killed (-9) in the middle of streamed answers, through the gateway (issue 25).

    .venv/bin/python -m bench.gateway_failover                      # 50 streams per protocol (idle machine)
    .venv/bin/python -m bench.gateway_failover --streams 6 --max-tokens 24   # smoke

--nodes Hearth nodes (--parallel slots each, the gateway sending each at most --max-in-flight
streams: the slots above it take the continuations of a dead node's streams at once) behind one
gateway. Per protocol (Chat Completions, Anthropic Messages,
Responses): first the --streams requests (distinct prompts, temperature 0) are answered with no
failure (the reference); then the same requests are sent again, all at once, and when a third of
them have received text, the node serving most of the streams still running is killed -9 and
restarted on its data dir after the round. Reported per protocol:

- completed: streams that ended with their protocol's final event and no error event (target:
  all of them, for Hearth nodes);
- equal_text: of the streams the kill cut, the share whose text equals the reference answer
  (the continuation re-tokenizes the text relayed so far, so a token boundary can differ);
- cut_gap_ms: the client-visible pause at the cut (from the kill to the next text the client
  got), median, next to the median gap between two text events of the same streams.

Results: bench/results/gateway-failover-<stamp>.json and latest-gateway-failover.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.config import RESULTS_DIR
from bench.gateway import Proc, start_gateway, start_node
from bench.machine import machine_info

PROTOCOLS = ("chat", "messages", "responses")
TOPICS = ("rivers", "bread", "owls", "copper", "tides", "maps", "bells", "moss", "glass", "wool")


def log(msg: str) -> None:
    print(f"[failover-bench] {msg}", file=sys.stderr, flush=True)


@dataclass
class Stream:
    node: str = "?"
    text: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # when each text event arrived (perf_counter)
    done: bool = False  # the protocol's final event came
    error: str | None = None
    ended: float = 0.0  # when the stream ended (perf_counter)

    @property
    def joined(self) -> str:
        return "".join(self.text)


def request(protocol: str, i: int, max_tokens: int) -> tuple[str, dict[str, Any]]:
    prompt = f"Write a short story about {TOPICS[i % len(TOPICS)]} number {i}."
    if protocol == "chat":
        return "/v1/chat/completions", {"model": "smol", "messages": [{"role": "user", "content": prompt}],
                                        "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if protocol == "messages":
        return "/v1/messages", {"model": "smol", "messages": [{"role": "user", "content": prompt}],
                                "max_tokens": max_tokens, "temperature": 0, "stream": True}
    return "/v1/responses", {"model": "smol", "input": prompt, "max_output_tokens": max_tokens, "temperature": 0,
                             "stream": True, "store": False}


def read_event(protocol: str, event: str, data: dict[str, Any], s: Stream) -> None:
    """One SSE event of `protocol` into `s`."""
    now = time.perf_counter()
    if protocol == "chat":
        if "error" in data:
            s.error = str(data["error"])
        for ch in data.get("choices") or []:
            if (ch.get("delta") or {}).get("content"):
                s.text.append(ch["delta"]["content"])
                s.times.append(now)
            if ch.get("finish_reason"):
                s.done = True
    elif protocol == "messages":
        if event == "error":
            s.error = str(data.get("error"))
        elif event == "content_block_delta" and data.get("delta", {}).get("type") == "text_delta":
            s.text.append(data["delta"]["text"])
            s.times.append(now)
        elif event == "message_stop":
            s.done = True
    else:
        if event in ("error", "response.failed"):
            s.error = json.dumps(data)[:300]
        elif event == "response.output_text.delta":
            s.text.append(data["delta"])
            s.times.append(now)
        elif event in ("response.completed", "response.incomplete"):  # incomplete: max_output_tokens
            s.done = True


async def stream(client: httpx.AsyncClient, url: str, protocol: str, i: int, max_tokens: int, s: Stream) -> None:
    path, body = request(protocol, i, max_tokens)
    try:
        async with client.stream("POST", url + path, json=body) as r:
            s.node = r.headers.get("x-hearth-upstream", "?")
            if r.status_code != 200:
                s.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return
            event = ""
            async for line in r.aiter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and line != "data: [DONE]":
                    read_event(protocol, event, json.loads(line[6:]), s)
    except httpx.HTTPError as e:
        s.error = f"{type(e).__name__}: {e}"
    finally:
        s.ended = time.perf_counter()


async def round_of(url: str, protocol: str, n: int, max_tokens: int,
                   kill: Any = None) -> tuple[list[Stream], float | None, str | None]:
    """`n` concurrent streams; `kill(name)` the busiest node once a third have text. Returns the
    streams, when the kill happened and whom it hit."""
    streams = [Stream() for _ in range(n)]
    async with httpx.AsyncClient(timeout=httpx.Timeout(900, connect=10)) as client:
        tasks = [asyncio.create_task(stream(client, url, protocol, i, max_tokens, streams[i])) for i in range(n)]
        killed_at, victim = None, None
        if kill is not None:
            while not all(t.done() for t in tasks):
                running = [s for s in streams if s.text and not s.done and s.error is None]
                if sum(1 for s in streams if s.text) >= max(1, n // 3) and running:
                    by_node: dict[str, int] = {}
                    for s in running:
                        by_node[s.node] = by_node.get(s.node, 0) + 1
                    victim = max(by_node, key=lambda k: by_node[k])
                    killed_at = time.perf_counter()
                    kill(victim)
                    break
                await asyncio.sleep(0.02)
        await asyncio.gather(*tasks)
    return streams, killed_at, victim


async def bench_protocol(gw: Proc, nodes: dict[str, Proc], tmp: Path, protocol: str,
                         args: argparse.Namespace) -> dict[str, Any]:
    reference, _, _ = await round_of(gw.url, protocol, args.streams, args.max_tokens)
    ref_ok = sum(1 for s in reference if s.done and s.error is None)

    def kill(name: str) -> None:
        nodes[name].proc.kill()
        nodes[name].proc.wait(10)

    streams, killed_at, victim = await round_of(gw.url, protocol, args.streams, args.max_tokens, kill)
    assert killed_at is not None and victim is not None
    # cut: on the victim, text received before the kill, not ended before it
    cut = [(s, r) for s, r in zip(streams, reference, strict=True)
           if s.node == victim and s.times and s.times[0] < killed_at < s.ended]
    gaps = [next(t for t in s.times if t > killed_at) - killed_at for s, _ in cut
            if any(t > killed_at for t in s.times)]
    steady = [b - a for s in streams for a, b in zip(s.times, s.times[1:], strict=False)
              if b < killed_at or a > killed_at]
    out = {
        "streams": args.streams, "reference_completed": ref_ok, "victim": victim,
        "completed": sum(1 for s in streams if s.done and s.error is None),
        "errors": [s.error for s in streams if s.error][:5],
        "cut_streams": len(cut),
        "cut_completed": sum(1 for s, _ in cut if s.done and s.error is None),
        "equal_text_share": (sum(1 for s, r in cut if s.joined == r.joined) / len(cut)) if cut else None,
        "equal_text_all_share": sum(1 for s, r in zip(streams, reference, strict=True) if s.joined == r.joined)
        / len(streams),
        "cut_gap_ms_p50": statistics.median(gaps) * 1000 if gaps else None,
        "token_gap_ms_p50": statistics.median(steady) * 1000 if steady else None,
    }
    log(f"{protocol}: {out}")
    # the victim back on its data dir before the next protocol's round
    new = start_node(tmp, victim, args)
    nodes[victim] = new
    await new.ready()
    await asyncio.sleep(args.probe_interval * 4)  # the gateway's probe sees it up again
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="hearth-failover-"))
    nodes = {f"n{i}": start_node(tmp, f"n{i}", args) for i in range(args.nodes)}
    await asyncio.gather(*(p.ready() for p in nodes.values()))
    gw: Proc | None = None
    try:
        gw = await start_gateway(tmp, nodes, args, "--probe-interval", str(args.probe_interval),
                                 "--max-wait", "600", "--max-waiting", str(args.streams * 2),
                                 "--stall-timeout", "5").ready()
        out: dict[str, Any] = {}
        for protocol in args.protocols:
            out[protocol] = await bench_protocol(gw, nodes, tmp, protocol, args)
            # the restarted node has a new port: the gateway must be told (a restart keeps the port
            # in the e2e fleet; here the bench restarts the gateway over the new addresses)
            gw.stop()
            gw = await start_gateway(tmp, nodes, args, "--probe-interval", str(args.probe_interval),
                                     "--max-wait", "600", "--max-waiting", str(args.streams * 2),
                                     "--stall-timeout", "5").ready()
        return out
    finally:
        if gw is not None:
            gw.stop()
        for p in nodes.values():
            p.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--parallel", type=int, default=8, help="slots per node")
    ap.add_argument("--max-in-flight", type=int, default=5,
                    help="the gateway's cap per node (below --parallel: slots kept free for continuations)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--probe-interval", type=float, default=0.3)
    ap.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    args = ap.parse_args()
    t0 = time.time()
    results = asyncio.run(main_async(args))
    doc = {"bench": "gateway-failover", "args": vars(args), "machine": machine_info(),
           "seconds": round(time.time() - t0, 1), "results": results}
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    for name in (f"gateway-failover-{stamp}.json", "latest-gateway-failover.json"):
        (RESULTS_DIR / name).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
