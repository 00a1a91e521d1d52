"""The request side of the Responses API: input items, tools, tool_choice, text.format and
reasoning, checked and turned into the protocol-neutral types. Every failure is a BadRequest
naming the field (an item reference to nothing stored is a NotFound).

Item references (`{"type": "item_reference", "id"}`, or an item with only an `id`, as OpenAI's
types allow) are replaced by the stored items they name before anything else reads the input;
the store is reached through a lookup function, so this module stays free of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hearth.chat.types import Message, ReasoningOptions, ResponseFormat, Tool, ToolCall
from hearth.errors import BadRequest, NotFound

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


def _is_reference(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    kind = item.get("type")
    return kind == "item_reference" or (kind is None and "role" not in item and "id" in item)


def resolve_references(items: list[Any], lookup: Callable[[str], dict[str, Any] | None]) -> list[Any]:
    """`items` with each item reference replaced by the stored item it names (`lookup(id)`).
    An id nothing stored holds (unknown, deleted, or of a response created with `store: false`)
    is a 404 with `param: "input"`, as OpenAI answers it."""
    if not any(_is_reference(item) for item in items):
        return items
    out = []
    for i, item in enumerate(items):
        if not _is_reference(item):
            out.append(item)
            continue
        item_id = item.get("id")
        if not isinstance(item_id, str) or not item_id:
            raise BadRequest(f"input[{i}].id: an item reference needs the id of a stored item", param=f"input[{i}].id")
        found = lookup(item_id)
        if found is None:
            raise NotFound(f"input[{i}]: item with id {item_id!r} not found. Items are kept only with their "
                           "response, and not for a response created with store: false; send the item itself "
                           "instead of a reference", param="input")
        out.append(found)
    return out


def check_call_outputs(history: list[dict[str, Any]], items: list[Any]) -> None:
    """Every function_call_output answers a function_call made before it in the conversation
    (the replayed chain, then this input), as OpenAI requires."""
    calls = {item.get("call_id") for item in history if isinstance(item, dict) and item.get("type") == "function_call"}
    for i, item in enumerate(items):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "function_call":
            calls.add(item.get("call_id"))
        elif kind == "function_call_output" and item.get("call_id") not in calls:
            raise BadRequest(f"input[{i}]: no tool call found for function call output with call_id "
                             f"{item.get('call_id')!r}", param="input")


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


def to_messages(items: list[Any], where: str = "input", tools: ToolSet | None = None) -> list[Message]:
    """Input items → chat messages. A function_call joins the assistant message right before
    it (a turn's text and its calls are one chat message), under the name the model knows
    (`tools` maps a namespaced call back); function_call_output becomes a tool message;
    reasoning and unknown item types are skipped."""
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
            name = _str(item, "name", at) or ""
            if tools is not None:
                name = tools.model_name(name, _str(item, "namespace", at, optional=True))
            call = ToolCall(_str(item, "call_id", at) or "", name, _str(item, "arguments", at, optional=True) or "")
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


def _is_output(item: Any) -> bool:
    kind = item.get("type", "message" if "role" in item else None) if isinstance(item, dict) else None
    return kind in ("reasoning", "function_call") or (kind == "message" and item.get("role") == "assistant")


def split_partial(items: list[Any]) -> tuple[list[Any], list[Any]]:
    """(the items before the answer being continued, the answer's own output items: the
    trailing reasoning, assistant message and function_call items)."""
    n = len(items)
    while n and _is_output(items[n - 1]):
        n -= 1
    return items[:n], items[n:]


def _reasoning_text(item: dict[str, Any], at: str) -> str:
    """A reasoning item's text: its reasoning_text content, else its summary."""
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if isinstance(parts, list) and parts:
            return "".join(_str(p, "text", f"{at}.{key}") or "" for p in parts
                           if isinstance(p, dict) and p.get("type") == kind)
    return ""


def partial_message(items: list[Any], tools: ToolSet, where: str = "input", offset: int = 0) -> Message:
    """The answer being continued (`continue_final_message`) from its output items, in order:
    reasoning, the message's output_text, function calls (the last one's `arguments` may be
    partial JSON)."""
    if not items:
        raise BadRequest("continue_final_message needs the input to end with the assistant's partial output "
                         "(reasoning, message or function_call items)", param="continue_final_message")
    msg = Message("assistant", "")
    for i, item in enumerate(items):
        at = f"{where}[{offset + i}]"
        kind = item.get("type", "message")
        if kind == "reasoning":
            msg.reasoning = (msg.reasoning or "") + _reasoning_text(item, at)
        elif kind == "message":
            msg.content = (msg.content or "") + content_text(item.get("content") or "", at)
        else:
            name = tools.model_name(_str(item, "name", at) or "", _str(item, "namespace", at, optional=True))
            call = ToolCall(_str(item, "call_id", at) or "", name, _str(item, "arguments", at, optional=True) or "")
            msg.tool_calls = [*(msg.tool_calls or []), call]
    return msg


@dataclass(slots=True)
class ToolSet:
    """The request's tools as the model sees them. Function tools inside a `namespace` join
    the list under their own names (a name already taken becomes `namespace.name`); calls come
    back with `name` and `namespace` as the client declared them. Tools of any other type are
    hosted tools the server cannot run (web_search, file_search, code_interpreter, ...): they
    are echoed, left out of the prompt, and never a 400."""

    tools: list[Tool] = field(default_factory=list)
    echo: list[dict[str, Any]] = field(default_factory=list)
    # model-facing name → (namespace, name as declared) for the tools declared in a namespace
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)  # the hosted tool types, for the log

    def model_name(self, name: str, namespace: str | None) -> str:
        """The name the model knows a declared (namespace, name) by."""
        if namespace:
            for shown, declared in self.namespaced.items():
                if declared == (namespace, name):
                    return shown
        return name

    def add(self, t: dict[str, Any], at: str, namespace: str | None = None) -> Tool:
        """A function tool declared at `at` (inside `namespace`, if given), checked."""
        name = _str(t, "name", at) or ""
        if not 1 <= len(name) <= 128:
            raise BadRequest(f"{at}.name must be 1 to 128 characters", param=f"{at}.name")
        description = _str(t, "description", at, optional=True) or ""
        parameters = t.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise BadRequest(f"{at}.parameters must be a JSON schema object", param=f"{at}.parameters")
        shown = name
        if namespace is not None:
            if any(x.name == name for x in self.tools):
                shown = f"{namespace}.{name}"
            self.namespaced[shown] = (namespace, name)
        self.tools.append(Tool(shown, description, parameters))
        return self.tools[-1]


