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

from tests.cli.conftest import metric, run
from tests.conftest import Server, free_port

pytestmark = pytest.mark.slow

HEARTH = str(Path(sys.executable).parent / "hearth")
PROMPT = "you> "


def spawn(*args: str, env: dict[str, str] | None = None) -> pexpect.spawn:
    child = pexpect.spawn(HEARTH, ["chat", *args], env={**os.environ, "TERM": "dumb", **(env or {})},
                          encoding="utf-8", timeout=90, dimensions=(50, 200))
    child.logfile_read = sys.stdout  # shown by pytest on failure
    return child


def command(child: pexpect.spawn, line: str) -> str:
    """Send one line, return what was printed before the next prompt (without the echo)."""
    child.sendline(line)
    child.expect_exact(PROMPT)
    return child.before.split("\n", 1)[1] if "\n" in child.before else ""


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

    # Ctrl-C at the prompt drops the line and stays
    child.send("half a line")
    child.sendintr()
    child.expect_exact(PROMPT)

    # a long answer, stopped once it is streaming
    child.sendline("Write a very long story about a dragon, with ten chapters.")
    child.expect_exact("ten chapters.")
    child.expect(r"\w+\W+\w+\W+\w+\W+\w+\W+\w+")  # tokens are arriving
    child.sendintr()
    child.expect_exact("[stopped]", timeout=15)
    child.expect_exact(PROMPT)
    assert metric(cli_server.url, "hearth_cancellations_total", cause="cancel_call") == cancels + 1
    assert metric(cli_server.url, "hearth_running_sequences") == 0  # the run ended on the server
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
