"""The Batch API's durability: a batch whose node is killed (-9) at random points, then
restarted on the same data dir, five times over (issue 40).

    .venv/bin/python -m bench.batch                          # 200 lines, 5 kills
    .venv/bin/python -m bench.batch --lines 40 --kills 3     # smoke

One node (--parallel slots, --batch-concurrency lines at once). A batch of --lines chat
requests (distinct prompts, temperature 0, --max-tokens each) is submitted; the kill points are
drawn (seeded, --seed) as counts of finished lines, spread over the batch; when the batch's
`request_counts.completed` reaches the next one the node is killed with SIGKILL and started
again on its data dir. When the batch completes its output is read and checked:

- exactly_once: every custom_id of the input is in the output exactly once (the target), with
  `missing` and `duplicated` listed otherwise, and no line in the error file;
- reran: lines the restarted nodes answered although an earlier node had already recorded them
  (from each node's own count of chat requests, read just before its kill and at the end: the
  answers in flight at a kill are not recorded, so they run again and are not counted here);
- wall_s and lines_per_s over the whole run, restarts included.

Results: bench/results/batch-<stamp>.json and latest-batch.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import io
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.config import RESULTS_DIR
from bench.gateway import Proc
from bench.machine import machine_info
from bench.servers import free_port

CHAT = "/v1/chat/completions"
TOPICS = ("rivers", "bread", "owls", "copper", "tides", "maps", "bells", "moss", "glass", "wool")


def log(msg: str) -> None:
    print(f"[batch-bench] {msg}", file=sys.stderr, flush=True)


def input_file(n: int, max_tokens: int) -> bytes:
    return b"".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": CHAT, "body": {
        "model": "default", "temperature": 0, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": f"Write one sentence about {TOPICS[i % len(TOPICS)]} ({i})."}]}}
    ).encode() + b"\n" for i in range(n))


def chat_requests(url: str) -> float:
    """The node's count of chat requests answered (its own lines included)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("hearth_http_requests_total{") and f'endpoint="{CHAT}"' in line:
            total += float(line.rpartition(" ")[2])
    return total


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    # kill points: one in each of `kills` equal parts of the batch, at a random place inside it
    part = args.lines / (args.kills + 1)
    points = [int(part * k + rng.uniform(0.1, 0.9) * part) for k in range(1, args.kills + 1)]
    with tempfile.TemporaryDirectory(prefix="hearth-batch-bench-") as d:
        tmp = Path(d)
        port = free_port()
        node = await start_node(tmp, args, port)
        t0 = time.monotonic()
        kills: list[dict[str, Any]] = []
        answered = 0.0
        async with httpx.AsyncClient(base_url=node.url, timeout=60) as c:
            f = (await c.post("/v1/files", data={"purpose": "batch"},
                              files={"file": ("in.jsonl", io.BytesIO(input_file(args.lines, args.max_tokens)))})).json()
            batch = (await c.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": CHAT,
                                                       "completion_window": "24h"})).json()
        bid = batch["id"]
        log(f"batch {bid}: {args.lines} lines; kill points at {points} finished lines")
        for point in points:
            async with httpx.AsyncClient(base_url=node.url, timeout=60) as c:
                while True:
                    b = (await c.get(f"/v1/batches/{bid}")).json()
                    if b["request_counts"]["completed"] >= point or b["status"] == "completed":
                        break
                    await asyncio.sleep(args.poll)
            before = chat_requests(node.url)
            node.proc.send_signal(signal.SIGKILL)
            node.proc.wait(10)
            answered += before
            kills.append({"at_completed": b["request_counts"]["completed"], "node_answered": before})
            log(f"killed at {b['request_counts']['completed']} finished lines (this node answered {before:.0f})")
            node = await start_node(tmp, args, port)  # the same node: same data dir, same port
        async with httpx.AsyncClient(base_url=node.url, timeout=120) as c:
            while True:
                b = (await c.get(f"/v1/batches/{bid}")).json()
                if b["status"] in ("completed", "failed", "expired", "cancelled"):
                    break
                await asyncio.sleep(args.poll)
            wall = time.monotonic() - t0
            out = [json.loads(x) for x in (await c.get(f"/v1/files/{b['output_file_id']}/content")).text.splitlines()] \
                if b.get("output_file_id") else []
            errors = (await c.get(f"/v1/files/{b['error_file_id']}/content")).text.splitlines() \
                if b.get("error_file_id") else []
        answered += chat_requests(node.url)
        node.stop()
    ids = [o["custom_id"] for o in out]
    want = [f"line-{i}" for i in range(args.lines)]
    missing = sorted(set(want) - set(ids))
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    return {
        "status": b["status"], "lines": args.lines, "kills": kills,
        "output_lines": len(out), "error_lines": len(errors),
        "exactly_once": not missing and not duplicated and len(out) == args.lines and not errors,
        "missing": missing, "duplicated": duplicated,
        "reran": max(0, int(answered) - args.lines),  # answered beyond one per line: re-runs of unrecorded ones
        "wall_s": round(wall, 2), "lines_per_s": round(args.lines / wall, 2),
    }


async def start_node(tmp: Path, args: argparse.Namespace, port: int) -> Proc:
    """The node, its data dir in tmp/node (started again: the same node restarted)."""
    argv = [sys.executable, "-m", "hearth.cli.main", "serve", "--port", str(port), "--threads", str(args.threads),
            "--parallel", str(args.parallel), "--ctx", str(args.ctx),
            "--batch-concurrency", str(args.batch_concurrency)]
    log_path = tmp / f"node-{time.monotonic_ns()}.log"  # one log per start
    return await Proc(argv, port, {**os.environ, "HEARTH_HOME": str(tmp / "node")}, log_path).ready()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=200)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--batch-concurrency", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=40)
    ap.add_argument("--poll", type=float, default=0.02, help="seconds between looks at the batch")
    args = ap.parse_args()
    result = asyncio.run(run(args))
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    report = {"bench": "batch", "stamp": stamp, "settings": vars(args), "machine": machine_info(), "result": result}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    for path in (RESULTS_DIR / f"batch-{stamp}.json", RESULTS_DIR / "latest-batch.json"):
        path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    log("every line exactly once" if result["exactly_once"] else "FAILED: lines missing or duplicated")
    sys.exit(0 if result["exactly_once"] else 1)


if __name__ == "__main__":
    main()
