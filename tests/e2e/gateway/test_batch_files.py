"""Batch files through a real gateway process, with the official `openai` SDK (docs/gateway.md,
"Batches": files in chunks): a file of several 1 MiB chunks uploaded with `files.create` comes
back byte for byte from `files.content`, also after the gateway is killed (-9) and started again
on the same data dir, and `files.delete` removes it. No node is needed: files never reach one
(the fleet file names one that is not there)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.gateway.conftest import GW_KEY, stop
from tests.helpers.servers import free_port

pytestmark = pytest.mark.slow


def start(home: Path, toml: Path, log: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """A gateway on `home` (its SQLite store), once it answers GET /v1/files."""
    port = free_port()
    env = {**os.environ, "HEARTH_GATEWAY_HOME": str(home)}
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "hearth.cli.main", "gateway", "--upstreams", str(toml),
                                 "--port", str(port), "--api-key", GW_KEY],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        try:
            if httpx.get(url + "/v1/files", headers={"Authorization": f"Bearer {GW_KEY}"}, timeout=2).is_success:
                return url, proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        stop(p)


def test_a_file_of_several_chunks_round_trips_through_a_restart(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    toml = tmp_path / "fleet.toml"
    toml.write_text(f'[[upstream]]\nname = "gone"\nurl = "http://127.0.0.1:{free_port()}"\n'
                    'models = { "smol" = "m" }\n')
    row = {"custom_id": "", "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "smol", "messages": [{"role": "user", "content": "é✓ " * 30_000}]}}
    content = b"".join(json.dumps({**row, "custom_id": f"c{i}"}, ensure_ascii=False).encode() + b"\n"
                       for i in range(30))  # about 5 MB: five chunks and a bit, characters cut at their edges
    assert len(content) > 4 * 1024 * 1024
    url, gw = start(tmp_path / "gw", toml, tmp_path / "gateway.log")
    procs.append(gw)
    with openai.OpenAI(base_url=url + "/v1", api_key=GW_KEY, max_retries=0) as c:
        f = c.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
        assert f.bytes == len(content)
        assert c.files.content(f.id).content == content
    os.kill(gw.pid, signal.SIGKILL)
    gw.wait(15)
    url, again = start(tmp_path / "gw", toml, tmp_path / "gateway.log")
    procs.append(again)
    with openai.OpenAI(base_url=url + "/v1", api_key=GW_KEY, max_retries=0) as c:
        assert c.files.content(f.id).content == content
        assert c.files.delete(f.id).deleted
        with pytest.raises(openai.NotFoundError):
            c.files.content(f.id)
