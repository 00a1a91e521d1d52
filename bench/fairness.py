"""Fair shares and preemption on one node (issue 40): the noisy neighbour and the priority request.

    .venv/bin/python -m bench.fairness                         # 16 A streams, 12 B requests per phase
    .venv/bin/python -m bench.fairness --b-requests 4 --quick  # smoke
    .venv/bin/python -m bench.fairness --b-requests 8 --no-preemption  # the noisy neighbour only

One node, started once with a key file of four tenants (`a`, `b`, `batch` whose key defaults
to `flex`, `ops` whose key may ask for `priority`), on --parallel slots. Phases, in one run:

- noisy neighbour: tenant B sends one streamed request every --gap seconds (--b-requests of
  them); its time to first token (TTFT) is measured
  - `alone`: nothing else runs;
  - `fcfs`: tenant A keeps --a-streams streams open (each starts again when it ends), and B's
    requests are sent with A's key: one tenant, so one first-come-first-served queue, which is
    what Hearth did before fair shares (and what it still does within a tenant);
  - `fair`: the same load, B with its own key: fair shares between tenants.
  Target: fair p99 <= 1.5 x alone p99.
- preemption: a `priority` request (tenant ops, `service_tier: priority`) every --gap seconds
  - `idle`: nothing else runs;
  - `busy`: --parallel + 2 `flex` streams (tenant batch, long answers) keep every slot busy and
    more waiting, so each priority request pauses one (KV to RAM) to start.
  Target: busy p99 <= 1.5 x idle p99. Also reported: the node's preemption count, and whether
  each paused stream's text equals the same request run alone (temperature 0; a real model's
  kernels are not batch-invariant, so this compares with an unpaused run in the same batch
  shape only approximately: it is reported, not a target; the exact check is
  tests/unit/engine/test_preempt.py on the fake runner).

All requests: temperature 0, ignore_eos, distinct prompts. Results: bench/results/fairness-<stamp>.json,
latest-fairness.json and a plot (fairness-<stamp>.png, if matplotlib is installed). Run it under
`flock /tmp/hearth-bench.lock` on a shared machine, and say how loaded it was (`uptime` is recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from bench.config import RESULTS_DIR
from bench.gateway import Proc
from bench.machine import machine_info
from bench.servers import free_port

CHAT = "/v1/chat/completions"
KEYS = {"a": "sk-bench-a", "b": "sk-bench-b", "batch": "sk-bench-batch", "ops": "sk-bench-ops"}
KEY_FILE = f"""{KEYS["a"]} name=a
{KEYS["b"]} name=b
{KEYS["batch"]} name=batch priority=flex
{KEYS["ops"]} name=ops max_priority=priority
"""


def log(msg: str) -> None:
    print(f"[fairness] {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def summary(ttfts: list[float]) -> dict[str, Any]:
    return {"n": len(ttfts), "p50": pct(ttfts, 50), "p99": pct(ttfts, 99),
            "mean": statistics.fmean(ttfts) if ttfts else None, "all": [round(t, 4) for t in ttfts]}


async def stream(client: httpx.AsyncClient, url: str, key: str, prompt: str, max_tokens: int,
                 **extra: Any) -> tuple[float | None, str]:
    """One streamed chat request: (TTFT in seconds or None, the text)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, **extra}
    t0 = time.perf_counter()
    ttft, text = None, []
    async with client.stream("POST", url + CHAT, json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(piece)
    return ttft, "".join(text)


@contextlib.asynccontextmanager
async def background(client: httpx.AsyncClient, url: str, key: str, n: int, max_tokens: int, tag: str,
                     record: list[tuple[str, str]] | None = None, **extra: Any) -> AsyncIterator[None]:
    """`n` streams kept open (each starts again when it ends) until the block exits."""
    stop = asyncio.Event()

    async def one(i: int) -> None:
        k = 0
        while not stop.is_set():
            prompt = f"{tag} stream {i} round {k}: write about the sea, the wind and the rocks."
            with contextlib.suppress(httpx.HTTPError, RuntimeError):
                _, text = await stream(client, url, key, prompt, max_tokens, **extra)
                if record is not None and not stop.is_set():
                    record.append((prompt, text))
            k += 1

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    try:
        await asyncio.sleep(2.0)  # let them fill the slots and the queue
        yield
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def probe(client: httpx.AsyncClient, url: str, key: str, count: int, gap: float, max_tokens: int,
                tag: str, at_once: int = 1, **extra: Any) -> list[float]:
    """`count` times, one every `gap` seconds, `at_once` requests sent together (each on its
    own: they overlap if slow); every request's TTFT."""
    async def one(i: int) -> float | None:
        ttft, _ = await stream(client, url, key, f"{tag} question {i}: name three colours.", max_tokens, **extra)
        return ttft

    tasks = []
    for i in range(count):
        tasks += [asyncio.create_task(one(i * at_once + k)) for k in range(at_once)]
        await asyncio.sleep(gap)
    return [t for t in await asyncio.gather(*tasks) if t is not None]


async def metric(client: httpx.AsyncClient, url: str, name: str) -> float:
    text = (await client.get(url + "/metrics", headers={"Authorization": f"Bearer {KEYS['ops']}"})).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hearth-fair-") as d:
        tmp = Path(d)
        (tmp / "keys").write_text(KEY_FILE)
        port = free_port()
        argv = [sys.executable, "-m", "hearth.cli.main", "serve", "--port", str(port), "--threads", str(args.threads),
                "--parallel", str(args.parallel), "--ctx", str(args.ctx), "--api-key-file", str(tmp / "keys"),
                "--max-waiting", "256"]
        if args.model:
            argv += ["--model", args.model]
        node = await Proc(argv, port, {**os.environ, "HEARTH_HOME": str(tmp / "node")}, tmp / "node.log").ready()
        url = node.url
        out: dict[str, Any] = {}
        try:
            async with httpx.AsyncClient(timeout=600) as c:
                await stream(c, url, KEYS["b"], "warm up", 4)
                b = {"count": args.b_requests, "gap": args.gap, "max_tokens": args.b_tokens}
                log("noisy neighbour: B alone")
                alone = await probe(c, url, KEYS["b"], tag="alone", **b)
                log(f"noisy neighbour: A x{args.a_streams} and B, one tenant (FCFS)")
                async with background(c, url, KEYS["a"], args.a_streams, args.a_tokens, "fcfs"):
                    fcfs = await probe(c, url, KEYS["a"], tag="fcfs", **b)
                log(f"noisy neighbour: A x{args.a_streams} and B, two tenants (fair share)")
                async with background(c, url, KEYS["a"], args.a_streams, args.a_tokens, "fair"):
                    fair = await probe(c, url, KEYS["b"], tag="fair", **b)
                out["noisy_neighbour"] = {"alone": summary(alone), "fcfs": summary(fcfs), "fair": summary(fair)}
                if args.b_at_once > 1:  # B sends several at once: its share of the slots, not one
                    log(f"noisy neighbour: B alone, {args.b_at_once} at once")
                    out["noisy_neighbour"]["alone_at_once"] = summary(
                        await probe(c, url, KEYS["b"], tag="alone-n", at_once=args.b_at_once, **b))
                    log(f"noisy neighbour: A x{args.a_streams} and B, {args.b_at_once} at once (fair share)")
                    async with background(c, url, KEYS["a"], args.a_streams, args.a_tokens, "fair-n"):
                        out["noisy_neighbour"]["fair_at_once"] = summary(
                            await probe(c, url, KEYS["b"], tag="fair-n", at_once=args.b_at_once, **b))
                if args.no_preemption:
                    return finish(out)
                p = {"count": args.b_requests, "gap": args.gap, "max_tokens": args.b_tokens,
                     "service_tier": "priority"}
                log("preemption: priority on an idle node")
                idle = await probe(c, url, KEYS["ops"], tag="idle", **p)
                before = await metric(c, url, "hearth_preemptions_total")
                flex_done: list[tuple[str, str]] = []
                log(f"preemption: priority while {args.parallel + 2} flex streams fill every slot")
                async with background(c, url, KEYS["batch"], args.parallel + 2, args.flex_tokens, "flex",
                                      record=flex_done):
                    busy = await probe(c, url, KEYS["ops"], tag="busy", **p)
                preempted = await metric(c, url, "hearth_preemptions_total") - before
                same = 0
                checked = flex_done[: args.check]
                for prompt, text in checked:  # the same request alone, one at a time
                    _, ref = await stream(c, url, KEYS["batch"], prompt, args.flex_tokens)
                    same += ref == text
                out["preemption"] = {"idle": summary(idle), "busy": summary(busy), "preemptions": preempted,
                                     "flex_checked": len(checked), "flex_identical": same}
        finally:
            node.stop()
    return finish(out)


def finish(out: dict[str, Any]) -> dict[str, Any]:
    """The targets' ratios added to the phases measured."""
    nn, pr = out["noisy_neighbour"], out.get("preemption")

    def ratio(x: dict[str, Any], y: dict[str, Any]) -> float | None:
        return round(x["p99"] / y["p99"], 3) if x["p99"] and y["p99"] else None

    out["targets"] = {"fair_p99_over_alone": ratio(nn["fair"], nn["alone"]),
                      "fair_at_once_p99_over_alone": ratio(nn["fair_at_once"], nn["alone_at_once"])
                      if "fair_at_once" in nn else None,
                      "fcfs_p99_over_alone": ratio(nn["fcfs"], nn["alone"]),
                      "priority_busy_p99_over_idle": ratio(pr["busy"], pr["idle"]) if pr else None, "target": 1.5}
    return out


def plot(result: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups = [("Noisy neighbour: B's TTFT", "noisy_neighbour", ("alone", "fcfs", "fair")),
              ("Preemption: priority TTFT", "preemption", ("idle", "busy"))]
    groups = [g for g in groups if g[1] in result]
    fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
    for ax, (title, group, phases) in zip(axes[0], groups, strict=True):
        data = [result[group][p]["all"] for p in phases]
        ax.boxplot(data, tick_labels=list(phases), whis=(0, 100))
        ax.set_title(title)
        ax.set_ylabel("seconds")
    fig.tight_layout()
    fig.savefig(path)
    return True


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="the node's --model (default: the server's own default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--a-streams", type=int, default=16)
    ap.add_argument("--a-tokens", type=int, default=32, help="tokens per A answer")
    ap.add_argument("--b-requests", type=int, default=12)
    ap.add_argument("--b-tokens", type=int, default=8)
    ap.add_argument("--b-at-once", type=int, default=1,
                    help="also a phase where B sends this many requests together (alone, then beside A)")
    ap.add_argument("--gap", type=float, default=2.0, help="seconds between B's (and the priority) requests")
    ap.add_argument("--flex-tokens", type=int, default=96)
    ap.add_argument("--check", type=int, default=4, help="paused flex answers compared with a run alone")
    ap.add_argument("--quick", action="store_true", help="smoke: fewer, shorter requests")
    ap.add_argument("--no-preemption", action="store_true", help="the noisy neighbour phases only")
    args = ap.parse_args()
    if args.quick:
        args.a_streams, args.b_requests, args.gap, args.a_tokens, args.flex_tokens, args.check = 8, 4, 1.0, 16, 48, 2
    load_before = uptime()
    result = asyncio.run(run(args))
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    report = {"bench": "fairness", "stamp": stamp, "settings": vars(args), "machine": machine_info(),
              "uptime_before": load_before, "uptime_after": uptime(), "result": result}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    for path in (RESULTS_DIR / f"fairness-{stamp}.json", RESULTS_DIR / "latest-fairness.json"):
        path.write_text(json.dumps(report, indent=2) + "\n")
    if plot(result, RESULTS_DIR / f"fairness-{stamp}.png"):
        log(f"plot: {RESULTS_DIR / f'fairness-{stamp}.png'}")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
