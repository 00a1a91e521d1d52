"""`hearth sessions …` and `hearth snapshots …` against a real server with sessions (docs/sessions.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import httpx
import pytest

from hearth.cli.daemon import Daemon
from hearth.cli.server import gather_status
from tests.cli.conftest import run, run_json
from tests.helpers import Server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(cli_server: Server) -> Server:
    return cli_server


def turn(url: str, session: str, text: str) -> dict:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": text}], "max_tokens": 8, "temperature": 0, "session_id": session})
    r.raise_for_status()
    return r.json()


def test_sessions_ls_show_history_rm(server: Server) -> None:
    url = server.url
    turn(url, "cli-s1", "Say hi.")
    turn(url, "cli-s1", "Name a color.")

    rows = run_json("sessions", "ls", "--url", url)
    mine = next(s for s in rows if s["session_id"] == "cli-s1")
    assert mine["message_count"] == 4 and mine["current_pos"] > 0

    table = run("sessions", "ls", "--url", url)
    assert table.exit_code == 0 and "cli-s1" in table.stdout and f"{mine['current_pos']} /" in table.stdout

    shown = run_json("sessions", "show", "cli-s1", "--url", url)
    assert shown["session_id"] == "cli-s1" and shown["message_count"] == 4
    text = run("sessions", "show", "cli-s1", "--url", url).stdout
    assert re.search(r"message_count\s+4", text)

    history = run_json("sessions", "history", "cli-s1", "--url", url)
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    assert history[0]["content"] == "Say hi." and history[2]["content"] == "Name a color."
    printed = run("sessions", "history", "cli-s1", "--url", url).stdout
    assert "[1] user" in printed and "Say hi." in printed and "[4] assistant" in printed
    assert history[3]["content"].strip().split()[0] in printed

    removed = run("sessions", "rm", "cli-s1", "--url", url)
    assert removed.exit_code == 0 and "deleted session cli-s1" in removed.stdout
    assert httpx.get(f"{url}/v1/sessions/cli-s1", timeout=10).status_code == 404
    again = run("sessions", "show", "cli-s1", "--url", url)
    assert again.exit_code == 1 and "HTTP 404" in again.stderr and "session_not_found" in again.stderr


def test_sessions_rollback_and_resize_verbs(server: Server) -> None:
    url = server.url
    turn(url, "cli-rb", "Say hi.")
    turn(url, "cli-rb", "Name a color.")
    full = run_json("sessions", "show", "cli-rb", "--url", url)["current_pos"]
    rolled = run_json("sessions", "rollback", "cli-rb", "2", "--url", url)
    assert rolled["message_count"] == 2 and 0 < rolled["current_pos"] < full and rolled["busy"] is False
    printed = run("sessions", "rollback", "cli-rb", "1", "--url", url)
    assert printed.exit_code == 0 and "1 messages kept" in printed.stdout
    resized = run_json("sessions", "resize", "cli-rb", "512", "--url", url)
    assert resized["max_seq_len"] == 512 and resized["old_max_seq_len"] == 2048
    doubled = run("sessions", "resize", "cli-rb", "--next-pow2", "--url", url)
    assert doubled.exit_code == 0 and "max_seq_len 512 -> 1024" in doubled.stdout
    bad = run("sessions", "resize", "cli-rb", "--url", url)
    assert bad.exit_code == 2
    refused = run("sessions", "resize", "cli-rb", "100", "--strategy", "tape", "--url", url)
    assert refused.exit_code == 1 and "strategy" in refused.stderr


def test_snapshot_save_tag_export_import_load_rm(server: Server, tmp_path: Path) -> None:
    url = server.url
    turn(url, "cli-s2", "Say hi.")
    saved = httpx.post(f"{url}/v1/sessions/cli-s2/save", json={"title": "first"}, timeout=60).json()
    snap = saved["snapshot_id"]

    listed = run_json("snapshots", "ls", "--url", url)
    assert snap in [s["snapshot_id"] for s in listed]
    assert snap in run("snapshots", "ls", "--url", url).stdout

    tagged = run_json("snapshots", "tag", snap, "work", "draft", "--title", "renamed", "--url", url)
    assert tagged["tags"] == ["work", "draft"] and tagged["title"] == "renamed"
    untagged = run_json("snapshots", "tag", snap, "-r", "draft", "--url", url)
    assert untagged["tags"] == ["work"]
    assert httpx.get(f"{url}/v1/snapshots/{snap}", timeout=10).json()["tags"] == ["work"]
    assert run("snapshots", "tag", snap, "--url", url).exit_code == 2  # nothing to change

    shown = run("snapshots", "show", snap, "--url", url)
    assert shown.exit_code == 0 and "renamed" in shown.stdout and "cli-s2" in shown.stdout

    archive = tmp_path / "snap.tar"
    exported = run("snapshots", "export", snap, "-o", str(archive), "--url", url)
    assert exported.exit_code == 0, exported.output
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert any(n.endswith("manifest.json") for n in names) and any(n.endswith("kv.bin") for n in names)

    # importing the same snapshot again conflicts; after deleting it, the import brings it back
    conflict = run("snapshots", "import", str(archive), "--url", url)
    assert conflict.exit_code == 1 and "HTTP 409" in conflict.stderr
    assert "deleted snapshot" in run("snapshots", "rm", snap, "--url", url).stdout
    assert httpx.get(f"{url}/v1/snapshots/{snap}", timeout=10).status_code == 404
    imported = run_json("snapshots", "import", str(archive), "--url", url)
    assert imported["snapshot_id"] == snap and imported["tags"] == ["work"]

    loaded = run_json("snapshots", "load", snap, "--session", "cli-s3", "--url", url)
    assert loaded["session_id"] == "cli-s3" and loaded["message_count"] == 2
    again = run("snapshots", "load", snap, "--session", "cli-s3", "--url", url)
    assert again.exit_code == 1 and "session_exists" in again.stderr
    forced = run("snapshots", "load", snap, "--session", "cli-s3", "--force", "--url", url)
    assert forced.exit_code == 0 and "loaded" in forced.stdout
    # the loaded session continues from the restored KV: the old turn is not prefilled again
    usage = turn(url, "cli-s3", "Name a color.")["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= loaded["current_pos"] > 0

    assert run("snapshots", "rm", snap, "--url", url).exit_code == 0
    assert run("sessions", "rm", "cli-s2", "cli-s3", "--url", url).exit_code == 0


def test_corrupt_archive_import_is_one_line(server: Server, tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"this is not a tar archive" * 10)
    result = run("snapshots", "import", str(bad), "--url", server.url)
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "HTTP 4" in result.stderr


def test_status_counts_sessions(server: Server, tmp_path: Path) -> None:
    turn(server.url, "cli-s4", "Say hi.")
    n = len(httpx.get(f"{server.url}/v1/sessions", timeout=10).json()["data"])
    # Point a data dir's pid file at the shared test server; a helper process holds the lock,
    # as a background server would.
    daemon = Daemon(tmp_path)
    (tmp_path / "server.pid").write_text(json.dumps({"pid": server.proc.pid, "url": server.url, "started_at": 0,
                                                    "log": str(server.log), "argv": []}))
    lock = daemon._try_lock()
    assert lock is not None
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(lock,))
    os.close(lock)
    try:
        status = gather_status(daemon, None)
    finally:
        holder.kill()
        holder.wait()
    assert status["running"] is True and status["health"] == "ok"
    assert status["sessions"] == n >= 1
    assert sum(status["sessions_by_residency"].values()) == n
    assert status["kv_tokens"] > 0  # the turn above left its tokens in a slot
    assert run("sessions", "rm", "cli-s4", "--url", server.url).exit_code == 0
