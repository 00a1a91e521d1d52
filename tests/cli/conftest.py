"""One real server for the CLI tests (2 slots, 2048 tokens each) and helpers to run verbs."""

from __future__ import annotations

import json
import platform
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner, Result

from hearth.cli.main import app
from tests.helpers import Server, sample, start_server, stop_server


@pytest.fixture(scope="package")
def cli_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("hearth-cli"), "--parallel", "2", "--ctx", "2048")
    yield s
    stop_server(s)


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    """Run `hearth ARGS` in-process, with a wide terminal so tables keep whole ids."""
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **(env or {})}, catch_exceptions=False)


def run_json(*args: str) -> Any:
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def metric(url: str, name: str, **labels: str) -> float:
    """One Prometheus sample (0 when absent), matched on name and every given label."""
    return sample(httpx.get(f"{url}/metrics", timeout=10).text, name, default=0.0, **labels)



# select(2)-family system calls, by /proc/PID/syscall number.
_WAITING_FOR_INPUT = {"x86_64": {"7", "23", "270", "271"}, "aarch64": {"72", "73"}}


def blocked_reading_input(pid: int) -> bool:
    """True while the main thread of `pid` sleeps in select()/poll(): for a REPL at its prompt,
    CPython's readline waiting for a key. Only there does a SIGINT interrupt it at once: one that
    lands while readline is still setting up (or between keys) is noticed only at the next signal,
    so a test sends Ctrl-C at a prompt after this holds, not after a guessed pause."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] != "S":
                return False
        with open(f"/proc/{pid}/syscall") as f:
            number = f.read().split()[0]
    except (OSError, IndexError):
        return False
    if platform.machine() in _WAITING_FOR_INPUT:
        return number in _WAITING_FOR_INPUT[platform.machine()]
    with open(f"/proc/{pid}/wchan") as f:  # another architecture: the kernel's wait function
        return "select" in (w := f.read()) or "poll" in w
