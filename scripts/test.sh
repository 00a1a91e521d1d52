#!/usr/bin/env bash
# scripts/test.sh            the whole suite, what CI runs: set up (idempotent), lint, type-check,
#                            then unit and in-process API tests with a fake runner, and end-to-end
#                            tests that start the real server with the real model (and, in
#                            tests/agents, the stock Codex CLI and Claude Code against the 32k
#                            tool-calling model).
# scripts/test.sh --quick    the inner loop: ruff, mypy, tests/unit and tests/api (in-process, on
#                            the fake runner). No model downloads, no agent CLIs, no real servers;
#                            setup runs only if the venv is missing or out of date. About a minute.
# Any further arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ "${1:-}" = "--quick" ]; then
  shift
  scripts/setup.sh --stamp-ok || HEARTH_SETUP_MINIMAL=1 scripts/setup.sh
  .venv/bin/ruff check hearth tests bench
  .venv/bin/mypy
  exec .venv/bin/python -m pytest -q tests/unit tests/api "$@"
fi
scripts/setup.sh
scripts/setup_agents.sh  # the agent CLIs and the tool-calling model, for tests/agents
scripts/setup_clients.sh  # the Vercel AI SDK from npm, for tests/clients
.venv/bin/ruff check hearth tests bench
.venv/bin/mypy  # files and flags: [tool.mypy] in pyproject.toml
.venv/bin/python -m pytest -q "$@"
