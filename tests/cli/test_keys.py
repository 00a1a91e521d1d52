"""`hearth keys usage` against the real app on the scripted backend, its HTTP client bridged
into the app in-process (as tests/cli/test_cache.py does): the table and --json."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from hearth.api.app import create_app
from hearth.cli import keys as keys_cli
from hearth.cli.client import Client
from hearth.config import Settings
from hearth.tenants import ApiKey
from tests.cli.conftest import run
from tests.cli.test_cache import URL, bridge, cells
from tests.fakes import scripted_backend
from tests.helpers import wait_until


@pytest.fixture
def tc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    weights = tmp_path / "fake.gguf"
    weights.write_bytes(b"fake weights")
    backend, _ = scripted_backend("Warm and bright.", path=weights)
    keys = [ApiKey("ka", "alice", "team-a", rpm=100), ApiKey("kb", "bob", "team-b")]
    settings = Settings(data_dir=tmp_path, named_keys=keys, admin_key="adm")
    with TestClient(create_app(backend, settings)) as client:
        wait_until(lambda: backend.ready, "the backend to load")
        monkeypatch.setattr(keys_cli, "Client", lambda url, key: Client(url, key, transport=bridge(client)))
        yield client


def test_usage_per_key(tc: TestClient) -> None:
    r = tc.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
                headers={"Authorization": "Bearer ka"})
    assert r.status_code == 200, r.text
    out = run("keys", "usage", "--url", URL, "--json", env={"HEARTH_ADMIN_KEY": "adm"})
    assert out.exit_code == 0, out.output
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert rows["alice"]["requests"] == 1 and rows["alice"]["prompt_tokens"] == r.json()["usage"]["prompt_tokens"]
    assert rows["bob"]["requests"] == 0
    table = run("keys", "usage", "--url", URL, env={"HEARTH_ADMIN_KEY": "adm"})
    assert table.exit_code == 0, table.output
    alice = next(c for c in map(cells, table.stdout.splitlines()) if c[0] == "alice")
    assert alice[1:4] == ["team-a", "1", "0"] and alice[-1] == "rpm=100"
    refused = run("keys", "usage", "--url", URL, env={"HEARTH_ADMIN_KEY": "ka"})  # not the admin key
    assert refused.exit_code != 0


def test_rows_a_gateway_key_makes_show_whom_they_were_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = tmp_path / "fake.gguf"
    weights.write_bytes(b"fake weights")
    backend, _ = scripted_backend("Warm and bright.", path=weights)
    settings = Settings(data_dir=tmp_path, named_keys=[ApiKey("kgw", "gw", "gw", role="gateway")], admin_key="adm")
    with TestClient(create_app(backend, settings)) as client:
        wait_until(lambda: backend.ready, "the backend to load")
        monkeypatch.setattr(keys_cli, "Client", lambda url, key: Client(url, key, transport=bridge(client)))
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                      "max_tokens": 3},
                        headers={"Authorization": "Bearer kgw", "X-Hearth-Tenant": "team-a"})
        assert r.status_code == 200, r.text
        table = run("keys", "usage", "--url", URL, env={"HEARTH_ADMIN_KEY": "adm"})
    assert table.exit_code == 0, table.output
    rows = {c[0]: c for c in map(cells, table.stdout.splitlines()) if c and c[0] in ("gw", "team-a")}
    assert rows["team-a"][1:4] == ["team-a", "gw", "1"]  # key, tenant, via, requests
    assert rows["gw"][1:4] == ["gw", "-", "1"]
