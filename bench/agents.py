"""Agent first-request benchmark (issue 10): how long a new user waits for an agent's first
answer, Hearth against llama-server on the same model and threads.

    .venv/bin/python -m bench.agents                               # 3 runs per fixture, both servers
    .venv/bin/python -m bench.agents --runs 1 --fixtures codex-first --servers hearth   # smoke

The requests are the agents' own: each fixture in tests/fixtures/agents (the first request
Codex CLI 0.169 and Claude Code 2.1.330 sent, captured once) goes, as captured, to the
endpoint it was sent to (`/v1/responses`, `/v1/messages?beta=true`) of each server, streamed.
Changes: `max_output_tokens` / `max_tokens` is set to `--max-tokens` (the answer's length is
not what is measured), `temperature` to 0, `model` to the id the server lists, and a unique tag
is put in front of the first system or developer text of a cold request, so no server can serve
it from an earlier run's cache.

Per fixture and server, `--runs` times: a cold request (new tag: the whole prompt is
prefilled), then the same request again, warm (the server finds the whole prompt in its KV
cache, as an agent's next turn finds the previous one). Measured:
- `ttft_cold_s`, `ttft_warm_s`: request sent → the first event carrying model output or ending
  the answer (Responses: an output item, a text or arguments delta, the terminal event;
  Anthropic: a content block, message_delta). With the default `--max-tokens 1` that is the
  time to the first token, whether or not the server streams it as it comes;
- `prompt_tokens`: as the server reports it in the final usage (each server renders the request
  with its own template handling, so the counts may differ by the tools each drops);
- `prefill_tps`: prompt_tokens / ttft_cold_s (includes the first decode step: a lower bound).

Every measurement is bracketed by the foreign-CPU guard of bench/cpu.py; a contaminated one is
re-run after waiting for an idle machine (up to `--retries`). Output: results/agents-<stamp>.json
(+ latest-agents.json) and a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import datetime as dt
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.client import first_model_id
from bench.config import REPO_ROOT, RESULTS_DIR, Settings
from bench.cpu import CpuSnapshot, cpu_usage, wait_idle
from bench.machine import machine_info
from bench.servers import LAUNCHERS, RunningServer, ServerUnavailable, free_port
from bench.stats import median

FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures" / "agents"
FIXTURES = ("codex-first", "claude-code-first")
MODEL_NAME = "qwen2.5-coder-0.5b"

# Events that carry model output, or end the answer (the opening events a server may send at
# admission do not count). With --max-tokens 1 the end comes right after the first token, so
# the first of these is the time to the first token even when the server holds that token back
# (a tool parser waiting for the call's name, as Hearth's and llama-server's do).
RESPONSES_OUTPUT = {"response.output_item.added", "response.output_text.delta",
                    "response.function_call_arguments.delta", "response.reasoning_text.delta",
                    "response.completed", "response.incomplete", "response.failed"}
ANTHROPIC_OUTPUT = {"content_block_start", "content_block_delta", "message_delta", "message_stop"}
# Hearth's default wall-clock cap (600 s) is shorter than a cold 11k-token prefill on a busy
# 2-core machine; llama-server's --timeout is already 3600 s.
HEARTH_EXTRA = ["--request-timeout", "3600", "--max-request-timeout", "3600"]


def default_model() -> Path:
    from hearth import catalog

    m = catalog.find(MODEL_NAME)
    assert m is not None
    path = catalog.installed_path(m)
    if not path.is_file():
        raise FileNotFoundError(f"{MODEL_NAME} is not installed: .venv/bin/hearth models install {MODEL_NAME}")
    return path


def load_fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES_DIR / f"{name}.json").read_text())
    return data


def prepare(captured: dict[str, Any], tag: str, max_tokens: int, model: str | None) -> dict[str, Any]:
    """The captured body with the benchmark's changes (see the module docstring), for `model`
    (the id the server lists: each names the same GGUF its own way)."""
    body: dict[str, Any] = copy.deepcopy(captured["body"])
    body["temperature"] = 0
    if model:
        body["model"] = model
    if captured["path"].startswith("/v1/responses"):
        body["max_output_tokens"] = max_tokens
        first = next(i for i in body["input"] if i.get("role") in ("developer", "system"))
        part = first["content"][0] if isinstance(first["content"], list) else None
        if part is not None:
            part["text"] = f"[{tag}] {part['text']}"
        else:
            first["content"] = f"[{tag}] {first['content']}"
    else:
        body["max_tokens"] = max_tokens
        system = body["system"]
        if isinstance(system, str):
            body["system"] = f"[{tag}] {system}"
        else:  # the first block is Claude Code's billing line; tag the first real one
            block = system[1] if len(system) > 1 else system[0]
            block["text"] = f"[{tag}] {block['text']}"
    return body


async def first_output(client: httpx.AsyncClient, base_url: str, path: str, headers: dict[str, str],
                       body: dict[str, Any]) -> dict[str, Any]:
    """Stream one request; the time to the first model output, the prompt tokens and cached
    prompt tokens reported in its usage, and the server's `timings` (llama-server's object,
    which Hearth sends too) if it sent any."""
    anthropic = path.startswith("/v1/messages")
    wanted = ANTHROPIC_OUTPUT if anthropic else RESPONSES_OUTPUT
    t0 = time.perf_counter()
    ttft: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    timings: dict[str, Any] | None = None
    status = 0
    async with client.stream("POST", base_url + path, json=body, headers=headers) as resp:
        status = resp.status_code
        if status != 200:
            return {"status": status, "error": (await resp.aread()).decode(errors="replace")[:500]}
        event = None
        async for line in resp.aiter_lines():
            if line.startswith("event: "):
                event = line[7:].strip()
                continue
            if not line.startswith("data: "):
                continue
            data = json.loads(line[6:])
            kind = data.get("type", event)
            if ttft is None and kind in wanted:
                ttft = time.perf_counter() - t0
            usage = (data.get("response") or {}).get("usage") if not anthropic else data.get("usage") or (
                data.get("message") or {}).get("usage")
            if usage:
                if anthropic:
                    total = sum(int(usage.get(k) or 0) for k in
                                ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
                    prompt_tokens = max(prompt_tokens or 0, total)
                    cached_tokens = max(cached_tokens or 0, int(usage.get("cache_read_input_tokens") or 0))
                elif usage.get("input_tokens"):
                    prompt_tokens = int(usage["input_tokens"])
                    cached_tokens = int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
            timings = data.get("timings") or (data.get("response") or {}).get("timings") or timings
    return {"status": status, "ttft_s": ttft, "prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens,
            "timings": timings, "total_s": time.perf_counter() - t0}


class FixtureRequest:
    """One fixture against one server: `cold()` sends it with a fresh tag (so a re-run after a
    contaminated measurement is cold too), `warm()` sends the last cold body again."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, captured: dict[str, Any], max_tokens: int,
                 model: str | None) -> None:
        self.client, self.base_url, self.captured = client, base_url, captured
        self.max_tokens, self.model = max_tokens, model
        self.headers = {k: v for k, v in captured["headers"].items()
                        if k.lower() not in ("accept-encoding", "content-type")}
        self.body: dict[str, Any] = {}

    async def cold(self) -> dict[str, Any]:
        self.body = prepare(self.captured, f"bench-{uuid.uuid4().hex[:12]}", self.max_tokens, self.model)
        return await self.warm()

    async def warm(self) -> dict[str, Any]:
        return await first_output(self.client, self.base_url, self.captured["path"], self.headers, self.body)


