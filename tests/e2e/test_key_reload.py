"""API keys reloaded without a restart on a real `hearth serve` (the default model; docs/api.md,
"Reloading the keys"): the key file rewritten, SIGHUP sent, then polled (with a deadline that
only catches a hang) until the new key is accepted; the removed key is then a 401 (one ring:
the new key's acceptance proves the swap). An invalid file on SIGHUP is logged and changes
nothing; `hearth keys reload` answers the counts; the process lives on throughout."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import Server, start_server, stop_server, wait_until

pytestmark = pytest.mark.slow

ALICE, BOB, CAROL, ADMIN = "sk-alice-1", "sk-bob-1", "sk-carol-1", "sk-admin-1"


def status(s: Server, key: str) -> int:
    return httpx.get(f"{s.base_url}/models", headers={"Authorization": f"Bearer {key}"}, timeout=60).status_code


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{ALICE} name=alice tenant=team-a\n{BOB} name=bob tenant=team-b rpm=100\n")
    s = start_server(tmp_path, "--api-key-file", str(keys), "--admin-key", ADMIN, "--parallel", "1",
                     "--ctx", "1024")
    try:
        yield s, keys
    finally:
        stop_server(s)


def test_sighup_reloads_the_key_file(node: tuple[Server, Path]) -> None:
    s, keys = node
    assert status(s, BOB) == 200 and status(s, CAROL) == 401
    keys.write_text(f"{ALICE} name=alice tenant=team-a\n{CAROL} name=carol tenant=team-c\n")
    s.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: status(s, CAROL) == 200, "the new key accepted after SIGHUP", 60)
    assert status(s, BOB) == 401 and status(s, ALICE) == 200 and status(s, ADMIN) == 200
    r = httpx.post(f"{s.base_url}/chat/completions", headers={"Authorization": f"Bearer {CAROL}"}, timeout=120,
                   json={"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                         "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text
    log = s.log.read_text()
    assert "API keys reloaded: 1 added, 1 removed, 0 changed, 1 unchanged" in log
    assert CAROL not in log and BOB not in log  # counts, never keys

    # an invalid file: logged, nothing changes, the server lives on
    keys.write_text(f"{ALICE} name=alice\n{BOB} name=bob rpm=lots\n")
    s.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "API keys not reloaded" in s.log.read_text(), "the invalid file refused", 60)
    assert f"{keys}:2: rpm must be a whole number" in s.log.read_text()
    assert s.proc.poll() is None and status(s, CAROL) == 200 and status(s, BOB) == 401

    # the CLI (POST /admin/keys/reload): admin-only, counts
    keys.write_text(f"{ALICE} name=alice tenant=team-a rpm=50\n{BOB} name=bob\n")
    cli = [sys.executable, "-m", "hearth.cli.main", "keys", "reload", "--url", s.url]
    refused = subprocess.run([*cli, "--api-key", ALICE], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "admin key" in refused.stderr + refused.stdout
    out = subprocess.run([*cli, "--api-key", ADMIN], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "keys reloaded: 1 added, 1 removed, 1 changed, 0 unchanged" in out.stdout
    assert status(s, BOB) == 200 and status(s, CAROL) == 401
