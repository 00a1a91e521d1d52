"""A batch beside interactive chat on one node (issue 40, "Batch beside interactive").

    .venv/bin/python -m bench.batch_beside                        # 96 lines, 10 interactive requests
    .venv/bin/python -m bench.batch_beside --lines 32 --requests 4  # smoke

One node (--parallel slots; --batch-concurrency lines of a batch at once, default all the slots,
so a batch alone can use the whole machine). Phases, in one run:

- `batch alone`: a batch of --lines chat lines (distinct prompts, temperature 0, ignore_eos,
  --line-tokens each) runs with nothing else: its generated tokens over its wall time is the
  decode throughput the machine has when nobody else is there (`idle_tok_s`);
- `interactive alone`: --requests streamed chat requests, one every --gap seconds; their time to
  first token (TTFT). With --conversation they are the turns of one chat (a ~400-token system
  prompt and the whole history each turn, as a stateless app sends them), so a turn's TTFT
  also says whether its conversation's KV was still warm;
- `beside`: a second batch like the first (other prompts) is submitted, and once its first line
  is done the same interactive requests are sent while it runs; their TTFT, and the batch's
  generated tokens over its wall time (`beside_tok_s`).

Targets (issue 40): interactive TTFT p99 beside <= 1.2 x alone; the batch's throughput beside
>= 80 % of `idle_tok_s` (its share of the idle decode throughput). `valid` says whether the
batch was still running when the last interactive request finished (else the comparison says
little: raise --lines). Results: bench/results/batch_beside-<stamp>.json and
latest-batch_beside.json. Run it under `flock /tmp/hearth-bench.lock`; `uptime` is recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.config import RESULTS_DIR
from bench.fairness import pct, stream, summary, uptime
from bench.gateway import Proc
from bench.machine import machine_info
from bench.servers import free_port

CHAT = "/v1/chat/completions"
FINAL = ("completed", "failed", "expired", "cancelled")


def log(msg: str) -> None:
    print(f"[batch-beside] {msg}", file=sys.stderr, flush=True)


def input_file(n: int, max_tokens: int, tag: str) -> bytes:
    return b"".join(json.dumps({"custom_id": f"{tag}-{i}", "method": "POST", "url": CHAT, "body": {
        "model": "default", "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True,
        "messages": [{"role": "user", "content": f"{tag} {i}: describe a harbour at dawn in detail."}]}}
    ).encode() + b"\n" for i in range(n))


async def submit(c: httpx.AsyncClient, lines: int, tokens: int, tag: str) -> str:
    f = (await c.post("/v1/files", data={"purpose": "batch"},
                      files={"file": ("in.jsonl", io.BytesIO(input_file(lines, tokens, tag)))})).json()
    b = (await c.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": CHAT,
                                           "completion_window": "24h"})).json()
    return str(b["id"])


async def wait_batch(c: httpx.AsyncClient, bid: str, poll: float, until_done: int | None = None) -> dict[str, Any]:
    """The batch once final (or once `until_done` lines are done)."""
    while True:
        b: dict[str, Any] = (await c.get(f"/v1/batches/{bid}")).json()
        if b["status"] in FINAL or (until_done is not None and b["request_counts"]["completed"] >= until_done):
            return b
        await asyncio.sleep(poll)


async def generated(c: httpx.AsyncClient, b: dict[str, Any]) -> int:
    out = (await c.get(f"/v1/files/{b['output_file_id']}/content")).text.splitlines() if b.get("output_file_id") \
        else []
    return sum(int(json.loads(x)["response"]["body"]["usage"]["completion_tokens"]) for x in out)


# An app's instructions, ~400 tokens: what a conversation's turns share before their history.
SYSTEM = " ".join(f"Rule {i}: answer briefly, name sources when asked, keep a friendly tone, and never invent "
                  "facts about the harbour, its boats or its people." for i in range(1, 17))


async def conversation(c: httpx.AsyncClient, url: str, count: int, gap: float, tokens: int, tag: str) -> list[float]:
    """`count` turns of one chat, one every `gap` seconds (each after the previous answer):
    each sends the whole conversation so far, as a stateless app does. The TTFTs of turns 2 to
    `count` + 1: the first turn's is the system prompt's cold start (the beside phase's would
    find it cached by the alone phase's), not a turn of a running conversation."""
    history: list[dict[str, str]] = []
    out: list[float] = []
    for i in range(count + 1):
        t0 = time.monotonic()
        user = {"role": "user", "content": f"{tag} turn {i}: name three colours."}
        ttft, text = await stream(c, url, "none", "", tokens,
                                  messages=[{"role": "system", "content": SYSTEM}, *history, user])
        if ttft is not None and i > 0:
            out.append(ttft)
        history += [user, {"role": "assistant", "content": text}]
        await asyncio.sleep(max(0.0, gap - (time.monotonic() - t0)))
    return out


async def probes(c: httpx.AsyncClient, url: str, count: int, gap: float, tokens: int, tag: str,
                 chat: bool = False) -> list[float]:
    if chat:
        return await conversation(c, url, count, gap, tokens, tag)

    async def one(i: int) -> float | None:
        ttft, _ = await stream(c, url, "none", f"{tag} question {i}: name three colours.", tokens)
        return ttft

    tasks = []
    for i in range(count):
        tasks.append(asyncio.create_task(one(i)))
        await asyncio.sleep(gap)
    return [t for t in await asyncio.gather(*tasks) if t is not None]


async def timed_batch(c: httpx.AsyncClient, args: argparse.Namespace, tag: str) -> tuple[str, float]:
    bid = await submit(c, args.lines, args.line_tokens, tag)
    return bid, time.monotonic()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hearth-beside-") as d:
        tmp = Path(d)
        port = free_port()
        argv = [sys.executable, "-m", "hearth.cli.main", "serve", "--port", str(port), "--threads", str(args.threads),
                "--parallel", str(args.parallel), "--ctx", str(args.ctx),
                "--batch-concurrency", str(args.batch_concurrency or args.parallel)]
        node = await Proc(argv, port, {**os.environ, "HEARTH_HOME": str(tmp / "node")}, tmp / "node.log").ready()
        url = node.url
        try:
            async with httpx.AsyncClient(base_url=url, timeout=600) as c:
                await stream(c, url, "none", "warm up", 4)
                log(f"batch alone: {args.lines} lines x {args.line_tokens} tokens")
                bid, t0 = await timed_batch(c, args, "alone")
                alone_b = await wait_batch(c, bid, args.poll)
                alone_wall = time.monotonic() - t0
                idle_tok_s = await generated(c, alone_b) / alone_wall
                log(f"  {idle_tok_s:.1f} tok/s over {alone_wall:.1f} s")
                log(f"interactive alone: {args.requests} requests, one every {args.gap} s")
                alone = await probes(c, url, args.requests, args.gap, args.tokens, "alone", args.conversation)
                log("beside: the same interactive requests while a second batch runs")
                bid, t0 = await timed_batch(c, args, "beside")
                await wait_batch(c, bid, args.poll, until_done=1)  # the batch is running
                beside = await probes(c, url, args.requests, args.gap, args.tokens, "beside", args.conversation)
                still_running = (await c.get(f"/v1/batches/{bid}")).json()["status"] not in FINAL
                beside_b = await wait_batch(c, bid, args.poll)
                beside_wall = time.monotonic() - t0
                beside_tok_s = await generated(c, beside_b) / beside_wall
                log(f"  batch {beside_tok_s:.1f} tok/s over {beside_wall:.1f} s")
        finally:
            node.stop()
    a99, b99 = pct(alone, 99), pct(beside, 99)
    return {
        "batch_alone": {"status": alone_b["status"], "wall_s": round(alone_wall, 2), "tok_s": round(idle_tok_s, 2)},
        "batch_beside": {"status": beside_b["status"], "wall_s": round(beside_wall, 2),
                         "tok_s": round(beside_tok_s, 2)},
        "interactive": {"alone": summary(alone), "beside": summary(beside)},
        "valid": still_running,
        "targets": {"ttft_p99_beside_over_alone": round(b99 / a99, 3) if a99 and b99 else None, "ttft_target": 1.2,
                    "batch_share_of_idle_throughput": round(beside_tok_s / idle_tok_s, 3) if idle_tok_s else None,
                    "share_target": 0.8},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=96)
    ap.add_argument("--line-tokens", type=int, default=48, help="tokens per batch line (ignore_eos)")
    ap.add_argument("--requests", type=int, default=10, help="interactive requests per phase")
    ap.add_argument("--tokens", type=int, default=8, help="tokens per interactive answer")
    ap.add_argument("--gap", type=float, default=1.5, help="seconds between interactive requests")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--batch-concurrency", type=int, default=0, help="default: --parallel")
    ap.add_argument("--conversation", action="store_true",
                    help="the interactive requests are the turns of one chat (a ~400-token system prompt, then "
                         "the whole history each turn, as a stateless app sends it), not independent questions")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--poll", type=float, default=0.05)
    args = ap.parse_args()
    load_before = uptime()
    result = asyncio.run(run(args))
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    report = {"bench": "batch_beside", "stamp": stamp, "settings": vars(args), "machine": machine_info(),
              "uptime_before": load_before, "uptime_after": uptime(), "result": result}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    for path in (RESULTS_DIR / f"batch_beside-{stamp}.json", RESULTS_DIR / "latest-batch_beside.json"):
        path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({**result, "uptime_before": load_before, "uptime_after": report["uptime_after"]}, indent=2))


if __name__ == "__main__":
    main()
