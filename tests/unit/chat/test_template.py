import pytest

from hearth.chat.template import ChatTemplate
from hearth.chat.types import Message, Tool, ToolCall
from hearth.errors import BadRequest

SMOL = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\nDefault<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n'"
        " + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_renders_with_generation_prompt_and_default_system() -> None:
    t = ChatTemplate(SMOL)
    out = t.render([Message("user", "Hi")])
    assert out == "<|im_start|>system\nDefault<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_developer_becomes_system_for_templates_that_do_not_know_it() -> None:
    out = ChatTemplate(SMOL).render([Message("developer", "Be brief"), Message("user", "Hi")])
    assert out.startswith("<|im_start|>system\nBe brief<|im_end|>")


def test_assistant_tool_calls_render_with_empty_content() -> None:
    msgs = [Message("user", "q"), Message("assistant", None, tool_calls=[ToolCall("c1", "f", '{"a": 1}')]),
            Message("tool", "result", tool_call_id="c1")]
    out = ChatTemplate(SMOL).render(msgs, add_generation_prompt=False)
    assert "<|im_start|>assistant\n<|im_end|>" in out and "<|im_start|>tool\nresult" in out


def test_tools_and_template_kwargs_are_passed_through() -> None:
    src = ("{% if enable_thinking %}T{% endif %}{% for t in tools %}{{ t.function.name }}"
           "{{ t.function.parameters | tojson }}{% endfor %}")
    t = ChatTemplate(src)
    out = t.render([Message("user", "x")], tools=[Tool("get", "d", {"type": "object"})],
                   kwargs={"enable_thinking": True, "messages": "ignored"})
    assert out == 'Tget{"type": "object"}'


def test_template_errors_become_bad_requests() -> None:
    t = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(BadRequest, match="roles must alternate"):
        t.render([Message("user", "x")])


def test_missing_template_falls_back_to_chatml() -> None:
    assert ChatTemplate(None).render([Message("user", "x")]) == \
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
