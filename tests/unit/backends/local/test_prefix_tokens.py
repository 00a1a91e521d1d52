"""keep_tokens without tokenizing the prompt twice (hearth.backends.local.prefix_tokens): over
the real tokenizers and templates (the default model's, and the coder model's where it is
installed), the number found from the prompt's own tokens is the number the prefix's own
tokenization gives, for every breakpoint of the agents' captured requests and of conversations
built to be awkward (special-token text inside messages, whitespace runs, a breakpoint inside a
token), and the shortcut is taken where the template allows it."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hearth.api.anthropic.messages import read_messages
from hearth.backends.llamacpp.runner import LlamaCppRunner
from hearth.backends.local.model import EngineSettings, LocalModel, llamacpp_factory
from hearth.backends.local.prefix_tokens import split_at_special
from hearth.backends.local.prepare import prepare, render
from hearth.backends.local.prompt_size import longest_token
from hearth.chat.reasoning import think_markers
from hearth.chat.system_turns import renders_late_system
from hearth.chat.template import ChatTemplate
from hearth.chat.tools import knows_tools, plan_output, resolve_parser
from hearth.chat.types import ChatRequest, Message, Tool
from hearth.engine.fake_runner import FakeRunner
from hearth.engine.kv import common_prefix_len
from hearth.models import ModelSpec, embedded_model_path, resolve_model

FIXTURES = Path(__file__).parents[3] / "fixtures" / "agents"
AGENTS = ("claude-code-first", "claude-code-bash-first", "claude-code-bash-after-tool")


def _coder() -> ModelSpec | None:
    try:
        return resolve_model("qwen2.5-coder-0.5b")
    except FileNotFoundError:
        return None


CODER = _coder()
MODELS = [pytest.param(ModelSpec("default", embedded_model_path()), id="smollm2"),
          pytest.param(CODER, id="qwen2.5-coder", marks=pytest.mark.skipif(
              CODER is None, reason="qwen2.5-coder-0.5b is not installed (hearth models install qwen2.5-coder-0.5b)"))]


def local_model(runner: LlamaCppRunner, template: ChatTemplate) -> LocalModel:
    """A LocalModel with the real runner and template and no engine (prepare needs none)."""
    engine: Any = SimpleNamespace(seq_ctx=runner.n_ctx_train)
    tool_parser = resolve_parser("auto", template)
    return LocalModel(ModelSpec("m", Path(runner.path)), runner, engine, template, card=None,  # type: ignore[arg-type]
                      admission=None, longest_token=longest_token(runner),  # type: ignore[arg-type]
                      tool_parser=tool_parser, native_tools=knows_tools(template),
                      late_system=renders_late_system(template), think=think_markers(template.source))


@pytest.fixture(scope="module", params=MODELS)
def model(request: pytest.FixtureRequest) -> Iterator[LocalModel]:
    runner, _, template = llamacpp_factory(request.param, EngineSettings(ctx=64, parallel=1, threads=1, batch=16))
    assert isinstance(runner, LlamaCppRunner)
    try:
        yield local_model(runner, template)
    finally:
        runner.close()


def reference(m: LocalModel, req: ChatRequest) -> int:
    """keep_tokens as it was: the prefix tokenized on its own, compared with the whole prompt."""
    plan = plan_output(req, m.tool_parser)
    assert req.cache_through is not None
    whole = m.tokenize_text(render(m, req, plan), False)
    prefix = render(m, replace(req, messages=req.messages[:req.cache_through + 1]), plan, generation_prompt=False)
    return common_prefix_len(m.tokenize_text(prefix, False), whole)


def took_the_shortcut(m: LocalModel, req: ChatRequest) -> bool:
    plan = plan_output(req, m.tool_parser)
    assert req.cache_through is not None
    text = render(m, req, plan)
    prefix = render(m, replace(req, messages=req.messages[:req.cache_through + 1]), plan, generation_prompt=False)
    return split_at_special(m.runner, m.tokenize_text(text, False), text, prefix) is not None


def agent_request(name: str) -> ChatRequest:
    body = json.loads((FIXTURES / f"{name}.json").read_text())["body"]
    return read_messages(body, "req-test")[1]


@pytest.mark.parametrize("fixture", AGENTS)
def test_every_breakpoint_of_the_agents_requests_keeps_what_the_prefix_tokenizes_to(
        model: LocalModel, fixture: str) -> None:
    req = agent_request(fixture)
    assert req.cache_through is not None  # Claude Code marks its latest message
    assert took_the_shortcut(model, req)
    for through in range(len(req.messages)):
        r = replace(req, cache_through=through)
        assert prepare(model, r).keep_tokens == reference(model, r) > 0, through


WORDS = ["hello", " world", "\n", "\n\n", "  ", "\t", "é", "日本", "🙂", "<|im_end|>", "<|im_start|>",
         "<|endoftext|>", "<tool_call>", "```json\n{", '"name":', "}", " x", "1234", "\r\n", "<think>", "<|im_"]


def conversation(rng: random.Random) -> list[Message]:
    def text() -> str:
        return "".join(rng.choice(WORDS) for _ in range(rng.randint(0, 12)))

    messages = [Message("system", text())] if rng.random() < 0.5 else []
    for i in range(rng.randint(1, 5)):
        messages.append(Message("user" if i % 2 == 0 else "assistant", text()))
    if messages[-1].role != "user":
        messages.append(Message("user", text()))
    return messages


def test_awkward_conversations_keep_what_the_prefix_tokenizes_to(model: LocalModel) -> None:
    rng = random.Random(38)  # fixed: the same 120 conversations every run
    tools = [Tool("get_weather", "Weather for a city", {"type": "object", "properties": {"city": {"type": "string"}}})]
    shortcuts = 0
    for case in range(120):
        messages = conversation(rng)
        req = ChatRequest("m", messages, tools=tools if case % 3 == 0 else [], request_id=f"req-{case}")
        for through in range(len(messages)):
            r = replace(req, cache_through=through)
            assert prepare(model, r).keep_tokens == reference(model, r), (case, through, messages)
            shortcuts += took_the_shortcut(model, r)
    assert shortcuts > 0


# ---- the fallback -----------------------------------------------------------------------------

# Marks the conversation's last message: the prefix's text is then not the start of the whole's.
MARKS_LAST = ("{% for m in messages %}<|im_start|>{{ m.role }}{% if loop.last %} (last){% endif %}\n"
              "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# No special token anywhere: nothing to cut at.
PLAIN = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant:{% endif %}")
# A breakpoint whose newline merges with the next message's newline into one token.
RUN_ON = "<|im_start|>{% for m in messages %}{{ m.content }}\n{% endfor %}"


@pytest.mark.parametrize("source,shortcut", [(MARKS_LAST, False), (PLAIN, False), (RUN_ON, True)],
                         ids=["marks-last", "plain", "run-on"])
def test_templates_the_shortcut_cannot_read_fall_back_to_the_same_number(
        model: LocalModel, source: str, shortcut: bool) -> None:
    m = replace(model, template=ChatTemplate(source, bos_token="", eos_token=""), native_tools=False)
    messages = [Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "\nHello  "),
                Message("user", "\nWeather?")]
    for through in range(len(messages) - 1):
        req = ChatRequest("m", messages, cache_through=through)
        assert prepare(m, req).keep_tokens == reference(m, req), through
    assert took_the_shortcut(m, ChatRequest("m", messages, cache_through=1)) is shortcut


def test_a_continued_answer_keeps_what_the_prefix_tokenizes_to(model: LocalModel) -> None:
    messages = [Message("system", "Be brief."), Message("user", "Write a haiku."), Message("assistant", "Autumn")]
    req = ChatRequest("m", messages, cache_through=1, continue_final=True)
    plan = plan_output(req, model.tool_parser)
    prefix = render(model, replace(req, messages=messages[:2]), plan, generation_prompt=False)
    prepared = prepare(model, req)
    assert prepared.keep_tokens == common_prefix_len(model.tokenize_text(prefix, False), prepared.tokens) > 0


# ---- the walk, on the fake runner (one token per byte) -------------------------------------------


def test_the_walk_finds_the_last_special_token_before_the_breakpoint() -> None:
    r = FakeRunner()
    text = "system: be brief\nuser: hi\nassistant:"
    tokens = r.tokenize(text)
    cut = len("system: be brief\nuser: hi\n")
    # Every byte cuts the fake's text: the last whole token before the breakpoint is the anchor.
    assert split_at_special(r, tokens, text, text[:cut]) == (cut - 1, "\n")
    assert split_at_special(r, tokens, text, text[:3]) == (2, "s")  # near the start: walked forwards
    assert split_at_special(r, tokens, text, "") is None  # nothing before the breakpoint
    assert split_at_special(r, tokens, text, "other") is None  # not a prefix of the text


def test_tokens_that_do_not_spell_the_text_are_not_trusted() -> None:
    r = FakeRunner()
    text = "abcdef"
    assert split_at_special(r, r.tokenize("abcdeX"), text, "abcd") is None  # walked backwards
    assert split_at_special(r, r.tokenize("aXcdef"), text, "abcd") == (3, "d")  # only the tokens after it are read
    assert split_at_special(r, r.tokenize("aXcdef"), text, "ab") is None  # walked forwards
    assert split_at_special(r, r.tokenize("abcdefg"), text, "abcde") is None  # a token more than the text


def test_the_walk_gives_up_past_a_quarter_of_the_prompt() -> None:
    r = FakeRunner()
    text = "x" * 1000
    tokens = r.tokenize(text)
    assert split_at_special(r, tokens, text, text[:250]) == (249, "x")
    assert split_at_special(r, tokens, text, text[:251]) is None  # walked forwards, 251 tokens > 250
    assert split_at_special(r, tokens, text, text[:751]) == (750, "x")  # walked backwards: 250 tokens
    assert split_at_special(r, tokens, text, text[:750]) is None
