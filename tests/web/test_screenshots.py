"""The screenshots in docs/web.md, taken from the real page on a real server: a rendered answer
with code, and a branched conversation. Written to $HEARTH_WEB_SCREENSHOTS (a directory) when
set: `HEARTH_WEB_SCREENSHOTS=docs pytest tests/web -k screenshot_of` refreshes the docs' images.

The rendered answer is fixed text played to the page as its stream (what it shows must not hang
on what the tiny model writes); the branched conversation is the model's own."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import Server
from tests.web.markdown_fixtures import chunks
from tests.web.page import answer_with, last_reply, send, wait_done

pytestmark = pytest.mark.slow

RENDERED = """\
Here is a small **retry with backoff** helper. It waits longer after each failure and gives up \
after `attempts` tries:

```python
import time

def retry(call, attempts: int = 5, base: float = 0.2):
    for n in range(attempts):
        try:
            return call()
        except OSError:
            if n == attempts - 1:
                raise
            time.sleep(base * 2 ** n)
```

| attempt | wait before it |
|--------:|---------------:|
| 2 | 0.2 s |
| 3 | 0.4 s |
| 4 | 0.8 s |

Notes:

1. Catch only the errors worth retrying (here `OSError`), never everything.
2. Add jitter when many clients retry at once; see [the AWS note on backoff](https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/).
"""


def save(page: Any, tmp_path: Path, name: str) -> None:
    out = tmp_path / name
    page.screenshot(path=str(out))
    assert out.stat().st_size > 10_000
    target = os.environ.get("HEARTH_WEB_SCREENSHOTS")
    if target:
        (Path(target) / name).write_bytes(out.read_bytes())


def test_screenshot_of_a_rendered_answer(web_server: Server, new_page: Callable[..., Any], tmp_path: Path) -> None:
    page = new_page(web_server)
    page.set_viewport_size({"width": 1100, "height": 860})
    answer_with(page, chunks(RENDERED, 6))
    send(page, "Write a Python retry helper with exponential backoff.")
    wait_done(page)
    reply = last_reply(page)
    assert reply.locator(".codeblock .copy-code").count() == 1 and reply.locator("table").count() == 1
    # A stream played at once has no meaningful speed: its stats line is left out of the picture.
    reply.locator(".stats").evaluate("e => { e.hidden = true; }")
    reply.hover()  # its Copy and Retry buttons show
    page.locator("#prompt").blur()
    save(page, tmp_path, "web-markdown.png")
    sid = page.locator("#session-list .item.active").get_attribute("data-session-id")
    httpx.delete(f"{web_server.url}/v1/sessions/{sid}", timeout=10)  # its turn never reached the server


def test_screenshot_of_a_branched_conversation(web_server: Server, new_page: Callable[..., Any],
                                               tmp_path: Path) -> None:
    page = new_page(web_server, max_tokens=40, temperature=0)
    page.set_viewport_size({"width": 1100, "height": 700})
    page.fill("#system", "Answer briefly.")
    page.dispatch_event("#system", "change")
    send(page, "Suggest a name for a cat.")
    wait_done(page)
    send(page, "Now one for a dog.")
    wait_done(page)
    second = page.locator(".msg.user").nth(1)
    second.hover()
    second.locator(".edit").click()
    second.locator(".edit-text").fill("Now one for a parrot.")
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/v1/chat/completions")):
        second.locator(".edit-branch").click()
    wait_done(page)
    page.wait_for_selector("#session-list .item.branch.active")
    page.wait_for_selector("#banner:not([hidden])")
    page.locator("#prompt").blur()
    save(page, tmp_path, "web-branch.png")
