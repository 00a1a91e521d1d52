"""System (and developer) messages after the first message: kept where they stand when the
model's template renders them there, merged into the leading system prompt when it does not.

Agents put system turns mid-conversation (Claude Code's environment block follows the user's
first message; Codex sends two developer messages). Qwen2.5's template renders a system turn
anywhere; others raise ("System message must be at the beginning") or silently drop it. Which
one a template does is probed once, by rendering a late system turn and looking for it.
"""

from __future__ import annotations

from hearth.chat.template import ChatTemplate
from hearth.chat.types import Message
from hearth.errors import HearthError

SYSTEM_ROLES = ("system", "developer")
_PROBE = "hearth_probe_late_system"


def renders_late_system(template: ChatTemplate) -> bool:
    """Does the template render a system message that follows a user message, in place?"""
    try:
        text = template.render([Message("system", "s"), Message("user", "u1"), Message("system", _PROBE),
                                Message("user", "u2")])
    except HearthError:
        return False
    return _PROBE in text and text.index(_PROBE) > text.index("u1")


def place_system_turns(messages: list[Message], late_ok: bool) -> list[Message]:
    """`messages` unchanged if every system message is first or the template renders late ones
    (`late_ok`); otherwise one leading system message holding every system text in order,
    then the rest."""
    late = [m for m in messages[1:] if m.role in SYSTEM_ROLES]
    if not late or late_ok:
        return messages
    lead = messages[0] if messages and messages[0].role in SYSTEM_ROLES else None
    texts = [m.content for m in ([lead] if lead else []) + late if m.content]
    merged = Message(lead.role if lead else "system", "\n\n".join(texts))
    return [merged, *[m for m in messages[1 if lead else 0:] if m.role not in SYSTEM_ROLES]]