async def measure(server: RunningServer, fn: Any, retries: int, wait_s: float, max_foreign: float) -> dict[str, Any]:
    """Run `fn()` under the foreign-CPU guard; re-run a contaminated measurement."""
    assert server.proc is not None
    record: dict[str, Any] = {}
    for attempt in range(retries + 1):
        before = CpuSnapshot.take(server.proc.pid)
        record = await fn()
        cpu = cpu_usage(before, CpuSnapshot.take(server.proc.pid))
        record["cpu"] = {**cpu, "attempt": attempt, "contaminated": cpu["foreign_share"] > max_foreign}
        if not record["cpu"]["contaminated"]:
            break
        await asyncio.to_thread(wait_idle, wait_s)
    return record


async def bench_server(name: str, s: Settings, fixtures: list[str], max_tokens: int) -> dict[str, Any]:
    port = free_port()
    try:
        launch = LAUNCHERS[name](s, port)
    except ServerUnavailable as e:
        return {"status": "failed", "reason": str(e)}
    if name == "hearth":
        launch.argv += HEARTH_EXTRA
    out: dict[str, Any] = {"status": "ok", "command": launch.argv, "notes": launch.notes, "fixtures": {}}
    if s.wait_idle_s:
        await asyncio.to_thread(wait_idle, s.wait_idle_s)
    try:
        async with RunningServer(name, launch, port, s) as server, \
                httpx.AsyncClient(timeout=httpx.Timeout(s.request_timeout_s)) as client:
            out["startup_s"] = server.startup_s
            for fx in fixtures:
                req = FixtureRequest(client, server.base_url, load_fixture(fx), max_tokens,
                                     await first_model_id(client, server.base_url))
                runs = []
                for i in range(s.runs):
                    c = await measure(server, req.cold, s.retries, s.retry_wait_s, s.max_foreign_cpu)
                    w = await measure(server, req.warm, s.retries, s.retry_wait_s, s.max_foreign_cpu)
                    runs.append({"cold": c, "warm": w})
                    print(f"{name} {fx} run {i}: cold {c.get('ttft_s')} s, warm {w.get('ttft_s')} s, "
                          f"{c.get('prompt_tokens')} prompt tokens", file=sys.stderr, flush=True)
                out["fixtures"][fx] = summarize(runs)
    except ServerUnavailable as e:
        return {**out, "status": "failed", "reason": str(e)}
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def values(phase: str, key: str) -> list[float]:
        return [r[phase][key] for r in runs if r[phase].get(key) is not None]

    cold, warm, tokens = values("cold", "ttft_s"), values("warm", "ttft_s"), values("cold", "prompt_tokens")
    tps = [r["cold"]["prompt_tokens"] / r["cold"]["ttft_s"] for r in runs
           if r["cold"].get("prompt_tokens") and r["cold"].get("ttft_s")]
    return {"ttft_cold_s": median(cold), "ttft_warm_s": median(warm), "prompt_tokens": median(tokens),
            "prefill_tps": median(tps), "errors": [r for r in runs if r["cold"].get("status") != 200
                                                   or r["warm"].get("status") != 200],
            "contaminated": sum(r[p]["cpu"]["contaminated"] for r in runs for p in ("cold", "warm")),
            "runs": runs}


