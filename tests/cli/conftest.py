"""One real server for the CLI tests (2 slots, 2048 tokens each) and helpers to run verbs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner, Result

from hearth.cli.main import app
from tests.conftest import Server, start_server, stop_server


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
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{", 1)[0] == name and all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return 0.0

