"""Anthropic cache_control through the official anthropic SDK, against a real server with the real
default model: the first request writes the marked prefix to the prompt cache and says so, the
same request again reads it, and the usage's three parts always sum to the prompt."""

from __future__ import annotations

import time
from typing import Any

import pytest
from anthropic import Anthropic
from anthropic.types import Message, Usage

from hearth.models import DEFAULT_MODEL_ID
from tests.helpers import Server

pytestmark = pytest.mark.slow

# Several of the cache's 256-token blocks, and text no other test sends, so the first request
# finds nothing of it cached.
RULES = " ".join(f"Rule {i}: when the user greets you, answer with one short friendly sentence." for i in range(40))
SYSTEM = [{"type": "text", "text": RULES, "cache_control": {"type": "ephemeral"}}]
ASK: dict[str, Any] = {"model": DEFAULT_MODEL_ID, "system": SYSTEM, "messages": [{"role": "user", "content": "Hi!"}]}


@pytest.fixture(scope="module")
def client(server: Server) -> Anthropic:
    return Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=600)  # a deadline, not speed


def parts(u: Usage) -> tuple[int, int, int]:
    return u.input_tokens, u.cache_creation_input_tokens or 0, u.cache_read_input_tokens or 0


def test_a_breakpoint_is_written_then_read(client: Anthropic) -> None:
    prompt = client.messages.count_tokens(**ASK).input_tokens
    assert prompt > 2 * 256

    def ask() -> Message:
        return client.messages.create(max_tokens=4, extra_body={"temperature": 0}, **ASK)

    first = ask()
    fresh, written, read = parts(first.usage)
    assert written > 256 and fresh + written + read == prompt, first.usage
    # The cache's writer stores the blocks after the answer; the repeat reads them (or the slot's
    # KV, whichever still holds them), so poll until a repeat reads anything (the deadline only
    # catches a hang).
    deadline = time.monotonic() + 120
    while True:
        second = ask()
        if parts(second.usage)[2] > 0:
            break
        assert time.monotonic() < deadline, "no repeat of the request read anything from the cache"
    fresh, written_again, read = parts(second.usage)
    assert read >= written and fresh + written_again + read == prompt, second.usage
