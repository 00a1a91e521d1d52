#!/usr/bin/env bash
# Set up (idempotent), lint, type-check, and run the whole test suite: unit and in-process API
# tests with a fake runner, then end-to-end tests that start the real server with the real model
# (and, in tests/agents, the stock Codex CLI and Claude Code against the 32k tool-calling model).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/setup.sh
scripts/setup_agents.sh  # the agent CLIs and the tool-calling model, for tests/agents
.venv/bin/ruff check hearth tests bench
.venv/bin/mypy  # files and flags: [tool.mypy] in pyproject.toml
.venv/bin/python -m pytest -q "$@"
