"""`python -m bench.prompt_cache.first_request`: where the first answer after a restart goes.

    .venv/bin/python -m bench.prompt_cache.first_request --runs 3
    .venv/bin/python -m bench.prompt_cache.first_request --state-dir /tmp/hearth-fr --runs 3 [--no-warm]

Issue 38 item 4: the first answer after a restart for Claude Code's first request
(tests/fixtures/agents/claude-code-first.json, as bench/agents.py sends it: streamed,
1 output token, temperature 0, a tag in front of the system text). Each run is a fresh
process that serves Hearth in-process (uvicorn on a free port, the CLI's own `build_backend`
and `create_app`, `--ctx` 32768, one slot, `--threads` 2) on the same data directory, waits
until it is ready, sends the request once over HTTP and prints a timeline of the request:
each stage's start and end in ms after the request was sent (the timers wrap the functions
named; nothing else changes):

- `prepare` (hearth.backends.local.prepare: the whole template + tokens + parsers step), with
  `render` (the chat template) and `tokenize` inside it;
- `prefetch` (PrefixCache.prefetch: the prompt's blocks read from disk and checked, in the pool);
- `place` (Residency.place: the cache lookup and `state_set_blocks`, the join and llama.cpp's
  load, on the engine thread), `state_set_blocks` inside it;
- `decode` (each `Runner.decode`: the first is the last prompt token's prefill over the cached
  positions), `sample` (the first sampler call);
- `ttft` (the first output event on the client) and `done` (the stream's end).

`--no-warm` loads the model as before (no warm-up, no start prefetch: `ready_model` skipped),
for the comparison. Also the start: `ready_s` (process start to ready: model load, the start scan, and since
issue 38 the warm-up and the start prefetch), and the prompt cache's counters.

The first run (no `--state-dir`, or one with no blocks) makes the state: a cold request
(the whole prompt prefilled: minutes on 2 cores) in its own process, which waits for the
blocks to be written. `--state-dir` keeps it between invocations (the tag is stored beside it).
Only an idle machine's numbers mean much; run it under `flock /tmp/hearth-bench.lock`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

T0 = time.perf_counter()
EVENTS: list[tuple[str, float, float]] = []
_ORIGIN = [0.0]


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            EVENTS.append((name, t, time.perf_counter()))

    return wrapper


def _instrument() -> None:
    from hearth.backends.llamacpp.runner import LlamaCppRunner
    from hearth.backends.local import backend, prepare
    from hearth.backends.local.model import LocalModel
    from hearth.engine.prefix_cache import PrefixCache
    from hearth.engine.residency import Residency

    setattr(prepare, "render", _timed("render", prepare.render))  # noqa: B010 (a timer around it)
    setattr(backend, "prepare", _timed("prepare", prepare.prepare))  # noqa: B010
    for cls, names in ((LocalModel, ("tokenize_text",)), (PrefixCache, ("prefetch",)), (Residency, ("place",)),
                       (LlamaCppRunner, ("state_set_blocks", "decode", "new_sampler"))):
        for n in names:
            setattr(cls, n, _timed(n.replace("tokenize_text", "tokenize"), getattr(cls, n)))


async def _serve(state_dir: Path, model: Path, ctx: int, threads: int, body: dict[str, Any],
                 captured: dict[str, Any], seed: bool) -> dict[str, Any]:
    import httpx
    import uvicorn

    from bench.agents import first_output
    from bench.servers import free_port
    from hearth.api.app import create_app
    from hearth.backends.build import build_backend
    from hearth.config import Settings
    from hearth.models import resolve_model

    port = free_port()
    settings = Settings(models=[str(model)], ctx=ctx, parallel=1, threads=threads, port=port, data_dir=state_dir,
                        request_timeout=3600, max_request_timeout=3600)
    backend = build_backend(settings, [resolve_model(str(model))])
    app = create_app(backend, settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False,
                                           log_level="warning"))
    task = asyncio.create_task(server.serve())
    base = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=3600) as client:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(base + "/health")).status_code == 200:
                    break
            await asyncio.sleep(0.005)
        out["ready_s"] = round(time.perf_counter() - T0, 3)
        await asyncio.sleep(0.2)  # let the start settle (a client connects after the ready probe)
        EVENTS.clear()
        headers = {k: v for k, v in captured["headers"].items() if k.lower() not in ("accept-encoding", "content-type")}
        _ORIGIN[0] = time.perf_counter()
        rec = await first_output(client, base, captured["path"], headers, body)
        out.update({k: rec.get(k) for k in ("status", "ttft_s", "prompt_tokens", "cached_tokens", "total_s")})
        if seed:  # the writer's blocks on disk: none half-written, unchanged for 1 s
            seen: list[tuple[str, int]] = []
            while True:
                await asyncio.sleep(1.0)
                now = sorted((f.name, f.stat().st_size) for f in state_dir.glob("prompt-cache/*/*") if f.is_file())
                if now and now == seen and not any(n.endswith(".tmp") for n, _ in now):
                    break
                seen = now
        metrics = (await client.get(base + "/metrics")).text
        out["metrics"] = [ln for ln in metrics.splitlines()
                          if ln.startswith("hearth_prompt_cache") and "bucket" not in ln]
    server.should_exit = True
    await task
    o = _ORIGIN[0]
    out["timeline_ms"] = [(n, round((a - o) * 1000, 1), round((b - a) * 1000, 1)) for n, a, b in EVENTS if b >= o]
    return out


def child(a: argparse.Namespace) -> None:
    from bench.agents import load_fixture, prepare
    from hearth.backends.local import model_set

    _instrument()
    if a.no_warm:  # the code before issue 38's start work: no warm-up, no start prefetch
        setattr(model_set, "ready_model", lambda m, settings: m)  # noqa: B010
    captured = load_fixture("claude-code-first")
    tag = (a.state_dir / "bench-tag.txt").read_text().strip()
    body = prepare(captured, tag, 1, None)
    body.pop("model", None)
    out = asyncio.run(_serve(a.state_dir, a.model, a.ctx, a.threads, body, captured, a.seed))
    print("RESULT " + json.dumps(out))


def _run_child(a: argparse.Namespace, seed: bool) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.prompt_cache.first_request", "--child", "--state-dir", str(a.state_dir),
            "--model", str(a.model), "--ctx", str(a.ctx), "--threads", str(a.threads)] + (
        ["--seed"] if seed else []) + (["--no-warm"] if a.no_warm else [])
    p = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "HEARTH_LOG_LEVEL": "WARNING"})
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            got: dict[str, Any] = json.loads(line[7:])
            return got
    raise RuntimeError(f"child failed ({p.returncode}): {p.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> None:
    from bench.agents import default_model

    p = argparse.ArgumentParser(prog="python -m bench.prompt_cache.first_request", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-dir", type=Path, default=None, help="Hearth data directory kept between runs")
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--ctx", type=int, default=32768)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-warm", action="store_true",
                   help="without the warm-up and the start prefetch at load (as before issue 38's change)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--seed", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.model = a.model or default_model()
    if a.child:
        child(a)
        return
    a.state_dir = a.state_dir or Path(tempfile.mkdtemp(prefix="hearth-first-request-"))
    a.state_dir.mkdir(parents=True, exist_ok=True)
    tag_file = a.state_dir / "bench-tag.txt"
    if not tag_file.exists() or not any(a.state_dir.glob("prompt-cache/*/*.kvb")):
        tag_file.write_text(f"bench-{uuid.uuid4().hex[:12]}\n")
        cold = _run_child(a, seed=True)
        print(f"cold (makes the state in {a.state_dir}): ttft {cold['ttft_s']:.2f} s, "
              f"{cold['prompt_tokens']} prompt tokens", flush=True)
    rows = []
    for i in range(a.runs):
        r = _run_child(a, seed=False)
        rows.append(r)
        print(f"run {i + 1}: ready {r['ready_s']} s, ttft {r['ttft_s']:.3f} s, cached {r['cached_tokens']} of "
              f"{r['prompt_tokens']}", flush=True)
        for name, start, dur in r["timeline_ms"]:
            print(f"    {name:18s} at {start:8.1f} ms  took {dur:7.1f} ms")
    ttfts = [r["ttft_s"] for r in rows if r.get("ttft_s") is not None]
    if ttfts:
        print(f"ttft after a restart: median {statistics.median(ttfts):.3f} s, "
              f"runs {', '.join(f'{t:.3f}' for t in ttfts)}; state {a.state_dir}")


if __name__ == "__main__":
    main()
