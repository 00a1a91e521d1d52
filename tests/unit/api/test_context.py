"""The node's routes read one typed context, and every protocol calls one backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hearth.chat.types import ChatRequest, CompletionRequest, Message, SessionTurn
from hearth.sessions.backend import SessionBackend

API = Path(__file__).resolve().parents[3] / "hearth" / "api"


def test_only_the_context_module_reads_app_state() -> None:
    readers = sorted(str(p.relative_to(API)) for p in API.rglob("*.py")
                     if "app.state" in p.read_text() and p.name not in ("context.py", "app.py"))
    assert readers == []


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def chat(self, req: ChatRequest) -> str:
        self.calls.append(("chat", req))
        return "inner"

    async def complete(self, req: CompletionRequest) -> str:
        self.calls.append(("complete", req))
        return "inner"

    async def turn(self, req: ChatRequest) -> str:
        self.calls.append(("turn", req))
        return "session"


async def test_a_request_that_names_a_session_is_a_turn_any_other_goes_straight_through() -> None:
    inner, manager = Recorder(), Recorder()
    backend: Any = SessionBackend(inner, manager)  # type: ignore[arg-type]  # recorders stand in for both
    plain = ChatRequest("m", [Message("user", "hi")])
    turn = ChatRequest("m", [Message("user", "hi")], session=SessionTurn("s1"))
    completion = CompletionRequest("m", "hi")
    assert await backend.chat(plain) == "inner"
    assert await backend.chat(turn) == "session"
    assert await backend.complete(completion) == "inner"
    assert inner.calls == [("chat", plain), ("complete", completion)]
    assert manager.calls == [("turn", turn)]
