"""`hearth replay` against the real app on the scripted backend with --journal, its HTTP client
bridged into the app in-process: identical when the answer is the same, a diff and exit 1 when
the model now answers otherwise."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from hearth.api.app import create_app
from hearth.cli import replay as replay_cli
from hearth.cli.client import Client
from hearth.config import Settings
from tests.cli.conftest import run
from tests.cli.test_cache import URL, bridge
from tests.fakes import ScriptedRunner, scripted_backend
from tests.helpers import wait_until

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "temperature": 0}


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TestClient, ScriptedRunner]]:
    weights = tmp_path / "fake.gguf"
    weights.write_bytes(b"fake weights")
    backend, runner = scripted_backend("Warm and bright.", path=weights)
    with TestClient(create_app(backend, Settings(data_dir=tmp_path, journal=True))) as client:
        wait_until(lambda: backend.ready, "the backend to load")
        monkeypatch.setattr(replay_cli, "Client", lambda url, key: Client(url, key, transport=bridge(client)))
        yield client, runner


def test_replay_identical_then_different(served: tuple[TestClient, ScriptedRunner]) -> None:
    tc, runner = served
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/messages", CHAT),
                       ("/v1/completions", {"prompt": "hi", "max_tokens": 5, "temperature": 0})):
        rid = tc.post(path, json={**body, "stream": True}).text.split('"id":"', 1)[1].split('"', 1)[0]
        out = run("replay", rid, "--url", URL)
        assert out.exit_code == 0 and out.stdout.startswith(f"identical: {rid}"), (path, out.output)
    rid = tc.post("/v1/chat/completions", json=CHAT).json()["id"]
    runner.answer = b"Cold and dark."
    out = run("replay", rid, "--url", URL, "--json")
    assert out.exit_code == 1, out.output
    got = json.loads(out.stdout)
    assert got["identical"] is False and got["recorded"]["text"] == "Warm and bright."
    assert got["replayed"]["text"] == "Cold and dark."
    diff = run("replay", rid, "--url", URL)
    assert diff.exit_code == 1 and "-Warm and bright." in diff.stdout and "+Cold and dark." in diff.stdout
    missing = run("replay", "chatcmpl-none", "--url", URL)
    assert missing.exit_code != 0 and "404" in missing.output
