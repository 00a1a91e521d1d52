"""`hearth chat` driven in a pseudo-terminal: streaming, Ctrl-C cancel, slash commands, Ctrl-D."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import httpx
import pexpect
import pytest

from tests.cli.conftest import blocked_reading_input, metric, run
from tests.helpers import Server, free_port, wait_until

pytestmark = pytest.mark.slow

HEARTH = str(Path(sys.executable).parent / "hearth")
PROMPT = "you> "
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def spawn(*args: str, env: dict[str, str] | None = None) -> pexpect.spawn:
    child = pexpect.spawn(HEARTH, ["chat", *args], env={**os.environ, **(env or {})},
                          encoding="utf-8", timeout=90, dimensions=(50, 200))
    child.logfile_read = sys.stdout  # shown by pytest on failure
    return child


def command(child: pexpect.spawn, line: str) -> str:
    """Send one line, return what was printed before the next prompt (without the echo)."""
    child.sendline(line)
    child.expect_exact(PROMPT)
    text = ANSI.sub("", child.before)
    return text.split("\n", 1)[1] if "\n" in text else ""


def stats(child: pexpect.spawn) -> dict[str, str]:
    text = command(child, "/stats")
    m = re.search(r"completion tokens (\d+), TTFT (\d+) ms, ([\d.]+|-) tok/s, total [\d.]+ s, finish (\w+)", text)
    assert m, text
    return {"completion_tokens": m[1], "ttft_ms": m[2], "tok_s": m[3], "finish": m[4]}


def test_repl_streams_stops_on_ctrl_c_and_keeps_going(cli_server: Server) -> None:
    cancels = metric(cli_server.url, "hearth_cancellations_total", cause="cancel_call")
    child = spawn("--url", cli_server.url, "--max-tokens", "1500", "--temperature", "0")
    child.expect(r"session (\S+)|no sessions")
    child.expect_exact(PROMPT)

    help_text = command(child, "/help")
    assert "/rollback N" in help_text and "backslash" in help_text

    # Ctrl-C at the prompt drops the line and stays. The terminal echoes typed text even before
    # readline reads it, and CPython's readline can miss a SIGINT that lands while it is still
    # setting up (it then waits in select() for the next key), so wait until it waits for a key.
    child.send("half a line")
    child.expect_exact("half a line")
    wait_until(lambda: blocked_reading_input(child.pid), "the REPL to wait for a key")
    child.sendintr()
    child.expect_exact(PROMPT)

    # a long answer, stopped once it is streaming
    child.sendline("Write a very long story about a dragon, with ten chapters.")
    child.expect_exact("ten chapters.")
    child.expect(r"\w+\W+\w+\W+\w+\W+\w+\W+\w+")  # tokens are arriving
    child.sendintr()
    child.expect_exact("[stopped]")
    child.expect_exact(PROMPT)
    # the server counts the cancel when the run's stream closes, which may come just after the
    # client has its last chunk: waited for, not read once
    wait_until(lambda: metric(cli_server.url, "hearth_cancellations_total", cause="cancel_call") == cancels + 1,
             "the cancel to be counted")
    wait_until(lambda: metric(cli_server.url, "hearth_running_sequences") == 0, "the run to end on the server")
    first = stats(child)
    assert first["finish"] == "cancelled"
    assert 0 < int(first["completion_tokens"]) < 1500

    # the REPL is alive: a fresh session answers the next prompt
    assert "new session" in command(child, "/clear")
    reply = command(child, "Say hi.")
    assert re.search(r"\w", reply)
    second = stats(child)
    assert second["finish"] in ("stop", "length") and int(second["completion_tokens"]) > 0
    assert int(second["ttft_ms"]) > 0

    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_multiline_input_and_history(cli_server: Server) -> None:
    child = spawn("--url", cli_server.url, "--max-tokens", "8", "--temperature", "0")
    child.expect_exact(PROMPT)
    child.sendline("Repeat these two words: apple \\")
    child.expect_exact("...  ")
    child.sendline("banana")
    child.expect_exact(PROMPT)
    history = command(child, "/history")
    # one user message spanning both lines, then the assistant's reply
    assert re.search(r"\[\d+\] user\s+Repeat these two words: apple \s*\r?\nbanana", history), history
    assert re.search(r"\[\d+\] assistant", history)
    assert "unknown command" in command(child, "/nope")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_chat_starts_a_background_server_when_none_answers(tmp_path: Path) -> None:
    port, home = free_port(), tmp_path / "home"
    url = f"http://127.0.0.1:{port}"
    child = spawn("--max-tokens", "8", env={"HEARTH_URL": url, "HEARTH_HOME": str(home)})
    try:
        child.expect_exact(f"started a background server at {url}", timeout=200)
        child.expect_exact(PROMPT)
        assert re.search(r"\w", command(child, "Say hi."))
        child.sendeof()
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
        # the server outlives the REPL, owned by the data dir
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    finally:
        child.close(force=True)
        stopped = run("server", "stop", "--data-dir", str(home))
    assert stopped.exit_code == 0, stopped.output
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/health", timeout=1)
        except httpx.HTTPError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the server still answers after stop")


def test_explicit_url_that_nothing_answers_is_an_error() -> None:
    child = spawn("--url", f"http://127.0.0.1:{free_port()}")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert "error: no Hearth server answers" in child.before


def test_repl_session_commands(cli_server: Server) -> None:
    url = cli_server.url
    child = spawn("--url", url, "--session", "cli-repl", "--max-tokens", "8", "--temperature", "0",
                  "--system", "Answer briefly.")
    child.expect_exact("session cli-repl (new)")
    child.expect_exact(PROMPT)
    command(child, "Say hi.")
    command(child, "Name a color.")
    history = httpx.get(f"{url}/v1/sessions/cli-repl/history", timeout=10).json()["data"]
    assert [m["role"] for m in history] == ["system", "user", "assistant", "user", "assistant"]
    assert history[0]["content"] == "Answer briefly."

    assert "cli-repl" in command(child, "/sessions")
    saved = re.search(r"saved snapshot (snap_[0-9a-f]{32}) \(checkpoint\)", command(child, "/save checkpoint"))
    assert saved, "no snapshot id printed"
    snap = saved[1]
    assert httpx.get(f"{url}/v1/snapshots/{snap}", timeout=10).json()["title"] == "checkpoint"
    assert snap in command(child, "/snapshots")

    assert "now has 3 messages" in command(child, "/rollback 3")
    history = httpx.get(f"{url}/v1/sessions/cli-repl/history", timeout=10).json()["data"]
    assert [m["role"] for m in history] == ["system", "user", "assistant"]
    shown = command(child, "/history")
    assert "[3] assistant" in shown and "[4]" not in shown

    loaded = re.search(r"loaded snap_\w+ into session (\S+) \((\d+) messages", command(child, f"/load {snap}"))
    assert loaded and loaded[2] == "5"
    assert httpx.get(f"{url}/v1/sessions/{loaded[1]}", timeout=10).json()["message_count"] == 5
    command(child, "Say bye.")  # the turn goes to the loaded session
    assert httpx.get(f"{url}/v1/sessions/{loaded[1]}", timeout=10).json()["message_count"] == 7

    # errors are one line and the REPL goes on
    bad = command(child, "/load snap_" + "0" * 32)
    errors = [line for line in bad.splitlines() if "error" in line]  # (a spinner line may come first)
    assert len(errors) == 1 and errors[0].startswith("error: ") and "HTTP 404" in errors[0]
    assert "usage: /rollback N" in command(child, "/rollback two")

    assert "applies from the next turn" in command(child, "/system Answer in French.")
    command(child, "Say hi.")
    history = httpx.get(f"{url}/v1/sessions/{loaded[1]}/history", timeout=10).json()["data"]
    assert history[0] == {**history[0], "role": "system", "content": "Answer in French."}
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    # the conversation outlives the REPL: resuming shows it
    child = spawn("--url", url, "--session", "cli-repl")
    child.expect(r"session cli-repl: resuming, 3 messages")
    child.expect_exact(PROMPT)
    child.sendeof()
    child.expect(pexpect.EOF)
    for sid in ("cli-repl", loaded[1]):
        httpx.delete(f"{url}/v1/sessions/{sid}", timeout=10)
    httpx.delete(f"{url}/v1/snapshots/{snap}", timeout=10)
