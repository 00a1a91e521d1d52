"""Embeddings throughput: Hearth's /v1/embeddings against llama-server `--embeddings`, same GGUF
(the catalog's all-MiniLM-L6-v2), same threads.

Workloads (each sends `--inputs` sentences in all): 1 input per request (sequential), 16 and 256
inputs per request, and 16 concurrent clients of 1 input each. Rounds alternate the servers
(both stay up; one is measured at a time). Reports inputs/s and tokens/s (the servers' own
usage.prompt_tokens), the ratio Hearth / llama-server per workload (median over rounds), and the
cosine between the two servers' vectors for the same inputs.

    flock /tmp/hearth-bench.lock .venv/bin/python -m bench.embeddings --rounds 3 --threads 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.servers import wait_ready
from hearth import catalog

PHRASE = ("the quick brown fox jumps over lazy dogs while seven wizards quietly judge boxing matches near "
         "a river bank where engineers measure vectors for search and retrieval pipelines every day")
WORDS = PHRASE.split()
WORKLOADS = {"1/request": (1, 1), "16/request": (16, 1), "256/request": (256, 1), "16 clients x 1": (1, 16)}


def sentences(n: int) -> list[str]:
    rng = np.random.default_rng(7)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(6, 24)))) for _ in range(n)]


def start(argv: list[str], url: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    wait_ready(url, proc)
    return proc


def run(url: str, model: str, texts: list[str], per_request: int, clients: int) -> dict[str, float]:
    batches = [texts[i:i + per_request] for i in range(0, len(texts), per_request)]
    tokens = 0
    with httpx.Client(timeout=300) as http:
        def one(batch: list[str]) -> int:
            r = http.post(f"{url}/v1/embeddings", json={"model": model, "input": batch, "encoding_format": "float"})
            r.raise_for_status()
            body = r.json()
            assert len(body["data"]) == len(batch)
            return int(body["usage"]["prompt_tokens"])

        one(batches[0])  # warm-up
        t0 = time.perf_counter()
        if clients == 1:
            for b in batches:
                tokens += one(b)
        else:
            with ThreadPoolExecutor(clients) as pool:
                tokens = sum(pool.map(one, batches))
        dt = time.perf_counter() - t0
    return {"seconds": dt, "inputs_per_s": len(texts) / dt, "tokens_per_s": tokens / dt, "tokens": tokens}


def vectors(url: str, model: str, texts: list[str]) -> np.ndarray:
    r = httpx.post(f"{url}/v1/embeddings", json={"model": model, "input": texts, "encoding_format": "float"},
                   timeout=300)
    r.raise_for_status()
    return np.array([d["embedding"] for d in r.json()["data"]])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--inputs", type=int, default=512)
    ap.add_argument("--llama-server", default=str(Path.home() / ".cache/hearth/llama-server/0.3.36/llama-server"))
    ap.add_argument("--out", default="bench/results/latest-embeddings.json")
    args = ap.parse_args()
    gguf = catalog.installed_path(catalog.MINILM)
    if not gguf.is_file():
        sys.exit(f"install the model first: hearth models install {catalog.MINILM.id}")
    texts = sentences(args.inputs)
    tmp = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    hearth_url, llama_url = "http://127.0.0.1:18931", "http://127.0.0.1:18932"
    servers = {
        "hearth": (hearth_url, catalog.MINILM.id, [sys.executable, "-m", "hearth.cli.main", "serve", "--port", "18931",
                                                   "--threads", str(args.threads), "--model", catalog.MINILM.id,
                                                   "--data-dir", str(tmp / "data")]),
        # 16 slots of the model's 512-token context, so 16 clients are served at once
        "llama-server": (llama_url, "x", [args.llama_server, "-m", str(gguf), "--embeddings", "--port", "18932",
                                          "-t", str(args.threads), "-tb", str(args.threads), "-np", "16",
                                          "-c", str(512 * 16), "-b", "2048", "-ub", "2048"]),
    }
    procs = {name: start(argv, url, tmp / f"{name}.log") for name, (url, _, argv) in servers.items()}
    results: dict[str, dict[str, list[dict[str, float]]]] = {n: {w: [] for w in WORKLOADS} for n in servers}
    try:
        a = vectors(hearth_url, catalog.MINILM.id, texts[:64])
        b = vectors(llama_url, "x", texts[:64])
        cos = [float(x @ y / np.linalg.norm(x) / np.linalg.norm(y)) for x, y in zip(a, b, strict=True)]
        for r in range(args.rounds):
            order = list(servers) if r % 2 == 0 else list(servers)[::-1]
            for name in order:
                url, model, _ = servers[name]
                for w, (per_request, clients) in WORKLOADS.items():
                    results[name][w].append(run(url, model, texts, per_request, clients))
                    print(f"round {r} {name:12s} {w:15s} {results[name][w][-1]['inputs_per_s']:8.1f} inputs/s",
                          flush=True)
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(30)
    summary: dict[str, Any] = {}
    for w in WORKLOADS:
        h = statistics.median(x["inputs_per_s"] for x in results["hearth"][w])
        ll = statistics.median(x["inputs_per_s"] for x in results["llama-server"][w])
        ht = statistics.median(x["tokens_per_s"] for x in results["hearth"][w])
        lt = statistics.median(x["tokens_per_s"] for x in results["llama-server"][w])
        summary[w] = {"hearth_inputs_per_s": round(h, 1), "llama_server_inputs_per_s": round(ll, 1),
                      "hearth_tokens_per_s": round(ht, 1), "llama_server_tokens_per_s": round(lt, 1),
                      "ratio": round(h / ll, 3)}
    out = {"model": catalog.MINILM.id, "gguf": str(gguf), "threads": args.threads, "inputs": args.inputs,
           "rounds": args.rounds, "cosine_hearth_vs_llama_server_min": round(min(cos), 6),
           "summary": summary, "runs": results}
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps({"summary": summary, "cosine_min": out["cosine_hearth_vs_llama_server_min"]}, indent=2))


if __name__ == "__main__":
    main()
