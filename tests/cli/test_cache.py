"""`hearth cache stats|list|clear` and the cache lines of `hearth server status`, against the real
app on the scripted LocalBackend (a prompt cache with a disk tier, no model): the verbs' HTTP
client is bridged into the app in-process, so everything from the argument parsing to the
routes runs, without a port."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner, Result

from hearth.api.app import create_app
from hearth.backends.base import Backend
from hearth.cli import cache as cache_cli
from hearth.cli.client import Client
from hearth.cli.main import app as app_cli
from hearth.cli.server import cache_lines, cache_status
from hearth.config import Settings
from tests.cli.conftest import run
from tests.fakes import scripted_backend
from tests.helpers import Server, wait_until

LONG = [{"role": "user", "content": "Tell me about the hearth. " + "The fire keeps the house warm. " * 20}]
URL = "http://hearth.test"


def bridge(tc: TestClient) -> httpx.MockTransport:
    """A sync transport that hands each request to the app behind `tc`."""
    def handle(request: httpx.Request) -> httpx.Response:
        r = tc.request(request.method, request.url.raw_path.decode(), content=request.content,
                       headers=dict(request.headers))
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)
    return httpx.MockTransport(handle)


class App:
    def __init__(self, tc: TestClient, backend: Backend) -> None:
        self.tc, self.backend = tc, backend

    def client(self, api_key: str | None = None) -> Client:
        return Client(URL, api_key, transport=bridge(self.tc))

    def blocks(self) -> tuple[int, int]:
        cache = self.backend.prompt_cache
        assert cache is not None
        t = cache.cache_stats()["fake"].tiers
        return t["ram"].blocks, t["disk"].blocks

    def cache_a_prompt(self) -> int:
        r = self.tc.post("/v1/chat/completions", json={"messages": LONG, "max_tokens": 8},
                         headers={"Authorization": "Bearer adm"})
        assert r.status_code == 200, r.text
        wait_until(lambda: self.blocks()[0] >= 3 and self.blocks()[1] == self.blocks()[0],
                   "the prompt's blocks in RAM and on disk")
        return self.blocks()[0]


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    weights = tmp_path / "fake.gguf"
    weights.write_bytes(b"fake weights")
    backend, _ = scripted_backend("Warm and bright.", path=weights)
    backend.settings.cache_dir = tmp_path / "prompt-cache"
    settings = Settings(data_dir=tmp_path, api_keys=["user-key"], admin_key="adm")
    with TestClient(create_app(backend, settings)) as tc:
        wait_until(lambda: backend.ready, "the backend to load")  # the app loads it in the background
        handle = App(tc, backend)
        monkeypatch.setattr(cache_cli, "Client", lambda url, key: Client(url, key, transport=bridge(tc)))
        yield handle


def cells(line: str) -> list[str]:
    """The cells of one row of a rich table."""
    return [c.strip() for c in line.strip().strip("│").split("│")]


def cache(*args: str, key: str | None = "adm", answer: str | None = None) -> Result:
    """`hearth cache ARGS` with the admin key in HEARTH_ADMIN_KEY and `answer` on stdin."""
    if answer is None:
        return run("cache", *args, "--url", URL, env={"HEARTH_ADMIN_KEY": key} if key else {})
    return CliRunner().invoke(app_cli, ["cache", *args, "--url", URL], input=answer, catch_exceptions=False,
                              env={"COLUMNS": "200", **({"HEARTH_ADMIN_KEY": key} if key else {})})


def test_stats_list_and_clear(app: App) -> None:
    n = app.cache_a_prompt()

    stats = json.loads(cache("stats", "--json").stdout)
    fake = stats["models"]["fake"]
    assert fake["tiers"]["ram"]["blocks"] == fake["tiers"]["disk"]["blocks"] == n and fake["misses"] == 1
    table = cache("stats")
    assert table.exit_code == 0, table.output
    rows = {r[1]: r for r in map(cells, table.stdout.splitlines()) if r[0] == "fake"}
    assert set(rows) == {"slot", "ram", "disk"}
    assert rows["ram"][4] == rows["disk"][4] == str(n)  # the blocks column
    assert rows["ram"][6] == "1.0 GB" and rows["disk"][6] == "8.0 GB"  # the budgets
    assert rows["slot"][4:] == ["-"] * 4  # slots hold no blocks
    assert "fake: 1 miss, " in table.stdout and f"{n} blocks written" in table.stdout

    listed = json.loads(cache("list", "--json").stdout)
    assert listed["total"] == n and [e["start"] for e in listed["data"][:3]] == [0, 256, 512]
    printed = cache("list", "--limit", "2")
    assert printed.exit_code == 0, printed.output
    assert f"Prompt cache of fake ({n} blocks, first 2 shown)" in printed.stdout
    assert listed["data"][0]["hash"] in printed.stdout and listed["data"][1]["hash"] in printed.stdout
    assert listed["data"][2]["hash"] not in printed.stdout

    asked = cache("clear")  # no --yes, and nobody to answer: nothing is dropped
    assert asked.exit_code == 1 and "Aborted" in asked.output
    assert f"Drop the prompt cache of every model: {n} blocks" in asked.stderr
    assert app.blocks() == (n, n)
    declined = cache("clear", "--model", "fake", answer="n\n")
    assert declined.exit_code == 1 and f"Drop fake's prompt cache: {n} blocks" in declined.stderr
    assert app.blocks() == (n, n)

    cleared = cache("clear", "-m", "fake", answer="y\n")
    assert cleared.exit_code == 0, cleared.output
    assert f"dropped {n} blocks of fake's prompt cache" in cleared.stdout
    assert app.blocks() == (0, 0)
    again = json.loads(cache("clear", "--yes", "--json").stdout)
    assert again == {"object": "prompt_cache.cleared", "model": None, "dropped": 0}


def test_keys_and_errors_are_one_line(app: App) -> None:
    denied = cache("stats", key="user-key")
    assert denied.exit_code == 1 and "HTTP 403, insufficient_permissions" in denied.stderr
    assert denied.stderr.count("\n") == 1
    # --api-key wins over the environment; HEARTH_API_KEY is read when HEARTH_ADMIN_KEY is not set
    assert run("cache", "stats", "--url", URL, "--api-key", "adm", env={"HEARTH_ADMIN_KEY": "x"}).exit_code == 0
    assert run("cache", "stats", "--url", URL, env={"HEARTH_API_KEY": "adm"}).exit_code == 0
    unknown = cache("list", "--model", "nope")
    assert unknown.exit_code == 1 and "model_not_found" in unknown.stderr
    bad = cache("list", "--limit", "0")
    assert bad.exit_code == 1 and "limit must be an integer" in bad.stderr
    assert cache("clear", "--model", "nope").exit_code == 1  # refused before anything is asked


def test_status_lines_come_from_metrics(app: App) -> None:
    """`hearth server status` reads the cache from /metrics: an API key is enough there."""
    with app.client("user-key") as c:
        before = cache_status(c.samples())
    assert before is not None
    assert before["tiers"]["ram"]["blocks"] == 0 and before["tiers"]["ram"]["budget_bytes"] == 1024 << 20
    n = app.cache_a_prompt()
    app.tc.post("/v1/chat/completions", json={"messages": LONG, "max_tokens": 8},
                headers={"Authorization": "Bearer adm"})  # the same prompt again: a hit
    with app.client("user-key") as c:
        after = cache_status(c.samples())
    assert after is not None
    assert after["tiers"]["ram"]["blocks"] == after["tiers"]["disk"]["blocks"] == n and after["misses"] == 1
    assert sum(t["hits"] for t in after["tiers"].values()) == 1
    hit = next(tier for tier, t in after["tiers"].items() if t["hits"])
    lines = cache_lines(after)
    assert lines[0].startswith(f"  cache     ram {n} blocks, ") and f"of 1.0 GB; disk {n} blocks, " in lines[0]
    assert lines[0].endswith("of 8.0 GB")
    assert lines[1].startswith("  reused    slot ") and lines[1].endswith("; 1 miss")
    assert f"{hit} {after['tiers'][hit]['hit_tokens']} tokens (1 hit)" in lines[1]
    assert cache_status([("hearth_kv_tokens", {"model": "fake"}, 3.0)]) is None  # a server without a cache


@pytest.mark.slow
def test_the_verbs_on_a_real_server(cli_server: Server) -> None:
    """The real model's KV, cut into blocks by the llama.cpp runner, written to disk, listed, cleared."""
    url = cli_server.url
    assert run("cache", "clear", "--yes", "--url", url).exit_code == 0  # what earlier tests left
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Name the colour of the sky. " * 40}], "max_tokens": 4,
        "temperature": 0})
    assert r.status_code == 200, r.text
    prompt = r.json()["usage"]["prompt_tokens"]
    assert prompt > 256

    def stats() -> dict[str, Any]:
        result = run("cache", "stats", "--url", url, "--json")
        assert result.exit_code == 0, result.output
        models: dict[str, Any] = json.loads(result.stdout)["models"]
        return next(iter(models.values()))

    wait_until(lambda: stats()["tiers"]["disk"]["blocks"] > prompt // 256, "the prompt's blocks on disk")
    listed = json.loads(run("cache", "list", "--url", url, "--json").stdout)
    blocks = listed["data"]
    assert [e["start"] for e in blocks] == [256 * i for i in range(len(blocks))]  # one chain: this prompt's
    assert all(e["n_tokens"] == 256 for e in blocks[:-1]) and 0 < blocks[-1]["n_tokens"] <= 256
    assert all(e["ram"] and e["disk"] for e in blocks)
    assert prompt <= sum(e["n_tokens"] for e in blocks) <= prompt + 4  # the prompt and what was generated
    cleared = run("cache", "clear", "--yes", "--url", url)
    assert cleared.exit_code == 0 and f"dropped {len(blocks)} blocks" in cleared.stdout, cleared.output
    after = stats()
    assert after["tiers"]["ram"]["blocks"] == after["tiers"]["disk"]["blocks"] == 0
