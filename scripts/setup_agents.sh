#!/usr/bin/env bash
# Test setup for the agent end-to-end tests (tests/agents): the four stock agent CLIs that
# `hearth launch` knows (Codex, Claude Code, opencode, Qwen Code) from npm at pinned versions, and
# the 32k tool-calling model. Idempotent; scripts/test.sh runs it after scripts/setup.sh.
# Serving Hearth needs none of this.
#
# Each CLI goes into its own prefix under $HEARTH_NPM_CACHE (default ~/.cache/hearth/npm), like
# the llama.cpp wheel: installed once per machine (~1.3 GB for all four; opencode and Qwen Code,
# ~500 MB, took 20 s of npm here), reused after (a few seconds). An install is built in a
# temporary prefix and renamed into place once the binary runs, so an interrupted one is never
# reused. The model goes into the model cache with its checksum checked
# (`hearth models install`, ~490 MB).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

CODEX_VERSION="0.169.0"
CLAUDE_CODE_VERSION="2.1.330"
OPENCODE_VERSION="1.18.33"
QWEN_CODE_VERSION="0.24.4"
cache="${HEARTH_NPM_CACHE:-$HOME/.cache/hearth/npm}"
mkdir -p "$cache"

# install_cli PACKAGE VERSION BIN: npm install into $cache/<name>-<version>, unless it is there.
install_cli() {
  local pkg="$1" version="$2" bin="$3"
  local dir="$cache/${pkg//\//_}-$version"
  local exe="$dir/node_modules/.bin/$bin"
  if [ -x "$exe" ] && "$exe" --version >/dev/null 2>&1; then
    echo "setup_agents: reusing $pkg $version ($("$exe" --version))"
    return
  fi
  echo "setup_agents: installing $pkg@$version from npm"
  rm -rf "$dir.partial"
  npm install --prefix "$dir.partial" --no-audit --no-fund --no-update-notifier --loglevel=error \
    "$pkg@$version" >/dev/null
  local staged="$dir.partial/node_modules/.bin/$bin"
  # Claude Code's postinstall puts the platform binary over a placeholder; npm may skip install
  # scripts it has not been told to allow, so run it if the placeholder is still there.
  if ! "$staged" --version >/dev/null 2>&1 && [ -f "$dir.partial/node_modules/$pkg/install.cjs" ]; then
    (cd "$dir.partial/node_modules/$pkg" && node install.cjs >/dev/null)
  fi
  "$staged" --version >/dev/null
  rm -rf "$dir"
  mv "$dir.partial" "$dir"
  echo "setup_agents: $pkg $("$exe" --version)"
}

install_cli "@openai/codex" "$CODEX_VERSION" codex
install_cli "@anthropic-ai/claude-code" "$CLAUDE_CODE_VERSION" claude
install_cli opencode-ai "$OPENCODE_VERSION" opencode
install_cli @qwen-code/qwen-code "$QWEN_CODE_VERSION" qwen
.venv/bin/hearth models install qwen2.5-coder-0.5b
