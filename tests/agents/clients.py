"""The stock agent CLIs as the tests run them: where scripts/setup_agents.sh put them, and the
configuration and environment that point them at one local server and nowhere else.

Neither CLI may reach the internet: each gets a fresh home directory, only a dummy key, the
base URL of the local server, and every switch its vendor documents for telemetry, update
checks, error reporting and other non-essential traffic turned off.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

CODEX_VERSION = "0.169.0"
CLAUDE_CODE_VERSION = "2.1.330"
MODEL = "qwen2.5-coder-0.5b"


def npm_cache() -> Path:
    return Path(os.environ.get("HEARTH_NPM_CACHE") or Path.home() / ".cache" / "hearth" / "npm")


def cli_path(package: str, version: str, binary: str) -> Path:
    return npm_cache() / f"{package.replace('/', '_')}-{version}" / "node_modules" / ".bin" / binary


CODEX = cli_path("@openai/codex", CODEX_VERSION, "codex")
CLAUDE = cli_path("@anthropic-ai/claude-code", CLAUDE_CODE_VERSION, "claude")


def _base_env(home: Path) -> dict[str, str]:
    """A minimal environment: no inherited keys or proxies, a home of the test's own."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_CACHE_HOME=str(home / ".cache"),
               NO_COLOR="1")
    return env


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str


def run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float) -> Run:
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return Run(p.returncode, p.stdout, p.stderr)


def codex_env(home: Path, base_url: str) -> dict[str, str]:
    """CODEX_HOME with a config.toml naming one provider: Hearth, over the Responses API."""
    codex_home = home / "codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(f'''model = "{MODEL}"
model_provider = "hearth"
model_context_window = 32768
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[model_providers.hearth]
name = "Hearth"
base_url = "{base_url}/v1"
env_key = "HEARTH_TEST_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
# Codex's idle timer counts SSE events, not the comments Hearth sends while a cold prompt is
# prefilled: give a loaded CI machine room.
stream_idle_timeout_ms = 1800000

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
''')
    env = _base_env(home)
    env.update(CODEX_HOME=str(codex_home), HEARTH_TEST_KEY="dummy")
    return env


def claude_env(home: Path, base_url: str) -> dict[str, str]:
    env = _base_env(home)
    env.update(
        ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY="dummy", ANTHROPIC_MODEL=MODEL,
        ANTHROPIC_SMALL_FAST_MODEL=MODEL, ANTHROPIC_DEFAULT_HAIKU_MODEL=MODEL,
        ANTHROPIC_DEFAULT_SONNET_MODEL=MODEL, ANTHROPIC_DEFAULT_OPUS_MODEL=MODEL,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_TELEMETRY="1", DISABLE_AUTOUPDATER="1",
        DISABLE_ERROR_REPORTING="1", DISABLE_BUG_COMMAND="1", CLAUDE_CODE_DISABLE_FEEDBACK_SURVEY="1",
        CLAUDE_CODE_ENABLE_TELEMETRY="0",
        # its real window, and room for a cold prefill on a loaded machine (5 min by default)
        CLAUDE_CODE_MAX_CONTEXT_TOKENS="32768", CLAUDE_STREAM_IDLE_TIMEOUT_MS="1800000",
    )
    return env
