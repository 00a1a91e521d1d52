"""POST /v1/completions in-process: envelope, stream, echo of token prompts, failures."""

from __future__ import annotations

from tests.api.conftest import Harness

BODY = {"model": "fake", "prompt": "The answer", "max_tokens": 5, "temperature": 0}


async def test_envelope_and_stream_agree(h: Harness) -> None:
    r = await h.post("/v1/completions", BODY)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["choices"][0]["finish_reason"] == "length"
    events = await h.sse("/v1/completions", BODY)
    assert events[-1][1] == "[DONE]"
    streamed = "".join(d["choices"][0]["text"] for _, d in events[:-1] if d["choices"])
    assert streamed == body["choices"][0]["text"] and len(streamed) == 5


async def test_echo_of_a_token_prompt_is_detokenized(h: Harness) -> None:
    r = await h.post("/v1/completions", {**BODY, "prompt": list(b"abc"), "echo": True, "max_tokens": 1})
    assert r.json()["choices"][0]["text"].startswith("abc")
    r = await h.post("/v1/completions", {**BODY, "prompt": [97, 10**9]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


async def test_too_many_candidates_for_the_slots(h: Harness) -> None:
    r = await h.post("/v1/completions", {**BODY, "prompt": ["a", "b"], "n": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert "runs 2 (--parallel)" in r.json()["error"]["message"]


async def test_engine_failure_is_a_500(h: Harness) -> None:
    assert h.runner is not None
    h.runner.fail_decodes = 1
    r = await h.post("/v1/completions", BODY)
    assert r.status_code == 500 and r.json()["error"]["code"] == "generation_failed"
