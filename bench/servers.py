"""Server definitions (how to launch each one) and the subprocess lifecycle around a benchmark."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import httpx

from bench.config import Settings

LLAMA_CPP_VERSION = "0.3.36"


class ServerUnavailable(RuntimeError):
    """The server cannot be run here (binary missing, failed to start, never became ready)."""


@dataclass
class Launch:
    """A resolved command plus what the harness must know to talk to it fairly."""

    argv: list[str]
    supports_ignore_eos: bool
    notes: dict[str, object] = field(default_factory=dict)


def _venv_bin(name: str) -> Path | None:
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return candidate
    found = shutil.which(name)
    return Path(found) if found else None


def _help_text(argv: list[str]) -> str:
    try:
        proc = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerUnavailable(f"{argv[0]} --help failed: {exc}") from exc
    if proc.returncode != 0:
        raise ServerUnavailable(f"{' '.join(argv)} --help exited {proc.returncode}: {proc.stderr[-500:]}")
    return proc.stdout + proc.stderr


def hearth_launch(s: Settings, port: int) -> Launch:
    exe = _venv_bin("hearth")
    if exe is None:
        raise ServerUnavailable("`hearth` executable not found (pip install -e . in the venv)")
    _help_text([str(exe), "serve"])
    argv = [
        str(exe),
        "serve",
        "--model",
        str(s.model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--threads",
        str(s.threads),
        "--parallel",
        str(s.parallel),
        "--ctx",
        str(s.ctx),
        # Explicit although --no-kv-unified is Hearth's default, so the command documents the layout.
        "--kv-unified" if s.kv_unified else "--no-kv-unified",
    ]
    return Launch(argv, supports_ignore_eos=True, notes={"kv_unified": s.kv_unified})


def llama_server_binary() -> Path | None:
    env = os.environ.get("LLAMA_SERVER_BIN")
    if env:
        return Path(env)
    cached = Path.home() / ".cache" / "hearth" / "llama-server" / LLAMA_CPP_VERSION / "llama-server"
    if cached.exists():
        return cached
    found = shutil.which("llama-server")
    return Path(found) if found else None


def llama_server_launch(s: Settings, port: int) -> Launch:
    exe = llama_server_binary()
    if exe is None or not exe.exists():
        raise ServerUnavailable("llama-server not built: run scripts/build_llama_server.sh (or set LLAMA_SERVER_BIN)")
    help_text = _help_text([str(exe)])
    # llama-server's -c is the total context shared by all slots.
    argv = [
        str(exe),
        "-m",
        str(s.model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-t",
        str(s.threads),
        "-np",
        str(s.parallel),
        "-c",
        str(s.ctx * s.parallel),
    ]
    notes: dict[str, object] = {"ctx_total": s.ctx * s.parallel}
    # Without -kvu llama-server gives each of the -np slots its own KV stream of -c/-np cells (its
    # help: unified is "enabled if number of slots is auto", and -np is always given here), which is
    # Hearth's default layout. -kvu only with --kv-unified.
    if s.kv_unified:
        if "--kv-unified" not in help_text:
            raise ServerUnavailable("--kv-unified asked but this llama-server has no -kvu option")
        argv.append("-kvu")
    notes["kv_unified"] = s.kv_unified
    # /metrics (Prometheus) for the cancel workload; /slots is on by default. Costs nothing unless polled.
    if "--metrics" in help_text:
        argv.append("--metrics")
        notes["metrics_endpoint"] = True
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30)
    notes["version"] = (version.stdout + version.stderr).strip().splitlines()[-2:]
    return Launch(argv, supports_ignore_eos=True, notes=notes)


def llama_cpp_python_launch(s: Settings, port: int) -> Launch:
    try:
        ver = version("llama-cpp-python")
    except PackageNotFoundError as exc:
        raise ServerUnavailable(f"llama-cpp-python not installed: {exc}") from exc
    argv = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(s.model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        str(s.threads),
        "--n_ctx",
        str(s.ctx),
        # By default a new request interrupts the one being streamed; queue them instead.
        "--interrupt_requests",
        "false",
    ]
    notes: dict[str, object] = {
        "version": ver,
        "serial": "one request at a time (global lock); --parallel does not apply",
        "interrupt_requests": False,
        "ignore_eos": "not supported: end-of-generation tokens get logit_bias -100 instead",
    }
    return Launch(argv, supports_ignore_eos=False, notes=notes)


LAUNCHERS: dict[str, Callable[[Settings, int], Launch]] = {
    "hearth": hearth_launch,
    "llama-server": llama_server_launch,
    "llama-cpp-python": llama_cpp_python_launch,
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _log_tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


class RunningServer:
    """A started server subprocess; use as an async context manager (`async with`)."""

    def __init__(self, name: str, launch: Launch, port: int, settings: Settings) -> None:
        self.name = name
        self.launch = launch
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.settings = settings
        self.log_path = Path(tempfile.mkdtemp(prefix="hearth-bench-")) / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    async def __aenter__(self) -> RunningServer:
        t0 = time.perf_counter()
        with self.log_path.open("wb") as log:
            try:
                self.proc = subprocess.Popen(
                    self.launch.argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ServerUnavailable(f"cannot start {self.name}: {exc}") from exc
        try:
            await self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - t0
        return self

    def kv_layout_from_log(self) -> bool | None:
        """What the server itself logged about its KV layout (llama-server prints `kv_unified = 'false'`)."""
        m = re.search(r"kv_unified = '(true|false)'", _log_tail(self.log_path, 200_000))
        return None if m is None else m.group(1) == "true"

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.settings.startup_timeout_s
        async with httpx.AsyncClient(timeout=5.0) as client:
            while time.monotonic() < deadline:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise ServerUnavailable(
                        f"{self.name} exited with {self.proc.returncode} before ready:\n{_log_tail(self.log_path)}"
                    )
                for path in ("/health", "/v1/models"):
                    try:
                        resp = await client.get(self.base_url + path)
                    except httpx.HTTPError:
                        break  # not listening yet
                    if resp.status_code == 200:
                        return
                    if resp.status_code != 404:
                        break  # e.g. 503 while loading: keep polling /health
                await asyncio.sleep(0.25)
        raise ServerUnavailable(
            f"{self.name} not ready after {self.settings.startup_timeout_s}s:\n{_log_tail(self.log_path)}"
        )

    def stop(self) -> None:
        """SIGTERM the server's process group, then SIGKILL it if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session made the server its own group leader
        try:
            os.killpg(pgid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=15)
        except ProcessLookupError:
            pass


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    """Block until a server process started by a bench answers /health with 200 (RuntimeError
    if it exits first or never does)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} never became healthy")
