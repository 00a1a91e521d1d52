"""llama-cpp-python's own server (`python -m llama_cpp.server`, the same wheel), the fleet's
`openai`-kind upstream, serving the alias `foreign`: the gateway translates Anthropic Messages
and Responses clients to OpenAI chat for it, keeps Responses chains itself and injects the
upstream's key. (A stream of it broken by kill -9: test_outages.py.)"""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.e2e.gateway.conftest import Gateway, cancel_at_first_piece

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fleet")]  # all of it up

MSG = [{"role": "user", "content": "Name three colours."}]


def test_chat_through_to_a_foreign_engine(oai: openai.OpenAI) -> None:
    # llama-cpp-python's server is not deterministic across its own prompt-cache reuse (a repeated
    # prompt is re-evaluated from a cached prefix), so streamed == non-streamed is asserted on
    # Hearth nodes only; here each must be a whole answer that ran to max_tokens.
    r = oai.chat.completions.create(model="foreign", messages=MSG, max_tokens=12, temperature=0)  # type: ignore[arg-type]
    assert r.model == "foreign" and r.choices[0].message.content and r.choices[0].finish_reason == "length"
    assert r.usage and r.usage.completion_tokens == 12
    chunks = list(oai.chat.completions.create(model="foreign", messages=MSG, max_tokens=12, temperature=0,  # type: ignore[arg-type]
                                              stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    c = oai.completions.create(model="foreign", prompt="Once upon a time", max_tokens=6, temperature=0)
    assert c.choices[0].text and c.choices[0].finish_reason == "length"
    cs = list(oai.completions.create(model="foreign", prompt="Once upon a time", max_tokens=6, temperature=0,
                                     stream=True))
    assert "".join(x.choices[0].text for x in cs if x.choices)
    assert [x.choices[0].finish_reason for x in cs if x.choices and x.choices[0].finish_reason] == ["length"]
    events = list(oai.responses.create(model="foreign", input="Hi", max_output_tokens=6, stream=True))
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta")


def test_anthropic_and_responses_are_translated_and_chains_kept_by_the_gateway(
        oai: openai.OpenAI, ac: anthropic.Anthropic) -> None:
    t0 = {"temperature": 0}
    m = ac.messages.create(model="foreign", max_tokens=12, messages=MSG, extra_body=t0)  # type: ignore[arg-type]
    with ac.messages.stream(model="foreign", max_tokens=12, messages=MSG, extra_body=t0) as st:  # type: ignore[arg-type]
        text = st.get_final_text()
    assert m.model == "foreign" and m.content[0].text and text  # type: ignore[union-attr]
    assert m.stop_reason == "max_tokens"

    first = oai.responses.create(model="foreign", input="My name is Ada.", max_output_tokens=8, temperature=0)
    second = oai.responses.create(model="foreign", input="What is my name?", previous_response_id=first.id,
                                  max_output_tokens=8, temperature=0)
    assert second.previous_response_id == first.id and second.output_text
    assert oai.responses.retrieve(first.id).output_text == first.output_text
    with pytest.raises(openai.NotFoundError):  # foreign engines keep no sessions
        oai.chat.completions.create(model="foreign", messages=MSG, max_tokens=2, extra_body={"session_id": "s"})  # type: ignore[arg-type]


def test_cancel_reaches_a_run_on_a_foreign_engine(gw: Gateway) -> None:
    finish, pieces, r = cancel_at_first_piece(gw, "foreign", "fc", 300)
    assert r.json()["cancelled"] == 1
    assert finish == "cancelled" and pieces < 300
