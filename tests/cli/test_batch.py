"""`hearth batch submit|status|ls|cancel|download` against a real server with the real model
(docs/api.md, "Batches")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import run, run_json
from tests.helpers import Server

pytestmark = pytest.mark.slow


def requests_file(tmp_path: Path, n: int, tail: bytes = b"") -> Path:
    p = tmp_path / "requests.jsonl"
    p.write_bytes(b"".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                                       "body": {"model": "default", "max_tokens": 3, "temperature": 0,
                                                "messages": [{"role": "user", "content": f"Say {i}."}]}}).encode()
                           + b"\n" for i in range(n)) + tail)
    return p


def test_submit_wait_status_download(cli_server: Server, tmp_path: Path) -> None:
    url = cli_server.url
    b = run_json("batch", "submit", str(requests_file(tmp_path, 3)), "--url", url, "--wait", "--metadata", "who=cli")
    assert b["status"] == "completed" and b["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert b["metadata"] == {"who": "cli"}
    assert run_json("batch", "status", b["id"], "--url", url)["status"] == "completed"
    shown = run("batch", "status", b["id"], "--url", url)
    assert shown.exit_code == 0 and "3 completed, 0 failed, 3 in all" in shown.stdout
    assert b["id"] in [x["id"] for x in run_json("batch", "ls", "--url", url)]
    out = tmp_path / "out.jsonl"
    assert run("batch", "download", b["id"], "-o", str(out), "--url", url).exit_code == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == ["c0", "c1", "c2"]
    assert all(x["response"]["status_code"] == 200 for x in lines)
    printed = run("batch", "download", b["id"], "--url", url)
    assert printed.exit_code == 0 and printed.stdout.encode() == out.read_bytes()
    no_errors = run("batch", "download", b["id"], "--errors", "--url", url)
    assert no_errors.exit_code == 1 and "has no error file" in no_errors.stderr
    late = run("batch", "cancel", b["id"], "--url", url)
    assert late.exit_code == 1 and "Cannot cancel a batch with status 'completed'" in late.stderr


def test_a_bad_file_is_refused_with_its_line(cli_server: Server, tmp_path: Path) -> None:
    r = run("batch", "submit", str(requests_file(tmp_path, 2, b"{oops\n")), "--url", cli_server.url)
    assert r.exit_code == 1 and "line 3" in r.stderr and "HTTP 400" in r.stderr
    r = run("batch", "status", "batch_" + "0" * 32, "--url", cli_server.url)
    assert r.exit_code == 1 and "No such Batch object" in r.stderr
