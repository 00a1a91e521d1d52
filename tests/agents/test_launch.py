"""`hearth launch` with the stock CLIs scripts/setup_agents.sh installs (Codex, Claude Code,
opencode, Qwen Code): each starts through it against the 32k server and reports its own version
(arguments pass through; the exit code is the CLI's). Their full runs also start through
`hearth launch` (test_codex.py, test_claude_code.py, test_opencode.py, test_qwen_code.py); the
configuration each gets is checked in tests/cli/test_launch.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agents.clients import (
    CLAUDE,
    CLAUDE_CODE_VERSION,
    CODEX,
    CODEX_VERSION,
    OPENCODE,
    OPENCODE_VERSION,
    QWEN,
    QWEN_CODE_VERSION,
    claude_env,
    codex_env,
    launched,
    opencode_env,
    qwen_env,
    run,
)
from tests.helpers import Server


@pytest.mark.parametrize(("agent", "exe", "version"), [("codex", CODEX, f"codex-cli {CODEX_VERSION}"),
                                                       ("claude", CLAUDE, f"{CLAUDE_CODE_VERSION} (Claude Code)"),
                                                       ("opencode", OPENCODE, OPENCODE_VERSION),
                                                       ("qwen", QWEN, QWEN_CODE_VERSION)])
def test_each_cli_starts_through_hearth_launch(qwen_server: Server, tmp_path: Path, agent: str, exe: Path,
                                               version: str) -> None:
    if not exe.is_file():
        pytest.fail(f"{exe} is missing: run scripts/setup_agents.sh")
    home = tmp_path / "home"
    env = {"codex": lambda: codex_env(home, qwen_server.url), "claude": lambda: claude_env(home, qwen_server.url),
           "opencode": lambda: opencode_env(home), "qwen": lambda: qwen_env(home)}[agent]()
    result = run(launched(agent, qwen_server.url, "--version"), env, tmp_path, timeout=120)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == version
    assert f"hearth launch: {agent} ({exe}) against {qwen_server.url}, model qwen2.5-coder-0.5b, " \
           "context 32768" in result.stderr
