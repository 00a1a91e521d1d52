"""OpenAI chat messages as requests carry them, and their conversion to `Message`: Chat
Completions' `messages` and /tokenize's (which templates them the same way)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from hearth.chat.types import Message, ToolCall, new_id
from hearth.errors import BadRequest
from hearth.http.parsing import OpenBody


class ContentPart(OpenBody):
    type: str
    text: str | None = None


class FunctionCallIn(OpenBody):
    name: str
    arguments: str = ""


class ToolCallIn(OpenBody):
    id: str = Field(default_factory=lambda: new_id("call_"))
    type: Literal["function"] = "function"
    function: FunctionCallIn


class MessageIn(OpenBody):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


def text_of(content: str | list[ContentPart] | None, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    texts = []
    for i, part in enumerate(content):
        if part.type in ("text", "input_text", "output_text") and part.text is not None:
            texts.append(part.text)
        elif part.type in ("image_url", "input_image", "image", "input_audio", "file"):
            raise BadRequest(f"{where}.content[{i}]: {part.type} input is not supported: this model has "
                             "no vision or audio", param=f"{where}.content")
        else:
            raise BadRequest(f"{where}.content[{i}]: unsupported content part type {part.type!r}",
                             param=f"{where}.content")
    return "".join(texts)


def to_message(m: MessageIn, i: int) -> Message:
    where = f"messages[{i}]"
    content = text_of(m.content, where)
    if m.role == "tool":
        if not m.tool_call_id:
            raise BadRequest(f"{where}: a tool message needs tool_call_id", param=f"{where}.tool_call_id")
        if content is None:
            raise BadRequest(f"{where}: a tool message needs content", param=f"{where}.content")
    elif m.role == "assistant":
        if content is None and not m.tool_calls:
            raise BadRequest(f"{where}: an assistant message needs content or tool_calls",
                             param=f"{where}.content")
    elif content is None:
        raise BadRequest(f"{where}: a {m.role} message needs content", param=f"{where}.content")
    if m.tool_calls and m.role != "assistant":
        raise BadRequest(f"{where}: only assistant messages carry tool_calls", param=f"{where}.tool_calls")
    calls = [ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []]
    return Message(m.role, content, m.name, calls or None, m.tool_call_id, m.reasoning_content)
