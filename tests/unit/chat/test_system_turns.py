"""System turns after the first message: kept in place when the template renders them there,
merged into the leading system prompt when it refuses or drops them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearth.chat.system_turns import place_system_turns, renders_late_system
from hearth.chat.template import ChatTemplate
from hearth.chat.types import Message

QWEN = (Path(__file__).parents[2] / "fixtures" / "templates" / "qwen2.5-coder-0.5b-instruct.jinja").read_text()
RAISES = ("{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
          "{{ raise_exception('System message must be at the beginning') }}{% endif %}"
          "[{{ m.role }}] {{ m.content }}\n{% endfor %}")
DROPS = ("{% if messages[0].role == 'system' %}<<SYS>>{{ messages[0].content }}<</SYS>>\n{% endif %}"
         "{% for m in messages %}{% if m.role != 'system' %}[{{ m.role }}] {{ m.content }}\n{% endif %}{% endfor %}")

# Claude Code's first turn, in short: its environment block follows the user's message.
AGENT_TURN = [Message("system", "You are an agent."), Message("user", "List the files."),
              Message("system", "# Environment\ncwd: /work")]


def test_a_template_that_renders_late_system_turns_keeps_them_in_place() -> None:
    qwen = ChatTemplate(QWEN)
    assert renders_late_system(qwen)
    assert place_system_turns(AGENT_TURN, True) is AGENT_TURN
    text = qwen.render(AGENT_TURN)
    assert text.index("List the files.") < text.index("<|im_start|>system\n# Environment")


@pytest.mark.parametrize("source", [RAISES, DROPS])
def test_other_templates_get_every_system_text_in_the_leading_prompt(source: str) -> None:
    template = ChatTemplate(source)
    assert not renders_late_system(template)
    placed = place_system_turns(AGENT_TURN, False)
    assert placed == [Message("system", "You are an agent.\n\n# Environment\ncwd: /work"),
                      Message("user", "List the files.")]
    assert "# Environment" in template.render(placed)  # rendered, not refused, not dropped


def test_late_system_turns_without_a_leading_one_become_it() -> None:
    msgs = [Message("user", "hi"), Message("developer", "Be brief."), Message("assistant", "ok"),
            Message("system", "Use tools.")]
    assert place_system_turns(msgs, False) == [Message("system", "Be brief.\n\nUse tools."), Message("user", "hi"),
                                               Message("assistant", "ok")]
    first_only = [Message("system", "s"), Message("user", "u")]
    assert place_system_turns(first_only, False) is first_only
