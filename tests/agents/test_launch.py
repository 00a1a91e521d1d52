"""`hearth launch` with the stock CLIs scripts/setup_agents.sh installs: each starts through it
against the 32k server and reports its own version (arguments pass through; the exit code is
the CLI's). Their full tool round trips also start through `hearth launch` (test_codex.py,
test_claude_code.py); the configuration each gets is checked in tests/cli/test_launch.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agents.clients import (
    CLAUDE,
    CLAUDE_CODE_VERSION,
    CODEX,
    CODEX_VERSION,
    claude_env,
    codex_env,
    launched,
    run,
)
from tests.helpers import Server


@pytest.mark.parametrize(("agent", "exe", "version"), [("codex", CODEX, f"codex-cli {CODEX_VERSION}"),
                                                       ("claude", CLAUDE, f"{CLAUDE_CODE_VERSION} (Claude Code)")])
def test_each_cli_starts_through_hearth_launch(qwen_server: Server, tmp_path: Path, agent: str, exe: Path,
                                               version: str) -> None:
    if not exe.is_file():
        pytest.fail(f"{exe} is missing: run scripts/setup_agents.sh")
    env = (codex_env if agent == "codex" else claude_env)(tmp_path / "home", qwen_server.url)
    result = run(launched(agent, qwen_server.url, "--version"), env, tmp_path, timeout=120)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == version
    assert f"hearth launch: {agent} ({exe}) against {qwen_server.url}, model qwen2.5-coder-0.5b, " \
           "context 32768" in result.stderr
