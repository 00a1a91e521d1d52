"""Gateway benchmark (issue 12): overhead, multi-turn routing, drain.

    .venv/bin/python -m bench.gateway                         # all three, defaults below (lead, idle machine)
    .venv/bin/python -m bench.gateway --rounds 2 --conversations 3 --turns 3 --drain-words 300 --max-tokens 8
                                                              # smoke (what CI-sized checks use)

- overhead: one Hearth node, and a gateway over it. Rounds alternate direct / through the gateway
  (A/B, same run); each round sends `c` concurrent streams (c in --concurrency) of --max-tokens
  tokens. Reports TTFT p50 added by the gateway (ms) and throughput (completion tokens / s) as
  gateway ÷ direct. Once per --overhead-threads value: with the node's llama.cpp on both cores
  (2) the gateway and the client wait for a core on every relayed token, as they would on one
  machine packed full; with 1, a core is left to them, as a gateway on its own machine or core
  has one.
- multiturn: --nodes Hearth nodes behind a gateway, --conversations stateless conversations
  (full history each turn, temperature 0) × --turns turns, interleaved; once with the gateway's
  cost model (affinity + cache-aware) and once with --routing round_robin. Reports the share of
  turns that landed on the node that served the conversation's previous turn (the one holding its
  KV; from the X-Hearth-Upstream header), cached-token share, and TTFT p50 at the last turn.
- drain: a session of ~3k tokens on one node is moved with its KV to another (the admin move
  endpoint) and compared with the prefill it saves (the same history as a stateless request with
  cache_prompt false on the destination).

Results: bench/results/gateway-<stamp>.json and latest-gateway.json (+ .png).

    .venv/bin/python -m bench.gateway --medians RUN.json RUN.json ...
                                                              # overhead medians over several runs
                                                              # → latest-gateway-overhead.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.config import DEFAULT_PROMPT, RESULTS_DIR
from bench.gateway_load import load
from bench.machine import machine_info
from bench.multiturn import stream_turn, user_message
from bench.servers import free_port
from bench.stats import median

MODEL_ID = "smollm2-135m-instruct"
# The servers (uvicorn) close a connection idle for 5 s; a client reusing one just then gets a
# ReadError (a race no server can avoid). Connections idle past 2 s are not reused.
LIMITS = httpx.Limits(keepalive_expiry=2.0)


def log(msg: str) -> None:
    print(f"[gateway-bench] {msg}", file=sys.stderr, flush=True)


class Proc:
    """A Hearth node or gateway subprocess on a free loopback port."""

    def __init__(self, argv: list[str], port: int, env: dict[str, str], log_path: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.proc = subprocess.Popen(argv, stdout=log_path.open("wb"), stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)

    async def ready(self, timeout: float = 300) -> Proc:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=5) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"exited: {self.log_path.read_text()[-2000:]}")
                try:
                    if (await c.get(self.url + "/health")).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError(f"not ready: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def start_node(tmp: Path, name: str, args: argparse.Namespace, port: int | None = None) -> Proc:
    """A node with its data dir in tmp/name (the same name again: the same node restarted)."""
    port = port or free_port()
    env = {**os.environ, "HEARTH_HOME": str(tmp / name)}
    argv = [sys.executable, "-m", "hearth.cli.main", "serve", "--port", str(port), "--threads", str(args.threads),
            "--parallel", str(args.parallel), "--ctx", str(args.ctx)]
    return Proc(argv, port, env, tmp / f"{name}.log")


def start_gateway(tmp: Path, nodes: dict[str, Proc], args: argparse.Namespace, *extra: str) -> Proc:
    port = free_port()
    toml = tmp / f"fleet-{port}.toml"
    toml.write_text("".join(f'[[upstream]]\nname = "{n}"\nurl = "{p.url}"\nmodels = {{ "smol" = "{MODEL_ID}" }}\n'
                            f"max_in_flight = {getattr(args, 'max_in_flight', None) or args.parallel}\n\n"
                            for n, p in nodes.items()))
    env = {**os.environ, "HEARTH_GATEWAY_HOME": str(tmp / f"gw-{port}")}
    argv = [sys.executable, "-m", "hearth.cli.main", "gateway", "--upstreams", str(toml), "--port", str(port),
            "--log-level", "warning", *extra]
    return Proc(argv, port, env, tmp / f"gateway-{port}.log")


def start_gateway_toml(tmp: Path, toml_text: str, *extra: str) -> Proc:
    """A gateway over the fleet file `toml_text`."""
    port = free_port()
    toml = tmp / f"fleet-{port}.toml"
    toml.write_text(toml_text)
    env = {**os.environ, "HEARTH_GATEWAY_HOME": str(tmp / f"gw-{port}")}
    argv = [sys.executable, "-m", "hearth.cli.main", "gateway", "--upstreams", str(toml), "--port", str(port),
            "--log-level", "warning", *extra]
    return Proc(argv, port, env, tmp / f"gateway-{port}.log")


async def overhead(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for threads in args.overhead_threads:
        (tmp / f"t{threads}").mkdir()
        out[f"threads_{threads}"] = await overhead_run(tmp / f"t{threads}", argparse.Namespace(**{
            **vars(args), "threads": threads}))
    return out


async def overhead_run(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    node = await start_node(tmp, "solo", args).ready()
    gw = await start_gateway(tmp, {"solo": node}, args).ready()
    out: dict[str, Any] = {}
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=10), limits=LIMITS) as client:
            body = {"model": "smol", "messages": [{"role": "user", "content": DEFAULT_PROMPT}], "temperature": 0,
                    "max_tokens": args.max_tokens, "ignore_eos": True}
            await stream_turn(client, gw.url, body)  # warm-up
            for c in args.concurrency:
                for url, model in ((node.url, MODEL_ID), (gw.url, "smol")):  # untimed: first use of c slots
                    await asyncio.gather(*(stream_turn(client, url, {**body, "model": model}) for _ in range(c)))
                ttft: dict[str, list[float]] = {"direct": [], "gateway": []}
                tput: dict[str, list[float]] = {"direct": [], "gateway": []}
                for r in range(args.rounds * 2):
                    name, url, model = (("direct", node.url, MODEL_ID), ("gateway", gw.url, "smol"))[r % 2]  # A/B
                    t0 = time.perf_counter()
                    results = await asyncio.gather(*(stream_turn(client, url, {**body, "model": model})
                                                     for _ in range(c)))
                    wall = time.perf_counter() - t0
                    ttft[name] += [x[0] for x in results]
                    tput[name].append(sum(x[3].get("completion_tokens", 0) for x in results) / wall)
                d, g = median(ttft["direct"]), median(ttft["gateway"])
                td, tg = median(tput["direct"]), median(tput["gateway"])
                out[f"streams_{c}"] = {
                    "ttft_p50_direct_ms": d and d * 1000, "ttft_p50_gateway_ms": g and g * 1000,
                    "added_ttft_p50_ms": (g - d) * 1000 if d is not None and g is not None else None,
                    "throughput_direct_tok_s": td, "throughput_gateway_tok_s": tg,
                    "throughput_ratio": tg / td if td and tg else None}
                log(f"overhead threads={args.threads} c={c}: {out[f'streams_{c}']}")
    finally:
        gw.stop()
        node.stop()
    return out


async def multiturn_run(gw: Proc, args: argparse.Namespace) -> dict[str, Any]:
    convs: list[list[dict[str, str]]] = [[{"role": "system", "content": f"You are assistant {i}. Be brief."}]
                                         for i in range(args.conversations)]
    last_node: dict[int, str] = {}
    same, moved, cached, prompt = 0, 0, 0, 0
    ttft_last: list[float] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(900, connect=10), limits=LIMITS) as client:
        for turn in range(1, args.turns + 1):
            for i, conv in enumerate(convs):
                user = {"role": "user", "content": user_message(i, turn, args.words)}
                body = {"model": "smol", "messages": [*conv, user], "temperature": 0, "max_tokens": args.max_tokens}
                t0 = time.perf_counter()
                async with client.stream("POST", gw.url + "/v1/chat/completions",
                                         json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
                    node = r.headers.get("x-hearth-upstream", "?")
                    ttft, parts = None, []
                    usage: dict[str, Any] = {}
                    async for line in r.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        chunk = json.loads(line[6:])
                        for ch in chunk.get("choices") or []:
                            if (ch.get("delta") or {}).get("content"):
                                ttft = ttft if ttft is not None else time.perf_counter() - t0
                                parts.append(ch["delta"]["content"])
                        usage = chunk.get("usage") or usage
                if turn > 1:
                    same, moved = (same + 1, moved) if last_node.get(i) == node else (same, moved + 1)
                    cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                    prompt += usage.get("prompt_tokens", 0)
                if turn == args.turns and ttft is not None:
                    ttft_last.append(ttft)
                last_node[i] = node
                conv += [user, {"role": "assistant", "content": "".join(parts)}]
    later = same + moved
    return {"turns_on_kv_node": same / later if later else None, "cached_share": cached / prompt if prompt else None,
            "ttft_p50_last_turn_s": statistics.median(ttft_last) if ttft_last else None}


async def multiturn(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for policy in ("cost", "round_robin"):
        (tmp / policy).mkdir()
        nodes = {f"n{i}": start_node(tmp / policy, f"n{i}", args) for i in range(args.nodes)}
        gw = None
        try:
            for p in nodes.values():
                await p.ready()
            gw = await start_gateway(tmp / policy, nodes, args, "--routing", policy).ready()
            out[policy] = await multiturn_run(gw, args)
            log(f"multiturn {policy}: {out[policy]}")
        finally:
            if gw is not None:
                gw.stop()
            for p in nodes.values():
                p.stop()
    c, r = out["cost"]["ttft_p50_last_turn_s"], out["round_robin"]["ttft_p50_last_turn_s"]
    out["ttft_last_turn_ratio_rr_over_cost"] = r / c if c and r else None
    return out


async def drain(tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    nodes = {"a": start_node(tmp, "da", args), "b": start_node(tmp, "db", args)}
    gw = None
    try:
        for p in nodes.values():
            await p.ready()
        gw = await start_gateway(tmp, nodes, args).ready()
        async with httpx.AsyncClient(base_url=gw.url, timeout=httpx.Timeout(900, connect=10),
                                     limits=LIMITS) as client:
            history: list[dict[str, str]] = []
            info: dict[str, Any] = {}
            while info.get("current_pos", 0) < args.drain_tokens:
                user = {"role": "user", "content": user_message(0, len(history), args.drain_words)}
                r = (await client.post("/v1/chat/completions", json={
                    "model": "smol", "messages": [user], "max_tokens": 8, "temperature": 0,
                    "session_id": "bench-drain"})).json()
                history += [user, {"role": "assistant", "content": r["choices"][0]["message"]["content"]}]
                info = (await client.get("/v1/sessions/bench-drain")).json()
            src = (await client.get("/admin/sessions/bench-drain")).json()["node"]
            t0 = time.perf_counter()
            moved = (await client.post("/admin/sessions/bench-drain/move", json={})).json()
            move_s = time.perf_counter() - t0
            dst = nodes[moved["to"]]
            ttft, _, _, usage = await stream_turn(client, dst.url, {
                "model": MODEL_ID, "messages": history, "max_tokens": 1, "temperature": 0, "cache_prompt": False})
            after, _, _, usage_after = await stream_turn(client, gw.url, {
                "model": "smol", "messages": [{"role": "user", "content": "One more?"}], "max_tokens": 1,
                "session_id": "bench-drain"})
        out = {"session_tokens": info.get("current_pos"), "from": src, "to": moved["to"], "move_s": move_s,
               "reprefill_ttft_s": ttft, "reprefill_prompt_tokens": usage.get("prompt_tokens"),
               "next_turn_ttft_after_move_s": after,
               "next_turn_cached_tokens": (usage_after.get("prompt_tokens_details") or {}).get("cached_tokens")}
        log(f"drain: {out}")
        return out
    finally:
        if gw is not None:
            gw.stop()
        for p in nodes.values():
            p.stop()


def plot(result: dict[str, Any], path: Path) -> None:
    """Overhead (added TTFT, throughput ratio) and multi-turn TTFT at the last turn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    runs = [(f"{t.split('_')[1]} thr, {c.split('_')[1]} str", v) for t, per in (result.get("overhead") or {}).items()
            for c, v in per.items()]
    labels = [name for name, _ in runs]
    x = range(len(runs))
    axes[0].bar(list(x), [v["added_ttft_p50_ms"] or 0 for _, v in runs])
    axes[0].axhline(2.0, color="red", linestyle="--", label="2 ms target")
    axes[0].set(title="TTFT p50 added by the gateway (ms)", xticks=list(x))
    axes[0].set_xticklabels(labels, rotation=20)
    axes[0].legend()
    axes[1].bar(list(x), [v["throughput_ratio"] or 0 for _, v in runs])
    axes[1].axhline(0.98, color="red", linestyle="--", label="0.98 target")
    axes[1].set(title="throughput gateway / direct", xticks=list(x), ylim=(0.9, 1.05))
    axes[1].set_xticklabels(labels, rotation=20)
    axes[1].legend()
    mt = result.get("multiturn") or {}
    policies = [p for p in ("cost", "round_robin") if p in mt]
    axes[2].bar(policies, [mt[p]["ttft_p50_last_turn_s"] or 0 for p in policies])
    axes[2].set(title="multi-turn: TTFT p50 at the last turn (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"bench": "gateway", "started_at": dt.datetime.now(dt.UTC).isoformat(),
                              "machine": machine_info(), "settings": vars(args).copy()}
    with tempfile.TemporaryDirectory(prefix="hearth-gw-bench-") as d:
        tmp = Path(d)
        for part in args.only or ["overhead", "multiturn", "drain", "load"]:
            (tmp / part).mkdir()
            t0 = time.perf_counter()
            if part == "load":
                result[part] = await load(tmp / part, args, start_gateway_toml)
            else:
                result[part] = await {"overhead": overhead, "multiturn": multiturn, "drain": drain}[part](tmp / part,
                                                                                                        args)
            log(f"{part} took {time.perf_counter() - t0:.0f} s")
    return result


