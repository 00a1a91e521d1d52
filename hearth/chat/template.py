"""The model's own Jinja chat template (from the GGUF), rendered in a sandbox.

Follows the conventions HF templates expect: `messages`, `add_generation_prompt`,
`bos_token` / `eos_token`, `tools`, `raise_exception`, `strftime_now`, and any
`chat_template_kwargs` (e.g. enable_thinking) passed through as variables.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from hearth.chat.types import Message, Tool
from hearth.errors import BadRequest

# Used when a GGUF carries no template: ChatML, which most small instruct models speak.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

RESERVED = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or CHATML
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._template = env.from_string(self.source)
        self.bos_token = bos_token
        self.eos_token = eos_token
        # Templates written before the "developer" role know only "system".
        self.knows_developer = "developer" in self.source

    def render(self, messages: list[Message], *, tools: list[Tool] | None = None,
               add_generation_prompt: bool = True, kwargs: dict[str, Any] | None = None) -> str:
        extra = {k: v for k, v in (kwargs or {}).items() if k not in RESERVED}
        try:
            return self._template.render(
                messages=[self._message_dict(m) for m in messages],
                tools=[_tool_dict(t) for t in tools] if tools else None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except jinja2.TemplateError as e:
            raise BadRequest(f"the model's chat template rejected these messages: {e}",
                             param="messages") from e
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise BadRequest(f"the model's chat template could not render these messages: {e}",
                             param="messages") from e

    def _message_dict(self, m: Message) -> dict[str, Any]:
        role = m.role
        if role == "developer" and not self.knows_developer:
            role = "system"
        d: dict[str, Any] = {"role": role, "content": m.content or ""}
        if m.name:
            d["name"] = m.name
        if m.tool_calls:
            d["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                for c in m.tool_calls
            ]
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        if m.reasoning:
            d["reasoning_content"] = m.reasoning
        return d


def _arguments(text: str) -> Any:
    # HF templates expect a mapping they can iterate or `tojson`; keep text if it is not JSON.
    try:
        return json.loads(text)
    except ValueError:
        return text


def _tool_dict(t: Tool) -> dict[str, Any]:
    return {"type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
