"""Servers and the AI SDK's location for the client-library suite (tests/clients).

One server per model for the whole session: the default model for text, the 32k tool-calling
model (Qwen2.5-Coder-0.5B, installed by scripts/setup_agents.sh) for tool calls and structured
output. Each library's tests share them, so the suite loads each model once."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Server, start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def text_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The embedded default model; 4 slots, so a library that sends two requests at once (the
    AI SDK, the Agents SDK) never queues behind itself."""
    s = start_server(tmp_path_factory.mktemp("clients-text"), "--parallel", "4", "--ctx", "4096", "--max-wait", "600")
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def tool_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Qwen2.5-Coder-0.5B, the model the README names for tool calling. 8k of context is plenty
    for these prompts (one or two tools, a few turns); a long request timeout, because a cold
    prefill on a loaded CI machine is slow."""
    s = start_server(tmp_path_factory.mktemp("clients-tools"), "--model", "qwen2.5-coder-0.5b", "--ctx", "8192",
                     "--parallel", "2", "--max-wait", "600", "--request-timeout", "3600")
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def ai_sdk_dir() -> Path:
    """The npm prefix scripts/setup_clients.sh installed the AI SDK into (asked of the script, so
    the pins live in one place). Missing: fail with the command that installs it, never skip."""
    out = subprocess.run([str(ROOT / "scripts" / "setup_clients.sh"), "--dir"], capture_output=True, text=True,
                         check=True)
    d = Path(out.stdout.strip())
    assert (d / "node_modules" / "ai").is_dir(), f"the AI SDK is not installed in {d}: run scripts/setup_clients.sh"
    return d


@pytest.fixture(scope="session")
def ollama_js_dir() -> Path:
    """The npm prefix of Ollama's JavaScript client (scripts/setup_clients.sh), found as ai_sdk_dir is."""
    out = subprocess.run([str(ROOT / "scripts" / "setup_clients.sh"), "--ollama-dir"], capture_output=True,
                         text=True, check=True)
    d = Path(out.stdout.strip())
    assert (d / "node_modules" / "ollama").is_dir(), f"ollama-js is not installed in {d}: run scripts/setup_clients.sh"
    return d
