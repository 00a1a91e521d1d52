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
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.gateway.conftest import GW_ADMIN, GW_KEY, Gateway, start_gateway, stop
from tests.helpers.servers import free_port

pytestmark = pytest.mark.slow


@pytest.fixture
def gateways() -> Iterator[list[Gateway]]:
    started: list[Gateway] = []
    yield started
    for g in started:
        stop(g.proc)


def test_a_file_of_several_chunks_round_trips_through_a_restart(tmp_path: Path, gateways: list[Gateway]) -> None:
    toml = (f'[[upstream]]\nname = "gone"\nurl = "http://127.0.0.1:{free_port()}"\n'
            'models = { "smol" = "m" }\n')
    row = {"custom_id": "", "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "smol", "messages": [{"role": "user", "content": "é✓ " * 30_000}]}}
    content = b"".join(json.dumps({**row, "custom_id": f"c{i}"}, ensure_ascii=False).encode() + b"\n"
                       for i in range(30))  # about 5 MB: five chunks and a bit, characters cut at their edges
    assert len(content) > 4 * 1024 * 1024
    gw = start_gateway(tmp_path, toml, home=tmp_path / "gw", ready="/v1/files")  # no node: /health is 503
    gateways.append(gw)
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=GW_KEY, max_retries=0) as c:
        f = c.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
        assert f.bytes == len(content)
        assert c.files.content(f.id).content == content
    os.kill(gw.proc.pid, signal.SIGKILL)
    gw.proc.wait(15)
    again = start_gateway(tmp_path, toml, home=tmp_path / "gw", ready="/v1/files")  # the same store
    gateways.append(again)
    # the admin key: a DELETE needs it on a gateway that has one (start_gateway's does)
    with openai.OpenAI(base_url=again.url + "/v1", api_key=GW_ADMIN, max_retries=0) as c:
        assert c.files.content(f.id).content == content
        assert c.files.delete(f.id).deleted
        with pytest.raises(openai.NotFoundError):
            c.files.content(f.id)
