"""The request side of the Responses API: input items, tools, tool_choice, text.format and
reasoning, checked and turned into the protocol-neutral types. Every failure is a BadRequest
naming the field."""

from __future__ import annotations

from typing import Any

from hearth.chat.types import Message, ReasoningOptions, ResponseFormat, Tool, ToolCall
from hearth.errors import BadRequest

MESSAGE_ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")
MEDIA_PARTS = ("input_image", "input_file", "input_audio", "image_url", "image", "file")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
TOOL_CHOICES = ("none", "auto", "required")


def normalize_input(value: Any) -> list[dict[str, Any]]:
    """`input` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        return value
    raise BadRequest("input must be a string or a list of input items", param="input")


def _str(item: dict[str, Any], key: str, at: str, *, optional: bool = False) -> str | None:
    value = item.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{at}.{key} must be a string", param=f"{at}.{key}")
    return value


def content_text(content: Any, at: str) -> str:
    """A message's content (a string or a list of text parts) as one string."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{at}.content must be a string or a list of content parts", param=f"{at}.content")
    texts = []
    for j, part in enumerate(content):
        where = f"{at}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            texts.append(_str(part, "text", where) or "")
        elif kind == "refusal":
            texts.append(_str(part, "refusal", where) or "")
        elif kind in MEDIA_PARTS:
            raise BadRequest(f"{where}: {kind} is not supported: this model has no vision or audio input",
                             param=f"{at}.content")
        else:
            raise BadRequest(f"{where}: unsupported content part type {kind!r}", param=f"{at}.content")
    return "".join(texts)


def to_messages(items: list[Any], where: str = "input") -> list[Message]:
    """Input items → chat messages. A function_call joins the assistant message right before
    it (a turn's text and its calls are one chat message); function_call_output becomes a
    tool message; reasoning and unknown item types are skipped."""
    messages: list[Message] = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{at}: an input item must be an object", param=at)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in MESSAGE_ROLES:
                raise BadRequest(f"{at}.role must be one of {', '.join(MESSAGE_ROLES)}", param=f"{at}.role")
            if item.get("content") is None:
                raise BadRequest(f"{at}: a message needs content", param=f"{at}.content")
            messages.append(Message(role, content_text(item["content"], at)))
        elif kind == "function_call":
            call = ToolCall(_str(item, "call_id", at) or "", _str(item, "name", at) or "",
                            _str(item, "arguments", at, optional=True) or "")
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                messages.append(Message("assistant", None, tool_calls=[call]))
        elif kind == "function_call_output":
            call_id = _str(item, "call_id", at)
            output = item.get("output")
            text = output if isinstance(output, str) else content_text(output, f"{at}.output")
            messages.append(Message("tool", text, tool_call_id=call_id))
        elif kind is None:
            raise BadRequest(f"{at}: an input item needs a type (or a role, for a message)", param=f"{at}.type")
    return messages


def to_tools(tools: Any) -> tuple[list[Tool], list[dict[str, Any]]]:
    """Flat function tools → (Tools, their echo in the response)."""
    if tools is None:
        return [], []
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    out, echo = [], []
    for i, t in enumerate(tools):
        at = f"tools[{i}]"
        kind = t.get("type") if isinstance(t, dict) else None
        if kind != "function":
            raise BadRequest(f"{at}: tool type {kind!r} is not supported; only function tools are",
                             param=f"{at}.type")
        name = _str(t, "name", at) or ""
        if not 1 <= len(name) <= 128:
            raise BadRequest(f"{at}.name must be 1 to 128 characters", param=f"{at}.name")
        description = _str(t, "description", at, optional=True) or ""
        parameters = t.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise BadRequest(f"{at}.parameters must be a JSON schema object", param=f"{at}.parameters")
        out.append(Tool(name, description, parameters))
        echo.append({"type": "function", "name": name, "description": description, "parameters": parameters,
                     "strict": t.get("strict")})
    return out, echo


def to_tool_choice(choice: Any, tools: list[Tool]) -> str | None:
    """"none" | "auto" | "required" | {type: function, name} → ChatRequest.tool_choice."""
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise BadRequest("tool_choice must be none, auto, required or a function", param="tool_choice")
        if choice == "required" and not tools:
            raise BadRequest("tool_choice is required but no tools are given", param="tool_choice")
        return choice
    name = choice.get("name") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(name, str) or not name:
        raise BadRequest('tool_choice object must be {"type": "function", "name": ...}', param="tool_choice")
    if name not in {t.name for t in tools}:
        raise BadRequest(f"tool_choice names {name!r}, which is not among the tools", param="tool_choice")
    return name


def to_response_format(text: Any) -> tuple[ResponseFormat | None, dict[str, Any]]:
    """`text.format` → (ResponseFormat, the `text` echo)."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if text is not None and not isinstance(text, dict):
        raise BadRequest("text must be an object", param="text")
    if fmt is None:
        return None, {"format": {"type": "text"}}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    echo = {"format": fmt}
    if kind == "text":
        return None, echo
    if kind == "json_object":
        return ResponseFormat("json_object"), echo
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise BadRequest("text.format.schema must be a JSON schema object", param="text.format.schema")
        name = fmt.get("name")
        return ResponseFormat("json_schema", schema, name if isinstance(name, str) else None,
                              bool(fmt.get("strict"))), echo
    raise BadRequest("text.format.type must be text, json_object or json_schema", param="text.format.type")


def to_reasoning(reasoning: Any) -> tuple[ReasoningOptions, dict[str, Any] | None]:
    if reasoning is None:
        return ReasoningOptions(), None
    if not isinstance(reasoning, dict):
        raise BadRequest("reasoning must be an object", param="reasoning")
    effort = reasoning.get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise BadRequest(f"reasoning.effort must be one of {', '.join(REASONING_EFFORTS)}",
                         param="reasoning.effort")
    echo = {"effort": effort, "summary": reasoning.get("summary")}
    if effort == "none":
        return ReasoningOptions(enable=False), echo
    return ReasoningOptions(effort=effort), echo


def check_metadata(metadata: Any) -> dict[str, str]:
    """OpenAI's limits: at most 16 pairs, keys up to 64 characters, values up to 512."""
    if metadata is None:
        return {}
    ok = (isinstance(metadata, dict) and len(metadata) <= 16
          and all(isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512
                  for k, v in metadata.items()))
    if not ok:
        raise BadRequest("metadata must map at most 16 keys (up to 64 characters) to strings (up to 512)",
                         param="metadata")
    return metadata