def to_tools(tools: Any) -> ToolSet:
    """Function and namespace tools → the model's tools; every tool echoed as given."""
    out = ToolSet()
    if tools is None:
        return out
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    for i, t in enumerate(tools):
        at = f"tools[{i}]"
        kind = t.get("type") if isinstance(t, dict) else None
        if not isinstance(kind, str):
            raise BadRequest(f"{at}: a tool must be an object with a type", param=f"{at}.type")
        if kind == "function":
            tool = out.add(t, at)
            out.echo.append({"type": "function", "name": tool.name, "description": tool.description,
                             "parameters": tool.parameters, "strict": t.get("strict")})
            continue
        out.echo.append(t)
        if kind != "namespace":
            out.left_out.append(kind)
            continue
        namespace = _str(t, "name", at) or ""
        inner = t.get("tools")
        if not namespace or not isinstance(inner, list):
            raise BadRequest(f"{at}: a namespace needs a name and a list of tools", param=at)
        for j, f in enumerate(inner):
            where = f"{at}.tools[{j}]"
            inner_kind = f.get("type") if isinstance(f, dict) else None
            if inner_kind == "function":
                out.add(f, where, namespace)
            elif isinstance(inner_kind, str):
                out.left_out.append(f"{namespace}/{inner_kind}")
            else:
                raise BadRequest(f"{where}: a tool must be an object with a type", param=f"{where}.type")
    return out


def to_tool_choice(choice: Any, tools: ToolSet) -> str | None:
    """"none" | "auto" | "required" | {type: function, name[, namespace]} → ChatRequest.tool_choice.
    A choice of a hosted tool type (which the server leaves out) is "auto"; `allowed_tools`
    keeps its mode."""
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise BadRequest("tool_choice must be none, auto, required or a function", param="tool_choice")
        if choice == "required" and not tools.tools:
            raise BadRequest("tool_choice is required but no tools are given", param="tool_choice")
        return choice
    kind = choice.get("type") if isinstance(choice, dict) else None
    if isinstance(kind, str) and kind != "function":
        if kind == "allowed_tools" and choice.get("mode") in ("auto", "required"):
            return str(choice["mode"]) if tools.tools else "auto"
        return "auto"
    name = choice.get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str) or not name:
        raise BadRequest('tool_choice object must be {"type": "function", "name": ...}', param="tool_choice")
    namespace = choice.get("namespace")
    shown = tools.model_name(name, namespace if isinstance(namespace, str) else None)
    if shown not in {t.name for t in tools.tools}:
        raise BadRequest(f"tool_choice names {name!r}, which is not among the tools", param="tool_choice")
    return shown


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
    return dict(metadata)
