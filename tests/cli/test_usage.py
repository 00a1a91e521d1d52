"""`hearth usage` against the real app on the scripted backend, its HTTP client bridged into the
app in-process (as tests/cli/test_keys.py does): sums, rows, and a tenant key's own view."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from hearth.api.app import create_app
from hearth.cli import usage as usage_cli
from hearth.cli.client import Client
from hearth.config import Settings
from hearth.tenants import ApiKey
from tests.cli.conftest import run
from tests.cli.test_cache import URL, bridge, cells
from tests.fakes import scripted_backend
from tests.helpers import wait_until

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture
def tc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    weights = tmp_path / "fake.gguf"
    weights.write_bytes(b"fake weights")
    backend, _ = scripted_backend("Warm and bright.", path=weights)
    keys = [ApiKey("ka", "alice", "team-a"), ApiKey("kb", "bob", "team-b")]
    settings = Settings(data_dir=tmp_path, named_keys=keys, admin_key="adm")
    with TestClient(create_app(backend, settings)) as client:
        wait_until(lambda: backend.ready, "the backend to load")
        monkeypatch.setattr(usage_cli, "Client", lambda url, key: Client(url, key, transport=bridge(client)))
        yield client


def test_usage_sums_and_rows(tc: TestClient) -> None:
    answers = [tc.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {k}"}).json()
               for k in ("ka", "ka", "kb")]
    out = run("usage", "--url", URL, "--group", "key", "--json", env={"HEARTH_ADMIN_KEY": "adm"})
    assert out.exit_code == 0, out.output
    sums = {r["key"]: r for r in json.loads(out.stdout)}
    assert sums["alice"]["requests"] == 2 and sums["bob"]["requests"] == 1
    assert sums["alice"]["generated_tokens"] == sum(a["usage"]["completion_tokens"] for a in answers[:2])
    mine = run("usage", "--url", URL, "--group", "none", "--json", env={"HEARTH_ADMIN_KEY": "kb"})  # bob's key
    assert mine.exit_code == 0, mine.output
    assert [r["request_id"] for r in json.loads(mine.stdout)] == [answers[2]["id"]]
    table = run("usage", "--url", URL, "--group", "tenant", env={"HEARTH_ADMIN_KEY": "adm"})
    assert table.exit_code == 0, table.output
    rows = [c for c in map(cells, table.stdout.splitlines()) if c and c[0] in ("team-a", "team-b")]
    assert [(c[0], c[1]) for c in rows] == [("team-a", "2"), ("team-b", "1")]
    bad = run("usage", "--url", URL, "--since", "someday", env={"HEARTH_ADMIN_KEY": "adm"})
    assert bad.exit_code != 0 and "since" in bad.output


def test_usage_against_a_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same command reads a gateway's ledger (its rows, `node` as a grouping)."""
    from tests.helpers.fake_fleet import Fleet, gateway

    with gateway(tmp_path, Fleet()) as gw:
        monkeypatch.setattr(usage_cli, "Client", lambda url, key: Client(url, key, transport=bridge(gw)))
        for _ in range(2):
            assert gw.post("/v1/chat/completions", json={"model": "smol", **CHAT}).status_code == 200
        out = run("usage", "--url", URL, "--group", "model", "--json", env={"HEARTH_ADMIN_KEY": "gw-key"})
        assert out.exit_code == 0, out.output
        [sums] = json.loads(out.stdout)
        assert (sums["model"], sums["requests"], sums["prompt_tokens"], sums["generated_tokens"]) == ("smol", 2, 10, 2)
        by_node = run("usage", "--url", URL, "--group", "node", "--json", env={"HEARTH_ADMIN_KEY": "gw-key"})
        assert by_node.exit_code == 0, by_node.output
        assert sum(r["requests"] for r in json.loads(by_node.stdout)) == 2
