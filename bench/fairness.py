"""Fair shares and preemption on one node (issue 40): the noisy neighbour and the priority request.

    .venv/bin/python -m bench.fairness                         # 16 A streams, 12 B requests per phase
    .venv/bin/python -m bench.fairness --b-requests 4 --quick  # smoke
    .venv/bin/python -m bench.fairness --b-requests 8 --no-preemption  # the noisy neighbour only
    .venv/bin/python -m bench.fairness --b-requests 8 --only-prefill   # priority beside flex prefills only

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
  - `busy_prefill`: --parallel + 2 `flex` streams with long prompts (about --flex-prompt tokens
    each, distinct from their first words, recomputed every time: `cache_prompt` false) and
    short answers (--flex-prefill-tokens), so every slot is nearly always in a long prefill when
    a priority request arrives: it pauses one half way through its prompt (0 skips this).
  Target: busy p99 <= 1.5 x idle p99 (both busy phases). Also reported: each phase's priority
  stream pace once started (`<phase>_tpot`: mean seconds per output chunk after the first,
  p50/p99 over the requests; beside flex prefills it shows the flex chunk size), the node's preemption
  count, and whether each paused stream's text equals the same request run alone (temperature
  0; a real model's kernels are not batch-invariant, so this compares with an unpaused run in
  the same batch shape only approximately: it is reported, not a target; the exact checks are
  tests/unit/engine/test_preempt*.py on the fake runner and tests/e2e/test_preempt_prefill.py).

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
FILLER = "the keeper climbed the stairs of the old lighthouse at dusk"  # about 12 tokens
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
                 times: list[float] | None = None, **extra: Any) -> tuple[float | None, str]:
    """One streamed chat request: (TTFT in seconds or None, the text); with `times`, each
    content chunk's arrival (seconds since the request) is appended to it."""
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
                    now = time.perf_counter() - t0
                    if ttft is None:
                        ttft = now
                    if times is not None:
                        times.append(now)
                    text.append(piece)
    return ttft, "".join(text)


def long_prompt(head: str, tokens: int) -> str:
    """About `tokens` tokens, starting with `head` (distinct heads share no cached prefix)."""
    return f"{head}: {' '.join([FILLER] * max(1, tokens // 12))}\nSummarise the text above."


@contextlib.asynccontextmanager
async def background(client: httpx.AsyncClient, url: str, key: str, n: int, max_tokens: int, tag: str,
                     record: list[tuple[str, str]] | None = None, prompt_tokens: int = 0,
                     **extra: Any) -> AsyncIterator[None]:
    """`n` streams kept open (each starts again when it ends) until the block exits; with
    `prompt_tokens`, each prompt is about that long."""
    stop = asyncio.Event()

    async def one(i: int) -> None:
        k = 0
        while not stop.is_set():
            prompt = f"{tag} stream {i} round {k}: write about the sea, the wind and the rocks."
            if prompt_tokens:
                prompt = long_prompt(f"{tag} stream {i} round {k}", prompt_tokens)
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
                tag: str, at_once: int = 1, tpots: list[float] | None = None, **extra: Any) -> list[float]:
    """`count` times, one every `gap` seconds, `at_once` requests sent together (each on its
    own: they overlap if slow); every request's TTFT. With `tpots`, each request's mean time
    per output chunk after the first is appended to it (its stream's pace once started)."""
    async def one(i: int) -> float | None:
        times: list[float] = []
        ttft, _ = await stream(client, url, key, f"{tag} question {i}: name three colours.", max_tokens,
                               times=times, **extra)
        if tpots is not None and len(times) >= 2:
            tpots.append((times[-1] - times[0]) / (len(times) - 1))
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
                if not args.only_prefill:
                    out["noisy_neighbour"] = await noisy_neighbour(c, url, args)
                if not args.no_preemption:
                    out["preemption"] = await preemption(c, url, args)
        finally:
            node.stop()
    return finish(out)


async def noisy_neighbour(c: httpx.AsyncClient, url: str, args: argparse.Namespace) -> dict[str, Any]:
    b = {"count": args.b_requests, "gap": args.gap, "max_tokens": args.b_tokens}
    log("noisy neighbour: B alone")
    alone = await probe(c, url, KEYS["b"], tag="alone", **b)
    log(f"noisy neighbour: A x{args.a_streams} and B, one tenant (FCFS)")
    async with background(c, url, KEYS["a"], args.a_streams, args.a_tokens, "fcfs"):
        fcfs = await probe(c, url, KEYS["a"], tag="fcfs", **b)
    log(f"noisy neighbour: A x{args.a_streams} and B, two tenants (fair share)")
    async with background(c, url, KEYS["a"], args.a_streams, args.a_tokens, "fair"):
        fair = await probe(c, url, KEYS["b"], tag="fair", **b)
    out = {"alone": summary(alone), "fcfs": summary(fcfs), "fair": summary(fair)}
    if args.b_at_once > 1:  # B sends several at once: its share of the slots, not one
        log(f"noisy neighbour: B alone, {args.b_at_once} at once")
        out["alone_at_once"] = summary(await probe(c, url, KEYS["b"], tag="alone-n", at_once=args.b_at_once, **b))
        log(f"noisy neighbour: A x{args.a_streams} and B, {args.b_at_once} at once (fair share)")
        async with background(c, url, KEYS["a"], args.a_streams, args.a_tokens, "fair-n"):
            out["fair_at_once"] = summary(
                await probe(c, url, KEYS["b"], tag="fair-n", at_once=args.b_at_once, **b))
    return out


