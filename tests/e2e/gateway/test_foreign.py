"""llama-cpp-python's own server (`python -m llama_cpp.server`, the same wheel) as an
`openai`-kind upstream: the gateway translates Anthropic Messages and Responses clients to
OpenAI chat for it, keeps Responses chains itself, injects the upstream's key, and ends a
stream broken by kill -9 with the protocol's terminal error."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from hearth.models import resolve_model
from tests.conftest import free_port
from tests.e2e.gateway.conftest import GW_KEY, Gateway, start_gateway, stop

pytestmark = pytest.mark.slow

UPSTREAM_KEY = "foreign-key"
MSG = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    log = tmp_path_factory.mktemp("foreign") / "llama_cpp_server.log"
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(resolve_model("default").path),
                             "--model_alias", "smollm2", "--port", str(port), "--n_ctx", "1024", "--n_threads", "1",
                             "--api_key", UPSTREAM_KEY,
                             # by default it abandons a running request whenever another arrives (a
                             # liveness probe included): it then ends the stream early without a finish
                             # reason, which the gateway rightly reports as a broken stream
                             "--interrupt_requests", "False"], stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {UPSTREAM_KEY}"},
                         timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    yield url, proc
    stop(proc)


@pytest.fixture(scope="module")
def gw(foreign: tuple[str, subprocess.Popen[bytes]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    toml = (f'[[upstream]]\nname = "foreign"\nurl = "{foreign[0]}"\nkind = "openai"\napi_key = "{UPSTREAM_KEY}"\n'
            'models = { "smol" = "smollm2" }\nmax_in_flight = 2\n')
    g = start_gateway(tmp_path_factory.mktemp("gw"), toml, "--probe-interval", "0.5")
    yield g
    stop(g.proc)


def test_chat_through_to_a_foreign_engine(gw: Gateway) -> None:
    oai = openai.OpenAI(base_url=gw.base_url, api_key=GW_KEY, max_retries=0)
    # llama-cpp-python's server is not deterministic across its own prompt-cache reuse (a repeated
    # prompt is re-evaluated from a cached prefix), so streamed == non-streamed is asserted on
    # Hearth nodes only; here each must be a whole answer that ran to max_tokens.
    r = oai.chat.completions.create(model="smol", messages=MSG, max_tokens=12, temperature=0)  # type: ignore[arg-type]
    assert r.model == "smol" and r.choices[0].message.content and r.choices[0].finish_reason == "length"
    assert r.usage and r.usage.completion_tokens == 12
    chunks = list(oai.chat.completions.create(model="smol", messages=MSG, max_tokens=12, temperature=0,  # type: ignore[arg-type]
                                              stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    c = oai.completions.create(model="smol", prompt="Once upon a time", max_tokens=6, temperature=0)
    assert c.choices[0].text and c.choices[0].finish_reason == "length"
    events = list(oai.responses.create(model="smol", input="Hi", max_output_tokens=6, stream=True))
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta")


def test_anthropic_and_responses_are_translated_and_chains_kept_by_the_gateway(gw: Gateway) -> None:
    ac = anthropic.Anthropic(base_url=gw.url, api_key=GW_KEY, max_retries=0)
    t0 = {"temperature": 0}
    m = ac.messages.create(model="smol", max_tokens=12, messages=MSG, extra_body=t0)  # type: ignore[arg-type]
    with ac.messages.stream(model="smol", max_tokens=12, messages=MSG, extra_body=t0) as st:  # type: ignore[arg-type]
        text = st.get_final_text()
    assert m.model == "smol" and m.content[0].text and text  # type: ignore[union-attr]
    assert m.stop_reason == "max_tokens"

    oai = openai.OpenAI(base_url=gw.base_url, api_key=GW_KEY, max_retries=0)
    first = oai.responses.create(model="smol", input="My name is Ada.", max_output_tokens=8, temperature=0)
    second = oai.responses.create(model="smol", input="What is my name?", previous_response_id=first.id,
                                  max_output_tokens=8, temperature=0)
    assert second.previous_response_id == first.id and second.output_text
    assert oai.responses.retrieve(first.id).output_text == first.output_text
    with pytest.raises(openai.NotFoundError):  # foreign engines keep no sessions
        oai.chat.completions.create(model="smol", messages=MSG, max_tokens=2, extra_body={"session_id": "s"})  # type: ignore[arg-type]


def test_cancel_reaches_a_run_on_a_foreign_engine(gw: Gateway) -> None:
    oai = openai.OpenAI(base_url=gw.base_url, api_key=GW_KEY, max_retries=0)
    stream = oai.chat.completions.create(model="smol", max_tokens=300, stream=True, extra_body={"cancel_id": "fc"},
                                         messages=[{"role": "user", "content": "Write a long story."}])
    finish, pieces = None, 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces += 1
            if pieces == 1:
                r = httpx.post(gw.base_url + "/cancel", json={"cancel_id": "fc"},
                               headers={"Authorization": f"Bearer {GW_KEY}"})
                assert r.json()["cancelled"] == 1
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "cancelled" and pieces < 300


def test_kill_mid_stream_ends_with_anthropic_error_event(gw: Gateway,
                                                         foreign: tuple[str, subprocess.Popen[bytes]]) -> None:
    ac = anthropic.Anthropic(base_url=gw.url, api_key=GW_KEY, max_retries=0)
    received = []
    story = [{"role": "user", "content": "A long story."}]
    with (pytest.raises(anthropic.APIStatusError) as e,
          ac.messages.stream(model="smol", max_tokens=400, messages=story, extra_body={"ignore_eos": True}) as st):  # type: ignore[arg-type]
        for delta in st.text_stream:
            received.append(delta)
            if len(received) == 3:
                foreign[1].kill()
    assert len(received) >= 3 and "failed mid-stream" in str(e.value)
