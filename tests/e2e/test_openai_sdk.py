"""The official openai SDK against a real Hearth server with the real default model."""

from __future__ import annotations

import openai
import pytest
from openai import OpenAI

from hearth.models import DEFAULT_MODEL_ID
from tests.helpers import EXACT, Server

pytestmark = pytest.mark.slow

# Comparisons between two requests recompute the whole prompt: llama.cpp's kernels are not
# batch-invariant, so logits from a cached prefix may differ in low-order bits (see docs/api.md).

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three colors.",
    "Explain what a CPU does in one sentence.",
]


@pytest.fixture(scope="module")
def client(server: Server) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=600)  # a deadline, not speed


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_models_lists_the_default_model(client: OpenAI) -> None:
    # Every model installed on the machine is listed (loaded on request); the default one first,
    # loaded at start. Which others are installed depends on the machine: not asserted.
    ids = [m.id for m in client.models.list()]
    assert ids[0] == DEFAULT_MODEL_ID and len(set(ids)) == len(ids)
    assert client.models.retrieve(DEFAULT_MODEL_ID).id == DEFAULT_MODEL_ID


def test_chat_completion(client: OpenAI) -> None:
    r = client.chat.completions.create(model=DEFAULT_MODEL_ID, messages=user(PROMPTS[0]), temperature=0,
                                       max_tokens=30)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert len(r.choices[0].message.content or "") > 10
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.prompt_tokens > 10 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


@pytest.mark.parametrize("prompt", PROMPTS)
def test_streamed_text_equals_non_streamed_text_at_temperature_0(client: OpenAI, prompt: str) -> None:
    full = client.chat.completions.create(model=DEFAULT_MODEL_ID, messages=user(prompt), temperature=0,
                                          max_tokens=48, extra_body=EXACT)
    stream = client.chat.completions.create(model=DEFAULT_MODEL_ID, messages=user(prompt), temperature=0,
                                            max_tokens=48, stream=True, stream_options={"include_usage": True},
                                            extra_body=EXACT)
    parts, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
            continue
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(parts) == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage is not None and full.usage is not None
    assert usage.completion_tokens == full.usage.completion_tokens


def test_system_and_developer_and_multi_turn_messages(client: OpenAI) -> None:
    r = client.chat.completions.create(model=DEFAULT_MODEL_ID, temperature=0, max_tokens=20, messages=[
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "text", "text": "Hi, my name is Ada."}]},
        {"role": "assistant", "content": "Hello Ada!"},
        {"role": "user", "content": "What is my name?"},
    ])
    assert r.choices[0].message.content


def test_tool_call_history_is_accepted(client: OpenAI) -> None:
    r = client.chat.completions.create(model=DEFAULT_MODEL_ID, temperature=0, max_tokens=10, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
    ])
    assert r.choices[0].message.content is not None


def test_legacy_completions(client: OpenAI) -> None:
    r = client.completions.create(model=DEFAULT_MODEL_ID, prompt="The capital of France is", max_tokens=8,
                                  temperature=0, extra_body=EXACT)
    assert r.object == "text_completion" and r.choices[0].text
    assert (r.usage is not None and r.usage.completion_tokens == 8) or r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=DEFAULT_MODEL_ID, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True,
        extra_body=EXACT)
        if c.choices)
    assert streamed == r.choices[0].text


def test_legacy_completions_with_several_prompts_and_echo(client: OpenAI) -> None:
    r = client.completions.create(model=DEFAULT_MODEL_ID, prompt=["One, two,", "Red, green,"], max_tokens=4,
                                  temperature=0, echo=True)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].text.startswith("One, two,") and r.choices[1].text.startswith("Red, green,")


def test_logprobs_in_openai_shape(client: OpenAI) -> None:
    r = client.chat.completions.create(model=DEFAULT_MODEL_ID, messages=user(PROMPTS[0]), temperature=0,
                                       max_tokens=6, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == r.usage.completion_tokens  # type: ignore[union-attr]
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].token == entry.token  # greedy picks the most likely token
        assert bytes(entry.bytes or []).decode(errors="replace") == entry.token
    assert "".join(e.token for e in content) == r.choices[0].message.content


def test_n_candidates(client: OpenAI) -> None:
    # seeded, and recomputed (EXACT): the same samples on every run, whatever ran before
    r = client.chat.completions.create(model=DEFAULT_MODEL_ID, messages=user("Tell me a fun fact."), n=2,
                                       temperature=1.0, seed=7, max_tokens=20, extra_body=EXACT)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.message.content for c in r.choices)
    assert r.choices[0].message.content != r.choices[1].message.content


def test_stop_string_truncates_before_the_stop(client: OpenAI) -> None:
    base = client.chat.completions.create(model=DEFAULT_MODEL_ID, messages=user(PROMPTS[1]), temperature=0,
                                          max_tokens=40, extra_body=EXACT).choices[0].message.content or ""
    words = base.split()
    assert len(words) > 4
    stop = words[3]
    cut = base[: base.index(stop)]
    for stream in (False, True):
        if stream:
            chunks = client.chat.completions.create(model=DEFAULT_MODEL_ID, messages=user(PROMPTS[1]),
                                                    temperature=0, max_tokens=40, stop=[stop], stream=True,
                                                    extra_body=EXACT)
            text, finish = "", None
            for ch in chunks:
                for c in ch.choices:
                    text += c.delta.content or ""
                    finish = c.finish_reason or finish
        else:
            r = client.chat.completions.create(model=DEFAULT_MODEL_ID, messages=user(PROMPTS[1]),
                                               temperature=0, max_tokens=40, stop=stop, extra_body=EXACT)
            text, finish = r.choices[0].message.content or "", r.choices[0].finish_reason
        assert text == cut and finish == "stop"


def test_same_seed_same_output(client: OpenAI) -> None:
    def sample(seed: int) -> str:
        return client.chat.completions.create(
            model=DEFAULT_MODEL_ID, messages=user("Write a random word."), temperature=1.2, seed=seed,
            max_tokens=24, extra_body=EXACT).choices[0].message.content or ""

    a, b = sample(1234), sample(1234)
    assert a == b
    assert len({sample(s) for s in (1, 2, 3)} | {a}) > 1  # different seeds do vary


def test_sdk_error_classes(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="no-such-model", messages=user("hi"))
    assert nf.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="tool_call_id"):
        client.chat.completions.create(model=DEFAULT_MODEL_ID,
                                       messages=[{"role": "tool", "content": "x"}])  # type: ignore[list-item]
    with pytest.raises(openai.BadRequestError, match=r"maximum context length is 2048 tokens") as big:
        client.chat.completions.create(model=DEFAULT_MODEL_ID, messages=user("word " * 3000))
    assert big.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    assert "prompt has" in str(big.value)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=DEFAULT_MODEL_ID, messages=user("hi"), temperature=-1)