def table(results: dict[str, Any], fixtures: list[str]) -> str:
    lines = ["| fixture | server | prompt tokens | TTFT cold (s) | TTFT warm (s) | prefill tok/s | contaminated |",
             "|---|---|---|---|---|---|---|"]

    def fmt(v: float | None, digits: int = 2) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    for fx in fixtures:
        for name, r in results.items():
            f = (r.get("fixtures") or {}).get(fx)
            if f is None:
                lines.append(f"| {fx} | {name} | {r.get('reason', 'failed')[:60]} | | | | |")
                continue
            lines.append(f"| {fx} | {name} | {fmt(f['prompt_tokens'], 0)} | {fmt(f['ttft_cold_s'])} | "
                         f"{fmt(f['ttft_warm_s'])} | {fmt(f['prefill_tps'], 0)} | {f['contaminated']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="hearth,llama-server")
    p.add_argument("--fixtures", default=",".join(FIXTURES))
    p.add_argument("--model", type=Path, default=None, help=f"GGUF (default: the installed {MODEL_NAME})")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=32768)
    p.add_argument("--wait-idle", type=float, default=0.0)
    p.add_argument("--max-foreign-cpu", type=float, default=0.10)
    p.add_argument("--retries", type=int, default=2)
    p.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    a = p.parse_args(argv)
    s = Settings(model=a.model or default_model(), servers=a.servers.split(","), runs=a.runs, threads=a.threads,
                 parallel=1, ctx=a.ctx, wait_idle_s=a.wait_idle, max_foreign_cpu=a.max_foreign_cpu,
                 retries=a.retries, request_timeout_s=3600.0, out_dir=a.out_dir)
    fixtures = a.fixtures.split(",")
    results: dict[str, Any] = {}
    for name in s.servers:
        results[name] = asyncio.run(bench_server(name, s, fixtures, a.max_tokens))
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    doc = {"stamp": stamp, "machine": machine_info(), "settings": {**s.to_json(), "max_tokens": a.max_tokens,
                                                                    "fixtures": fixtures}, "servers": results}
    s.out_dir.mkdir(parents=True, exist_ok=True)
    for path in (s.out_dir / f"agents-{stamp}.json", s.out_dir / "latest-agents.json"):
        path.write_text(json.dumps(doc, indent=1))
    print(table(results, fixtures))
    print(f"\nModel {s.model.name}, threads {s.threads}, one slot of {s.ctx} tokens, max_tokens {a.max_tokens}, "
          f"runs {s.runs}. JSON: {s.out_dir / f'agents-{stamp}.json'}")


if __name__ == "__main__":
    main()
