"""The gateway's memory for one large batch file (issue 40, files in bounded chunks): the peak
resident set (VmHWM, /proc) of a real gateway process while a file of `--mb` MB is uploaded
(`POST /v1/files`), and, in a fresh gateway process on the same database, while it is downloaded
(`GET /v1/files/{id}/content`), and in a third while a batch is created over it and its run
starts, each above the process's resident set before the request. The
client streams the file from disk and the download to disk, in this process, so only the
gateway's memory is measured. No node is needed (files never reach one).

    .venv/bin/python -m bench.gateway_batch_files                    # this checkout, SQLite
    .venv/bin/python -m bench.gateway_batch_files --database postgresql://...
    .venv/bin/python -m bench.gateway_batch_files --tree /tmp/old    # another checkout's hearth/
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.servers import free_port

LINE_BYTES = 2048


def input_file(path: Path, mb: int) -> int:
    """A JSONL batch file of about `mb` MB (lines of about LINE_BYTES); its size."""
    with path.open("wb") as f:
        i = 0
        while f.tell() < mb * 1_000_000:
            message = {"role": "user", "content": ""}
            body = {"model": "smol", "max_tokens": 1, "messages": [message]}
            row = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            message["content"] = "é" * ((LINE_BYTES - len(json.dumps(row))) // 2)  # 2 bytes each in UTF-8
            f.write(json.dumps(row, ensure_ascii=False).encode() + b"\n")
            i += 1
        return f.tell()


def status_kb(pid: int, field: str) -> int:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith(field + ":"):
            return int(row.split()[1])
    raise KeyError(field)


class Gateway:
    def __init__(self, root: Path, tree: Path | None, database: str | None) -> None:
        self.port = free_port()
        toml = root / "fleet.toml"
        toml.write_text(f'[[upstream]]\nname = "n"\nurl = "http://127.0.0.1:{free_port()}"\n'
                        'models = { "smol" = "m" }\n')
        env = {**os.environ, "HEARTH_GATEWAY_HOME": str(root / "gw")}
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
        self.proc = subprocess.Popen([sys.executable, "-m", "hearth.cli.main", "gateway", "--upstreams", str(toml),
                                      "--port", str(self.port), "--log-level", "warning", "--digest-interval", "0",
                                      *(["--database", database] if database else [])],
                                     env=env, cwd=tree or Path.cwd(), stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.url + "/v1/files", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.2)
        time.sleep(1)  # its first probes
        self.rss_kb = status_kb(self.proc.pid, "VmRSS")

    def peak_above_start_mb(self) -> float:
        return (status_kb(self.proc.pid, "VmHWM") - self.rss_kb) / 1024

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def measure(root: Path, tree: Path | None, database: str | None, mb: int) -> dict[str, float]:
    src = root / "in.jsonl"
    size = input_file(src, mb)
    g = Gateway(root, tree, database)
    try:
        t0 = time.monotonic()
        with src.open("rb") as f:
            r = httpx.post(g.url + "/v1/files", files={"file": ("in.jsonl", f, "application/jsonl")},
                           data={"purpose": "batch"}, timeout=600)
        r.raise_for_status()
        upload_s = time.monotonic() - t0
        fid, upload_mb = r.json()["id"], g.peak_above_start_mb()
    finally:
        g.stop()
    g = Gateway(root, tree, database)
    try:
        t0, digest, got = time.monotonic(), hashlib.sha256(), 0
        with httpx.stream("GET", f"{g.url}/v1/files/{fid}/content", timeout=600) as resp:
            resp.raise_for_status()
            for piece in resp.iter_bytes():
                digest.update(piece)
                got += len(piece)
        download_s = time.monotonic() - t0
        download_mb = g.peak_above_start_mb()
    finally:
        g.stop()
    g = Gateway(root, tree, database)
    try:  # a batch over it: checked again, copied, and its run started (its lines then wait on the absent node)
        t0 = time.monotonic()
        r = httpx.post(g.url + "/v1/batches", json={"input_file_id": fid, "endpoint": "/v1/chat/completions",
                                                    "completion_window": "24h"}, timeout=600)
        r.raise_for_status()
        create_s = time.monotonic() - t0
        time.sleep(3)  # the runner reads the input's ids and starts its first lines
        create_mb = g.peak_above_start_mb()
    finally:
        g.stop()
    assert got == size and digest.hexdigest() == hashlib.sha256(src.read_bytes()).hexdigest(), "not the same bytes"
    return {"file_mb": round(size / 1e6, 1), "upload_peak_mb": round(upload_mb, 1), "upload_s": round(upload_s, 2),
            "download_peak_mb": round(download_mb, 1), "download_s": round(download_s, 2),
            "batch_peak_mb": round(create_mb, 1), "create_s": round(create_s, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--tree", type=Path, help="run the gateway from this checkout's hearth/ (PYTHONPATH)")
    ap.add_argument("--database", help="a PostgreSQL URL (an empty database); default: SQLite")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hearth-files-") as tmp:
        result = measure(Path(tmp), args.tree, args.database, args.mb)
    print(json.dumps({"tree": str(args.tree or "."), "database": "postgresql" if args.database else "sqlite",
                      "load": os.getloadavg()[0], **result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
