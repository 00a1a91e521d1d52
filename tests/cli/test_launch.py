"""`hearth launch` with stand-in CLIs: an executable per agent on PATH that prints the arguments
and environment it was started with, against a scripted server with an API key. What each agent
gets (base URL, key, model, context, cache settings), that the key is never printed, that extra
arguments pass through, and that a missing CLI gets its install command, not an install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from hearth.api.app import create_app
from hearth.cli.agents import opencode_output_limit
from hearth.config import Settings
from tests.fakes import scripted_backend
from tests.helpers import free_port, wait_until

KEY = "sk-launch-test-0123456789"
N_CTX = 16384
FAKE = f"""#!{sys.executable}
import json, os, sys
print(json.dumps({{"argv": sys.argv, "env": dict(os.environ)}}))
"""


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("launch")
    weights = tmp / "fake.gguf"
    weights.write_bytes(b"fake weights")
    backend, _ = scripted_backend("ok", path=weights, n_ctx=N_CTX)
    app = create_app(backend, Settings(data_dir=tmp, api_keys=[KEY]))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="launch-server", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return bool(httpx.get(f"{base}/health", timeout=2).json().get("status") == "ok")
        except httpx.HTTPError:
            return False

    wait_until(up, "the scripted server to come up", 60, interval=0.1)
    yield base
    server.should_exit = True
    thread.join(30)


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("claude", "codex", "opencode", "qwen"):
        exe = folder / name
        exe.write_text(FAKE)
        exe.chmod(0o755)
    return folder


def launch(*args: str, path: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HEARTH_")}
    environ.update(PATH=path, **env)
    return subprocess.run([sys.executable, "-m", "hearth.cli.main", "launch", *args], env=environ,
                          capture_output=True, text=True, timeout=120)


def started(fake_bin: Path, url: str, agent: str, *extra: str) -> tuple[dict[str, Any], str]:
    """What the stand-in for `agent` was started with, and what hearth printed."""
    p = launch(agent, "--url", url, "--api-key", KEY, *extra, path=f"{fake_bin}:{os.environ['PATH']}")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["argv"][0] == str(fake_bin / agent)
    assert KEY not in p.stderr  # the key is set, never shown
    return got, p.stderr


def test_claude_gets_the_base_url_key_model_and_cache_settings(fake_bin: Path, url: str) -> None:
    got, printed = started(fake_bin, url, "claude", "--", "-p", "hi", "--model", "x")
    env = got["env"]
    assert (env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_AUTH_TOKEN"], env["ANTHROPIC_API_KEY"]) == (url, KEY, "")
    assert {env[k] for k in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                             "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL")} == {"fake"}
    assert env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0" and env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == str(N_CTX)
    # its 5-minute stream idle timer (which SSE comments do not reset) would cut a cold prefill
    assert env["CLAUDE_STREAM_IDLE_TIMEOUT_MS"] == "1800000"
    assert got["argv"][1:] == ["-p", "hi", "--model", "x"]  # what follows `--` is the CLI's
    assert f"ANTHROPIC_BASE_URL={url}" in printed and "ANTHROPIC_AUTH_TOKEN=(the server's key)" in printed


def test_codex_gets_hearth_as_its_responses_provider(fake_bin: Path, url: str) -> None:
    got, printed = started(fake_bin, url, "codex", "--model", "fake", "--", "exec", "hi")
    args = got["argv"][1:]
    assert args[-2:] == ["exec", "hi"]
    overrides = dict(a.split("=", 1) for a in args[1:-2:2])
    assert args[:-2:2] == ["-c"] * len(overrides)
    assert {k: json.loads(v) for k, v in overrides.items()} == {
        "model": "fake", "model_provider": "hearth", "model_providers.hearth.name": "Hearth",
        "model_providers.hearth.base_url": f"{url}/v1", "model_providers.hearth.env_key": "HEARTH_API_KEY",
        "model_providers.hearth.wire_api": "responses", "model_context_window": N_CTX,
        # its 5-minute stream idle timer counts SSE events, not comments: a cold prefill outlasts it
        "model_providers.hearth.stream_idle_timeout_ms": 1_800_000}
    assert got["env"]["HEARTH_API_KEY"] == KEY
    assert "HEARTH_API_KEY=(the server's key)" in printed


def test_opencode_gets_an_inline_provider_config(fake_bin: Path, url: str) -> None:
    got, _ = started(fake_bin, url, "opencode")
    config = json.loads(got["env"]["OPENCODE_CONFIG_CONTENT"])
    assert config["model"] == "hearth/fake"
    provider = config["provider"]["hearth"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": f"{url}/v1", "apiKey": "{env:HEARTH_API_KEY}"}
    # opencode keeps `output` free in the window and compacts past `context - output`: a quarter
    # of the window leaves room for the conversation (the whole window made it compact at once)
    assert provider["models"]["fake"]["limit"] == {"context": N_CTX, "output": N_CTX // 4}
    assert got["env"]["HEARTH_API_KEY"] == KEY and got["argv"][1:] == []


def test_qwen_code_gets_the_openai_variables(fake_bin: Path, url: str) -> None:
    got, _ = started(fake_bin, url, "qwen", "--", "--prompt", "hi")
    env = got["env"]
    assert (env["OPENAI_BASE_URL"], env["OPENAI_API_KEY"], env["OPENAI_MODEL"]) == (f"{url}/v1", KEY, "fake")
    # its 4-minute stream idle timer (which SSE comments do not reset) would cut a long prefill
    assert env["QWEN_STREAM_IDLE_TIMEOUT_MS"] == "1800000"
    # and its 15-minute cap on a stream's life (prefill included) would cut the answer after it
    assert env["QWEN_STREAM_MAX_LIFETIME_MS"] == "0"
    assert got["argv"][1:] == ["--prompt", "hi"]


def test_the_servers_key_comes_from_hearth_api_keys_when_none_is_given(fake_bin: Path, url: str) -> None:
    p = launch("qwen", "--url", url, path=f"{fake_bin}:{os.environ['PATH']}", HEARTH_API_KEYS=f"{KEY},other")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["env"]["OPENAI_API_KEY"] == KEY and KEY not in p.stderr


@pytest.mark.parametrize(("agent", "install"), [("claude", "npm install -g @anthropic-ai/claude-code"),
                                                ("codex", "npm install -g @openai/codex"),
                                                ("opencode", "npm install -g opencode-ai"),
                                                ("qwen", "npm install -g @qwen-code/qwen-code")])
def test_a_missing_cli_gets_its_install_command_and_nothing_is_installed(tmp_path: Path, url: str, agent: str,
                                                                         install: str) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    p = launch(agent, "--url", url, "--api-key", KEY, path=str(empty))
    assert p.returncode == 1 and p.stdout == ""
    assert install in p.stderr and "not installed" in p.stderr
    assert list(empty.iterdir()) == []


def test_an_unknown_agent_or_model_is_a_clear_error(fake_bin: Path, url: str) -> None:
    path = f"{fake_bin}:{os.environ['PATH']}"
    p = launch("aider", "--url", url, path=path)
    assert p.returncode == 2 and "choose one of claude, codex, opencode, qwen" in p.stderr
    p = launch("qwen", "--url", url, "--api-key", KEY, "--model", "nope", path=path)
    assert p.returncode == 1 and "no model 'nope'" in p.stderr and "fake" in p.stderr


def test_opencodes_output_budget_is_a_quarter_of_the_window_within_its_own_cap() -> None:
    assert [opencode_output_limit(n) for n in (32768, 4096, 200_000, 3)] == [8192, 1024, 32_000, 1]
