#!/usr/bin/env bash
# Test setup for the client-library suite (tests/clients): the Vercel AI SDK from npm at pinned
# versions. The Python client libraries (LangChain, the OpenAI Agents SDK, LiteLLM, pydantic-ai)
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
cache="${HEARTH_NPM_CACHE:-$HOME/.cache/hearth/npm}"
dir="$cache/ai-sdk-$AI_VERSION-openai-$AI_SDK_OPENAI_VERSION-compatible-$AI_SDK_OPENAI_COMPATIBLE_VERSION-zod-$ZOD_VERSION"
if [ "${1:-}" = "--dir" ]; then echo "$dir"; exit 0; fi  # where the tests load it from
mkdir -p "$cache"

loads() {  # loads PREFIX: node can require every package from it
  (cd "$1" && node -e 'for (const p of ["ai", "@ai-sdk/openai", "@ai-sdk/openai-compatible", "zod"]) require(p)') \
    >/dev/null 2>&1
}

if [ -d "$dir" ] && loads "$dir"; then
  echo "setup_clients: reusing the AI SDK $AI_VERSION ($dir)"
  exit 0
fi
echo "setup_clients: installing the AI SDK $AI_VERSION from npm"
rm -rf "$dir.partial"
mkdir -p "$dir.partial"
echo '{"private": true, "type": "module"}' > "$dir.partial/package.json"
npm install --prefix "$dir.partial" --no-audit --no-fund --no-update-notifier --loglevel=error --save-exact \
  "ai@$AI_VERSION" "@ai-sdk/openai@$AI_SDK_OPENAI_VERSION" \
  "@ai-sdk/openai-compatible@$AI_SDK_OPENAI_COMPATIBLE_VERSION" "zod@$ZOD_VERSION" >/dev/null
loads "$dir.partial"
rm -rf "$dir"
mv "$dir.partial" "$dir"
echo "setup_clients: the AI SDK $AI_VERSION in $dir"
