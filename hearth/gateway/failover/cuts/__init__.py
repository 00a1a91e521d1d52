"""One stream cut per client protocol (base.py: what a cut is; chat.py, messages.py,
responses.py, ollama.py: one each), and `cut_for`, the registry."""

from __future__ import annotations

from typing import Any

from hearth.gateway.failover.cuts.base import Cut
from hearth.gateway.failover.cuts.chat import ChatCut
from hearth.gateway.failover.cuts.messages import MessagesCut
from hearth.gateway.failover.cuts.ollama import OllamaCut
from hearth.gateway.failover.cuts.responses import ResponsesCut
from hearth.gateway.protocols import Protocol

__all__ = ["ChatCut", "Cut", "MessagesCut", "OllamaCut", "ResponsesCut", "cut_for"]


def cut_for(protocol: Protocol, request: dict[str, Any], started: float | None = None) -> Cut | None:
    """The Cut for a streamed request, or None where the stream cannot move (one answer only:
    `n` above 1 is not continued; legacy completions are not chat; nor is Ollama's raw
    generate). `started`: the turn's arrival (monotonic), for an Ollama answer's durations."""
    if protocol == "chat" and request.get("n", 1) in (1, None):
        return ChatCut()
    if protocol == "anthropic":
        return MessagesCut()
    if protocol == "responses":
        return ResponsesCut()
    if protocol == "ollama_chat":
        return OllamaCut("chat", started)
    if protocol == "ollama_generate" and request.get("raw") is not True:
        return OllamaCut("generate", started)
    return None