def overhead_medians(paths: list[Path]) -> dict[str, Any]:
    """Per setting (threads, streams) and figure: the median over the runs, and every run's value."""
    runs = [json.loads(p.read_text()) for p in paths]
    out: dict[str, Any] = {"runs": [{"file": p.name, "started_at": r["started_at"],
                                     "loadavg_at_start": r["machine"].get("loadavg_at_start")}
                                    for p, r in zip(paths, runs, strict=True)], "median": {}, "values": {}}
    for r in runs:
        for threads, per in (r.get("overhead") or {}).items():
            for streams, figures in per.items():
                for name, value in figures.items():
                    out["values"].setdefault(threads, {}).setdefault(streams, {}).setdefault(name, []).append(value)
    for threads, per in out["values"].items():
        for streams, figures in per.items():
            out["median"].setdefault(threads, {})[streams] = {
                name: median([v for v in values if v is not None]) for name, values in figures.items()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--medians", type=Path, nargs="+", help="summarize the overhead of these result files")
    ap.add_argument("--only", action="append", choices=["overhead", "multiturn", "drain", "load"])
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads per node (multiturn, drain)")
    ap.add_argument("--overhead-threads", type=int, nargs="+", default=[2, 1],
                    help="overhead: the node's llama.cpp threads, one run each")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=12, help="overhead: rounds per path and concurrency")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--words", type=int, default=120, help="multiturn: words per user message")
    ap.add_argument("--drain-tokens", type=int, default=3000, help="drain: session size to build, tokens")
    ap.add_argument("--drain-words", type=int, default=400)
    ap.add_argument("--load-concurrency", type=int, nargs="+", default=[16, 64, 256],
                    help="load: concurrent clients, one case each")
    ap.add_argument("--load-seconds", type=float, default=5.0, help="load: seconds per round")
    ap.add_argument("--load-rounds", type=int, default=2, help="load: rounds per target (direct, gateway) and case")
    ap.add_argument("--load-chunks", type=int, default=32, help="load: content chunks per streamed answer")
    ap.add_argument("--load-max-in-flight", type=int, default=128, help="load: the fake engine's max_in_flight")
    ap.add_argument("--load-default-limits", action="store_true",
                    help="load: the client keeps httpx's default pool (100 connections, 20 kept alive)")
    ap.add_argument("--load-one-client", action="store_true",
                    help="load: one httpx client for all workers (else one per 16 workers)")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = ap.parse_args()
    if args.medians:
        summary = json.dumps(overhead_medians(args.medians), indent=2)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "latest-gateway-overhead.json").write_text(summary)
        print(summary)
        return 0
    result = asyncio.run(main_async(args))
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    text = json.dumps(result, indent=2, default=str)
    (args.out / f"gateway-{stamp}.json").write_text(text)
    (args.out / "latest-gateway.json").write_text(text)
    png = args.out / f"gateway-{stamp}.png"
    plot(result, png)
    (args.out / "latest-gateway.png").write_bytes(png.read_bytes())
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
