"""A max_tokens past the context window, in-process on every protocol: lowered to what the
window leaves by default (llama-server's and Ollama's way), the window's end then reported as
each protocol's own `length`; `--strict-max-tokens` keeps OpenAI's 400. A prompt that fills the
window alone is a 400 either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import parse_sse, serve
from tests.fakes import scripted_backend

N_CTX = 2048  # the scripted backend's context
LONG = "x" * 3000  # an answer longer than the window
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}
PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def strict_backend(tmp_path: Path) -> Any:
    """The scripted backend with --strict-max-tokens (its engine settings, as build_backend sets them)."""
    weights = tmp_path / "fake.gguf"
    weights.write_bytes(b"fake weights")
    backend, _ = scripted_backend(LONG, path=weights)
    backend.settings.strict_max_tokens = True
    return backend


async def test_chat_and_completions_are_cut_by_the_window_with_length(tmp_path: Path) -> None:
    async with serve(tmp_path, answer=LONG) as h:
        for stream in (False, True):
            r = await h.post("/v1/chat/completions", {**CHAT, "max_tokens": 100_000, "stream": stream,
                                                      "stream_options": {"include_usage": True} if stream else None})
            assert r.status_code == 200, r.text
            if stream:
                chunks = [d for _, d in parse_sse(r.text) if d != "[DONE]"]
                finish = next(c["choices"][0]["finish_reason"] for c in chunks
                              if c["choices"] and c["choices"][0]["finish_reason"])
                usage = chunks[-1]["usage"]
            else:
                finish, usage = r.json()["choices"][0]["finish_reason"], r.json()["usage"]
            assert finish == "length"
            assert usage["prompt_tokens"] + usage["completion_tokens"] == N_CTX
        r = await h.post("/v1/completions", {"model": "fake", "prompt": PROMPT, "max_tokens": 100_000,
                                             "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["usage"]["total_tokens"] == N_CTX


async def test_responses_and_messages_are_cut_by_the_window_in_their_own_words(tmp_path: Path) -> None:
    async with serve(tmp_path, answer=LONG) as h:
        r = await h.post("/v1/responses", {"model": "fake", "input": "Hi", "temperature": 0,
                                           "max_output_tokens": 100_000})
        assert r.status_code == 200, r.text
        resp = r.json()
        assert resp["status"] == "incomplete" and resp["incomplete_details"] == {"reason": "max_output_tokens"}
        assert resp["usage"]["total_tokens"] == N_CTX
        r = await h.post("/v1/messages", {"model": "fake", "max_tokens": 32_000, "temperature": 0,
                                          "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200, r.text
        msg = r.json()
        assert msg["stop_reason"] == "max_tokens" and "stop_details" not in msg
        u = msg["usage"]  # the prompt is split three ways (the cache's reads and writes)
        assert u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"] \
            + u["output_tokens"] == N_CTX


async def test_an_answer_that_ends_inside_the_window_is_not_affected(tmp_path: Path) -> None:
    async with serve(tmp_path, answer="Done.") as h:
        r = await h.post("/v1/messages", {"model": "fake", "max_tokens": 32_000, "temperature": 0,
                                          "messages": [{"role": "user", "content": "Hi"}]})
        msg = r.json()
        assert (msg["stop_reason"], msg["content"][0]["text"]) == ("end_turn", "Done.")


@pytest.mark.parametrize(("path", "body", "code"), [
    ("/v1/chat/completions", {**CHAT, "max_tokens": 100_000}, "context_length_exceeded"),
    ("/v1/completions", {"model": "fake", "prompt": PROMPT, "max_tokens": 100_000}, "context_length_exceeded"),
    ("/v1/responses", {"model": "fake", "input": "Hi", "max_output_tokens": 100_000}, "context_length_exceeded"),
    ("/v1/messages", {"model": "fake", "max_tokens": 32_000, "messages": [{"role": "user", "content": "Hi"}]},
     None),
])
async def test_strict_max_tokens_keeps_the_400(tmp_path: Path, path: str, body: dict[str, Any],
                                              code: str | None) -> None:
    async with serve(tmp_path, strict_backend(tmp_path)) as h:
        r = await h.post(path, body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        if code is None:  # Anthropic's shape and wording
            assert err["type"] == "invalid_request_error" and "exceed context limit" in err["message"]
        else:
            assert err["code"] == code


@pytest.mark.parametrize("strict", [False, True])
async def test_a_prompt_that_fills_the_window_alone_is_a_400_either_way(tmp_path: Path, strict: bool) -> None:
    async with serve(tmp_path, strict_backend(tmp_path) if strict else None) as h:
        r = await h.post("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x" * N_CTX}],
                                                  "max_tokens": 10})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
