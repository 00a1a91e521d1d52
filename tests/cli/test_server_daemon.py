"""`hearth server start|stop|status|logs` with a temporary data dir and a free port."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.cli.conftest import run
from tests.helpers import free_port

pytestmark = pytest.mark.slow


def hearth(*args: str, home: Path, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEARTH_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "hearth.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a stopped child of this test process may linger as a zombie until reaped
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_start_status_logs_stop(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    url = f"http://127.0.0.1:{port}"
    started = run("server", "start", "--data-dir", str(home), "--port", str(port), "--parallel", "2",
                  "--ctx", "1024", "--threads", "2", "--json")
    try:
        assert started.exit_code == 0, started.output
        info = json.loads(started.stdout)
        assert info["url"] == url and answers(url)
        pid_file = json.loads((home / "server.pid").read_text())
        assert pid_file["pid"] == info["pid"] and pid_alive(info["pid"])
        served = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]
        assert (served["meta"]["parallel"], served["meta"]["n_ctx"]) == (2, 1024)  # the flags reached the server

        status = run("server", "status", "--data-dir", str(home), "--json")
        assert status.exit_code == 0, status.output
        st = json.loads(status.stdout)
        assert st["running"] is True and st["pid"] == info["pid"] and st["url"] == url
        assert st["health"] == "ok" and st["models"] == [served["id"]]
        assert st["parallel"] == 2 and st["slots_busy"] == 0 and st["uptime_seconds"] >= 0
        cache = st["prompt_cache"]  # the default budgets, nothing cached yet
        assert cache["tiers"]["ram"] == {"blocks": 0, "bytes": 0, "budget_bytes": 1024 << 20, "hits": 0,
                                         "hit_tokens": 0}
        assert cache["tiers"]["disk"]["budget_bytes"] == 8192 << 20 and cache["misses"] == 0

        table = run("server", "status", "--data-dir", str(home))
        assert f"pid {info['pid']}" in table.stdout and url in table.stdout and "0 busy of 2" in table.stdout
        assert "  cache     ram 0 blocks, 0 B of 1.0 GB; disk 0 blocks, 0 B of 8.0 GB" in table.stdout
        assert "  reused    slot 0 tokens (0 hits), ram 0 tokens (0 hits), disk 0 tokens (0 hits); 0 misses" \
            in table.stdout

        logs = run("server", "logs", "--data-dir", str(home), "-n", "0")
        assert logs.exit_code == 0 and f"serving {served['id']} on {url}" in logs.stdout
    finally:
        stopped = run("server", "stop", "--data-dir", str(home))
    assert stopped.exit_code == 0, stopped.output
    assert f"pid {info['pid']}" in stopped.stdout
    assert not answers(url) and not pid_alive(info["pid"])
    assert not (home / "server.pid").exists()
    after = run("server", "status", "--data-dir", str(home))
    assert after.exit_code == 1 and "not running" in after.stdout


def test_two_concurrent_starts_only_one_wins(tmp_path: Path) -> None:
    home = tmp_path / "home"
    ports = [free_port(), free_port()]
    env = {**os.environ, "HEARTH_HOME": str(home)}
    procs = [subprocess.Popen([sys.executable, "-m", "hearth.cli.main", "server", "start", "--port", str(p),
                               "--threads", "1", "--parallel", "1", "--ctx", "512"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for p in ports]
    outs = [p.communicate(timeout=200) for p in procs]
    try:
        codes = [p.returncode for p in procs]
        assert sorted(codes) == [0, 1], outs
        winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
        assert "already running or starting" in outs[loser][1]
        assert outs[loser][1].count("\n") == 1  # one line
        assert answers(f"http://127.0.0.1:{ports[winner]}")
        assert not answers(f"http://127.0.0.1:{ports[loser]}")
        # a third start, after the race, still refuses
        third = hearth("server", "start", "--port", str(free_port()), home=home)
        assert third.returncode == 1 and "already running" in third.stderr
    finally:
        stop = hearth("server", "stop", home=home)
    assert stop.returncode == 0, stop.stderr
    assert not answers(f"http://127.0.0.1:{ports[winner]}")


def test_a_stale_pid_file_does_not_block_a_start(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    # a pid file left by a crash: the lock is free, so it is stale whatever the pid names
    (home / "server.pid").write_text(json.dumps({"pid": os.getpid(), "url": "http://127.0.0.1:1", "started_at": 0,
                                                 "log": "", "argv": []}))
    status = hearth("server", "status", home=home)
    assert status.returncode == 1 and "not running" in status.stdout
    started = hearth("server", "start", "--port", str(port), "--threads", "1", "--parallel", "1", "--ctx", "512",
                     home=home)
    try:
        assert started.returncode == 0, started.stderr
        assert json.loads((home / "server.pid").read_text())["pid"] != os.getpid()
    finally:
        assert hearth("server", "stop", home=home).returncode == 0


def test_start_reports_a_server_that_cannot_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a model")
    result = hearth("server", "start", "--port", str(free_port()), "--model", str(bad), "--parallel", "1", home=home)
    # `serve` accepts any existing file; the load fails in the server, which stays up to say so
    try:
        assert result.returncode == 1
        assert result.stderr.startswith("error: the model failed to load") and result.stderr.count("\n") == 1
    finally:
        hearth("server", "stop", home=home)
    assert not (home / "server.pid").exists()


def test_a_chat_session_survives_a_server_restart(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["server", "start", "--port", str(port), "--threads", "2", "--parallel", "1", "--ctx", "1024"]
    assert hearth(*args, home=home).returncode == 0
    try:
        # `hearth chat` reading a pipe: one turn, then EOF leaves
        first = subprocess.run([sys.executable, "-m", "hearth.cli.main", "chat", "--url", url, "--session", "kept",
                                "--max-tokens", "8", "--temperature", "0"], input="Say hi.\n", capture_output=True,
                               text=True, timeout=120)
        assert first.returncode == 0, first.stderr
        before = httpx.get(f"{url}/v1/sessions/kept/history", timeout=10).json()["data"]
        assert [m["role"] for m in before] == ["user", "assistant"]
        assert before[1]["content"].strip() and before[1]["content"].strip() in first.stdout

        assert hearth("server", "stop", home=home).returncode == 0
        assert not answers(url)
        assert hearth(*args, home=home).returncode == 0

        again = subprocess.run([sys.executable, "-m", "hearth.cli.main", "chat", "--url", url, "--session", "kept"],
                               input="/history\n", capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        assert "session kept: resuming, 2 messages" in again.stdout
        assert "[1] user" in again.stdout and "Say hi." in again.stdout and before[1]["content"].strip() in again.stdout
    finally:
        hearth("server", "stop", home=home)


def test_a_keyed_server_needs_the_key(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    url = f"http://127.0.0.1:{port}"
    started = hearth("server", "start", "--port", str(port), "--threads", "1", "--parallel", "1", "--ctx", "512",
                     "--api-key", "sekret", home=home)
    try:
        assert started.returncode == 0, started.stderr
        assert "sekret" not in (home / "server.pid").read_text()  # the key travels in the environment only
        denied = run("sessions", "ls", "--url", url)
        assert denied.exit_code == 1 and "HTTP 401" in denied.stderr and denied.stderr.count("\n") == 1
        models = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer sekret"}, timeout=10).json()
        # status names the loaded models; the others (installed, loaded on request) apart
        ids = [m["id"] for m in models["data"] if m["status"]["value"] == "loaded"]
        status = run("server", "status", "--data-dir", str(home), "--api-key", "sekret", "--json")
        assert json.loads(status.stdout)["models"] == ids
        assert json.loads(status.stdout)["on_demand"] == [m["id"] for m in models["data"] if m["id"] not in ids]
        # HEARTH_API_KEY works as well as --api-key; without a key, status says what it could not read
        status = run("server", "status", "--data-dir", str(home), "--json", env={"HEARTH_API_KEY": "sekret"})
        assert json.loads(status.stdout)["models"] == ids
        keyless = json.loads(run("server", "status", "--data-dir", str(home), "--json").stdout)
        assert keyless["health"] == "ok" and "HTTP 401" in keyless["models"]
        table = run("server", "status", "--data-dir", str(home)).stdout
        assert re.search(r"model\s+\? \(missing API key.*HTTP 401", table), table
        chat = subprocess.run([sys.executable, "-m", "hearth.cli.main", "chat", "--url", url, "--max-tokens", "4"],
                              input="Say hi.\n/stats\n", capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HEARTH_API_KEY": "sekret"})
        assert chat.returncode == 0, chat.stderr
        assert re.search(r"completion tokens [1-4],", chat.stdout), chat.stdout
    finally:
        hearth("server", "stop", home=home)
