"""The chat page in a real headless browser: Debian's chromium driven by playwright.

playwright's own browser download cannot run here, so the system chromium is used
(scripts/setup.sh installs it); without it, or without playwright, these tests are skipped.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
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

