"""A server the bench stops and starts again on the same state: Hearth on its data directory
(the prompt cache lives in <data_dir>/prompt-cache/<model>/), llama-server on its
`--slot-save-path` directory. Stopped gracefully (SIGTERM, then wait for the process to exit)
or with `kill -9` (SIGKILL to the whole process group)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.agents import HEARTH_EXTRA
from bench.config import Settings
from bench.servers import LAUNCHERS, Launch, RunningServer, free_port

HEARTH_BLOCKS = "prompt-cache/*/*.kvb"
GRACEFUL_TIMEOUT_S = 120.0  # Hearth finishes the cache writes in hand before it exits
_METRIC = re.compile(r"^(hearth_prompt_cache\w*(?:\{[^}]*\})?)\s+(\S+)$")


class Restartable:
    """One server on one state directory; `async with` stops it at the end, however it ends."""

    def __init__(self, name: str, settings: Settings, state_dir: Path) -> None:
        self.name, self.settings, self.state_dir = name, settings, state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()  # the same port across restarts (both servers bind with SO_REUSEADDR)
        self.launch = self._launch()
        self.server: RunningServer | None = None

    def _launch(self) -> Launch:
        launch = LAUNCHERS[self.name](self.settings, self.port)
        if self.name == "hearth":
            launch.argv += [*HEARTH_EXTRA, "--data-dir", str(self.state_dir)]
        else:
            launch.argv += ["--slot-save-path", str(self.state_dir)]
        return launch

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> RunningServer:
        assert self.server is not None, "not started"
        return self.server

    async def start(self) -> float:
        self.server = await RunningServer(self.name, self.launch, self.port, self.settings).__aenter__()
        assert self.server.startup_s is not None
        return self.server.startup_s

    def stop(self, how: str = "graceful", keep_log: bool = False) -> dict[str, Any]:
        """SIGTERM and wait for the exit ("graceful"; SIGKILL after GRACEFUL_TIMEOUT_S, reported),
        or SIGKILL at once ("kill"). The server's log (RunningServer makes a directory per start)
        goes with it unless `keep_log`, or unless the server had already died."""
        server = self.server
        if server is None or server.proc is None or server.proc.poll() is not None:
            return {"how": how, "shutdown_s": 0.0}
        try:
            return self._stop(server.proc, how)
        finally:
            if keep_log:
                print(f"{self.name} log: {server.log_path}", file=sys.stderr, flush=True)
            else:
                shutil.rmtree(server.log_path.parent, ignore_errors=True)

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes], how: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        out: dict[str, Any] = {"how": how}
        os.killpg(proc.pid, signal.SIGKILL if how == "kill" else signal.SIGTERM)
        try:
            proc.wait(timeout=GRACEFUL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            out["graceful_timed_out"] = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        out["shutdown_s"] = round(time.perf_counter() - t0, 3)
        out["exit_code"] = proc.returncode
        return out

    async def restart(self, how: str) -> dict[str, Any]:
        out = self.stop(how)
        out["startup_s"] = round(await self.start(), 3)
        return out

    async def __aenter__(self) -> Restartable:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.stop("graceful", keep_log=exc_type is not None)  # SIGKILL if it does not exit in time

    # ---- what the server keeps on disk ------------------------------------------------------

    def state_files(self) -> list[Path]:
        """Hearth's prompt-cache blocks, or llama-server's saved slots."""
        pattern = HEARTH_BLOCKS if self.name == "hearth" else "*.bin"
        return sorted(self.state_dir.glob(pattern))

    def disk_usage(self) -> dict[str, int]:
        files = self.state_files()
        stats = [f.stat() for f in files]
        return {"files": len(files), "bytes": sum(s.st_size for s in stats),
                "allocated_bytes": sum(s.st_blocks * 512 for s in stats)}  # what `du` counts

    async def wait_cache_written(self, min_blocks: int, timeout_s: float = 300.0) -> dict[str, Any]:
        """Hearth: wait until its writer has put the last request's blocks on disk: at least
        `min_blocks` block files, none half-written (`.tmp`), and the count and bytes unchanged
        over 4 polls 0.25 s apart. (Read from the directory, which every version has; the
        server's /metrics counters are recorded beside the measurements where it has them.)"""
        t0 = time.perf_counter()
        seen: list[tuple[int, int]] = []

        def settled() -> bool:
            usage = self.disk_usage()
            tmp = any(self.state_dir.glob("prompt-cache/*/.*.tmp"))
            seen.append((usage["files"], usage["bytes"]))
            last = seen[-4:]
            return (not tmp and usage["files"] >= min_blocks and len(last) == 4 and len(set(last)) == 1)

        deadline = time.monotonic() + timeout_s
        while not (ok := settled()) and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
        return {**self.disk_usage(), "wait_s": round(time.perf_counter() - t0, 3), "settled": ok}

    def evict_page_cache(self) -> dict[str, int]:
        """Drop the state files from the OS page cache (fsync, then POSIX_FADV_DONTNEED), so the
        next read comes from the disk, as after a reboot. Only these files: the model's GGUF and
        everything else on the machine keep their pages."""
        n = size = 0
        for path in self.state_files():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n, size = n + 1, size + os.fstat(fd).st_size
            finally:
                os.close(fd)
        return {"files": n, "bytes": size}

    def cache_log(self) -> list[str]:
        """Hearth's log lines about the prompt cache since this start (what the scan found, files
        it ignored)."""
        try:
            text = self.running.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [line.strip() for line in text.splitlines() if re.search(r"prompt.cache", line)][-20:]

    # ---- llama-server's slots ---------------------------------------------------------------

    async def slot(self, client: httpx.AsyncClient, action: str, filename: str) -> dict[str, Any]:
        """POST /slots/0?action=save|restore: llama-server's own record (n_saved / n_restored
        tokens, n_written / n_read bytes, timings.save_ms / restore_ms), plus the wall time."""
        t0 = time.perf_counter()
        r = await client.post(f"{self.base_url}/slots/0", params={"action": action}, json={"filename": filename})
        out: dict[str, Any] = {"status": r.status_code, "wall_s": round(time.perf_counter() - t0, 4)}
        try:
            out.update(r.json())
        except ValueError:
            out["error"] = r.text[:300]
        return out

    # ---- Hearth's counters ------------------------------------------------------------------

    async def cache_metrics(self, client: httpx.AsyncClient) -> dict[str, float]:
        """The `hearth_prompt_cache*` samples of GET /metrics (empty where the server has none)."""
        try:
            r = await client.get(f"{self.base_url}/metrics")
        except httpx.HTTPError:
            return {}
        if r.status_code != 200:
            return {}
        out: dict[str, float] = {}
        for line in r.text.splitlines():
            m = _METRIC.match(line)
            if m:
                try:
                    out[m[1]] = float(m[2])
                except ValueError:
                    continue
        return out
