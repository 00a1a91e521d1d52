"""What each agent CLI needs to talk to one Hearth server, and nothing else: its base URL, key
and model, and the settings that keep its prompts cacheable. `hearth launch` (launch.py) and
the agent tests (tests/agents/clients.py) build their configurations here, so the two cannot
drift apart.

A configuration is environment variables (`env`) and arguments put before the user's own
(`args`); none writes to the user's files (Codex takes its provider as `-c` overrides, opencode
its config as `OPENCODE_CONFIG_CONTENT`). `secret` names the variables that carry the key, which
`hearth launch` never prints.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

# The variable Codex and opencode read the key from (named in their configs, set by `hearth launch`).
KEY_ENV = "HEARTH_API_KEY"
# What the CLIs send when the server needs no key: each refuses to start without one.
NO_KEY = "hearth"


@dataclass(frozen=True, slots=True)
class Target:
    """The server an agent is pointed at: `url` without /v1; `context`: the model's window, if known."""

    url: str
    model: str
    key: str | None = None
    context: int | None = None


@dataclass(slots=True)
class AgentConfig:
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    secret: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Agent:
    name: str  # what `hearth launch` takes
    binary: str  # the executable looked up on PATH
    package: str  # its npm package, for the install command
    configure: Callable[[Target], AgentConfig]

    @property
    def install(self) -> str:
        return f"npm install -g {self.package}"


# How long an agent CLI waits for the next event of a stream before it drops the request (and
# retries it from the start): 30 minutes. Their defaults (Claude Code's and Codex's 5 minutes,
# Qwen Code's 4) count events, not the SSE comments Hearth sends while it processes a prompt,
# and a cold agent prompt (8-13k tokens) takes 2-7 minutes to prefill on a two-core machine
# (README, "Agents"): each retry started over, so it never ended. Hearth's own time cap, counted
# from the first token, still ends every answer.
STREAM_IDLE_MS = 1_800_000


def claude_code(t: Target) -> AgentConfig:
    """Claude Code over Anthropic's Messages API. Every model role is the one model. The
    attribution header is off: Claude Code writes it into the system prompt with a value that
    changes per request, which would make every prompt a cache miss from its first block.
    Non-essential traffic (telemetry, updates, error reports) is off: it would go to Anthropic.
    Its stream idle timer is widened (STREAM_IDLE_MS)."""
    env = {"ANTHROPIC_BASE_URL": t.url, "ANTHROPIC_AUTH_TOKEN": t.key or NO_KEY, "ANTHROPIC_API_KEY": "",
           "ANTHROPIC_MODEL": t.model, "ANTHROPIC_SMALL_FAST_MODEL": t.model,
           "ANTHROPIC_DEFAULT_HAIKU_MODEL": t.model, "ANTHROPIC_DEFAULT_SONNET_MODEL": t.model,
           "ANTHROPIC_DEFAULT_OPUS_MODEL": t.model,
           "CLAUDE_CODE_ATTRIBUTION_HEADER": "0", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(STREAM_IDLE_MS)}
    if t.context:
        env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(t.context)
    return AgentConfig(env=env, secret={"ANTHROPIC_AUTH_TOKEN"})


def codex_provider(t: Target) -> dict[str, str | int]:
    """Codex's settings for Hearth as its model provider over the Responses API, as config keys
    (a config.toml's, or `-c key=value` overrides). Codex sends a prompt_cache_key per
    conversation, which Hearth uses to keep that conversation's slot and cached prefix. Its
    stream idle timer is widened (STREAM_IDLE_MS)."""
    out: dict[str, str | int] = {
        "model": t.model, "model_provider": "hearth",
        "model_providers.hearth.name": "Hearth", "model_providers.hearth.base_url": f"{t.url}/v1",
        "model_providers.hearth.env_key": KEY_ENV, "model_providers.hearth.wire_api": "responses",
        "model_providers.hearth.stream_idle_timeout_ms": STREAM_IDLE_MS}
    if t.context:
        out["model_context_window"] = t.context
    return out


def codex(t: Target) -> AgentConfig:
    args = [a for k, v in codex_provider(t).items() for a in ("-c", f"{k}={json.dumps(v)}")]
    return AgentConfig(env={KEY_ENV: t.key or NO_KEY}, args=args, secret={KEY_ENV})


def opencode_output_limit(context: int) -> int:
    """The output budget opencode is told for a model of `context` tokens: a quarter of the
    window. opencode asks for it as max_tokens and also keeps it free in the window: it compacts
    the conversation (a summarising request) as soon as a turn's tokens pass `context - output`
    (output capped at its 32,000). Given the whole window as output, as before, every turn
    of a 32k model passed 768 tokens and opencode compacted after its first answer (seen with
    opencode 1.18.33 against Hearth)."""
    return max(1, min(context // 4, 32_000))


def opencode(t: Target) -> AgentConfig:
    """opencode with Hearth as an OpenAI-compatible provider, its config given inline (it merges
    it over the user's own)."""
    model: dict[str, object] = {"name": t.model}
    if t.context:
        model["limit"] = {"context": t.context, "output": opencode_output_limit(t.context)}
    config = {"$schema": "https://opencode.ai/config.json", "model": f"hearth/{t.model}",
              "provider": {"hearth": {"npm": "@ai-sdk/openai-compatible", "name": "Hearth",
                                      "options": {"baseURL": f"{t.url}/v1", "apiKey": "{env:" + KEY_ENV + "}"},
                                      "models": {t.model: model}}}}
    return AgentConfig(env={KEY_ENV: t.key or NO_KEY, "OPENCODE_CONFIG_CONTENT": json.dumps(config)},
                       secret={KEY_ENV})


# Its cap on a stream's whole life (15 minutes by default) is off (0): it cut the same prompt's
# answer after a 13-minute prefill. Hearth's own time cap, counted from the first token, ends
# every answer, so the stream stays bounded.
QWEN_STREAM_MAX_LIFETIME_MS = 0


def qwen_code(t: Target) -> AgentConfig:
    """Qwen Code over OpenAI's Chat Completions. It asks for a fixed max_tokens (32,768) whatever
    the model: Hearth lowers it to what the context leaves (unless --strict-max-tokens). Its
    stream idle timer counts chunks, not the SSE comments Hearth sends while it processes the
    prompt (4 minutes by default: it cut its own 13k-token first prompt on a loaded two-core
    machine, each retry starting over), so it is widened (STREAM_IDLE_MS), and its cap on a
    stream's life, which counts the prompt's processing too, is off
    (QWEN_STREAM_MAX_LIFETIME_MS)."""
    env = {"OPENAI_BASE_URL": f"{t.url}/v1", "OPENAI_API_KEY": t.key or NO_KEY, "OPENAI_MODEL": t.model,
           "QWEN_STREAM_IDLE_TIMEOUT_MS": str(STREAM_IDLE_MS),
           "QWEN_STREAM_MAX_LIFETIME_MS": str(QWEN_STREAM_MAX_LIFETIME_MS)}
    return AgentConfig(env=env, secret={"OPENAI_API_KEY"})


AGENTS = {a.name: a for a in (
    Agent("claude", "claude", "@anthropic-ai/claude-code", claude_code),
    Agent("codex", "codex", "@openai/codex", codex),
    Agent("opencode", "opencode", "opencode-ai", opencode),
    Agent("qwen", "qwen", "@qwen-code/qwen-code", qwen_code),
)}
