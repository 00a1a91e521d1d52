"""Continuing a partial assistant message (`continue_final_message`): the conversation's last
message is an answer cut short, and the model goes on writing it.

The prompt is the conversation before that message, rendered with the generation prompt, then
the message as the model itself would have written it (`prefill_text`): its reasoning inside
its thinking markers, its text, and its tool calls in the model's call format, the last call's
arguments left open where they were cut. That text is fed silently through the output parsers
(reasoning, tool calls), so they are in the state the cut left them in and the events carry
only what is new (`prefill_parsers`). A session stores the message whole (`merged`).

Tool calls are written back only in formats whose prefix Hearth can spell exactly as the model
does (`CONTINUABLE`); a partial message with tool calls for another format is a 400. So is a
grammar (response_format, a forced tool_choice): it constrains the output from its start and
cannot pick up in the middle.
"""

from __future__ import annotations

import json

from hearth.chat.output import OutputParser
from hearth.chat.types import ChatRequest, Message, ToolCall
from hearth.errors import BadRequest

PARAM = "continue_final_message"

# Tool-call formats whose opening Hearth writes as the model does: Hermes / Qwen
# (`<tool_call>\n{"name": ..., "arguments": ` then the arguments), which is also the format
# Hearth teaches templates that know no tools.
CONTINUABLE = ("hermes",)


def check(req: ChatRequest) -> Message:
    """The partial assistant message a `continue_final` request continues; 400 if it has none."""
    last = req.messages[-1] if req.messages else None
    if last is None or last.role != "assistant":
        raise BadRequest("continue_final_message needs the conversation's last message to be the assistant's "
                         "partial answer", param=PARAM)
    if req.n != 1:
        raise BadRequest("continue_final_message continues one answer: n must be 1", param=PARAM)
    return last


def prefill_text(partial: Message, think: tuple[str, str], inside: bool, parser: str | None) -> str:
    """The raw text of `partial` as the model writes it, to append to a prompt that ends with
    the generation prompt (`inside`: that prompt already opened the thinking block)."""
    start, end = think
    out = ""
    after = bool(partial.content or partial.tool_calls)
    if partial.reasoning:
        out += ("" if inside else start + "\n") + partial.reasoning + (f"\n{end}\n\n" if after else "")
    elif inside and after:  # the template opened thinking and the answer had none: close it, empty
        out += f"{end}\n\n"
    out += partial.content or ""
    if partial.tool_calls:
        if parser not in CONTINUABLE:
            raise BadRequest(f"this model writes tool calls in the {parser or 'no'} format: a partial answer with "
                             "tool calls cannot be continued (only the hermes format can)", param=PARAM)
        for i, call in enumerate(partial.tool_calls):
            last = i == len(partial.tool_calls) - 1
            out += ("\n" if out else "") + _call_text(call, closed=not last)
    return out


def _call_text(call: ToolCall, closed: bool) -> str:
    head = '<tool_call>\n{"name": ' + json.dumps(call.name, ensure_ascii=False) + ', "arguments": '
    if not closed:
        return head + call.arguments  # left open: the model goes on with the arguments
    return head + (call.arguments or "{}") + "}\n</tool_call>"


def prefill_parsers(parsers: list[OutputParser], text: str) -> None:
    """Bring fresh output parsers to the state `text` leaves them in; what they make of it
    was already sent (by the node that wrote it), so it is dropped."""
    for p in parsers:
        p.feed(text)


def merged(partial: Message, reply: Message) -> Message:
    """The whole answer: the partial message, then what the continuation added (`reply`:
    text, reasoning, and tool-call arguments by call index, the first continuing the
    partial's last call when it carries no name)."""
    calls = [ToolCall(c.id, c.name, c.arguments) for c in partial.tool_calls or []]
    for i, c in enumerate(reply.tool_calls or []):
        if not c.name and calls and i == 0:
            calls[-1].arguments += c.arguments
        else:
            calls.append(ToolCall(c.id, c.name, c.arguments))
    reasoning = (partial.reasoning or "") + (reply.reasoning or "")
    return Message("assistant", (partial.content or "") + (reply.content or ""), partial.name, calls or None,
                   reasoning=reasoning or None)
