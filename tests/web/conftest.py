"""The chat page in a real headless browser: Debian's chromium driven by playwright.

playwright's own browser download cannot run here, so the system chromium is used
(scripts/setup.sh installs it); without it, or without playwright, these tests are skipped.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Server, start_server, stop_server

CHROMIUM = os.environ.get("HEARTH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
API_KEY = "web-test-key"


@pytest.fixture(scope="module")  # closed with its module: playwright's loop never outlives these tests
def browser() -> Iterator[Any]:
    from playwright import sync_api

    if not Path(CHROMIUM).exists():  # a failure, not a skip: a skipped browser test hides a broken page
        pytest.fail(f"no chromium at {CHROMIUM}: scripts/setup.sh installs it with apt (or set HEARTH_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        # --no-sandbox: CI runs as root, where chromium's sandbox refuses to start.
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"], timeout=60_000)
        yield b
        b.close()


@pytest.fixture(scope="module")
def web_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("web"), "--parallel", "4", "--ctx", "4096")
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("webkey"), "--parallel", "2", "--ctx", "2048", "--api-key", API_KEY)
    yield s
    stop_server(s)


@pytest.fixture
def new_page(browser: Any) -> Iterator[Callable[..., Any]]:
    """Opens the page in a fresh browser context (its own localStorage; `context` goes to
    playwright's new_context); closes them all after."""
    contexts: list[Any] = []

    def open_page(server: Server, *, key: str | None = None, max_tokens: int | None = None,
                  temperature: float | None = None, wait_ready: bool = True, **context: Any) -> Any:
        ctx = browser.new_context(viewport={"width": 1280, "height": 800}, **context)
        contexts.append(ctx)
        page = ctx.new_page()
        page.set_default_timeout(30_000)
        page.errors = []  # type: ignore[attr-defined]
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        page.goto(server.url + "/")
        page.wait_for_function("() => document.getElementById('health').dataset.state === 'ok'")
        settings = {"#api-key": key, "#max-tokens": max_tokens, "#temperature": temperature}
        if any(v is not None for v in settings.values()):
            if not page.locator("#settings").evaluate("d => d.open"):
                page.click("#settings summary")
            for selector, value in settings.items():
                if value is not None:
                    page.fill(selector, str(value))
                    page.dispatch_event(selector, "change")
        if wait_ready:
            page.wait_for_function("() => document.getElementById('model-name').textContent !== ''")
        return page

    yield open_page
    for ctx in contexts:
        ctx.close()
