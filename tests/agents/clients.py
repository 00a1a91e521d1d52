"""The stock agent CLIs as the tests run them: where scripts/setup_agents.sh put them, and the
configuration and environment that point them at one local server and nowhere else.

Neither CLI may reach the internet: each gets a fresh home directory, only a dummy key, the
base URL of the local server, and every switch its vendor documents for telemetry, update
checks, error reporting and other non-essential traffic turned off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hearth.cli.agents import Target, claude_code, codex, codex_provider

CODEX_VERSION = "0.169.0"
CLAUDE_CODE_VERSION = "2.1.330"
OPENCODE_VERSION = "1.18.33"
QWEN_CODE_VERSION = "0.24.4"
MODEL = "qwen2.5-coder-0.5b"
CONTEXT = 32768  # the model's window, as tests/agents/conftest.py serves it
DUMMY_KEY = "dummy"  # the server needs none


def npm_cache() -> Path:
    return Path(os.environ.get("HEARTH_NPM_CACHE") or Path.home() / ".cache" / "hearth" / "npm")


def cli_path(package: str, version: str, binary: str) -> Path:
    return npm_cache() / f"{package.replace('/', '_')}-{version}" / "node_modules" / ".bin" / binary


CODEX = cli_path("@openai/codex", CODEX_VERSION, "codex")
CLAUDE = cli_path("@anthropic-ai/claude-code", CLAUDE_CODE_VERSION, "claude")
OPENCODE = cli_path("opencode-ai", OPENCODE_VERSION, "opencode")
QWEN = cli_path("@qwen-code/qwen-code", QWEN_CODE_VERSION, "qwen")


def _base_env(home: Path) -> dict[str, str]:
    """A minimal environment: no inherited keys or proxies, a home of the test's own."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_CACHE_HOME=str(home / ".cache"),
               XDG_DATA_HOME=str(home / ".local" / "share"), XDG_STATE_HOME=str(home / ".local" / "state"),
               NO_COLOR="1")
    return env


def launched(agent: str, url: str, *args: str) -> list[str]:
    """The command that starts `agent` through `hearth launch` (hearth/cli/launch.py) against
    `url`, with `args` passed to it: the way a user starts it, so the tests run launch's own
    configuration. The environment must have the CLI on PATH (`codex_env`, `claude_env`)."""
    return [sys.executable, "-m", "hearth.cli.main", "launch", agent, "--url", url, "--model", MODEL, "--", *args]


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str


def run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> Run:
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return Run(p.returncode, p.stdout, p.stderr)


def toml_value(v: str | int) -> str:
    return str(v) if isinstance(v, int) else json.dumps(v)


def codex_env(home: Path, base_url: str) -> dict[str, str]:
    """CODEX_HOME with a config.toml naming one provider: Hearth, over the Responses API (the
    provider settings `hearth launch codex` passes as -c overrides, hearth/cli/agents.py), and
    every switch for traffic elsewhere off."""
    codex_home = home / "codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    provider = codex_provider(Target(base_url, MODEL, DUMMY_KEY, CONTEXT))
    table = "model_providers.hearth."
    top = "\n".join(f"{k} = {toml_value(v)}" for k, v in provider.items() if not k.startswith(table))
    hearth = "\n".join(f"{k[len(table):]} = {toml_value(v)}" for k, v in provider.items() if k.startswith(table))
    (codex_home / "config.toml").write_text(f'''{top}
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.hearth]
{hearth}
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
''')
    env = _base_env(home)
    env["PATH"] = f"{CODEX.parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(CODEX_HOME=str(codex_home), **codex(Target(base_url, MODEL, DUMMY_KEY, CONTEXT)).env)
    return env


def claude_env(home: Path, base_url: str) -> dict[str, str]:
    """What `hearth launch claude` sets (hearth/cli/agents.py), and every other switch its
    vendor documents for traffic elsewhere off."""
    env = _base_env(home)
    env["PATH"] = f"{CLAUDE.parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(claude_code(Target(base_url, MODEL, DUMMY_KEY, CONTEXT)).env)
    env.update(
        DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1",
        DISABLE_ERROR_REPORTING="1", DISABLE_BUG_COMMAND="1", CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY="1",
        CLAUDE_CODE_ENABLE_TELEMETRY="0",
    )
    return env


def opencode_env(home: Path) -> dict[str, str]:
    """opencode on PATH and every switch it has for traffic elsewhere off (the models.dev
    catalog, updates, sharing, LSP downloads, default plugins) and Claude Code's files unread.
    Its provider config is not here: the tests take it from `hearth launch opencode`."""
    env = _base_env(home)
    env["PATH"] = f"{OPENCODE.parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(OPENCODE_DISABLE_MODELS_FETCH="1", OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_SHARE="1",
               OPENCODE_DISABLE_LSP_DOWNLOAD="1", OPENCODE_DISABLE_DEFAULT_PLUGINS="1",
               OPENCODE_DISABLE_CLAUDE_CODE="1")
    return env


def qwen_env(home: Path) -> dict[str, str]:
    """Qwen Code on PATH, with a settings.json in its home that turns off usage statistics,
    telemetry, update checks and its managed auto-memory (after a turn it sends a request of its
    own, ~13k tokens more to prefill: ~4 of the test's ~11 minutes on 2 cores, testing nothing
    of Hearth's that the first request does not; checked against a fake server: with it off,
    `qwen -p` sends one request). Base URL, key and model come from `hearth launch qwen`."""
    settings = home / ".qwen" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False},
                                    "general": {"enableAutoUpdate": False},
                                    "memory": {"enableManagedAutoMemory": False}}))
    env = _base_env(home)
    env["PATH"] = f"{QWEN.parent}{os.pathsep}{env.get('PATH', '')}"
    return env