async def preemption(c: httpx.AsyncClient, url: str, args: argparse.Namespace) -> dict[str, Any]:
    p = {"count": args.b_requests, "gap": args.gap, "max_tokens": args.b_tokens, "service_tier": "priority"}
    log("preemption: priority on an idle node")
    idle_tpots: list[float] = []
    out: dict[str, Any] = {"idle": summary(await probe(c, url, KEYS["ops"], tag="idle", tpots=idle_tpots, **p)),
                           "idle_tpot": summary(idle_tpots)}
    n_flex = args.parallel + 2
    phases: list[tuple[str, int, dict[str, Any]]] = []
    if not args.only_prefill:
        phases.append(("busy", args.flex_tokens, {}))
    if args.flex_prompt:
        phases.append(("busy_prefill", args.flex_prefill_tokens,
                       {"prompt_tokens": args.flex_prompt, "cache_prompt": False}))
    for name, tokens, extra in phases:
        before = await metric(c, url, "hearth_preemptions_total")
        flex_done: list[tuple[str, str]] = []
        log(f"preemption: priority while {n_flex} flex streams fill every slot ({name})")
        tpots: list[float] = []
        async with background(c, url, KEYS["batch"], n_flex, tokens, name, record=flex_done, **extra):
            busy = await probe(c, url, KEYS["ops"], tag=name, tpots=tpots, **p)
        preempted = await metric(c, url, "hearth_preemptions_total") - before
        same = 0
        checked = flex_done[: args.check]
        for prompt, text in checked:  # the same request alone, one at a time
            _, ref = await stream(c, url, KEYS["batch"], prompt, tokens, cache_prompt=False)
            same += ref == text
        out[name] = summary(busy)
        out[f"{name}_tpot"] = summary(tpots)  # the priority stream's pace beside the flex work
        out[f"{name}_flex_done"] = len(flex_done)  # flex answers finished meanwhile (the phase's length is fixed)
        out[f"{name}_preemptions"] = preempted
        out[f"{name}_flex_checked"], out[f"{name}_flex_identical"] = len(checked), same
    return out


def finish(out: dict[str, Any]) -> dict[str, Any]:
    """The targets' ratios added to the phases measured."""
    nn, pr = out.get("noisy_neighbour", {}), out.get("preemption", {})

    def ratio(group: dict[str, Any], x: str, y: str) -> float | None:
        if x not in group or y not in group:
            return None
        return round(group[x]["p99"] / group[y]["p99"], 3) if group[x]["p99"] and group[y]["p99"] else None

    out["targets"] = {"fair_p99_over_alone": ratio(nn, "fair", "alone"),
                      "fair_at_once_p99_over_alone": ratio(nn, "fair_at_once", "alone_at_once"),
                      "fcfs_p99_over_alone": ratio(nn, "fcfs", "alone"),
                      "priority_busy_p99_over_idle": ratio(pr, "busy", "idle"),
                      "priority_busy_prefill_p99_over_idle": ratio(pr, "busy_prefill", "idle"), "target": 1.5}
    return out


def plot(result: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    every: list[tuple[str, str, tuple[str, ...]]] = [
        ("Noisy neighbour: B's TTFT", "noisy_neighbour", ("alone", "fcfs", "fair")),
        ("Preemption: priority TTFT", "preemption", ("idle", "busy", "busy_prefill"))]
    groups = [(title, g, tuple(p for p in phases if p in result[g])) for title, g, phases in every if g in result]
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
    ap.add_argument("--flex-prompt", type=int, default=600,
                    help="prompt tokens (about) of each flex stream in the busy_prefill phase (0: no such phase)")
    ap.add_argument("--flex-prefill-tokens", type=int, default=8, help="tokens per flex answer in busy_prefill")
    ap.add_argument("--check", type=int, default=4, help="paused flex answers compared with a run alone")
    ap.add_argument("--quick", action="store_true", help="smoke: fewer, shorter requests")
    ap.add_argument("--no-preemption", action="store_true", help="the noisy neighbour phases only")
    ap.add_argument("--only-prefill", action="store_true",
                    help="the priority phases idle and busy_prefill only (no noisy neighbour, no busy)")
    args = ap.parse_args()
    if args.no_preemption and args.only_prefill:
        ap.error("--no-preemption and --only-prefill leave nothing to run")
    if args.flex_prompt and args.flex_prompt + args.flex_prefill_tokens + 64 > args.ctx:
        ap.error("--flex-prompt and --flex-prefill-tokens must fit --ctx (with 64 tokens of chat template)")
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
