"""Multi-turn benchmark: many long conversations, interleaved round-robin (issue 3).

    .venv/bin/python -m bench.multiturn                # everything below, ~40 min on 2 cores
    .venv/bin/python -m bench.multiturn --sessions 4 --turns 4 --only hearth-sessions   # smoke

Each of `--sessions` conversations gets `--turns` turns; each turn adds a ~250-token user
message and a short reply (temperature 0), so histories reach 2-3k tokens. Turns go
round-robin over the sessions (turn 1 of every session, then turn 2, ...), so a server with
fewer slots than sessions must keep the others somewhere or re-prefill them. Runs:

- hearth-sessions: Hearth through sessions (each turn sends only its new message), with a
  `--session-ram-mb` budget smaller than the sessions' KV (so some spill to disk), restarted
  between turns 4 and 5;
- llama-server: full history every turn (`-np 4`, its host-RAM prompt cache on by default),
  restarted between turns 4 and 5 too;
- hearth-stateless: Hearth as a stateless server (full history each turn), no restart;
- llama-cpp-python: its server (no cache across interleaved conversations); by default only
  `--lcp-sessions` sessions, because each of its turns re-prefills the whole history;
- snapshot: Hearth only: load a snapshot of a ~3k-token session and get the first token of a
  new turn, against a stateless request that prefills the same context from scratch.

Per-turn TTFT p50/p95, total time, and the prompt tokens each Hearth turn actually prefilled
(prompt - cached) go to bench/results/multiturn-<stamp>.json (+ latest-multiturn.json) and a
plot (multiturn-<stamp>.png).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.client import first_model_id
from bench.config import RESULTS_DIR, Settings, default_model
from bench.machine import machine_info
from bench.report import save_json
from bench.servers import LAUNCHERS, Launch, RunningServer, free_port
from bench.stats import median, percentile

WORDS = [
    "river", "mountain", "lantern", "harvest", "window", "copper", "garden", "silver", "thunder", "meadow",
    "violet", "engine", "pocket", "marble", "forest", "candle", "anchor", "basket", "feather", "harbor", "island",
    "jacket", "kettle", "ladder", "mirror", "needle", "orchard", "pepper", "quarry", "rabbit", "saddle", "timber",
    "umbrella", "valley", "wagon", "yellow", "zephyr", "bridge", "castle", "dragon", "ember", "falcon", "glacier",
    "hollow", "ivory", "jungle", "kingdom", "legend",
]
SYSTEM = "You are a helpful assistant. Answer in one short sentence."


def user_message(session: int, turn: int, words: int) -> str:
    rng = random.Random(session * 1000 + turn)
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"Conversation {session}, note {turn}: {body}. Summarize the note above."


@dataclass
class TurnResult:
    run: str
    session: int
    turn: int
    ttft_s: float
    total_s: float
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None


@dataclass
class Conversation:
    index: int
    messages: list[dict[str, str]] = field(default_factory=lambda: [{"role": "system", "content": SYSTEM}])


def log(msg: str) -> None:
    print(f"[multiturn {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


async def stream_turn(client: httpx.AsyncClient, url: str,
                      body: dict[str, Any]) -> tuple[float, float, str, dict[str, Any]]:
    """(ttft, total, reply text, usage) of one streamed chat completion."""
    t0 = time.perf_counter()
    ttft: float | None = None
    parts: list[str] = []
    usage: dict[str, Any] = {}
    async with client.stream("POST", f"{url}/v1/chat/completions", json={
            **body, "stream": True, "stream_options": {"include_usage": True}}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    parts.append(text)
            if chunk.get("usage"):
                usage = chunk["usage"]
    total = time.perf_counter() - t0
    return (ttft if ttft is not None else total), total, "".join(parts), usage


LaunchFor = Callable[[int], Launch]


async def conversation_run(name: str, launch_for: LaunchFor, settings: Settings, *, sessions: int, turns: int,
                           words: int, max_tokens: int, use_sessions: bool, restart_after: int | None
                           ) -> list[TurnResult]:
    """All turns of all conversations against one server (restarted once if asked)."""
    convs = [Conversation(i) for i in range(sessions)]
    results: list[TurnResult] = []
    port = free_port()
    launch = launch_for(port)
    server = await RunningServer(name, launch, port, settings).__aenter__()
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(900, connect=10)) as client:
            model_id = await first_model_id(client, server.base_url) or "bench"
            for turn in range(1, turns + 1):
                if restart_after is not None and turn == restart_after + 1:
                    log(f"{name}: restarting between turns {restart_after} and {turn}")
                    server.stop()
                    server = await RunningServer(name, launch, port, settings).__aenter__()
                for conv in convs:
                    user = {"role": "user", "content": user_message(conv.index, turn, words)}
                    body: dict[str, Any] = {"model": model_id, "temperature": 0, "max_tokens": max_tokens}
                    if use_sessions:
                        new = [conv.messages[0], user] if turn == 1 else [user]
                        body.update(messages=new, session_id=f"bench-{conv.index}")
                    else:
                        body["messages"] = [*conv.messages, user]
                    try:
                        try:
                            ttft, total, reply, usage = await stream_turn(client, server.base_url, body)
                        except httpx.RemoteProtocolError:  # a kept-alive connection the server closed
                            ttft, total, reply, usage = await stream_turn(client, server.base_url, body)
                    except Exception as e:  # recorded, never fatal
                        results.append(TurnResult(name, conv.index, turn, float("nan"), float("nan"), error=str(e)))
                        log(f"{name}: session {conv.index} turn {turn} failed: {e}")
                        continue
                    conv.messages += [user, {"role": "assistant", "content": reply}]
                    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                    results.append(TurnResult(name, conv.index, turn, ttft, total, usage.get("prompt_tokens"), cached))
                done = [r for r in results if r.turn == turn and r.error is None]
                log(f"{name}: turn {turn}: TTFT p50 {statistics.median(r.ttft_s for r in done):.2f}s"
                    if done else f"{name}: turn {turn}: all failed")
    finally:
        server.stop()
    return results


async def snapshot_run(launch_for: LaunchFor, settings: Settings, *, words: int, turns: int,
                       repeats: int) -> dict[str, Any]:
    """Snapshot load + first token vs a stateless re-prefill of the same context."""
    port = free_port()
    out: dict[str, Any] = {"load_plus_ttft_s": [], "reprefill_ttft_s": [], "context_tokens": None}
    async with RunningServer("hearth-snapshot", launch_for(port), port, settings) as server, \
            httpx.AsyncClient(base_url=server.base_url, timeout=httpx.Timeout(900, connect=10)) as client:
        model_id = await first_model_id(client, server.base_url) or "bench"
        conv = Conversation(999)
        for turn in range(1, turns + 1):  # build a ~3k-token session
            user = {"role": "user", "content": user_message(999, turn, words)}
            new = [conv.messages[0], user] if turn == 1 else [user]
            _, _, reply, usage = await stream_turn(client, server.base_url, {
                "model": model_id, "temperature": 0, "max_tokens": 16, "messages": new, "session_id": "snap-src"})
            conv.messages += [user, {"role": "assistant", "content": reply}]
            out["context_tokens"] = usage.get("prompt_tokens")
        snap = (await client.post("/v1/sessions/snap-src/save", json={"title": "bench"})).json()["snapshot_id"]
        question = {"role": "user", "content": "What was the first note about?"}
        for i in range(repeats):
            t0 = time.perf_counter()
            r = await client.post(f"/v1/snapshots/{snap}/load", json={"session_id": f"snap-{i}"})
            r.raise_for_status()
            load_s = time.perf_counter() - t0
            ttft, _, _, usage = await stream_turn(client, server.base_url, {
                "model": model_id, "temperature": 0, "max_tokens": 4, "messages": [question],
                "session_id": f"snap-{i}"})
            out["load_plus_ttft_s"].append(load_s + ttft)
            out.setdefault("load_cached_tokens", []).append((usage.get("prompt_tokens_details") or {}).get(
                "cached_tokens"))
            ttft, _, _, usage = await stream_turn(client, server.base_url, {
                "model": model_id, "temperature": 0, "max_tokens": 4, "cache_prompt": False,
                "messages": [*conv.messages, question]})
            out["reprefill_ttft_s"].append(ttft)
            out.setdefault("reprefill_prompt_tokens", []).append(usage.get("prompt_tokens"))
    return out


def summarize(results: list[TurnResult], turns: int) -> dict[str, Any]:
    per_turn = {}
    for t in range(1, turns + 1):
        ok = [r for r in results if r.turn == t and r.error is None]
        ttfts = [r.ttft_s for r in ok]
        prefilled = [r.prompt_tokens - r.cached_tokens for r in ok
                     if r.prompt_tokens is not None and r.cached_tokens is not None]
        per_turn[str(t)] = {
            "n": len(ok), "errors": sum(1 for r in results if r.turn == t and r.error),
            "ttft_p50_s": median(ttfts),
            "ttft_p95_s": percentile(ttfts, 95),
            "prompt_tokens_p50": median([r.prompt_tokens for r in ok if r.prompt_tokens]),
            "prefilled_tokens_max": max(prefilled) if prefilled else None,
        }
    totals = [r.total_s for r in results if r.error is None]
    return {"per_turn": per_turn, "total_time_s": sum(totals), "turns_ok": len(totals),
            "turns_failed": sum(1 for r in results if r.error)}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, run in result["runs"].items():
        per = run["summary"]["per_turn"]
        xs = [int(t) for t in per if per[t]["ttft_p50_s"] is not None]
        ax.plot(xs, [per[str(t)]["ttft_p50_s"] for t in xs], marker="o", label=name)
    ax.set_xlabel("turn")
    ax.set_ylabel("TTFT p50 (s)")
    ax.set_yscale("log")
    cfg = result["settings"]
    ax.set_title(f"{cfg['sessions']} sessions round-robin, ~{cfg['words']} words per turn")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def ratios(runs: dict[str, Any], restart_after: int, turns: int) -> dict[str, Any]:
    def p50(run: str, turn: int) -> float | None:
        r = runs.get(run)
        return None if r is None else r["summary"]["per_turn"][str(turn)]["ttft_p50_s"]

    out: dict[str, Any] = {}
    hs = p50("hearth-sessions", turns)
    for peer in ("llama-server", "llama-cpp-python"):
        theirs = p50(peer, turns)
        if hs and theirs:
            out[f"turn{turns}_p50_hearth_sessions_over_{peer}"] = round(hs / theirs, 4)
    hs5, ls5 = p50("hearth-sessions", restart_after + 1), p50("llama-server", restart_after + 1)
    if hs5 and ls5:
        out[f"turn{restart_after + 1}_after_restart_p50_hearth_over_llama_server"] = round(hs5 / ls5, 4)
    hst = p50("hearth-stateless", turns)
    if hs and hst:
        out[f"turn{turns}_p50_hearth_sessions_over_hearth_stateless"] = round(hs / hst, 4)
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    model = (args.model or default_model()).resolve()
    settings = Settings(model=model, threads=args.threads, parallel=args.parallel, ctx=args.ctx)
    home = Path(tempfile.mkdtemp(prefix="hearth-multiturn-"))
    os.environ["HEARTH_HOME"] = str(home)  # Hearth's sessions, swapped KV and snapshots go here

    def hearth(port: int) -> Launch:
        launch = LAUNCHERS["hearth"](settings, port)
        launch.argv += ["--session-ram-mb", str(args.session_ram_mb)]
        return launch
    result: dict[str, Any] = {
        "schema": 1, "timestamp": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(), "model": str(model),
        "settings": {"sessions": args.sessions, "turns": args.turns, "words": args.words,
                     "max_tokens": args.max_tokens, "threads": args.threads, "parallel": args.parallel,
                     "ctx_per_slot": args.ctx, "session_ram_mb": args.session_ram_mb,
                     "restart_after": args.restart_after, "lcp_sessions": args.lcp_sessions},
        "runs": {},
    }
    if args.merge:  # runs from an earlier invocation (same settings), replaced by any run again here
        earlier = json.loads(args.merge.read_text())
        result["runs"].update(earlier.get("runs", {}))
        if "snapshot" in earlier:
            result["snapshot"] = earlier["snapshot"]
        result["merged_from"] = {"file": str(args.merge), "timestamp": earlier.get("timestamp")}
    wanted = args.only.split(",") if args.only else ["hearth-sessions", "llama-server", "hearth-stateless",
                                                     "llama-cpp-python", "snapshot"]
    for run in wanted:
        log(f"run {run}")
        if run == "snapshot":
            result["snapshot"] = await snapshot_run(hearth, settings, words=args.words, turns=args.turns + 4,
                                                    repeats=args.snapshot_repeats)
            snap = result["snapshot"]
            a, b = statistics.median(snap["load_plus_ttft_s"]), statistics.median(snap["reprefill_ttft_s"])
            snap["speedup_p50"] = round(b / a, 2)
            log(f"snapshot: load+first token {a:.3f}s vs re-prefill {b:.3f}s of {snap['context_tokens']} tokens")
            continue
        launch_for = hearth if run.startswith("hearth") else (lambda port, run=run: LAUNCHERS[run](settings, port))
        sessions = args.lcp_sessions if run == "llama-cpp-python" else args.sessions
        restart = args.restart_after if run in ("hearth-sessions", "llama-server") else None
        res = await conversation_run(run, launch_for, settings, sessions=sessions, turns=args.turns, words=args.words,
                                     max_tokens=args.max_tokens, use_sessions=run == "hearth-sessions",
                                     restart_after=restart)
        result["runs"][run] = {"command": launch_for(0).argv, "sessions": sessions, "restart_after": restart,
                               "summary": summarize(res, args.turns), "turns": [r.__dict__ for r in res]}
        write(result, args.out_dir, final=False)
    result["ratios"] = ratios(result["runs"], args.restart_after, args.turns)
    return result


def write(result: dict[str, Any], out_dir: Path, final: bool) -> Path:
    path, _ = save_json(result, out_dir, "multiturn")
    if final and result["runs"]:
        plot(json.loads(path.read_text()), path.with_suffix(".png"))
    return path


def table(result: dict[str, Any]) -> str:
    turns = result["settings"]["turns"]
    lines = ["| run | sessions | " + " | ".join(f"turn {t} p50" for t in range(1, turns + 1)) + " | total |",
             "|---|---|" + "---|" * (turns + 1)]
    for name, run in result["runs"].items():
        per = run["summary"]["per_turn"]
        cells = [f"{per[str(t)]['ttft_p50_s']:.2f}s" if per[str(t)]["ttft_p50_s"] is not None else "-"
                 for t in range(1, turns + 1)]
        total = run["summary"]["total_time_s"]
        lines.append(f"| {name} | {run['sessions']} | " + " | ".join(cells) + f" | {total:.0f}s |")
    return "\n".join(lines)


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    # SIGTERM unwinds through the `finally` blocks that stop the server being measured.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    p = argparse.ArgumentParser(prog="bench.multiturn", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--lcp-sessions", type=int, default=4, help="sessions for llama-cpp-python (it re-prefills)")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--words", type=int, default=190, help="words per user turn (~250 tokens)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--ctx", type=int, default=4096, help="context per slot")
    p.add_argument("--session-ram-mb", type=int, default=512,
                   help="Hearth's RAM budget for swapped KV (below the sessions' total, so some spill to disk)")
    p.add_argument("--restart-after", type=int, default=4)
    p.add_argument("--snapshot-repeats", type=int, default=3)
    p.add_argument("--only", default="", help="comma-separated runs: hearth-sessions, llama-server, "
                   "hearth-stateless, llama-cpp-python, snapshot")
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    p.add_argument("--merge", type=Path, default=None, help="keep the runs of this earlier result file")
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    path = write(result, args.out_dir, final=True)
    print(table(result))
    print(json.dumps({"ratios": result.get("ratios"), "snapshot": {k: v for k, v in (result.get("snapshot") or {})
                                                                   .items() if "speedup" in k or "tokens" in k}}))
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
