"""CPU per one-input embedding request: the server's event-loop thread (the main thread,
/proc/PID/task/PID/schedstat, nanoseconds) and its whole process, per request, with the
requests/s beside; servers from one or more source trees (PYTHONPATH) alternated round by
round, all up at once, one measured at a time.

    flock /tmp/hearth-bench.lock .venv/bin/python -m bench.embed_cpu --requests 300 --rounds 5 \\
        --src /path/to/base --src .
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
from pathlib import Path
from typing import Any

import httpx

from bench.servers import free_port, wait_ready
from bench.stream_cpu import loop_ns, process_ns
from hearth import catalog

TEXT = "the quick brown fox jumps over lazy dogs while seven wizards quietly judge boxing matches"


def measure(url: str, pid: int, n: int) -> dict[str, float]:
    body = {"model": catalog.MINILM.id, "input": TEXT}
    with httpx.Client(timeout=60) as c:
        loop0, proc0, t0 = loop_ns(pid), process_ns(pid), time.perf_counter()
        for _ in range(n):
            c.post(f"{url}/v1/embeddings", json=body).raise_for_status()
        wall = time.perf_counter() - t0
        loop, proc = loop_ns(pid) - loop0, process_ns(pid) - proc0
    return {"loop_us": loop / 1000 / n, "process_us": proc / 1000 / n, "req_s": n / wall}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--src", action="append", default=[])
    a = ap.parse_args(argv)
    procs: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` too stops the servers (finally)
    try:
        for src in a.src or [""]:
            port, data = free_port(), tempfile.mkdtemp(prefix="hearth-embed-cpu-")
            env = dict(os.environ, PYTHONPATH=src) if src else None
            proc = subprocess.Popen([str(Path(sys.executable).parent / "hearth"), "serve", "--model",
                                     catalog.MINILM.id, "--host", "127.0.0.1", "--port", str(port), "--threads",
                                     str(a.threads), "--data-dir", data], env=env,
                                    stdout=(Path(data) / "server.log").open("wb"), stderr=subprocess.STDOUT,
                                    start_new_session=True)
            procs[src or "."] = (f"http://127.0.0.1:{port}", proc)
            wait_ready(procs[src or "."][0], proc)
            measure(procs[src or "."][0], proc.pid, 30)  # warm
        print(f"load: {os.getloadavg()}", flush=True)
        rows: dict[str, list[dict[str, float]]] = {}
        for r in range(a.rounds):
            for name, (url, proc) in procs.items() if r % 2 == 0 else reversed(procs.items()):
                m = measure(url, proc.pid, a.requests)
                rows.setdefault(name, []).append(m)
                print(f"round {r} {name}: loop {m['loop_us']:.0f} µs/request, process {m['process_us']:.0f} "
                      f"µs/request, {m['req_s']:.1f} req/s", flush=True)
        out: dict[str, Any] = {"requests": a.requests, "rounds": a.rounds, "load": os.getloadavg()}
        for name, v in rows.items():
            out[name] = {f: round(statistics.median(m[f] for m in v), 1) for f in ("loop_us", "process_us", "req_s")}
        print(json.dumps(out, indent=1))
    finally:
        for _, proc in procs.values():
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
