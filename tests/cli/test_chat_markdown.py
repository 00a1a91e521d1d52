"""`hearth chat` rendering markdown, and /retry, /edit, /branch, in a pseudo-terminal.

The server here is Hearth's real app on the scripted fake runner, served on a port from a
thread: every answer is the fixed markdown below, so what the terminal shows is known exactly,
and the sessions (rollback, snapshots) are the real ones."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pexpect
import pytest
import uvicorn

from hearth.api.app import create_app
from hearth.config import Settings
from tests.cli.test_chat_repl import ANSI, PROMPT, command, spawn
from tests.fakes import scripted_backend
from tests.helpers import free_port, wait_until

ANSWER = """\
# Plan

Use **bold** and `code`.

- first point
- second point

```python
print('hi')
```

| name | n |
|------|---|
| ada  | 1 |
"""


@pytest.fixture(scope="module")
def scripted_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("scripted-chat")
    weights = tmp / "fake.gguf"
    weights.write_bytes(b"fake weights")
    backend, _ = scripted_backend(ANSWER, path=weights, n_ctx=16384)
    app = create_app(backend, Settings(data_dir=tmp))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="scripted-chat-server", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return bool(httpx.get(f"{url}/health", timeout=2).json().get("status") == "ok")
        except httpx.HTTPError:
            return False

    wait_until(up, "the scripted server to come up", 60, interval=0.1)
    yield url
    server.should_exit = True
    thread.join(30)


def chat(url: str, *args: str) -> pexpect.spawn:
    """`hearth chat` on the scripted server, greedy (the fake runner samples at random otherwise)."""
    return spawn("--url", url, "--temperature", "0", *args)


def history(url: str, sid: str) -> list[dict[str, Any]]:
    return list(httpx.get(f"{url}/v1/sessions/{sid}/history", timeout=10).json()["data"])


def flat(text: str) -> str:
    """Terminal output without escapes and hyperlink markers, whitespace runs as one space."""
    text = re.sub(r"\x1b\]8;[^\x1b\x07]*(\x1b\\|\x07)", "", text)
    return re.sub(r"\s+", " ", ANSI.sub("", text))


def test_answers_are_rendered_as_markdown(scripted_url: str) -> None:
    child = chat(scripted_url)
    child.expect_exact(PROMPT)
    # The output holds the live region's passing draws too, of a block still being written
    # ("Use **bo" can show as such for a moment); a whole block is never shown as raw markup.
    shown = flat(command(child, "Make a plan."))
    assert "Plan" in shown and "# Plan" not in shown, "a heading, not its markup"
    assert "Use bold and code." in shown and "Use **bold**" not in shown and "`code`" not in shown
    assert "• first point" in shown and "• second point" in shown and "- first point" not in shown
    assert "print('hi')" in shown and "```python" not in shown
    assert re.search(r"name +n ─+ ada +1", shown), "a table, drawn"
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_plain_prints_the_raw_text(scripted_url: str) -> None:
    child = chat(scripted_url, "--plain")
    child.expect_exact(PROMPT)
    shown = ANSI.sub("", command(child, "Make a plan.")).replace("\r\n", "\n")
    assert ANSWER.strip() in shown
    child.sendeof()
    child.expect(pexpect.EOF)


def test_retry_edit_and_branch(scripted_url: str) -> None:
    url, sid = scripted_url, "md-edits"
    child = chat(url, "--session", sid, "--system", "Be brief.")
    child.expect_exact(PROMPT)
    assert "nothing to retry" in command(child, "/retry")
    command(child, "Hello")
    command(child, "Second question")
    assert [(m["role"], m["content"]) for m in history(url, sid)][1::2] == [("user", "Hello"),
                                                                          ("user", "Second question")]

    # /retry: the last turn again, rolled back first (one pair of messages, not two).
    assert "Plan" in flat(command(child, "/retry"))
    after = history(url, sid)
    assert [(m["role"], m["content"]) for m in after if m["role"] != "assistant"] == [
        ("system", "Be brief."), ("user", "Hello"), ("user", "Second question")]
    assert len(after) == 5

    # /edit N TEXT: message 2 (numbered as /history shows) replaced, everything after it gone.
    command(child, "/edit 2 Changed")
    assert [(m["role"], m["content"]) for m in history(url, sid)][:2] == [("system", "Be brief."), ("user", "Changed")]
    assert len(history(url, sid)) == 3
    assert "message 3 is not a user message" in command(child, "/edit 3 nope")
    assert "usage: /edit N" in command(child, "/edit x")

    # /edit N alone puts the old text on the line to be edited.
    child.sendline("/edit 2")
    child.expect_exact("edit> ")
    child.expect_exact("Changed")
    child.sendline(" again")
    child.expect_exact(PROMPT)
    assert [m["content"] for m in history(url, sid)][1] == "Changed again"

    # /branch N TEXT: a new session from the shared part; the original is kept.
    command(child, "Third question")
    original = history(url, sid)
    assert len(original) == 5
    out = flat(command(child, "/branch 4 Another question"))
    m = re.search(r"branched into session (\S+) \((\d+) tokens of messages 1-3 reused\); md-edits is kept", out)
    assert m, out
    branch, reused = m[1], int(m[2])
    assert reused > 0
    assert history(url, sid) == original
    branched = history(url, branch)
    assert branched[:3] == original[:3] and branched[3]["content"] == "Another question" and len(branched) == 5
    stats = flat(command(child, "/stats"))
    cached = re.search(r"cached (\d+)", stats)
    assert cached and int(cached[1]) >= reused, stats
    assert "branch" not in {t for s in httpx.get(f"{url}/v1/snapshots", timeout=10).json()["data"] for t in s["tags"]}

    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    for s in (sid, branch):
        httpx.delete(f"{url}/v1/sessions/{s}", timeout=10)


def test_help_lists_the_new_commands(scripted_url: str) -> None:
    child = chat(scripted_url)
    child.expect_exact(PROMPT)
    text = command(child, "/help")
    assert "/retry" in text and "/edit N [TEXT]" in text and "/branch N [TEXT]" in text
    child.sendeof()
    child.expect(pexpect.EOF)
