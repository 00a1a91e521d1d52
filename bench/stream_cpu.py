"""CPU per streamed token on the server's HTTP side: the server process's CPU time (not wall
time, so the figure survives a loaded machine) per generated token, for a streamed and a
non-streamed `/v1/chat/completions` of the same length (temperature 0, ignore_eos), alternated
round by round. The event-loop thread (the main thread) is read apart from the rest (the
engine thread and llama.cpp's compute threads) from /proc/PID/task/PID/schedstat (nanoseconds);
the process total from /proc/PID/stat (clock ticks, dead compute threads included).

    flock /tmp/hearth-bench.lock .venv/bin/python -m bench.stream_cpu --tokens 512 --rounds 5

`loop µs/token` streamed minus non-streamed is what streaming itself costs the event loop.
With `--streams K`, K streams run at once and the token count is theirs together.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.config import default_model
from bench.servers import free_port, wait_ready

_HZ = os.sysconf("SC_CLK_TCK")


def loop_ns(pid: int) -> int:
    """The main thread's run time (the event loop's: uvicorn runs it there)."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0])


def process_ns(pid: int) -> int:
    rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) * 1_000_000_000 // _HZ


def one(url: str, tokens: int, stream: bool, tag: str) -> int:
    body: dict[str, Any] = {"max_tokens": tokens, "temperature": 0, "ignore_eos": True,
                            "stream": stream, "stream_options": {"include_usage": True} if stream else None,
                            "messages": [{"role": "user", "content": f"[{tag}] Tell me a long story about a dragon."}]}
    if not stream:
        body.pop("stream_options")
    with httpx.Client(timeout=600) as c:
        if not stream:
            r = c.post(f"{url}/v1/chat/completions", json=body)
            r.raise_for_status()
            return int(r.json()["usage"]["completion_tokens"])
        n = 0
        with c.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    d = json.loads(line[6:])
                    if d.get("usage"):
                        n = int(d["usage"]["completion_tokens"])
        return n


def measure(url: str, pid: int, tokens: int, streams: int, stream: bool, tag: str) -> dict[str, float]:
    loop0, proc0, t0 = loop_ns(pid), process_ns(pid), time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        n = sum(pool.map(lambda i: one(url, tokens, stream, f"{tag}-{i}"), range(streams)))
    wall = time.perf_counter() - t0
    loop, proc = loop_ns(pid) - loop0, process_ns(pid) - proc0
    return {"tokens": n, "loop_us": loop / 1000 / n, "process_us": proc / 1000 / n, "tok_s": n / wall}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--fake", action="store_true",
                    help="serve bench.fake_node (the scripted fake runner, 5 ms a step): the HTTP side alone")
    ap.add_argument("--src", action="append", default=[],
                    help="a source tree to serve from (PYTHONPATH); twice or more to alternate them round by round "
                         "(default: this checkout)")
    a = ap.parse_args(argv)
    procs: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` too stops the servers (finally)
    try:
        for src in a.src or [""]:
            port = free_port()
            data = tempfile.mkdtemp(prefix="hearth-stream-cpu-")
            exe = Path(sys.executable).parent / "hearth"
            env = dict(os.environ, PYTHONPATH=src) if src else None
            argv = [sys.executable, "-m", "bench.fake_node", "--port", str(port)] if a.fake else [
                str(exe), "serve", "--model", str(a.model or default_model()), "--host", "127.0.0.1", "--port",
                str(port), "--threads", str(a.threads), "--data-dir", data, "--parallel", str(max(a.streams, 1))]
            if a.fake and src:
                env = dict(os.environ, PYTHONPATH=f"{src}:{Path.cwd()}")  # bench.fake_node from this checkout
            proc = subprocess.Popen(argv, env=env,
                                    stdout=(Path(data) / "server.log").open("wb"), stderr=subprocess.STDOUT,
                                    start_new_session=True)
            procs[src or "."] = (f"http://127.0.0.1:{port}", proc)
            wait_ready(procs[src or "."][0], proc)
            one(procs[src or "."][0], 32, True, "warm")
            one(procs[src or "."][0], 32, False, "warm")
        print(f"load: {os.getloadavg()}", flush=True)
        rows: dict[tuple[str, bool], list[dict[str, float]]] = {}
        for r in range(a.rounds):
            for name, (url, proc) in procs.items() if r % 2 == 0 else reversed(procs.items()):
                for stream in (True, False) if r % 2 == 0 else (False, True):
                    m = measure(url, proc.pid, a.tokens, a.streams, stream, f"r{r}")
                    rows.setdefault((name, stream), []).append(m)
                    print(f"round {r} {name} {'stream' if stream else 'whole '}: {m['tokens']} tokens, "
                          f"loop {m['loop_us']:.0f} µs/token, process {m['process_us']:.0f} µs/token, "
                          f"{m['tok_s']:.1f} tok/s", flush=True)
        out: dict[str, Any] = {"streams": a.streams, "tokens": a.tokens, "rounds": a.rounds, "load": os.getloadavg()}
        for (name, stream), v in rows.items():
            out[f"{name} {'stream' if stream else 'whole'}"] = {
                f: round(statistics.median(m[f] for m in v), 1) for f in ("loop_us", "process_us", "tok_s")}
        print(json.dumps(out, indent=1))
    finally:
        for _, proc in procs.values():
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
