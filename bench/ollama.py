"""Ollama's API overhead (issue 37): `/api/chat` streamed (NDJSON) beside Hearth's own
`/v1/chat/completions` streamed (SSE), on one server, the same request.

    .venv/bin/python -m bench.ollama                 # 8 alternated rounds
    .venv/bin/python -m bench.ollama --rounds 2      # smoke

One Hearth server with the default model and one slot. Each round sends the same chat to both
endpoints, in alternating order, at temperature 0 with the whole prompt recomputed
(`cache_prompt: false`, so each request does the same prefill) and the same token budget.
Measured per request, on the client: TTFT (the first piece of text) and decode tokens/s
(tokens after the first over the time between the first and the last piece of text; the
token count is the server's: `eval_count`, `usage.completion_tokens`). Medians, the ratio
Ollama / OpenAI of the medians, and the median of the per-round ratios. The machine is shared:
the load average is recorded before and after.
Results: bench/results/ollama-<stamp>.json and latest-ollama.json.
"""

from __future__ import annotations

import argparse
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

from bench.config import RESULTS_DIR
from bench.servers import free_port

MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]
TOKENS = 96


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def openai_run(client: httpx.Client, url: str) -> tuple[float, float, int]:
    body = {"model": "default", "messages": MESSAGES, "temperature": 0, "max_tokens": TOKENS, "stream": True,
            "stream_options": {"include_usage": True}, "cache_prompt": False}
    start, times, count = time.perf_counter(), [], 0
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                count = chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                times.append(time.perf_counter())
    return times[0] - start, (count - 1) / (times[-1] - times[0]), count


def ollama_run(client: httpx.Client, url: str) -> tuple[float, float, int]:
    body = {"model": "default", "messages": MESSAGES, "options": {"temperature": 0, "num_predict": TOKENS},
            "cache_prompt": False}
    start, times, count = time.perf_counter(), [], 0
    with client.stream("POST", f"{url}/api/chat", json=body) as r:
        for line in r.iter_lines():
            if not line:
                continue
            obj = json.loads(line)
            if obj["done"]:
                count = obj["eval_count"]
            elif obj["message"]["content"]:
                times.append(time.perf_counter())
    return times[0] - start, (count - 1) / (times[-1] - times[0]), count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="bench-ollama-") as tmp:
        log = Path(tmp) / "server.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "hearth.cli.main", "serve", "--port", str(port),
                                     "--threads", str(args.threads), "--parallel", "1", "--ctx", "2048"],
                                    stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HEARTH_HOME": tmp})
        try:
            deadline = time.monotonic() + 180
            while not _ready(url):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"the server did not start:\n{log.read_text()[-2000:]}")
                time.sleep(0.2)
            samples: dict[str, list[tuple[float, float, int]]] = {"openai": [], "ollama": []}
            before = load()
            with httpx.Client(timeout=600) as client:
                openai_run(client, url)  # warm-up, not counted
                ollama_run(client, url)
                for i in range(args.rounds):
                    order = [("openai", openai_run), ("ollama", ollama_run)]
                    for name, run in order if i % 2 == 0 else order[::-1]:
                        samples[name].append(run(client, url))
            after = load()
        finally:
            proc.terminate()
            proc.wait(30)
    result = summarize(samples, before, after, args)
    print(json.dumps(result, indent=2))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    for name in (f"ollama-{stamp}.json", "latest-ollama.json"):
        (RESULTS_DIR / name).write_text(json.dumps(result, indent=2) + "\n")


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def summarize(samples: dict[str, list[tuple[float, float, int]]], before: list[float], after: list[float],
              args: argparse.Namespace) -> dict[str, Any]:
    """Medians per endpoint, and the median of the per-round ratios (both requests of a round ran
    back to back: a load spike from another process on the shared machine tends to hit a round,
    and the paired ratio keeps it from counting against one side only)."""
    def med(name: str, i: int) -> float:
        return statistics.median(s[i] for s in samples[name])

    paired = {key: round(statistics.median(o[i] / a[i] for o, a in zip(samples["ollama"], samples["openai"],
                                                                         strict=True)), 3)
              for key, i in (("ttft", 0), ("decode_tok_s", 1))}
    medians = {name: {"ttft_ms": round(med(name, 0) * 1000, 1), "decode_tok_s": round(med(name, 1), 2),
                      "tokens": sorted({s[2] for s in samples[name]})} for name in samples}
    return {"bench": "ollama", "rounds": args.rounds, "threads": args.threads, "max_tokens": TOKENS,
            "load_before": before, "load_after": after, "median": medians,
            "ratio_ollama_over_openai": {"ttft": round(med("ollama", 0) / med("openai", 0), 3),
                                         "decode_tok_s": round(med("ollama", 1) / med("openai", 1), 3)},
            "paired_ratio_median": paired,
            "samples": {name: [[round(a, 4), round(b, 2), c] for a, b, c in runs] for name, runs in samples.items()}}

if __name__ == "__main__":
    main()
