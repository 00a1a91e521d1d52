#!/usr/bin/env bash
# Test setup for the client-library suite (tests/clients): the Vercel AI SDK and Ollama's own
# JavaScript client (`ollama`) from npm at pinned versions. The Python client libraries (LangChain, the OpenAI Agents SDK, LiteLLM, pydantic-ai)
# are pinned in pyproject.toml's dev extra and installed by scripts/setup.sh. Idempotent;
# scripts/test.sh runs it after scripts/setup.sh. Serving Hearth needs none of this.
#
# Like the agent CLIs (scripts/setup_agents.sh), the packages go into one prefix under
# $HEARTH_NPM_CACHE (default ~/.cache/hearth/npm), named for the pins, installed once per machine
# (~10 MB) and reused after. An install is built in a temporary prefix and renamed into place once
# node can load it, so an interrupted one is never reused. The tests find the prefix the same way
# (tests/clients/conftest.py: ai_sdk_dir).
set -euo pipefail

AI_VERSION="7.0.173"
AI_SDK_OPENAI_VERSION="4.0.118"
AI_SDK_OPENAI_COMPATIBLE_VERSION="3.0.92"
ZOD_VERSION="4.6.7"  # the AI SDK's peer dependency (tool and output schemas)
OLLAMA_JS_VERSION="0.6.4"  # tests/clients/test_ollama_clients.py: Ollama's native API (/api/*)
cache="${HEARTH_NPM_CACHE:-$HOME/.cache/hearth/npm}"
dir="$cache/ai-sdk-$AI_VERSION-openai-$AI_SDK_OPENAI_VERSION-compatible-$AI_SDK_OPENAI_COMPATIBLE_VERSION-zod-$ZOD_VERSION"
ollama_dir="$cache/ollama-js-$OLLAMA_JS_VERSION"
if [ "${1:-}" = "--dir" ]; then echo "$dir"; exit 0; fi  # where the tests load it from
if [ "${1:-}" = "--ollama-dir" ]; then echo "$ollama_dir"; exit 0; fi
mkdir -p "$cache"

loads() {  # loads PREFIX PACKAGE...: node can require every package from it
  local prefix="$1"
  shift
  (cd "$prefix" && node -e 'for (const p of process.argv.slice(1)) require(p)' "$@") >/dev/null 2>&1
}

install() {  # install WHAT PREFIX "PACKAGE..." SPEC...: into PREFIX once, reused after
  local what="$1" prefix="$2" packages="$3"
  shift 3
  # shellcheck disable=SC2086  # the package list is words
  if [ -d "$prefix" ] && loads "$prefix" $packages; then
    echo "setup_clients: reusing $what ($prefix)"
    return
  fi
  echo "setup_clients: installing $what from npm"
  rm -rf "$prefix.partial"
  mkdir -p "$prefix.partial"
  echo '{"private": true, "type": "module"}' > "$prefix.partial/package.json"
  npm install --prefix "$prefix.partial" --no-audit --no-fund --no-update-notifier --loglevel=error --save-exact \
    "$@" >/dev/null
  # shellcheck disable=SC2086
  loads "$prefix.partial" $packages
  rm -rf "$prefix"
  mv "$prefix.partial" "$prefix"
  echo "setup_clients: $what in $prefix"
}

install "the AI SDK $AI_VERSION" "$dir" "ai @ai-sdk/openai @ai-sdk/openai-compatible zod" \
  "ai@$AI_VERSION" "@ai-sdk/openai@$AI_SDK_OPENAI_VERSION" \
  "@ai-sdk/openai-compatible@$AI_SDK_OPENAI_COMPATIBLE_VERSION" "zod@$ZOD_VERSION"
install "ollama-js $OLLAMA_JS_VERSION" "$ollama_dir" "ollama" "ollama@$OLLAMA_JS_VERSION"
