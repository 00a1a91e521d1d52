"""A background `hearth serve` owned by one data directory.

Files in the data directory: `server.lock`, `server.pid` (JSON: pid, url, model, start time,
log path) and `server.log`. Invariant: **the lock is held exactly while a background server
lives.** `start` takes the lock (fcntl.flock, non-blocking) and hands the locked descriptor to
the server process, which keeps it until it exits; so a second `start` fails at once instead of
racing, and a pid file whose lock is free is stale, whatever its pid now names.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from hearth.cli.client import CLIError
from hearth.config import default_data_dir

# The background servers this process started. A server outlives `start` on purpose, so its Popen
# is kept rather than dropped while the child runs (Popen warns about that, and no one would
# collect the child's exit status); the finished ones are reaped at the next start.
_started: list[subprocess.Popen[bytes]] = []


@dataclass(slots=True)
class ServeOptions:
    """The `hearth serve` flags a background server takes."""

    models: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 8000
    ctx: int | None = None
    parallel: int | None = None
    threads: int | None = None
    api_key: str | None = None  # passed through the environment, never on the command line

    def argv(self) -> list[str]:
        args = ["serve", "--host", self.host, "--port", str(self.port)]
        for m in self.models:
            args += ["--model", m]
        for flag, value in (("--ctx", self.ctx), ("--parallel", self.parallel), ("--threads", self.threads)):
            if value is not None:
                args += [flag, str(value)]
        return args


@dataclass(slots=True)
class PidInfo:
    pid: int
    url: str
    started_at: float
    log: str
    argv: list[str]


def connect_host(host: str) -> str:
    """Where a client reaches a server bound to `host` on this machine."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class Daemon:
    def __init__(self, data_dir: Path | str | None = None) -> None:
        self.data_dir = Path(data_dir) if data_dir else default_data_dir()
        self.lock_file = self.data_dir / "server.lock"
        self.pid_file = self.data_dir / "server.pid"
        self.log_file = self.data_dir / "server.log"

    # the lock

    def _try_lock(self) -> int | None:
        """A descriptor holding the lock, or None if a server (or a start) holds it."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def is_running(self) -> bool:
        if not self.lock_file.exists():
            return False
        fd = self._try_lock()
        if fd is None:
            return True
        os.close(fd)
        return False

    def read_pid(self) -> PidInfo | None:
        try:
            return PidInfo(**json.loads(self.pid_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def running(self) -> PidInfo | None:
        """The live server's pid file, or None (a stale pid file is removed)."""
        if not self.is_running():
            self.pid_file.unlink(missing_ok=True)
            return None
        return self.read_pid()

    # start

    def start(self, options: ServeOptions, wait: bool = True, timeout: float = 300.0,
              on_wait: Callable[[str], None] | None = None) -> PidInfo:
        fd = self._try_lock()
        if fd is None:
            info = self.read_pid()
            where = f" (pid {info.pid}, {info.url})" if info else ""
            raise CLIError(f"a Hearth server is already running or starting from {self.data_dir}{where}; "
                           "see: hearth server status")
        try:
            self.pid_file.unlink(missing_ok=True)
            url = f"http://{connect_host(options.host)}:{options.port}"
            if _port_busy(connect_host(options.host).strip("[]"), options.port):
                raise CLIError(f"port {options.port} is already in use on {options.host}; pick another with --port")
            env = {**os.environ, "HEARTH_HOME": str(self.data_dir)}
            if options.api_key:
                env["HEARTH_API_KEYS"] = options.api_key
            argv = [sys.executable, "-m", "hearth.cli.main", *options.argv()]
            with self.log_file.open("ab") as log:
                log.write(f"\n=== hearth server start {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                          f"{' '.join(argv[1:])}\n".encode())
                log.flush()
                # A new session: Ctrl-C in the terminal that started it must not reach it.
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True, pass_fds=(fd,))
            _started[:] = [p for p in _started if p.poll() is None]
            _started.append(proc)
            info = PidInfo(pid=proc.pid, url=url, started_at=time.time(), log=str(self.log_file), argv=argv[3:])
            tmp = self.pid_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(info)))
            tmp.replace(self.pid_file)
        finally:
            os.close(fd)  # the server keeps its own copy of the locked descriptor
        if wait:
            self._wait_ready(proc, info, timeout, on_wait)
        return info

    def _wait_ready(self, proc: subprocess.Popen[bytes], info: PidInfo, timeout: float,
                    on_wait: Callable[[str], None] | None) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as http:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    self.pid_file.unlink(missing_ok=True)
                    raise CLIError(f"the server exited with status {proc.returncode} while starting: "
                                   f"{self.last_error_line()} (log: {self.log_file})")
                try:
                    r = http.get(f"{info.url}/health")
                    body = r.json()
                except (httpx.HTTPError, ValueError):
                    body = {"status": "starting"}
                status = body.get("status") if isinstance(body, dict) else None
                if status == "ok":
                    return
                if status == "error":
                    raise CLIError(f"the model failed to load: {body.get('error')} (the server is still up; "
                                   "stop it with: hearth server stop)")
                if on_wait:
                    on_wait(str(status or "starting"))
                time.sleep(0.25)
        raise CLIError(f"the server did not become ready within {timeout:.0f}s (log: {self.log_file})")

    def last_error_line(self) -> str:
        try:
            lines = [ln for ln in self.log_file.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "no log"
        for line in reversed(lines):
            if line.startswith("error:") or "Error" in line:
                return line.strip()
        return lines[-1].strip() if lines else "no output"

    # stop

    def stop(self, timeout: float = 30.0) -> PidInfo:
        """SIGTERM the server and wait for it to let go of the lock; SIGKILL after `timeout`."""
        info = self.running()
        if info is None:
            raise CLIError(f"no background server is running from {self.data_dir}")
        _signal(info.pid, signal.SIGTERM)
        if self._wait_stopped(timeout):
            return info
        _signal(info.pid, signal.SIGKILL)
        if self._wait_stopped(10.0):
            return info
        raise CLIError(f"pid {info.pid} did not exit after SIGKILL")

    def _wait_stopped(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.is_running():
                self.pid_file.unlink(missing_ok=True)
                return True
            time.sleep(0.1)
        return False


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as e:
        raise CLIError(f"not allowed to signal pid {pid}") from e


def _port_busy(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False
