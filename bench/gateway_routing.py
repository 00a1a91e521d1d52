"""Routing stateless agent conversations over a fleet (issue 25): on what nodes really hold (their
prompt-cache digests) vs the gateway's own estimate vs round-robin.

    .venv/bin/python -m bench.gateway_routing                 # defaults below (idle machine)
    .venv/bin/python -m bench.gateway_routing --conversations 4 --turns 2   # smoke

--nodes Hearth nodes (default model) behind a gateway. --conversations agent conversations built
from the captured Claude Code (Messages API) and Codex (Responses API, its tool list left out so
it fits the default model's context) first requests, each with another task
(bench/prompt_cache/conversations.py): all Claude Code conversations share the long system
prompt, all Codex ones theirs, and each conversation keeps its client's conversation key
(Claude Code's session header, Codex's prompt_cache_key). Turns are interleaved (turn 1 of every
conversation, then turn 2, ..., the order rotated by one each turn); each later turn sends the
whole conversation again plus a short user message. After turn --restart-after the node holding
the most conversations is restarted (graceful, same port and data dir: its RAM tier is gone, its
disk tier is not).

Once per --routing policy, each on a fresh fleet with empty caches:
- cost: the gateway's cost model on the nodes' digests (real cache state);
- estimate: the same without digests (characters / 4 and the prefixes it sent where);
- round_robin: no affinity, no cache.

Reported per policy: the share of prompt tokens the nodes reported cached, TTFT p50/p90 over
all turns and over first turns, and the gateway's predicted vs reported cached tokens
(`hearth_gateway_predicted_cached_tokens_total` / `_reported_`).

Results: bench/results/gateway-routing-<stamp>.json and latest-gateway-routing.json.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.config import RESULTS_DIR
from bench.gateway import start_gateway, start_node
from bench.machine import machine_info
from bench.prompt_cache.conversations import TASKS, with_task, without_tools

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "agents"
POLICIES = ("cost", "estimate", "round_robin")
FOLLOW_UPS = ("Now do the same for the tests directory.", "Explain what you just did in one sentence.",
              "Is there anything else to check?", "Summarise the conversation so far.")


def log(msg: str) -> None:
    print(f"[routing-bench] {msg}", file=sys.stderr, flush=True)


def conversations(n: int) -> list[dict[str, Any]]:
    """n captured requests, half Claude Code and half Codex, each with its own task and ids."""
    claude = json.loads((FIXTURES / "claude-code-bash-first.json").read_text())
    codex = without_tools(json.loads((FIXTURES / "codex-first.json").read_text()))
    return [with_task(claude if i % 2 == 0 else codex, TASKS[i % len(TASKS)]) for i in range(n)]


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


class Conv:
    def __init__(self, captured: dict[str, Any], max_tokens: int) -> None:
        self.path = str(captured["path"]).split("?")[0]
        self.messages = self.path.startswith("/v1/messages")
        self.headers = {k: v for k, v in captured["headers"].items()
                        if k.lower().startswith(("x-claude-code", "session", "anthropic-", "x-session"))}
        self.body = copy.deepcopy(captured["body"])
        self.body.update({"model": "smol", "stream": True, "temperature": 0})
        if self.messages:
            self.body.update({"max_tokens": max_tokens})
            for k in ("thinking", "context_management", "output_config"):
                self.body.pop(k, None)
        else:
            self.body.update({"max_output_tokens": max_tokens, "store": False})
            self.body.pop("reasoning", None)
            self.body.pop("include", None)

    def add_turn(self, answer: str, follow_up: str) -> None:
        if self.messages:
            self.body["messages"] += [{"role": "assistant", "content": answer or "."},
                                      {"role": "user", "content": follow_up}]
        else:
            self.body["input"] += [{"type": "message", "role": "assistant",
                                    "content": [{"type": "output_text", "text": answer or "."}]},
                                   {"type": "message", "role": "user",
                                    "content": [{"type": "input_text", "text": follow_up}]}]


async def turn(client: httpx.AsyncClient, url: str, conv: Conv) -> dict[str, Any]:
    t0 = time.perf_counter()
    ttft: float | None = None
    parts: list[str] = []
    usage: dict[str, Any] = {}
    async with client.stream("POST", url + conv.path, json=conv.body, headers=conv.headers) as r:
        node = r.headers.get("x-hearth-upstream", "?")
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        event = ""
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
                continue
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            text = None
            if event == "content_block_delta":
                text = data.get("delta", {}).get("text")
            elif event == "response.output_text.delta":
                text = data.get("delta")
            if text:
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                parts.append(text)
            if event == "message_start":
                usage.update(data["message"].get("usage") or {})
            elif event == "message_delta":
                usage.update(data.get("usage") or {})
            elif event in ("response.completed", "response.incomplete"):
                usage.update(data["response"].get("usage") or {})
    if conv.messages:
        prompt = sum(int(usage.get(k) or 0) for k in ("input_tokens", "cache_read_input_tokens",
                                                      "cache_creation_input_tokens"))
        cached = int(usage.get("cache_read_input_tokens") or 0)
    else:
        prompt = int(usage.get("input_tokens") or 0)
        cached = int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
    return {"node": node, "ttft": ttft if ttft is not None else time.perf_counter() - t0, "prompt": prompt,
            "cached": cached, "text": "".join(parts)}


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


async def run_policy(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"hearth-routing-{policy}-"))
    nodes = {f"n{i}": start_node(tmp, f"n{i}", args) for i in range(args.nodes)}
    await asyncio.gather(*(p.ready() for p in nodes.values()))
    routing = {"cost": ["--routing", "cost"], "estimate": ["--routing", "cost", "--digest-interval", "0"],
               "round_robin": ["--routing", "round_robin"]}[policy]
    gw = await start_gateway(tmp, nodes, args, *routing, "--probe-interval", "0.5", "--max-wait", "600").ready()
    convs = [Conv(c, args.max_tokens) for c in conversations(args.conversations)]
    turns: list[dict[str, Any]] = []
    restarted = None
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(900, connect=10)) as client:
            for t in range(args.turns):
                if t == args.restart_after and args.restart_after > 0:
                    last = [x for x in turns if x["turn"] == t - 1]
                    counts: dict[str, int] = {}
                    for x in last:
                        counts[x["node"]] = counts.get(x["node"], 0) + 1
                    restarted = max(counts, key=lambda k: counts[k])
                    port = nodes[restarted].port
                    nodes[restarted].stop()
                    nodes[restarted] = await start_node(tmp, restarted, args, port=port).ready()
                    await asyncio.sleep(2)  # the gateway's probe and digest poll see it again
                    log(f"{policy}: restarted {restarted}")
                # interleaved, the order rotated each turn (a fixed order would give round-robin the
                # same node for a conversation every turn whenever the nodes divide the conversations)
                for i in [(t + k) % len(convs) for k in range(len(convs))]:
                    conv = convs[i]
                    r = await turn(client, gw.url, conv)
                    r.update({"turn": t, "conv": i})
                    turns.append(r)
                    conv.add_turn(r["text"], FOLLOW_UPS[t % len(FOLLOW_UPS)])
            m = (await client.get(gw.url + "/metrics")).text
    finally:
        gw.stop()
        for p in nodes.values():
            p.stop()
    prompt = sum(x["prompt"] for x in turns)
    cached = sum(x["cached"] for x in turns)
    ttft = [x["ttft"] for x in turns]
    after = [x["ttft"] for x in turns if x["turn"] >= max(1, args.restart_after)]
    out = {"cached_share": cached / prompt if prompt else None, "prompt_tokens": prompt, "cached_tokens": cached,
           "ttft_p50_s": percentile(ttft, 0.5), "ttft_p90_s": percentile(ttft, 0.9),
           "ttft_p50_after_restart_s": percentile(after, 0.5), "ttft_p90_after_restart_s": percentile(after, 0.9),
           "first_turn_ttft_p50_s": statistics.median([x["ttft"] for x in turns if x["turn"] == 0]),
           "predicted_cached_tokens": metric(m, "hearth_gateway_predicted_cached_tokens_total"),
           "reported_cached_tokens": metric(m, "hearth_gateway_reported_cached_tokens_total"),
           "restarted": restarted, "turns": [{k: v for k, v in x.items() if k != "text"} for x in turns]}
    p, r = out["predicted_cached_tokens"], out["reported_cached_tokens"]
    out["predicted_vs_reported"] = p / r if r else None
    log(f"{policy}: {({k: v for k, v in out.items() if k != 'turns'})}")
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    return {policy: await run_policy(policy, args) for policy in args.routing}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--conversations", type=int, default=12)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--restart-after", type=int, default=2, help="restart a node before this turn (0: never)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--routing", nargs="+", default=list(POLICIES), choices=POLICIES)
    args = ap.parse_args()
    t0 = time.time()
    results = asyncio.run(main_async(args))
    doc = {"bench": "gateway-routing", "args": vars(args), "machine": machine_info(),
           "seconds": round(time.time() - t0, 1), "results": results}
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    for name in (f"gateway-routing-{stamp}.json", "latest-gateway-routing.json"):
        (RESULTS_DIR / name).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: {x: y for x, y in v.items() if x != "turns"} for k, v in results.items()}, indent=2))


if __name__ == "__main__":
    main()
